"""report.html as text: self-contained (nothing that could reach the network), the verdict in words, every chart."""

import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest

from exporter.loadtest.outputs import result_document
from exporter.loadtest.report import render_report
from tests.loadtest import built_steps

CHART_TITLES = (
    "SLO attainment",
    "Time to first token",
    "Inter-token latency",
    "Achieved throughput: requests",
    "Achieved throughput: tokens",
    "KV cache usage",
    "Queue",
)


class _Links(HTMLParser):
    """Every attribute that makes a browser fetch something, and every script."""

    def __init__(self):
        super().__init__()
        self.fetching: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.fetching.append("<script>")
        for name, value in attrs:
            if name in ("src", "href", "srcset", "poster", "data", "action") and value:
                self.fetching.append(f"{tag} {name}={value}")


def _report(built) -> str:
    return render_report(result_document(built))


@pytest.mark.parametrize(
    "built",
    [built_steps.several_steps, built_steps.saturated_below_knee, built_steps.one_step, built_steps.no_knee],
)
def test_the_report_has_no_script_link_import_or_remote_url(built):
    html = _report(built())
    parser = _Links()
    parser.feed(html)
    assert parser.fetching == []
    assert "@import" not in html and "url(" not in html
    # Besides the SVG namespace (an identifier browsers never fetch), URLs appear only as text: the endpoint driven
    # and the engine's /metrics, never inside a tag.
    urls = set(re.findall(r"https?://[^\s\"'<)]+", html)) - {"http://www.w3.org/2000/svg"}
    assert urls <= {"http://127.0.0.1:8000/v1/completions", "http://127.0.0.1:9/metrics"}
    assert not re.search(r"<[^>]*https?://(?!www\.w3\.org/2000/svg)", html)


def _verdict(html: str) -> str:
    return html[html.index('<section class="verdict') : html.index("</section>")]


def test_the_verdict_names_both_answers_what_limited_them_why_and_the_slos_first():
    html = _report(built_steps.several_steps())
    verdict = _verdict(html)
    # The knee (12) is below the saturation point (14): the headline is the knee's load.
    assert "One replica holds 12 concurrent requests: 24 requests/s, 768 output tokens/s." in verdict
    assert "the KV cache" in verdict
    assert "The engine saturated at concurrency 14: its KV cache filled" in verdict
    assert "concurrency 14 (kv_full, queue); concurrency 12 was not saturated" in verdict
    assert "<dt>SLO knee</dt><dd>concurrency 12</dd>" in verdict
    assert "TTFT ≤ 500 ms and ITL (mean per request) ≤ 50 ms for 90.0% of requests" in verdict
    assert "saturation.kv_usage 0.817, saturation.queue 2" in verdict
    assert html.index("</section>") < html.index("<svg")


def test_a_saturation_point_below_the_knee_is_the_operating_point_of_the_verdict_and_the_charts():
    html = _report(built_steps.saturated_below_knee())
    verdict = _verdict(html)
    # The headline is the saturation point's load (16 requests/s at 8), not the knee's (16.2 at 16).
    assert "One replica holds 8 concurrent requests: 16 requests/s, 512 output tokens/s." in verdict
    assert "the engine&#x27;s batch or compute" in verdict
    assert "concurrency 8 (throughput_plateau, queue); concurrency 6 was not saturated" in verdict
    assert "<dt>SLO knee</dt><dd>concurrency 16</dd>" in verdict
    assert "saturation.kv_usage 0.57, saturation.queue 2" in verdict
    assert html.count(">operating point (8)</text>") == len(CHART_TITLES)
    rows = dict((int(c), css) for css, c in re.findall(r'<tr class="([a-z]*)"><td>(\d+)</td>', html))
    assert rows[8] == "knee" and rows[16] == ""


def test_repeated_runs_that_disagree_show_the_knee_as_a_range():
    built = built_steps.several_steps()
    disagreeing = replace(built, search=replace(built.search, knee_range=(12, 14)))
    assert "concurrency 12; concurrency 14 passed in one run and failed in another" in _verdict(_report(disagreeing))
    assert "passed in one run" not in _report(built)


def test_a_run_without_latency_slos_says_so():
    built = built_steps.saturated_below_knee()
    no_slos = replace(
        built, settings=replace(built.settings, slos=replace(built_steps.SLOS, ttft_seconds=None, itl_seconds=None))
    )
    html = _report(no_slos)
    assert "no latency SLO for 90.0% of requests; errors count as misses" in _verdict(html)
    assert "TTFT SLO" not in html and "ITL SLO" not in html


def test_every_chart_is_drawn_with_labelled_axes_and_the_lines_that_matter():
    html = _report(built_steps.several_steps())
    for title in CHART_TITLES:
        assert f'aria-label="{title}"' in html, title
    assert html.count('aria-label="KV cache usage over each step"') == 1
    assert html.count('aria-label="Requests waiting over each step"') == 1
    for label in ("TTFT (ms)", "ITL (ms)", "completed requests/s", "output tokens/s", "KV cache usage (%)"):
        assert f">{label}</text>" in html, label
    for line in ("objective 90.0%", "TTFT SLO 500 ms", "ITL SLO 50 ms", "threshold 81.7%", "threshold 2"):
        assert f">{line}</text>" in html, line
    assert html.count(">operating point (12)</text>") == len(CHART_TITLES)


def test_one_step_draws_every_chart_with_its_single_point():
    html = _report(built_steps.one_step())
    for title in CHART_TITLES:
        assert f'aria-label="{title}"' in html, title
    assert "One replica holds 1 concurrent request: 2 requests/s, 64 output tokens/s." in html
    assert "not reached: the engine held every load tried" in html
    assert "nan" not in html.lower().replace("nanosecond", "")


def test_no_answer_says_so_and_why_a_step_has_no_engine_readings():
    html = _report(built_steps.no_knee())
    assert "No answer: the SLOs did not hold even at concurrency 1, and the engine never saturated." in html
    assert '<section class="verdict none">' in html
    assert "no engine readings (cannot reach http://127.0.0.1:9/metrics)" in html
    assert "none written: no answer with engine readings to calibrate from" in html
    assert "operating point (" not in html


def test_the_steps_table_lists_every_step_in_the_order_run_and_marks_the_operating_point():
    html = _report(built_steps.several_steps())
    rows = re.findall(r'<tr class="([a-z]*)"><td>(\d+)</td>', html)
    assert [int(c) for _, c in rows] == [1, 2, 4, 8, 16, 12, 14]
    classes = dict((int(c), css) for css, c in rows)
    assert (classes[12], classes[14], classes[8]) == ("knee", "fail", "")
    assert "certainly failing: 224 of 560 requests missed (sequential test)" in html
    assert "most misses: itl; engine: kv_full, queue" in html


def _chart(html: str, title: str) -> str:
    chart = html[html.index(f'aria-label="{title}"') :]
    return chart[: chart.index("</svg>")]


def test_a_level_run_twice_is_one_point_on_the_charts_its_last_run():
    built = built_steps.several_steps()
    steps = built.search.steps
    rerun = replace(steps[5], request_rate=99.0)  # the knee confirmed by a second run, at another rate
    html = _report(replace(built, search=replace(built.search, steps=(*steps, rerun))))
    assert len(re.findall(r'<tr class="[a-z]*"><td>12</td>', html)) == 2  # the table lists both runs
    throughput = _chart(html, "Achieved throughput: requests")
    assert throughput.count("<circle") == 7  # seven levels, one point each
    # The axis reaches 100 only for the second run's 99 requests/s: the first run's 24 would need 30 at most.
    assert re.findall(r'class="tick"[^>]*>(\d+)<', throughput)[:5] == ["0", "25", "50", "75", "100"]


def test_no_answer_names_the_lowest_load_tried_not_concurrency_1():
    # --concurrency 4,8: neither met the SLOs, and 1 was never run.
    document = result_document(built_steps.no_knee())
    steps = [{**document["steps"][0], "concurrency": load} for load in (8, 4)]
    html = render_report({**document, "steps": steps})
    assert "No answer: the SLOs did not hold even at concurrency 4, and the engine never saturated." in html


@pytest.mark.parametrize("where", ["model", "note", "engine_error", "error_reason", "ended_early"])
def test_text_from_the_server_is_escaped(where):
    hostile = "<script>alert(1)</script>"
    document = result_document(built_steps.no_knee())
    step = document["steps"][0]
    changed = {
        "model": {**document, "model": hostile},
        "note": {**document, "notes": [f"engine metrics unreachable: {hostile}"]},
        "engine_error": {**document, "steps": [{**step, "engine_error": hostile}]},
        "error_reason": {**document, "steps": [{**step, "error_reasons": {hostile: 3}}]},
        "ended_early": {**document, "steps": [{**step, "ended_early": hostile}]},
    }[where]
    html = render_report(changed)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_each_step_says_why_its_requests_failed():
    document = result_document(built_steps.no_knee())
    step = {**document["steps"][0], "error_reasons": {"http 503": 2, "timeout": 1}}
    html = render_report({**document, "steps": [step]})
    assert "errors: http 503 (2), timeout (1)" in html
