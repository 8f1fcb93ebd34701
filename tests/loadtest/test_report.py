"""report.html as text: self-contained (nothing that could reach the network), the verdict in words, every chart."""

import re
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


@pytest.mark.parametrize("built", [built_steps.several_steps, built_steps.one_step, built_steps.no_knee])
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


def test_the_verdict_names_the_knee_what_limited_it_why_and_the_slos_first():
    html = _report(built_steps.several_steps())
    verdict = html[html.index('<section class="verdict') : html.index("</section>")]
    assert "Knee at concurrency 12" in verdict
    assert "the KV cache" in verdict
    assert "usage reached 0.99 with 6.5 requests waiting at concurrency 16" in verdict
    assert "TTFT ≤ 500 ms and ITL (mean per request) ≤ 50 ms for 90.0% of requests" in verdict
    assert "saturation.kv_usage 0.817, saturation.queue 2" in verdict
    assert html.index("</section>") < html.index("<svg")


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
    assert html.count(">knee (12)</text>") == len(CHART_TITLES)


def test_one_step_draws_every_chart_with_its_single_point():
    html = _report(built_steps.one_step())
    for title in CHART_TITLES:
        assert f'aria-label="{title}"' in html, title
    assert "Knee at concurrency 1" in html
    assert "nan" not in html.lower().replace("nanosecond", "")


def test_no_knee_says_so_and_why_a_step_has_no_engine_readings():
    html = _report(built_steps.no_knee())
    assert "No knee: the SLOs did not hold even at concurrency 1." in html
    assert "no engine readings (cannot reach http://127.0.0.1:9/metrics)" in html
    assert "none written: no knee with engine readings to calibrate from" in html


def test_the_steps_table_lists_every_step_in_the_order_run_and_marks_the_knee():
    html = _report(built_steps.several_steps())
    rows = re.findall(r'<tr class="([a-z]*)"><td>(\d+)</td>', html)
    assert [int(c) for _, c in rows] == [1, 2, 4, 8, 16, 12, 14]
    assert dict((int(c), css) for css, c in rows)[12] == "knee"
    assert "certainly failing: upper bound 0.70 &lt; 0.9 after 40 requests" in html


def test_text_from_the_server_is_escaped():
    built = built_steps.no_knee()
    html = render_report({**result_document(built), "model": "<script>alert(1)</script>"})
    assert "<script>" not in html and "&lt;script&gt;" in html
