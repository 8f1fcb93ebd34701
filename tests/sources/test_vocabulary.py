"""A vocabulary turns names into a reading; what it does not name stays None."""

import pytest

from exporter.sources.engines.base import TooManyInstances
from exporter.sources.engines.vocabulary import Vocabulary
from exporter.sources.promtext import parse

TOY = Vocabulary(
    name="toy",
    prefix="toy_",
    instance_label="rank",
    model_label="model",
    running=("toy_running",),
    kv_usage=("toy_usage", "toy_usage_old"),
    ttft=("toy_ttft_seconds",),
    extra=("toy_capacity",),
)


def test_needs_lists_every_name_it_reads():
    assert TOY.needs == ("toy_running", "toy_usage", "toy_usage_old", "toy_ttft_seconds", "toy_capacity")


def test_one_reading_per_instance_and_none_where_silent():
    page = parse(
        'toy_running{model="m",rank="0"} 1\ntoy_running{model="m",rank="1"} 2\ntoy_usage_old{model="m",rank="1"} 0.5\n'
    )
    first, second = TOY.read(page)
    assert (first.engine, first.instance, first.model, first.requests_running) == ("toy", "0", "m", 1.0)
    assert first.kv_cache_usage_ratio is None
    assert (second.instance, second.kv_cache_usage_ratio) == ("1", 0.5)
    assert second.requests_waiting is None and second.ttft_seconds is None and second.preemptions_total is None


def test_a_page_without_its_gauges_has_no_readings():
    assert TOY.read(parse("other_running 1\n")) == []


def test_detection_signature_is_its_load_and_kv_gauges():
    found = TOY.detect(parse("toy_running 1\n"))
    assert found.score == 0.5 + 0.5 * 0.5
    assert found.evidence == ("1 names start with 'toy_'", "has toy_running", "lacks toy_usage")


def test_a_page_without_load_or_kv_gauges_is_read_by_its_counters_and_histograms():
    page = parse(
        'toy_ttft_seconds_bucket{model="m",rank="0",le="+Inf"} 3\ntoy_ttft_seconds_count{model="m",rank="0"} 3\n'
    )
    [reading] = TOY.read(page)
    assert (reading.instance, reading.model) == ("0", "m")
    assert reading.ttft_seconds is not None and reading.ttft_seconds.count == 3.0


def test_series_without_the_instance_label_make_no_extra_instance_beside_the_gauges():
    # SGLang under DP attention: tokenizer-side histograms are server-wide and carry no rank.
    page = parse(
        'toy_running{model="m",rank="0"} 1\ntoy_running{model="m",rank="1"} 2\n'
        'toy_ttft_seconds_bucket{model="m",le="+Inf"} 3\ntoy_ttft_seconds_count{model="m"} 3\n'
    )
    assert [reading.instance for reading in TOY.read(page)] == ["0", "1"]


def test_more_instances_than_allowed_are_refused():
    page = parse("".join(f'toy_running{{model="m",rank="{i}"}} 1\n' for i in range(3)))
    assert len(TOY.read(page, max_instances=3)) == 3
    with pytest.raises(TooManyInstances):
        TOY.read(page, max_instances=2)
