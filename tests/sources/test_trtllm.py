"""TensorRT-LLM through Triton (the backend README's sample) and through trtllm-serve (a page built here)."""

import math

from exporter.sources.engines.trtllm import ADAPTER
from exporter.sources.promtext import parse

SERVE_PAGE = """\
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="trtllm",model_name="nemotron"} 6.0
trtllm_num_requests_waiting{engine_type="trtllm",model_name="nemotron"} 2.0
trtllm_kv_cache_utilization{engine_type="trtllm",model_name="nemotron"} 0.75
trtllm_kv_cache_max_blocks{engine_type="trtllm",model_name="nemotron"} 4000.0
trtllm_kv_cache_tokens_per_block{engine_type="trtllm",model_name="nemotron"} 32.0
trtllm_prompt_tokens_total{engine_type="trtllm",model_name="nemotron"} 1200.0
trtllm_generation_tokens_total{engine_type="trtllm",model_name="nemotron"} 3400.0
trtllm_request_success_total{engine_type="trtllm",finished_reason="stop",model_name="nemotron"} 9.0
trtllm_request_success_total{engine_type="trtllm",finished_reason="length",model_name="nemotron"} 1.0
trtllm_time_to_first_token_seconds_bucket{engine_type="trtllm",le="0.1",model_name="nemotron"} 8.0
trtllm_time_to_first_token_seconds_bucket{engine_type="trtllm",le="+Inf",model_name="nemotron"} 10.0
trtllm_time_to_first_token_seconds_count{engine_type="trtllm",model_name="nemotron"} 10.0
trtllm_time_to_first_token_seconds_sum{engine_type="trtllm",model_name="nemotron"} 0.9
"""


def test_triton_sample_reads_fraction_blocks_and_request_types(engine_page):
    [reading] = ADAPTER.read(parse(engine_page("triton-trtllm-readme.prom")))
    assert (reading.engine, reading.instance, reading.model) == ("trtllm", "", "tensorrt_llm")
    assert reading.kv_cache_usage_ratio == 0.4875
    assert reading.kv_cache_capacity_tokens == 6239 * 64
    assert reading.kv_block_size == 64
    assert (reading.requests_running, reading.requests_waiting) == (0.0, 1.0)  # "active" and "waiting"


def test_triton_usage_is_used_over_max_when_fraction_is_absent(engine_page):
    text = engine_page("triton-trtllm-readme.prom").replace('kv_cache_block_type="fraction"', 'kv_cache_block_type="x"')
    [reading] = ADAPTER.read(parse(text))
    assert reading.kv_cache_usage_ratio == 1 / 6239


def test_triton_models_are_read_apart():
    page = "".join(
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}",model="{m}",version="1"}} {v}\n'
        for m, fraction in (("a", 0.1), ("b", 0.2))
        for kind, v in (("fraction", fraction), ("max", 100), ("tokens_per", 32))
    )
    first, second = ADAPTER.read(parse(page))
    assert (first.model, first.kv_cache_usage_ratio) == ("a", 0.1)
    assert (second.model, second.kv_cache_usage_ratio, second.kv_cache_capacity_tokens) == ("b", 0.2, 3200)


def test_trtllm_serve_page_reads_blocks_and_counters():
    [reading] = ADAPTER.read(parse(SERVE_PAGE))
    assert (reading.engine, reading.model) == ("trtllm", "nemotron")
    assert reading.kv_cache_usage_ratio == 0.75
    assert (reading.kv_cache_capacity_tokens, reading.kv_block_size) == (128000, 32)
    assert (reading.requests_running, reading.requests_waiting) == (6.0, 2.0)
    assert (reading.prompt_tokens_total, reading.generation_tokens_total) == (1200.0, 3400.0)
    assert reading.requests_finished_total == 10.0
    assert reading.preemptions_total is None
    assert reading.ttft_seconds is not None and reading.ttft_seconds.buckets == ((0.1, 8.0), (math.inf, 10.0))


def test_detection_names_the_exporter_it_recognised(engine_page):
    triton = ADAPTER.detect(parse(engine_page("triton-trtllm-readme.prom")))
    serve = ADAPTER.detect(parse(SERVE_PAGE))
    assert triton.score == serve.score == 1.0
    assert triton.evidence[0].startswith("Triton backend: ")
    assert serve.evidence[0].startswith("trtllm-serve: ")
