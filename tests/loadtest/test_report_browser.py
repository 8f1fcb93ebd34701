"""report.html in a real headless Chromium (Debian's chromium and chromium-driver, driven by selenium): it renders,
every chart has a size, and the browser fetches nothing, with the network made unreachable through a dead proxy.

Skips, saying why, only where deploy/local/install-browser.sh says this machine cannot have the browser (exit 3).
"""

import pytest
from selenium.webdriver.support.ui import WebDriverWait

from exporter.loadtest.outputs import write_outputs
from tests.loadtest import built_steps
from tests.support.browser import LOAD_TIMEOUT_SECONDS, chromium_or_skip, fetched

CHARTS_PER_REPORT = {
    "several_steps": 9,
    "saturated_below_knee": 9,
    "one_step": 9,
    "no_knee": 7,
}  # no engine readings: no time series


@pytest.fixture(scope="module")
def browser():
    with chromium_or_skip(1280, 1600) as driver:
        yield driver


@pytest.mark.parametrize("name", sorted(CHARTS_PER_REPORT))
def test_the_report_renders_offline_with_every_chart_and_fetches_nothing(browser, tmp_path, name):
    written = write_outputs(tmp_path, getattr(built_steps, name)())
    browser.get(written.report.as_uri())
    WebDriverWait(browser, LOAD_TIMEOUT_SECONDS).until(
        lambda driver: driver.execute_script("return document.readyState") == "complete",
        "the report did not finish loading",
    )
    sizes = browser.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart'))"
        ".map(svg => { const box = svg.getBoundingClientRect(); return [box.width, box.height]; });"
    )
    assert len(sizes) == CHARTS_PER_REPORT[name]
    assert all(width > 100 and height > 100 for width, height in sizes), sizes
    assert fetched(browser) == []
    headline = browser.execute_script("return document.querySelector('.verdict .big').innerText;")
    assert headline.startswith("No answer" if name == "no_knee" else "One replica holds")
