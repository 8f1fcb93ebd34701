"""TGI: load gauges and request histograms, and no KV gauge at all."""

import math

from exporter.sources.engines.tgi import ADAPTER
from exporter.sources.promtext import parse

PAGE = """\
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 4
# TYPE tgi_queue_size gauge
tgi_queue_size 7
# TYPE tgi_request_success counter
tgi_request_success 120
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 80
tgi_request_duration_bucket{le="1.0"} 110
tgi_request_duration_bucket{le="+Inf"} 120
tgi_request_duration_sum 61.5
tgi_request_duration_count 120
# TYPE tgi_request_mean_time_per_token_duration histogram
tgi_request_mean_time_per_token_duration_bucket{le="0.05"} 100
tgi_request_mean_time_per_token_duration_bucket{le="+Inf"} 120
tgi_request_mean_time_per_token_duration_sum 3.1
tgi_request_mean_time_per_token_duration_count 120
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="100"} 60
tgi_request_input_length_bucket{le="+Inf"} 120
tgi_request_input_length_sum 15000
tgi_request_input_length_count 120
# TYPE tgi_batch_inference_duration histogram
tgi_batch_inference_duration_bucket{method="prefill",le="+Inf"} 50
tgi_batch_inference_duration_count{method="prefill"} 50
"""


def test_reads_load_and_request_histograms_with_kv_fields_empty():
    [reading] = ADAPTER.read(parse(PAGE))
    assert (reading.engine, reading.instance, reading.model) == ("tgi", "", None)
    assert (reading.requests_running, reading.requests_waiting) == (4.0, 7.0)
    assert reading.kv_cache_usage_ratio is None and reading.kv_cache_capacity_tokens is None
    assert reading.requests_finished_total == 120.0
    assert reading.e2e_seconds is not None and reading.e2e_seconds.buckets[-1] == (math.inf, 120.0)
    assert reading.itl_seconds is not None and reading.itl_seconds.sum == 3.1
    assert reading.request_prompt_tokens is not None and reading.request_prompt_tokens.sum == 15000.0
    assert reading.ttft_seconds is None  # TGI has no TTFT histogram


def test_counter_with_total_suffix_is_read_too():
    [reading] = ADAPTER.read(parse("tgi_queue_size 0\ntgi_request_success_total 3\n"))
    assert reading.requests_finished_total == 3.0


def test_detects_its_page():
    found = ADAPTER.detect(parse(PAGE))
    assert found.score == 1.0
    assert found.evidence[0] == "18 names start with 'tgi_'"
