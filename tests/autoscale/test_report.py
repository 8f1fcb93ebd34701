"""report.html's parts without a browser: the downsampling that keeps a week drawable (a one-sample peak, and a
one-sample dip in capacity, survive it), the overflow boxes, the cap on the decisions listed, and markup from the
config shown as text."""

import itertools
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from exporter.autoscale.report import BUCKETS, REPORT_DECISIONS, REPORT_FILE, overflow, render_report, steps
from exporter.svg import Axis, Series, line_chart
from tests.autoscale.week import HOSTILE_MODEL, replay_a_week


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return replay_a_week(tmp_path_factory.mktemp("week"))


def _document(out: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((out / "result.json").read_text())
    return document


def test_a_short_step_function_is_drawn_as_it_is() -> None:
    assert steps([(0.0, 1.0), (10.0, 3.0), (25.0, 2.0)], 30.0, BUCKETS, max) == (
        (0.0, 10.0, 1.0),
        (10.0, 25.0, 3.0),
        (25.0, 30.0, 2.0),
    )


def test_downsampling_keeps_a_one_sample_peak_and_a_one_sample_dip() -> None:
    count = 40_320
    flat = [(time * 15.0, 10.0) for time in range(count)]
    peaked = [*flat[:12_345], (12_345 * 15.0, 500.0), *flat[12_346:]]
    drawn = steps(peaked, count * 15.0, BUCKETS, max)
    assert len(drawn) == BUCKETS
    assert max(value for _, _, value in drawn) == 500.0
    assert sum(1 for _, _, value in drawn if value == 500.0) == 1  # one bucket, not a widened plateau
    dipped = [*flat[:777], (777 * 15.0, 0.0), *flat[778:]]
    assert min(value for _, _, value in steps(dipped, count * 15.0, BUCKETS, min)) == 0.0
    # The buckets tile the trace end to end.
    assert drawn[0][0] == 0.0 and drawn[-1][1] == count * 15.0
    assert all(a[1] == pytest.approx(b[0]) for a, b in itertools.pairwise(drawn))


def test_a_value_held_across_whole_buckets_is_in_each() -> None:
    """A bucket with no change inside holds the value in force at its start, not nothing."""
    changes = (
        [(float(time), 1.0) for time in range(1000)] + [(1000.0, 7.0)] + [(2000.0 + time, 1.0) for time in range(1000)]
    )
    drawn = steps(changes, 3000.0, 300, max)
    assert [value for low, _, value in drawn if 1100 <= low < 1900] == [7.0] * 80


def test_overflow_is_where_demand_is_above_capacity() -> None:
    demand = ((0.0, 10.0, 5.0), (10.0, 20.0, 30.0), (20.0, 40.0, 5.0))
    capacity = ((0.0, 15.0, 10.0), (15.0, 40.0, 40.0))
    assert overflow(demand, capacity) == ((10.0, 15.0, 10.0, 30.0),)
    assert overflow(demand, ((0.0, 40.0, 30.0),)) == ()


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_markup_in_names_is_text_escaped_once(week: Path) -> None:
    document = _document(week)
    document["workloads"][0]["name"] = "<script>alert(1)</script>"
    document["workloads"][0]["decisions"][0]["reason"] = "a & b <i>"
    page = _Text()
    page.feed(render_report(document))
    text = "".join(page.text)
    assert "script" not in page.tags and "img" not in page.tags and "i" not in page.tags
    assert HOSTILE_MODEL in text and "<script>alert(1)</script>" in text
    assert "&amp;" not in text  # escaped once, not twice


def test_the_page_is_written_beside_result_json_and_says_it_downsampled(week: Path) -> None:
    page = (week / REPORT_FILE).read_text()
    assert page == render_report(_document(week))
    assert f"the charts hold {BUCKETS} equal buckets of time" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "").replace("http://example.invalid", "")


def test_a_short_trace_is_drawn_whole_and_says_nothing_of_buckets(week: Path) -> None:
    document = _document(week)
    workload = document["workloads"][0]
    workload["trace"]["demand"] = workload["trace"]["demand"][:100]
    workload["trace"]["end"] = workload["trace"]["demand"][-1][0]
    workload["fleet"] = workload["fleet"][:1]
    assert "equal buckets of time" not in render_report(document)


def test_the_decisions_listed_are_capped_with_a_note(week: Path) -> None:
    document = _document(week)
    workload = document["workloads"][0]
    changes = [d for d in workload["decisions"] if d["replicas"] != d["current_replicas"]]
    assert len(changes) < REPORT_DECISIONS  # the week itself is listed whole
    assert "are cut here" not in render_report(document)
    workload["decisions"] = changes * 3
    page = render_report(document)
    assert page.count("<tr><td>+") == REPORT_DECISIONS
    assert f"{len(changes) * 3 - REPORT_DECISIONS} more are cut here" in page


@pytest.mark.parametrize("most", [3, 11, 23, 64])
def test_a_whole_axis_ticks_only_whole_numbers_where_a_plain_one_would_not(most: int) -> None:
    """Replicas are whole: a fleet of up to 11 would otherwise be ticked at 2.5, 5, 7.5 (as the report once was)."""

    def y_ticks(whole: bool) -> list[float]:
        axis = Axis("replicas", lambda value: f"{value:g}", whole=whole)
        chart = line_chart("Replicas", Axis("time", str), axis, [Series("ready", ((0.0, 1.0), (1.0, most)), "#000")])
        return [float(t) for t in re.findall(r'text-anchor="end">([^<]+)</text>', chart)]

    assert len(y_ticks(True)) >= 3
    assert all(tick.is_integer() for tick in y_ticks(True))
    if most == 11:
        assert not all(tick.is_integer() for tick in y_ticks(False))
