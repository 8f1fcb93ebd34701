"""report.html of a week's replay in a real headless Chromium (tests/support/browser.py): it renders both charts
with their lines (the oracle's ready capacity among them) and the overflow shaded, logs no error, fetches nothing
(the network is a dead proxy), and the model name, which is markup fetching an image, shows as text. A `--tune`
replay's report shows the tuning: the config change to paste and the figures beside the generated scaler's.

Skips, saying why, only where deploy/local/install-browser.sh says this machine cannot have the browser (exit 3).
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait

from exporter.autoscale.report import REPORT_FILE
from tests.autoscale.tuned import replay_tuned
from tests.autoscale.week import HOSTILE_MODEL, replay_a_week
from tests.support.browser import LOAD_TIMEOUT_SECONDS, chromium_or_skip, fetched


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with chromium_or_skip(1280, 1600) as driver:
        yield driver


def _load(browser: webdriver.Chrome, out: Path) -> webdriver.Chrome:
    browser.get((out / REPORT_FILE).as_uri())
    WebDriverWait(browser, LOAD_TIMEOUT_SECONDS).until(
        lambda driver: driver.execute_script("return document.readyState") == "complete",
        "the report did not finish loading",
    )
    return browser


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return replay_a_week(tmp_path_factory.mktemp("week"))


@pytest.fixture
def opened(browser: webdriver.Chrome, week: Path) -> webdriver.Chrome:
    return _load(browser, week)


def test_it_loads_with_no_error_and_fetches_nothing(opened: webdriver.Chrome) -> None:
    assert [entry for entry in opened.get_log("browser") if entry["level"] == "SEVERE"] == []
    assert fetched(opened) == []
    assert opened.execute_script("return document.scripts.length + document.images.length") == 0


def test_the_hostile_model_name_shows_as_text(opened: webdriver.Chrome) -> None:
    heading = opened.execute_script("return document.querySelector('section.workload h2').innerText")
    assert heading == f"inference/vllm-week ({HOSTILE_MODEL})"
    assert opened.title == "Autoscaler replay"


def test_both_charts_render_with_their_series_and_the_overflow_shaded(opened: webdriver.Chrome) -> None:
    charts = opened.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart')).map(svg => {"
        " const box = svg.getBoundingClientRect();"
        " return {title: svg.querySelector('.title').textContent, width: box.width, height: box.height,"
        "  lines: Array.from(svg.querySelectorAll('polyline.series')).map(line => line.points.numberOfItems),"
        "  legend: Array.from(svg.querySelectorAll('.legend')).map(text => text.textContent),"
        "  shaded: Array.from(svg.querySelectorAll('path.shade')).map(path => path.getBBox().width)}; });"
    )
    assert [chart["title"] for chart in charts] == ["Demand against ready capacity", "Replicas"]
    assert all(chart["width"] > 400 and chart["height"] > 250 for chart in charts), charts
    load, replicas = charts
    assert load["legend"] == ["ready x knee (10)", "oracle's ready x knee", "demand", "overflow (demand above)"]
    assert replicas["legend"][:2] == ["asked for (desired)", "ready"]
    # Step lines; the week's demand is 40,321 samples, drawn as at most two corners per pixel bucket.
    assert len(load["lines"]) == 3 and len(replicas["lines"]) == 2
    assert all(0 < points <= 2 * 480 for chart in charts for points in chart["lines"]), charts
    assert len(load["shaded"]) == 1 and load["shaded"][0] > 0
    assert replicas["shaded"] == []


def test_the_figures_and_the_downsampling_note_are_on_the_page(opened: webdriver.Chrome) -> None:
    rows = opened.execute_script(
        "return Array.from(document.querySelectorAll('table.figures tr')).map(row => row.cells[0].innerText)"
    )
    assert rows == ["fleet", "generated scaler", "static fleet at the peak", "oracle"]
    note = opened.execute_script("return document.querySelector('.notes').innerText")
    assert "480 equal buckets of time" in note


def test_a_tuned_report_shows_the_change_and_the_figures(browser: webdriver.Chrome, tmp_path: Path) -> None:
    out = replay_tuned(tmp_path)
    tuned = _load(browser, out)
    assert [entry for entry in tuned.get_log("browser") if entry["level"] == "SEVERE"] == []
    section = tuned.execute_script(
        "const section = document.getElementById('tune'); const box = section.getBoundingClientRect();"
        " return {heading: section.querySelector('h2').innerText, width: box.width, height: box.height,"
        "  change: section.querySelector('pre.change').innerText,"
        "  rows: Array.from(section.querySelectorAll('table.tuned tr')).map(row => row.cells[0].innerText),"
        "  linked: document.querySelector('a[href=\"#tune\"]').innerText};"
    )
    assert section["heading"] == "Tuning (--tune)"
    assert section["width"] > 400 and section["height"] > 100, section
    assert section["change"].splitlines() == ["autoscaling:", "  margin: 0.95", "  demand_window: 2m"]
    assert section["rows"] == [
        "workload: fleet",
        "inference/vllm-llama: generated scaler, the config (margin 0.8, demand_window 10m)",
        "inference/vllm-llama: tuned (margin 0.95, demand_window 2m)",
    ]
    assert section["linked"] == "--tune"
