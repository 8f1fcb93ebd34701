"""report.html in a real headless Chromium (Debian's chromium and chromium-driver, driven by selenium): it renders,
every chart has a size, and the browser fetches nothing, with the network made unreachable through a dead proxy.

Skips, saying why, only where deploy/local/install-browser.sh says this machine cannot have the browser (exit 3).
"""

import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from exporter.loadtest.outputs import write_outputs
from tests.loadtest import built_steps

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "/usr/bin/chromedriver"
CHARTS_PER_REPORT = {"several_steps": 9, "one_step": 9, "no_knee": 7}  # no engine readings: no time series
LOAD_TIMEOUT_SECONDS = 30


@pytest.fixture(scope="module")
def browser():
    installed = subprocess.run(
        ["bash", str(ROOT / "deploy/local/install-browser.sh")], capture_output=True, text=True, timeout=900
    )
    if installed.returncode == 3:
        pytest.skip(f"no browser on this machine: {installed.stderr.strip()}")
    assert installed.returncode == 0, installed.stderr
    # A socket bound but not listening: every connection to it is refused, so a proxy here makes any fetch fail
    # fast instead of reaching the network, and the page must render without one.
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    options = webdriver.ChromeOptions()
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,1600",
        f"--proxy-server=http://127.0.0.1:{dead.getsockname()[1]}",
        "--proxy-bypass-list=<-loopback>",
    ):
        options.add_argument(argument)
    with tempfile.TemporaryDirectory(prefix="plimsoll-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        driver.set_page_load_timeout(LOAD_TIMEOUT_SECONDS)
        try:
            yield driver
        finally:
            driver.quit()
            dead.close()


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
    assert browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name);") == []
    headline = browser.execute_script("return document.querySelector('.verdict .big').innerText;")
    assert headline.startswith(("Knee at concurrency", "No knee"))
