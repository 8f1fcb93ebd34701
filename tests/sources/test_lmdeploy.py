"""LMDeploy: vLLM-like names under `lmdeploy:`, one reading per DP engine (names from lmdeploy/metrics/loggers.py)."""

from exporter.sources.engines.lmdeploy import ADAPTER
from exporter.sources.promtext import parse


def page_for(engine: str, usage: float) -> str:
    labels = f'engine="{engine}",model_name="internlm/internlm3-8b-instruct"'
    return (
        f"lmdeploy:num_requests_running{{{labels}}} 3.0\n"
        f"lmdeploy:num_requests_waiting{{{labels}}} 1.0\n"
        f"lmdeploy:gpu_cache_usage_perc{{{labels}}} {usage}\n"
        f"lmdeploy:prompt_tokens_total{{{labels}}} 512.0\n"
        f"lmdeploy:generation_tokens_total{{{labels}}} 2048.0\n"
        f'lmdeploy:request_success_total{{{labels},finished_reason="ResponseType.FINISH"}} 4.0\n'
        f'lmdeploy:time_per_output_token_seconds_bucket{{{labels},le="0.01"}} 100.0\n'
        f'lmdeploy:time_per_output_token_seconds_bucket{{{labels},le="+Inf"}} 120.0\n'
        f"lmdeploy:time_per_output_token_seconds_count{{{labels}}} 120.0\n"
        f"lmdeploy:time_per_output_token_seconds_sum{{{labels}}} 1.0\n"
    )


def test_reads_each_dp_engine():
    first, second = ADAPTER.read(parse(page_for("0", 0.5) + page_for("1", 0.25)))
    assert (first.engine, first.instance, first.model) == ("lmdeploy", "0", "internlm/internlm3-8b-instruct")
    assert (first.kv_cache_usage_ratio, second.kv_cache_usage_ratio) == (0.5, 0.25)
    assert (first.requests_running, first.requests_waiting) == (3.0, 1.0)
    assert (first.prompt_tokens_total, first.generation_tokens_total) == (512.0, 2048.0)
    assert first.requests_finished_total == 4.0
    assert first.itl_seconds is not None and first.itl_seconds.count == 120.0
    assert first.kv_cache_capacity_tokens is None


def test_detects_its_page():
    assert ADAPTER.detect(parse(page_for("0", 0.5))).score == 1.0
