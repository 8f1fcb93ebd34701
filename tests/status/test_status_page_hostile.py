"""The status page against states it should not trust: markup in a target name, a model name or a poll error stays
text (the server's render and the script's), and a state the script cannot read, or an answer that never comes,
says so and leaves the page refreshing rather than frozen or half-updated."""

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from selenium.webdriver.support.ui import WebDriverWait

from exporter.config import Target
from exporter.daemon.snapshot import Snapshot, TargetState
from exporter.daemon.views import status_page
from tests.support.browser import chromium_or_skip
from tests.support.daemon_process import app_in_thread

MARKUP = '<img src="x" onerror="window.injected = true">'
UPDATE_TIMEOUT_SECONDS = 15  # the page refreshes every 3 s
HANG_TIMEOUT_SECONDS = 25  # the script gives up on an answer after 10 s, then waits 3 s for the next refresh
INSTANCE = {
    "engine": "vllm",
    "dp_rank": "0",
    "model": MARKUP,
    "kv_cache_usage_ratio": 0.5,
    "reasons": {"kv_cache_headroom_tokens": MARKUP},
    "saturation_eta_seconds": "+Inf",
    "kv_usage_history": [[1.0, 0.5], [2.0, 0.5]],
}
HOSTILE_STATE: dict[str, Any] = {
    "taken_at": 2.0,
    "saturation_kv_usage": 0.9,
    "targets": [
        {"target": MARKUP, "up": True, "engine": "vllm", "instances": [INSTANCE]},
        {"target": "down", "up": False, "engine": None, "last_failure": "error", "last_error": MARKUP, "instances": []},
    ],
    "nvml": {"up": False, "error": MARKUP, "driver_version": None, "gpus": []},
}


def _snapshot() -> Snapshot:
    target = Target(MARKUP, "http://127.0.0.1:9/metrics")
    down = TargetState(target, False, None, "error", {}, None, None, last_error=MARKUP)
    return Snapshot(taken_at=1.0, ready=True, nvml=None, targets=(down,))


class StateServer:
    """The page, rendered from a snapshot with markup in it, and /api/v1/state answering `state` (or never)."""

    def __init__(self) -> None:
        self.state: Any = HOSTILE_STATE
        self.hang = False

    def app(self) -> web.Application:
        async def index(request: web.Request) -> web.Response:
            return web.Response(text=status_page(_snapshot()), content_type="text/html")

        async def state(request: web.Request) -> web.Response:
            while self.hang:
                await asyncio.sleep(0.1)
            return web.Response(text=json.dumps(self.state), content_type="application/json")

        app = web.Application()
        app.router.add_get("/", index)
        app.router.add_get("/api/v1/state", state)
        return app


@pytest.fixture(scope="module")
def page() -> Iterator[tuple[Any, StateServer]]:
    server = StateServer()
    with chromium_or_skip() as browser, app_in_thread(server.app()) as url:
        browser.get(url + "/")
        yield browser, server
        server.hang = False


def _error(browser: Any) -> str:
    return str(browser.execute_script("return document.getElementById('error').textContent;"))


def _wait(browser: Any, condition: Any, timeout: float, what: str) -> None:
    WebDriverWait(browser, timeout).until(lambda driver: condition(driver), what)


def test_markup_in_a_name_or_an_error_is_text_in_the_servers_render():
    page = status_page(_snapshot())
    assert MARKUP not in page
    assert "&lt;img src=&quot;x&quot; onerror=&quot;window.injected = true&quot;&gt;" in page


def test_markup_in_the_state_is_text_in_the_scripts_rows(page):
    browser, server = page
    server.state = HOSTILE_STATE
    _wait(
        browser,
        lambda driver: "vllm" in driver.execute_script("return document.getElementById('instances').innerText;"),
        UPDATE_TIMEOUT_SECONDS,
        "the script did not render the state",
    )
    assert browser.execute_script("return document.querySelectorAll('img, script:not(body > script)').length;") == 0
    assert browser.execute_script("return window.injected === undefined;")
    shown = browser.execute_script("return document.body.innerText;")
    assert shown.count(MARKUP) >= 4, "target, model, reason, poll error and NVML error shown as they are"


def test_a_state_the_script_cannot_read_says_so_and_keeps_the_last_rows_whole(page):
    browser, server = page
    server.state = HOSTILE_STATE
    _wait(browser, lambda driver: _error(driver) == "", UPDATE_TIMEOUT_SECONDS, "the good state was not shown")
    rows = browser.execute_script("return document.getElementById('instances').innerHTML;")
    threshold = browser.execute_script("return document.getElementById('threshold').textContent;")
    server.state = {**HOSTILE_STATE, "saturation_kv_usage": 0.5, "targets": 5}
    try:
        _wait(browser, lambda driver: "cannot refresh" in _error(driver), UPDATE_TIMEOUT_SECONDS, "no error shown")
        assert browser.execute_script("return document.getElementById('instances').innerHTML;") == rows
        assert browser.execute_script("return document.getElementById('threshold').textContent;") == threshold
    finally:
        server.state = HOSTILE_STATE
    _wait(browser, lambda driver: _error(driver) == "", UPDATE_TIMEOUT_SECONDS, "the page stopped refreshing")


def test_an_answer_that_never_comes_ends_its_refresh_and_the_next_one_runs(page):
    browser, server = page
    server.state = HOSTILE_STATE
    _wait(browser, lambda driver: _error(driver) == "", UPDATE_TIMEOUT_SECONDS, "the good state was not shown")
    server.hang = True
    try:
        _wait(
            browser,
            lambda driver: "cannot refresh" in _error(driver),
            HANG_TIMEOUT_SECONDS,
            "the page waited on an answer that never came, without saying so",
        )
    finally:
        server.hang = False
    _wait(browser, lambda driver: _error(driver) == "", UPDATE_TIMEOUT_SECONDS, "the page stopped refreshing")
