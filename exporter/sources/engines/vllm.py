"""vLLM, V0 and V1 engines (names from vllm/v1/metrics/loggers.py; renames from engines.md A.1.2).

KV capacity is not a metric: it is in the labels of `vllm:cache_config_info`, which carry every CacheConfig field.
`kv_cache_size_tokens` (since PR #42206, 2026-05) is right for hybrid models too, where `num_gpu_blocks x
block_size` is not (block_size is then the smallest group's); older pages only have the product.
"""

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from exporter.sources.engines.base import EngineReading
from exporter.sources.engines.domains import size_product, with_counts
from exporter.sources.engines.series import Group, label_number
from exporter.sources.engines.vocabulary import Vocabulary
from exporter.sources.promtext import ParsedPage

CACHE_CONFIG = "vllm:cache_config_info"

VOCABULARY = Vocabulary(
    name="vllm",
    prefix="vllm:",
    instance_label="engine",  # the data-parallel engine index, V1 only; V0 pages have a single unlabelled engine
    model_label="model_name",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=(
        "vllm:kv_cache_usage_perc",
        # Renamed in v0.9.2 (PR #18354), hidden from v0.11 (PR #24245), removed in the v0.12/0.13 line (PR #29330).
        "vllm:gpu_cache_usage_perc",
    ),
    # Counters: prometheus_client always prints `_total`; the bare names are for re-exporters that strip it.
    preemptions=("vllm:num_preemptions_total", "vllm:num_preemptions"),
    prompt_tokens=("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
    generation_tokens=("vllm:generation_tokens_total", "vllm:generation_tokens"),
    requests_finished=("vllm:request_success_total", "vllm:request_success"),
    ttft=("vllm:time_to_first_token_seconds",),
    itl=(
        "vllm:inter_token_latency_seconds",
        # Deprecated for ITL in v0.11 (PR #24110), hidden in v0.12 (PR #29330), removed by PR #32661; same buckets.
        "vllm:time_per_output_token_seconds",
    ),
    e2e=("vllm:e2e_request_latency_seconds",),
    request_prompt_tokens=("vllm:request_prompt_tokens",),
    request_generation_tokens=("vllm:request_generation_tokens",),
    extra=(CACHE_CONFIG,),
)


def _refine(page: ParsedPage, group: Group, reading: EngineReading) -> EngineReading:
    # cache_config_info has no model_name label: match it on the engine index alone (V1 labels it per engine).
    engine = {"engine": group.instance} if "engine" in group.where else {}
    configs = page.select(CACHE_CONFIG, engine)
    if not configs:
        return reading
    config = configs[0].labels
    return with_counts(
        replace(reading, engine_config=MappingProxyType(dict(config))),
        kv_cache_capacity_tokens=capacity_tokens(config),
        kv_block_size=label_number(config, "block_size"),
    )


def capacity_tokens(config: Mapping[str, str]) -> float | None:
    """Tokens the KV pool holds, as the labels say it (checked as a count by the caller)."""
    tokens = label_number(config, "kv_cache_size_tokens")
    if tokens is not None:
        return tokens
    return size_product(label_number(config, "num_gpu_blocks"), label_number(config, "block_size"))


ADAPTER = replace(VOCABULARY, refine=_refine)
