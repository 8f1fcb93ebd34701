"""report.html of a week's replay in a real headless Chromium (tests/support/browser.py): it renders both charts
with their lines and the overflow shaded, logs no error, fetches nothing (the network is a dead proxy), and the
model name, which is markup fetching an image, shows as text.

Skips, saying why, only where deploy/local/install-browser.sh says this machine cannot have the browser (exit 3).
"""

from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait

from exporter.autoscale.report import REPORT_FILE
from tests.autoscale.week import HOSTILE_MODEL, replay_a_week
from tests.support.browser import LOAD_TIMEOUT_SECONDS, chromium_or_skip, fetched


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with chromium_or_skip(1280, 1600) as driver:
        yield driver


@pytest.fixture(scope="module")
def opened(browser: webdriver.Chrome, tmp_path_factory: pytest.TempPathFactory) -> webdriver.Chrome:
    out = replay_a_week(tmp_path_factory.mktemp("week"))
    browser.get((out / REPORT_FILE).as_uri())
    WebDriverWait(browser, LOAD_TIMEOUT_SECONDS).until(
        lambda driver: driver.execute_script("return document.readyState") == "complete",
        "the report did not finish loading",
    )
    return browser


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
    assert load["legend"] == ["ready x knee (10)", "demand", "overflow (demand above)"]
    assert replicas["legend"][:2] == ["asked for (desired)", "ready"]
    # Two step lines each; the week's demand is 40,321 samples, drawn as at most two corners per pixel bucket.
    assert len(load["lines"]) == 2 and len(replicas["lines"]) == 2
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
