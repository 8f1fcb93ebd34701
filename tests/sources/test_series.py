"""Choosing and combining series: replicas, splits, histograms, and detection scores."""

import math

import pytest

from exporter.sources.engines.base import TooManyInstances
from exporter.sources.engines.series import (
    at_most,
    counter,
    detection,
    gauge,
    groups,
    histogram,
    label_int,
    label_number,
    whole,
)
from exporter.sources.promtext import parse

REPLICAS = ("tp_rank",)


def test_replicated_gauge_takes_the_largest_copy():
    page = parse('g{tp_rank="0"} 0.5\ng{tp_rank="1"} 0.75\n')
    assert gauge(page, ("g",), {}) == 0.75


def test_first_alias_with_a_matching_series_wins():
    page = parse('old{engine="0"} 1\nnew{engine="1"} 2\n')
    assert gauge(page, ("new", "old"), {"engine": "0"}) == 1.0
    assert gauge(page, ("new", "old"), {"engine": "1"}) == 2.0
    assert gauge(page, ("new", "old"), {"engine": "2"}) is None


def test_nan_beside_numbers_is_dropped():
    page = parse('g{tp_rank="0"} NaN\ng{tp_rank="1"} 0.5\nc{reason="a"} NaN\nc{reason="b"} 3\n')
    assert gauge(page, ("g",), {}) == 0.5
    assert counter(page, ("c",), {}) == 3.0


def test_a_series_of_nan_alone_reads_nan_so_that_its_check_can_say_why():
    page = parse("g NaN\nc NaN\n")
    for value in (gauge(page, ("g",), {}), counter(page, ("c",), {})):
        assert value is not None and math.isnan(value)
    assert gauge(page, ("absent",), {}) is None and counter(page, ("absent",), {}) is None


def test_too_many_groups_is_refused_with_the_count():
    found = groups(parse("".join(f'g{{engine="{i}"}} 1\n' for i in range(5))), ("g",), "engine", None)
    assert at_most(found, 5) == found
    with pytest.raises(TooManyInstances) as refused:
        at_most(found, 4)
    assert (refused.value.found, refused.value.limit) == (5, 4)


def test_counter_splits_add_up_and_replicas_count_once():
    page = parse(
        'c{reason="stop",tp_rank="0"} 3\nc{reason="stop",tp_rank="1"} 3\n'
        'c{reason="length",tp_rank="0"} 4\nc{reason="length",tp_rank="1"} 4\n'
    )
    assert counter(page, ("c",), {}, REPLICAS) == 7.0
    assert counter(page, ("c",), {}) == 14.0  # without replica labels every series is its own


def test_histogram_buckets_are_sorted_with_inf_last():
    page = parse('h_bucket{le="+Inf"} 5\nh_bucket{le="1.0"} 3\nh_bucket{le="0.5"} 1\nh_sum 2.5\nh_count 5\n')
    found = histogram(page, ("h",), {})
    assert found is not None
    assert found.buckets == ((0.5, 1.0), (1.0, 3.0), (math.inf, 5.0))
    assert (found.count, found.sum) == (5.0, 2.5)


def test_histogram_without_inf_bucket_gets_one_from_count_and_nan_sum_without_sum():
    found = histogram(parse('h_bucket{le="1"} 2\nh_count 4\n'), ("h",), {})
    assert found is not None
    assert found.buckets == ((1.0, 2.0), (math.inf, 4.0))
    assert math.isnan(found.sum)


def test_histogram_count_falls_back_to_the_inf_bucket():
    found = histogram(parse('h_bucket{le="1"} 2\nh_bucket{le="+Inf"} 3\n'), ("h",), {})
    assert found is not None and found.count == 3.0


def test_histogram_with_neither_count_nor_inf_bucket_is_unknown():
    assert histogram(parse('h_bucket{le="1"} 2\n'), ("h",), {}) is None


def test_histogram_series_are_picked_by_labels_other_than_le():
    text = "".join(
        f'h_bucket{{engine="{e}",le="{le}"}} {n}\n'
        for e, counts in (("0", (1, 2)), ("1", (5, 9)))
        for le, n in zip(("1", "+Inf"), counts, strict=True)
    )
    text += 'h_count{engine="0"} 2\nh_count{engine="1"} 9\nh_sum{engine="0"} 1\nh_sum{engine="1"} 7\n'
    found = histogram(parse(text), ("h",), {"engine": "1"})
    assert found is not None
    assert found.buckets == ((1.0, 5.0), (math.inf, 9.0))
    assert (found.count, found.sum) == (9.0, 7.0)


def test_histogram_splits_add_up_and_replicas_count_once():
    text = ""
    for split, tp, counts in (("a", "0", (1, 2)), ("a", "1", (1, 2)), ("b", "0", (3, 4)), ("b", "1", (3, 4))):
        labels = f'split="{split}",tp_rank="{tp}"'
        text += f'h_bucket{{{labels},le="1"}} {counts[0]}\nh_bucket{{{labels},le="+Inf"}} {counts[1]}\n'
        text += f"h_count{{{labels}}} {counts[1]}\nh_sum{{{labels}}} 1\n"
    found = histogram(parse(text), ("h",), {}, REPLICAS)
    assert found is not None
    assert found.buckets == ((1.0, 4.0), (math.inf, 6.0))
    assert (found.count, found.sum) == (6.0, 2.0)


def test_splits_with_different_buckets_are_not_added():
    text = 'h_bucket{s="a",le="1"} 1\nh_count{s="a"} 2\nh_bucket{s="b",le="5"} 3\nh_count{s="b"} 4\n'
    found = histogram(parse(text), ("h",), {})
    assert found is not None and found.count == 4.0


def test_groups_are_distinct_instances_and_models_in_page_order():
    page = parse('g{engine="1",model_name="m"} 1\ng{engine="0",model_name="m"} 1\ng{engine="1",model_name="m"} 2\n')
    found = groups(page, ("g",), "engine", "model_name")
    assert [(g.instance, g.model, dict(g.where)) for g in found] == [
        ("1", "m", {"engine": "1", "model_name": "m"}),
        ("0", "m", {"engine": "0", "model_name": "m"}),
    ]


def test_group_without_the_instance_label_is_the_empty_instance():
    [found] = groups(parse('g{model_name="m"} 1\n'), ("g",), "engine", "model_name")
    assert (found.instance, found.model, dict(found.where)) == ("", "m", {"model_name": "m"})


def test_whole_numbers_from_floats_and_labels():
    assert whole(4096.0) == 4096
    assert whole(math.inf) is None
    assert whole(None) is None
    assert label_int({"n": "32"}, "n") == 32
    assert label_int({"n": "None"}, "n") is None
    assert label_int({}, "n") is None
    assert label_number({"n": "1e400"}, "n") == math.inf
    assert label_number({"n": "None"}, "n") is None


def test_detection_weighs_prefix_and_signature_and_says_why():
    page = parse("# TYPE x:a gauge\nx:a 1\nx:other 2\n")
    found = detection(page, "x:", [("x:a",), ("x:b", "x:b_old")])
    assert found.score == 0.5 + 0.5 * 0.5
    assert found.evidence == ("2 names start with 'x:'", "has x:a", "lacks x:b")


def test_detection_without_prefix_rests_on_the_signature():
    page = parse("a 1\nb 1\n")
    assert detection(page, "", [("a",), ("b",), ("c",)]).score == 2 / 3
    assert detection(parse("<html></html>"), "", [("a",)]).score == 0.0
