"""SGLang pages: the docs sample, and pages built here for tensor- and data-parallel ranks."""

import json
import math

from exporter.cli import main
from exporter.sources.engines.sglang import ADAPTER
from exporter.sources.promtext import parse

MODEL = "Qwen/Qwen3-235B-A22B-FP8"


def rank_lines(dp: str | None, tp: int, tokens: int, usage: float, running: int, retracted: int) -> str:
    dp_label = f'dp_rank="{dp}",' if dp is not None else ""
    labels = f'{dp_label}engine_type="unified",model_name="{MODEL}",pp_rank="0",tp_rank="{tp}"'
    return (
        f"sglang:max_total_num_tokens{{{labels}}} {tokens}.0\n"
        f"sglang:token_usage{{{labels}}} {usage}\n"
        f"sglang:num_running_reqs{{{labels}}} {running}.0\n"
        f"sglang:num_queue_reqs{{{labels}}} 3.0\n"
        f"sglang:num_retracted_requests_total{{{labels}}} {retracted}.0\n"
    )


def test_docs_sample_reads_usage_load_and_tokens(engine_page):
    [reading] = ADAPTER.read(parse(engine_page("sglang-docs-sample.prom")))
    assert (reading.engine, reading.instance, reading.model) == ("sglang", "", "meta-llama/Llama-3.1-8B-Instruct")
    assert reading.kv_cache_usage_ratio == 0.28
    assert (reading.requests_running, reading.requests_waiting) == (162.0, 2826.0)
    assert (reading.prompt_tokens_total, reading.generation_tokens_total) == (8128902.0, 7557572.0)
    assert reading.kv_cache_capacity_tokens is None  # the older sample predates max_total_num_tokens
    ttft = reading.ttft_seconds
    assert ttft is not None and (ttft.count, ttft.sum) == (11008.0, 2.3518979474117756e06)
    assert ttft.buckets[-2:] == ((0.04, 1.0), (math.inf, 11008.0))


def test_sglang_capacity_is_not_summed_across_tp_ranks():
    page = "".join(rank_lines(None, tp, 367404, 0.5 + tp / 100, 40, 2) for tp in range(4))
    [reading] = ADAPTER.read(parse(page))
    assert reading.kv_cache_capacity_tokens == 367404
    assert reading.kv_cache_usage_ratio == 0.53  # the largest copy, not 2.06
    assert (reading.requests_running, reading.requests_waiting) == (40.0, 3.0)
    assert reading.preemptions_total == 2.0  # a replicated counter counts once


def test_dp_ranks_are_read_apart_with_max_over_their_tp_ranks():
    page = "".join(rank_lines(dp, tp, 100000 * (int(dp) + 1), 0.1, 8, 0) for dp in ("0", "1") for tp in range(2))
    first, second = ADAPTER.read(parse(page))
    assert (first.instance, first.kv_cache_capacity_tokens) == ("0", 100000)
    assert (second.instance, second.kv_cache_capacity_tokens) == ("1", 200000)


def test_priority_scheduling_reads_the_total_not_the_sum_of_total_and_parts():
    page = "".join(
        f'sglang:num_queue_reqs{{model_name="m",priority="{priority}"}} {waiting}.0\n'
        f'sglang:num_retracted_requests_total{{model_name="m",priority="{priority}"}} {retracted}.0\n'
        for priority, waiting, retracted in (("", 5, 7), ("0", 3, 4), ("1", 2, 3))
    )
    [reading] = ADAPTER.read(parse(page))
    assert reading.requests_waiting == 5.0
    assert reading.preemptions_total == 7.0  # the parts alone add up to it too; total and parts would be 14


def test_page_size_is_the_block_size_when_exported():
    page = 'sglang:token_usage{model_name="m"} 0.1\nsglang:page_size{model_name="m"} 64.0\n'
    [reading] = ADAPTER.read(parse(page))
    assert reading.kv_block_size == 64


def test_old_time_per_output_token_histogram_stands_in_for_itl():
    page = (
        'sglang:num_running_reqs{model_name="m"} 1.0\n'
        'sglang:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 2.0\n'
        'sglang:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 5.0\n'
        'sglang:time_per_output_token_seconds_count{model_name="m"} 5.0\n'
    )
    [reading] = ADAPTER.read(parse(page))
    assert reading.itl_seconds is not None and reading.itl_seconds.buckets == ((0.01, 2.0), (math.inf, 5.0))


# SGLang before its first request: prometheus_client prints HELP and TYPE for every family but samples only for
# the gauges set at startup (the capacity "constants"); names from python/sglang/srt/metrics/collector.py.
FIRST_LABELS = 'engine_type="unified",model_name="Qwen/Qwen3-8B",pp_rank="0",tp_rank="0"'
FIRST_PAGE = (
    "# HELP sglang:num_running_reqs The number of running requests.\n"
    "# TYPE sglang:num_running_reqs gauge\n"
    "# HELP sglang:token_usage The token usage.\n"
    "# TYPE sglang:token_usage gauge\n"
    "# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.\n"
    "# TYPE sglang:max_total_num_tokens gauge\n"
    f"sglang:max_total_num_tokens{{{FIRST_LABELS}}} 412264.0\n"
    "# HELP sglang:page_size The page size.\n"
    "# TYPE sglang:page_size gauge\n"
    f"sglang:page_size{{{FIRST_LABELS}}} 1.0\n"
)


def test_the_first_page_before_any_request_yields_the_capacity():
    [reading] = ADAPTER.read(parse(FIRST_PAGE))
    assert (reading.model, reading.kv_cache_capacity_tokens, reading.kv_block_size) == ("Qwen/Qwen3-8B", 412264, 1)
    assert reading.requests_running is None  # not yet exported, so unknown rather than 0


def test_probe_prints_the_capacity_of_the_first_page(tmp_path, capsys):
    page = tmp_path / "sglang-first.prom"
    page.write_text(FIRST_PAGE)
    assert main(["probe", str(page), "--format", "json"]) == 0
    [reading] = json.loads(capsys.readouterr().out)["readings"]
    assert (reading["engine"], reading["kv_cache_capacity_tokens"]) == ("sglang", 412264)


def test_detects_its_page(engine_page):
    found = ADAPTER.detect(parse(engine_page("sglang-docs-sample.prom")))
    assert found.score == 1.0
    assert "has sglang:token_usage" in found.evidence
