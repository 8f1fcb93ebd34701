"""A vocabulary turns names into a reading; what it does not name stays None."""

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
