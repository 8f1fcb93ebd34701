"""Debian's chromium, headless, driven by selenium, with every fetch off loopback refused: the browser for the status
page's and the load-test report's tests, and for the README's screenshot (deploy/local/screenshot_status.py).

Every request but those to 127.0.0.1 goes to a proxy that is a socket bound and never listening, so it fails at once
instead of reaching the network; what a page did fetch is `fetched(driver)`.
"""

import contextlib
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "/usr/bin/chromedriver"
LOAD_TIMEOUT_SECONDS = 30


class NoBrowser(Exception):
    """deploy/local/install-browser.sh says this machine cannot have chromium (its message says why)."""


def install() -> None:
    """Make sure chromium and chromedriver are there (the script is idempotent); NoBrowser where they cannot be."""
    installed = subprocess.run(
        ["bash", str(ROOT / "deploy/local/install-browser.sh")], capture_output=True, text=True, timeout=900
    )
    if installed.returncode == 3:
        raise NoBrowser(installed.stderr.strip())
    if installed.returncode != 0:
        raise RuntimeError(f"install-browser.sh failed ({installed.returncode}): {installed.stderr}")


@contextlib.contextmanager
def headless_chromium(width: int = 1400, height: int = 900) -> Iterator[webdriver.Chrome]:
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
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--proxy-server=http://127.0.0.1:{dead.getsockname()[1]}",
        "--proxy-bypass-list=127.0.0.1",  # the daemon under test, and nothing else
    ):
        options.add_argument(argument)
    try:
        with tempfile.TemporaryDirectory(prefix="plimsoll-chromium-") as profile:
            options.add_argument(f"--user-data-dir={profile}")
            driver = webdriver.Chrome(service=Service(DRIVER), options=options)
            driver.set_page_load_timeout(LOAD_TIMEOUT_SECONDS)
            try:
                yield driver
            finally:
                driver.quit()
    finally:
        dead.close()


@contextlib.contextmanager
def chromium_or_skip(width: int = 1400, height: int = 900) -> Iterator[webdriver.Chrome]:
    """`headless_chromium` for a test, which skips, saying why, only where the machine cannot have the browser."""
    try:
        install()
    except NoBrowser as why:
        pytest.skip(f"no browser on this machine: {why}")
    with headless_chromium(width, height) as driver:
        yield driver


def fetched(driver: webdriver.Chrome) -> list[str]:
    """The URLs the page has fetched since it loaded (its own document not counted)."""
    return list(driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name);"))
