"""Hostile and partial engine pages: what one page can make a read cost, and what it can make Plimsoll export.

These call `read_page` directly on generated pages; the daemon's own tests drive the same pages over HTTP.
"""

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sources.engines import ADAPTERS, PageLimits, read_page

# CPU-time bounds, generous (several times what the fixed read takes on a 2-core machine): the read before the fix
# took 38 s for 8,000 instances and 154 s for 16,000, growing with the square of their number (some 36 minutes
# for 60,000).
SECONDS = 2.0
# Parsing all 120,000 samples of the 7 MB page, as a raised series cap allows, takes about 1.5 s here.
FULL_PARSE_SECONDS = 6.0


def vllm_instances(count: int) -> str:
    """A vLLM page of `count` data-parallel engines, two gauges each: 60,000 of them make about 7 MB."""
    return "".join(
        f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n'
        f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="m"}} 0.5\n'
        for i in range(count)
    )


def test_a_7mb_page_of_60000_instances_fails_on_the_series_cap_within_bounded_time():
    text = vllm_instances(60_000)
    assert len(text) > 7_000_000
    started = time.process_time()
    read = read_page(text)
    spent = time.process_time() - started
    assert read.failure == "too_many_series", read
    assert read.readings == ()
    assert read.detail is not None and "20,000" in read.detail and "max_series_per_target" in read.detail
    assert spent < SECONDS, f"reading a 7 MB page took {spent:.2f} s of CPU (bound {SECONDS} s)"


def test_a_page_of_60000_instances_within_the_series_cap_fails_on_the_instance_cap_within_bounded_time():
    text = vllm_instances(60_000)
    started = time.process_time()
    read = read_page(text, "auto", PageLimits(max_series=1_000_000))
    spent = time.process_time() - started
    assert (read.engine, read.failure, read.readings) == ("vllm", "too_many_instances", ())
    assert read.detail is not None and "60,000" in read.detail and "64" in read.detail
    assert "max_instances_per_target" in read.detail
    assert spent < FULL_PARSE_SECONDS, (
        f"reading 60,000 instances took {spent:.2f} s of CPU (bound {FULL_PARSE_SECONDS} s)"
    )


def test_reading_5000_instances_costs_time_linear_in_the_page():
    # Under both caps, so every instance is read: matching each instance's series by scanning every sample of a
    # name (the quadratic read) took about 15 s here; a read linear in the page takes a small fraction of a second.
    text = vllm_instances(5_000)
    started = time.process_time()
    read = read_page(text, "vllm", PageLimits(max_series=20_000, max_instances=5_000))
    spent = time.process_time() - started
    assert read.failure is None, read.detail
    assert len(read.readings) == 5_000
    assert read.readings[4_999].instance == "4999" and read.readings[4_999].kv_cache_usage_ratio == 0.5
    assert spent < SECONDS, f"reading 5,000 instances took {spent:.2f} s of CPU (bound {SECONDS} s)"


def test_one_instance_over_the_cap_fails_and_the_cap_itself_is_read():
    assert read_page(vllm_instances(64)).failure is None
    over = read_page(vllm_instances(65))
    assert (over.failure, over.readings) == ("too_many_instances", ())
    assert over.detail is not None and "65" in over.detail


def test_one_sample_over_the_series_cap_fails():
    limits = PageLimits(max_series=10, max_instances=64)
    assert read_page(vllm_instances(5), "auto", limits).failure is None  # 10 samples
    assert read_page(vllm_instances(6), "auto", limits).failure == "too_many_series"


def test_samples_the_adapters_do_not_read_do_not_count_towards_the_series_cap():
    noise = "".join(f'python_gc_objects_collected_total{{generation="{i}"}} 1\n' for i in range(50_000))
    read = read_page(noise + vllm_instances(2))
    assert read.failure is None and len(read.readings) == 2


# Every adapter's KV usage gauge, on a page that also carries the engine's running gauge.
KV_PAGES = {
    "vllm": 'vllm:num_requests_running{{model_name="m"}} 3\nvllm:kv_cache_usage_perc{{model_name="m"}} {value}\n',
    "sglang": 'sglang:num_running_reqs{{model_name="m"}} 3\nsglang:token_usage{{model_name="m"}} {value}\n',
    "trtllm": (
        'nv_trt_llm_request_metrics{{model="m",request_type="active",version="1"}} 3\n'
        'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction",model="m",version="1"}} {value}\n'
    ),
    "llamacpp": "llamacpp:requests_processing 3\nllamacpp:kv_cache_usage_ratio {value}\n",
    "lmdeploy": (
        'lmdeploy:num_requests_running{{model_name="m"}} 3\nlmdeploy:gpu_cache_usage_perc{{model_name="m"}} {value}\n'
    ),
    "nim": (
        'num_requests_running{{model_name="m"}} 3\nnum_requests_waiting{{model_name="m"}} 0\n'
        'gpu_cache_usage_perc{{model_name="m"}} {value}\n'
    ),
}
OUT_OF_DOMAIN = {"-Inf": "-Inf", "+Inf": "+Inf", "1e308": "1e+308", "5": "5", "1.5": "1.5", "-0.25": "-0.25"}


@pytest.mark.parametrize("engine", sorted(KV_PAGES))
@pytest.mark.parametrize("value", sorted(OUT_OF_DOMAIN))
def test_kv_usage_outside_0_to_1_is_rejected_with_a_reason_and_the_rest_is_read(engine, value):
    read = read_page(KV_PAGES[engine].format(value=value))
    assert (read.engine, read.failure) == (engine, None)
    [reading] = read.readings
    assert reading.kv_cache_usage_ratio is None
    assert reading.invalid["kv_cache_usage_ratio"] == f"{OUT_OF_DOMAIN[value]} is outside 0..1"
    assert "kv_cache_usage_ratio" not in reading.absent_fields()
    assert reading.requests_running == 3.0


@pytest.mark.parametrize("engine", sorted(KV_PAGES))
def test_kv_usage_of_nan_is_rejected_with_a_reason(engine):
    [reading] = read_page(KV_PAGES[engine].format(value="NaN")).readings
    assert reading.kv_cache_usage_ratio is None
    assert "NaN" in reading.invalid["kv_cache_usage_ratio"]


@pytest.mark.parametrize("engine", sorted(KV_PAGES))
@pytest.mark.parametrize("value", ["0", "1", "0.967741935483871", "1e-9"])
def test_kv_usage_inside_0_to_1_is_read_as_is(engine, value):
    [reading] = read_page(KV_PAGES[engine].format(value=value)).readings
    assert reading.kv_cache_usage_ratio == float(value)
    assert reading.invalid == {}


def test_triton_usage_from_blocks_is_rejected_when_used_exceeds_max():
    page = "".join(
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}",model="m",version="1"}} {value}\n'
        for kind, value in (("used", 700), ("max", 100), ("tokens_per", 32))
    )
    [reading] = read_page(page).readings
    assert reading.kv_cache_usage_ratio is None
    assert reading.invalid["kv_cache_usage_ratio"] == "7 is outside 0..1"
    assert reading.kv_cache_capacity_tokens == 3200


# Partial pages: an older release, or a build with some metrics off.
PARTIAL = {
    "vllm with only its KV gauge": ('vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n', "vllm"),
    "vllm with only its running gauge": ('vllm:num_requests_running{engine="0",model_name="m"} 4\n', "vllm"),
    "vllm with only its TTFT histogram": (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 2\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 3\n'
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3\n'
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.2\n',
        "vllm",
    ),
    "vllm with only counters": (
        'vllm:num_preemptions_total{engine="0",model_name="m"} 2\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 100\n',
        "vllm",
    ),
    "sglang without token_usage": (
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 5\n'
        'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1\n'
        'sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 1000\n',
        "sglang",
    ),
    "triton without its block counts": (
        'nv_trt_llm_request_metrics{model="m",request_type="active",version="1"} 2\n'
        'nv_trt_llm_request_metrics{model="m",request_type="waiting",version="1"} 1\n',
        "trtllm",
    ),
}


def test_a_page_with_only_the_kv_gauge_yields_it_and_reports_the_rest_absent():
    [reading] = read_page(PARTIAL["vllm with only its KV gauge"][0]).readings
    assert (reading.instance, reading.model, reading.kv_cache_usage_ratio) == ("0", "m", 0.25)
    assert reading.invalid == {}
    absent = reading.absent_fields()
    assert "kv_cache_usage_ratio" not in absent
    assert {"requests_running", "requests_waiting", "kv_cache_capacity_tokens", "ttft_seconds"} <= set(absent)


def test_a_page_with_only_the_running_gauge_yields_it():
    [reading] = read_page(PARTIAL["vllm with only its running gauge"][0]).readings
    assert reading.requests_running == 4.0
    assert "kv_cache_usage_ratio" in reading.absent_fields()


def test_a_page_with_only_a_latency_histogram_yields_a_reading_with_it():
    [reading] = read_page(PARTIAL["vllm with only its TTFT histogram"][0]).readings
    assert (reading.instance, reading.model) == ("0", "m")
    assert reading.ttft_seconds is not None and reading.ttft_seconds.buckets == ((0.1, 2.0), (math.inf, 3.0))
    assert reading.requests_running is None and "requests_running" in reading.absent_fields()


def test_a_page_with_only_counters_yields_a_reading_with_them():
    [reading] = read_page(PARTIAL["vllm with only counters"][0]).readings
    assert (reading.preemptions_total, reading.prompt_tokens_total) == (2.0, 100.0)
    assert "kv_cache_usage_ratio" in reading.absent_fields()


def test_sglang_without_token_usage_yields_load_and_capacity():
    [reading] = read_page(PARTIAL["sglang without token_usage"][0]).readings
    assert (reading.requests_running, reading.requests_waiting, reading.kv_cache_capacity_tokens) == (5.0, 1.0, 1000)
    assert "kv_cache_usage_ratio" in reading.absent_fields()


def test_triton_without_block_counts_yields_load_and_no_capacity():
    [reading] = read_page(PARTIAL["triton without its block counts"][0]).readings
    assert (reading.requests_running, reading.requests_waiting) == (2.0, 1.0)
    assert {"kv_cache_usage_ratio", "kv_cache_capacity_tokens", "kv_block_size"} <= set(reading.absent_fields())


@pytest.mark.parametrize("case", sorted(PARTIAL))
def test_every_partial_page_is_read_as_its_engine_with_one_reading(case):
    text, engine = PARTIAL[case]
    read = read_page(text)
    assert (read.engine, read.failure, len(read.readings)) == (engine, None, 1)


NAMES = sorted({name for adapter in ADAPTERS for name in adapter.needs})
LABELS = ["engine", "model_name", "model", "le", "tp_rank", "dp_rank", "request_type", "kv_cache_block_type"]
LABEL_VALUES = ["0", "1", "+Inf", "NaN", "", "m", "active", "waiting", "max", "used", "tokens_per", "fraction"]
HOSTILE_VALUES = ["0", "0.5", "1", "-1", "5", "NaN", "+Inf", "-Inf", "1e308", "-1e308", "1e-320", "4096"]


@st.composite
def engine_lines(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES)) + draw(st.sampled_from(["", "_bucket", "_sum", "_count"]))
    labels = draw(st.dictionaries(st.sampled_from(LABELS), st.sampled_from(LABEL_VALUES), max_size=3))
    block = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return f"{name}{{{block}}} {draw(st.sampled_from(HOSTILE_VALUES))}"


@settings(max_examples=150, deadline=None)
@given(st.lists(engine_lines(), max_size=30).map("\n".join), st.sampled_from(["auto", *(a.name for a in ADAPTERS)]))
def test_no_page_makes_a_kv_usage_ratio_outside_0_to_1(text, engine):
    read = read_page(text, engine)
    for reading in read.readings:
        ratio = reading.kv_cache_usage_ratio
        assert ratio is None or 0.0 <= ratio <= 1.0, (ratio, text)
        for name in ("requests_running", "requests_waiting", "preemptions_total", "prompt_tokens_total"):
            value = getattr(reading, name)
            assert value is None or (math.isfinite(value) and value >= 0), (name, value, text)
        for name in ("kv_cache_capacity_tokens", "kv_block_size"):
            value = getattr(reading, name)
            assert value is None or 0 < value < 2**40, (name, value, text)
        assert all(getattr(reading, name) is None for name in reading.invalid), reading
