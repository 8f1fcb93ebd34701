"""SGLang (names from python/sglang/srt/metrics/collector.py; engines.md A.2).

Scheduler gauges are repeated once per tp_rank/pp_rank when metrics are on for all schedulers; each copy
describes the same KV pool, so an instance takes the largest and never the sum (summing multiplies capacity by
the TP degree). One reading per dp_rank: each data-parallel rank has its own pool.

With DP attention the tokenizer-side counters and histograms (tokens, TTFT, ITL, E2E) are server-wide and carry
no dp_rank, so they are left off the per-rank readings rather than repeated on each.
"""

from dataclasses import replace

from exporter.sources.engines.base import EngineReading
from exporter.sources.engines.domains import with_counts
from exporter.sources.engines.series import Group, gauge
from exporter.sources.engines.vocabulary import Vocabulary
from exporter.sources.promtext import ParsedPage

MAX_TOTAL_TOKENS = "sglang:max_total_num_tokens"
PAGE_SIZE = "sglang:page_size"  # newer builds only

VOCABULARY = Vocabulary(
    name="sglang",
    prefix="sglang:",
    instance_label="dp_rank",
    model_label="model_name",
    replica_labels=("tp_rank", "pp_rank", "moe_ep_rank"),
    breakdown_labels=("priority",),
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    preemptions=("sglang:num_retracted_requests_total",),  # SGLang calls preemption "retraction"
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    requests_finished=("sglang:num_requests_total",),  # counted as each request finishes
    ttft=("sglang:time_to_first_token_seconds",),
    itl=(
        "sglang:inter_token_latency_seconds",
        # Replaced by ITL (added in PR #3988, the old one deleted in PR #4914, gone by v0.4.6.post5).
        "sglang:time_per_output_token_seconds",
    ),
    e2e=("sglang:e2e_request_latency_seconds",),
    request_prompt_tokens=("sglang:prompt_tokens_histogram",),  # optional, behind a server flag
    request_generation_tokens=("sglang:generation_tokens_histogram",),
    extra=(MAX_TOTAL_TOKENS, PAGE_SIZE),
)


def _refine(page: ParsedPage, group: Group, reading: EngineReading) -> EngineReading:
    return with_counts(
        reading,
        kv_cache_capacity_tokens=gauge(page, (MAX_TOTAL_TOKENS,), group.where),
        kv_block_size=gauge(page, (PAGE_SIZE,), group.where),
    )


ADAPTER = replace(VOCABULARY, refine=_refine)
