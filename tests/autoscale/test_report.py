"""report.html's parts without a browser: the downsampling that keeps a week drawable (a one-sample peak, and a
one-sample dip in capacity, survive it), the overflow boxes, the oracle's capacity drawn within the same bound, the
cap on the decisions listed, `--tune`'s section (what it searched, the change as the table prints it, the figures
beside the generated scaler's, or that no candidate met the budget; none without `--tune`), and markup from the
config shown as text."""

import itertools
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from exporter.autoscale.outputs import amount_text
from exporter.autoscale.report import BUCKETS, REPORT_DECISIONS, REPORT_FILE, overflow, render_report, steps
from exporter.svg import Axis, Series, line_chart
from tests.autoscale.tuned import replay_tuned
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


class _Tune(HTMLParser):
    """The tune section's text, the config change it shows, and its figures table's rows of cells."""

    def __init__(self) -> None:
        super().__init__()
        self.sections = 0
        self.text: list[str] = []
        self.change: list[str] = []
        self.rows: list[list[str]] = []
        self._open: list[str] = []  # the tags open inside the tune section

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if ("id", "tune") in attrs:
            self.sections += 1
            self._open = [tag]
        elif self._open:
            self._open.append(tag)
            if tag == "tr":  # the section's one table: its figures
                self.rows.append([])
            if tag in ("td", "th"):
                self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if not self._open:
            return
        self.text.append(data)
        if "pre" in self._open:
            self.change.append(data)
        elif self.rows and self._open[-1] in ("td", "th"):
            self.rows[-1][-1] += data


def _tune_section(page: str) -> _Tune:
    parsed = _Tune()
    parsed.feed(page)
    return parsed


def _last_lines(printed: str, count: int) -> list[str]:
    """The table's last lines before the files written: the config change, where there is one."""
    lines = [line for line in printed.splitlines() if line]
    return lines[-count:]


def test_a_tuned_run_shows_what_was_searched_the_change_and_the_figures_beside_the_scalers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = replay_tuned(tmp_path)
    printed = capsys.readouterr().out
    document = _document(out)
    tune, workload = document["tune"], document["workloads"][0]
    assert tune["chosen"] is not None and tune["chosen"]["margin"] != tune["current"]["margin"]
    section = _tune_section((out / REPORT_FILE).read_text())
    assert section.sections == 1
    text = "".join(section.text)
    # What it searched: every margin and window of the grid, and the replays it took.
    assert f"{tune['replays']} replays: every autoscaling.margin of 1, 0.95, 0.9," in text
    assert "with every autoscaling.demand_window of 10m, 7m, 5m, 2m" in text
    assert "overflow at most 0.500% of each workload" in text
    # The change, line for line as the table printed it.
    change = "".join(section.change).splitlines()
    assert change == ["autoscaling:", "  margin: 0.95", "  demand_window: 2m"]
    assert change == _last_lines(printed, 3)
    assert "Proposed: margin 0.95, demand_window 2m" in text
    # The figures: the config's knobs are the generated scaler's own, beside the tuned knobs'.
    head, now, tuned = section.rows
    assert head == [
        "workload: fleet",
        "replica-hours",
        "cost",
        "overflow (s)",
        "overflow (request-s)",
        "overflow share",
        "peak replicas",
    ]
    assert now[0] == "inference/vllm-llama: generated scaler, the config (margin 0.8, demand_window 10m)"
    assert now[1:] == [
        f"{workload['replica_hours']:.2f}",
        f"{workload['cost']:,.2f}",
        f"{workload['overflow_seconds']:g}",
        f"{workload['overflow_request_seconds']:g}",
        f"{tune['current']['workloads'][0]['overflow_share']:.3%}",
        str(workload["peak_replicas"]),
    ]
    figures = tune["chosen"]["workloads"][0]
    assert tuned == [
        "inference/vllm-llama: tuned (margin 0.95, demand_window 2m)",
        f"{figures['replica_hours']:.2f}",
        f"{figures['cost']:,.2f}",
        f"{figures['overflow_seconds']:g}",
        f"{figures['overflow_request_seconds']:g}",
        f"{figures['overflow_share']:.3%}",
        str(figures["peak_replicas"]),
    ]
    assert figures["replica_hours"] < workload["replica_hours"] and figures["peak_replicas"] > 0


def test_an_untuned_run_has_no_tune_section(week: Path) -> None:
    page = (week / REPORT_FILE).read_text()
    assert _tune_section(page).sections == 0
    assert "--tune" not in page and "Proposed" not in page


def test_a_budget_nobody_meets_is_said_with_no_change_to_paste(tmp_path: Path) -> None:
    out = replay_tuned(tmp_path, burst=True, budget="0.1%")
    document = _document(out)
    tune = document["tune"]
    assert tune["chosen"] is None
    page = (out / REPORT_FILE).read_text()
    section = _tune_section(page)
    text = " ".join("".join(section.text).split())
    lowest = tune["lowest_overflow"]
    assert f"No candidate meets the budget: the lowest overflow reached is {lowest['worst_overflow_share']:.3%}" in text
    assert section.change == [] and "Proposed" not in text
    assert "--tune</a>: no candidate met the 0.100% budget" in page
    _, now, least = section.rows
    assert now[0].startswith("inference/vllm-llama: generated scaler, the config")
    assert least[0].startswith("inference/vllm-llama: least overflow (margin ")
    assert least[3] == f"{lowest['workloads'][0]['overflow_seconds']:g}"


def test_markup_in_a_tuned_run_is_text_escaped_once(tmp_path: Path) -> None:
    document = _document(replay_tuned(tmp_path))
    document["workloads"][0]["name"] = "<script>alert(1)</script>"
    document["tune"]["config_change"] = "autoscaling:\n  margin: <i>1</i> & more\n"
    section = _tune_section(render_report(document))
    page = _Text()
    page.feed(render_report(document))
    assert "script" not in page.tags and "i" not in page.tags
    assert "".join(section.change) == "autoscaling:\n  margin: <i>1</i> & more"
    assert section.rows[1][0].startswith("inference/<script>alert(1)</script>: generated scaler")
    assert "&amp;" not in "".join(page.text)


def _oracle_line(page: str) -> list[str]:
    lines = re.findall(r'<polyline class="series thin" points="([^"]+)" stroke="#cc79a7" stroke-dasharray', page)
    assert len(lines) == 1
    corners: list[str] = lines[0].split()
    return corners


def test_the_oracles_ready_capacity_is_drawn_thin_and_dashed_and_the_page_stays_bounded(week: Path) -> None:
    page = (week / REPORT_FILE).read_text()
    document = _document(week)
    oracle = document["workloads"][0]["baselines"]["oracle"]
    assert len(_oracle_line(page)) == 2 * len(oracle["fleet"])  # 123 changes: drawn as they are
    assert "oracle&#x27;s ready x knee" in page
    # An oracle changing at every one of the week's 40,321 samples is drawn in the charts' buckets, as the demand is:
    # the page grows by one line of at most two corners a bucket, not by its samples.
    oracle["fleet"] = [
        [time, 1 + index % 2, 1 + index % 2]
        for index, (time, _) in enumerate(document["workloads"][0]["trace"]["demand"])
    ]
    busy = render_report(document)
    assert len(_oracle_line(busy)) == 2 * BUCKETS
    assert len(busy.encode()) - len(page.encode()) < 2 * BUCKETS * len(" 999.9,999.9")


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


@pytest.mark.parametrize(("value", "text"), [(0.0, "0"), (345.0, "345"), (12120.5, "12120.5"), (1234567.0, "1234567")])
def test_an_overflow_figure_prints_without_an_exponent(value: float, text: str) -> None:
    assert amount_text(value) == text
