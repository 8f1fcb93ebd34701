"""The status page of a real `plimsoll run` in Debian's headless chromium (selenium): it shows the daemon's rows,
follows the engine's KV usage without reloading, and fetches nothing but the daemon's /api/v1/state.

Skips, saying why, only where deploy/local/install-browser.sh says this machine cannot have the browser.
"""

from typing import Any

import pytest
from selenium.webdriver.support.ui import WebDriverWait

from exporter.core import status_format
from tests.status.conftest import Fleet
from tests.support.browser import chromium_or_skip, fetched
from tests.support.prometheus import http

UPDATE_TIMEOUT_SECONDS = 15  # the page refreshes every 3 s and the daemon polls every 0.5 s
ROWS = (
    "return Array.from(document.querySelectorAll('#instances tbody tr')).map(tr => ({target: tr.dataset.target, "
    "text: tr.innerText, kv: (tr.querySelector('td.kv') || {}).className || null, "
    "kvText: (tr.querySelector('td.kv') || {}).innerText || null}));"
)


@pytest.fixture(scope="module")
def browser():
    with chromium_or_skip() as driver:
        yield driver


def _rows(browser) -> dict[str, dict[str, Any]]:
    return {row["target"]: row for row in browser.execute_script(ROWS)}


def _eta_cell(browser) -> str:
    return browser.execute_script(
        "return document.querySelector('tr[data-target=\"vllm-tiny\"] td.eta').innerText;"
    ).strip()


def _daemons_eta(fleet: Fleet) -> str:
    _, state = http("GET", fleet.daemon.url + "/api/v1/state")
    (target,) = [target for target in state["targets"] if target["target"] == "vllm-tiny"]
    return status_format.duration(target["instances"][0]["saturation_eta_seconds"])


def test_the_page_and_plimsoll_status_write_a_time_to_saturation_alike(browser, fleet):
    _open(browser, fleet)
    cases = ["+Inf", 0.0, -3.0, 0.4, 59.0, 59.2, 240.0, 299.9, 3600.0, 7500.0, 3 * 86400 + 5]
    written = browser.execute_script("return arguments[0].map(duration);", cases)
    assert written == [status_format.duration(seconds) for seconds in cases]


def _instance(dp_rank: int, **values: Any) -> dict[str, Any]:
    shown = {
        "kv_cache_usage_ratio": 0.5,
        "kv_cache_headroom_tokens": 1000,
        "headroom_requests_p95": 4,
        "requests_running": 2,
        "requests_waiting": 1,
        "preemptions_total": 0,
        "saturation_eta_seconds": 600,
        "model_capacity_error_ratio": 0.05,
    }
    return {"engine": "vllm", "dp_rank": dp_rank, "model": "m", "kv_usage_history": [], **shown, **values}


def test_the_page_and_plimsoll_status_cut_absurd_numbers_at_the_same_limit(browser, fleet):
    """Numbers past status_format.MAX_SHOWN (which the server writes into the script) are missing on the page as
    in `plimsoll status`, a time to saturation past it is "never", and numbers at the limit are still shown."""
    limit, past = status_format.MAX_SHOWN, status_format.MAX_SHOWN * 10
    instances = [
        _instance(0, kv_cache_headroom_tokens=limit, headroom_requests_p95=-limit, saturation_eta_seconds=limit),
        _instance(1, kv_cache_usage_ratio=past, kv_cache_headroom_tokens=past, headroom_requests_p95=-past),
        _instance(2, requests_running=past, preemptions_total=1e300, saturation_eta_seconds=past),
        _instance(3, requests_running=past, requests_waiting=-past, saturation_eta_seconds=-past),
        _instance(4, model_capacity_error_ratio=past, saturation_eta_seconds="+Inf"),
    ]
    state = {
        "saturation_kv_usage": 0.9,
        "targets": [{"target": "t", "engine": "vllm", "up": True, "instances": instances}],
    }
    _open(browser, fleet)
    cells = browser.execute_script(
        "const body = document.createElement('tbody'); body.innerHTML = rows(arguments[0]);"
        "return Array.from(body.rows, tr => Array.from(tr.cells, td => td.textContent.trim()));",
        state,
    )
    expected = [
        [row.target, row.engine]
        + [
            cell.text
            for cell in (
                row.model,
                row.kv_usage,
                row.headroom_tokens,
                row.headroom_requests_p95,
                row.running_waiting,
                row.preemptions,
                row.saturation_in,
                row.model_drift,
            )
        ]
        + [""]
        for row in status_format.instance_rows(state)
    ]
    assert cells == expected
    assert [row[8] for row in cells] == ["11574074074d", "10m", "never", "-", "never"]
    assert cells[1][3:6] == ["-", "-", "-"] and cells[3][6] == "-"


def _open(browser, fleet: Fleet) -> None:
    browser.get(fleet.daemon.url + "/")
    WebDriverWait(browser, UPDATE_TIMEOUT_SECONDS).until(
        lambda driver: driver.execute_script("return document.getElementById('age').textContent").endswith("ago)"),
        "the page's script did not show the snapshot's age (it never read /api/v1/state)",
    )


def test_the_page_shows_each_targets_row_and_fetches_only_the_daemons_state(browser, fleet):
    fleet.set_usage(0.30)
    _open(browser, fleet)
    rows = _rows(browser)
    assert list(rows) == ["vllm-tiny", "sglang-no-model", "refused"]
    assert rows["vllm-tiny"]["kvText"].strip() == "30%" and "ok" in rows["vllm-tiny"]["kv"]
    assert "tiny-llama" in rows["vllm-tiny"]["text"]
    # The time to saturation the daemon computed, written as `plimsoll status` writes it: which value depends on
    # the usage earlier tests left in the history, so the page is read until it shows the daemon's latest.
    WebDriverWait(browser, UPDATE_TIMEOUT_SECONDS).until(
        lambda driver: _eta_cell(driver) == _daemons_eta(fleet),
        "the page's time to saturation is not the daemon's, written as `plimsoll status` writes it",
    )
    assert "no model given" in rows["sglang-no-model"]["text"]
    assert "down (refused)" in rows["refused"]["text"]
    sparkline = browser.execute_script(
        "return document.querySelector('tr[data-target=\"vllm-tiny\"] svg.spark polyline').getAttribute('points');"
    )
    assert len(sparkline.split()) >= 2, "the KV usage history is drawn"
    urls = fetched(browser)
    assert urls and set(urls) == {fleet.daemon.url + "/api/v1/state"}, urls


def test_the_page_follows_the_engines_kv_usage_without_reloading(browser, fleet):
    fleet.set_usage(0.30)
    _open(browser, fleet)
    browser.execute_script("window.sameDocument = true;")
    for usage, text, level in ((0.95, "95%", "at"), (0.85, "85%", "near"), (0.30, "30%", "ok")):
        fleet.set_usage(usage)
        WebDriverWait(browser, UPDATE_TIMEOUT_SECONDS).until(
            lambda driver, text=text: _rows(driver)["vllm-tiny"]["kvText"].strip() == text,
            f"the page did not show KV usage {text} within {UPDATE_TIMEOUT_SECONDS}s of the engine reporting it",
        )
        assert level in _rows(browser)["vllm-tiny"]["kv"].split()
    assert browser.execute_script("return window.sameDocument === true;"), "the page reloaded instead of updating"


def test_the_first_render_has_the_rows_without_a_script(fleet):
    fleet.set_usage(0.30)
    status, page = http("GET", fleet.daemon.url + "/", timeout_s=10.0)
    assert status == 200
    for expected in ('data-target="vllm-tiny"', "30%", 'data-target="refused"', "down (refused)", "no model given"):
        assert expected in page


def test_the_scripts_rows_read_the_same_as_the_servers(browser, fleet):
    """The script's copy of exporter/core/status_format.py against the original: the live rows' text equals the text
    of the rows the server rendered, for the same engine state."""
    fleet.set_usage(0.85)
    _open(browser, fleet)
    texts = (
        "return Array.from(root.querySelectorAll('#instances tbody tr'), tr => Array.from(tr.cells, td => "
        "td.textContent.trim()));"
    )
    live = browser.execute_script(f"const root = document; {texts}")
    served = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/').then(r => r.text()).then(html => {"
        f"  const root = new DOMParser().parseFromString(html, 'text/html'); done((() => {{ {texts} }})());"
        "});"
    )
    assert live == served
    assert any("85%" in cell for row in live for cell in row)


def _scale_up_model(**values: Any) -> dict[str, Any]:
    shown = {
        "model": "m",
        "workload": "Deployment serving/m",
        "startup_seconds": 300.0,
        "knee_concurrency": 8,
        "ready_replicas": 2,
        "demand_requests": 20.0,
        "capacity_requests": 16.0,
        "lags_count": 3,
        "last_lag_seconds": 330.5,
        "lag_median_seconds": 250.0,
        "pending_seconds": 75.2,
    }
    return {**shown, **values}


def test_the_page_and_plimsoll_status_write_the_scale_up_lag_alike(browser, fleet):
    """The page's script copy of status_format.scale_up_rows and seconds_text; and a daemon with no autoscaled
    model (this fleet's) has the section hidden."""
    _open(browser, fleet)
    assert browser.execute_script("return document.getElementById('scale-up').hidden;") is True
    cases = [0.0, 14.9, 59.99, 60.0, 330.5, 3599.0, 3600.0, 3900.0, 90000.0]
    written = browser.execute_script("return arguments[0].map(secs);", cases)
    assert written == [status_format.seconds_text(seconds) for seconds in cases]
    past = status_format.MAX_SHOWN * 10
    state = {
        "scale_up": [
            _scale_up_model(),
            _scale_up_model(lags_count=0, last_lag_seconds=None, lag_median_seconds=None, pending_seconds=0.0),
            _scale_up_model(demand_requests=past, capacity_requests=past, pending_seconds=past, startup_seconds=past),
        ]
    }
    cells = browser.execute_script(
        "const body = document.createElement('tbody'); body.innerHTML = scaleUp(arguments[0]);"
        "return Array.from(body.rows, tr => Array.from(tr.cells, td => [td.textContent.trim(), td.className]));",
        state,
    )
    expected = [
        [
            [row.model, ""],
            [row.workload, ""],
            [row.replicas, "num"],
            [row.demand, "num"],
            [row.last_lag.text, "num missing" if row.last_lag.missing else "num"],
            [row.median_lag.text, "num missing" if row.median_lag.missing else "num"],
            [row.pending, "num"],
            [row.assumed, "num"],
        ]
        for row in status_format.scale_up_rows(state)
    ]
    assert cells == expected
    assert [row[6][0] for row in cells] == ["1m 15s", "none", "none"] and cells[2][3][0] == "- / -"


def test_the_scale_up_section_shows_once_a_state_has_rows(browser, fleet):
    """A daemon reloaded with an autoscaled model: the page's next refresh shows the section it was served without.
    The state is this daemon's own, with a scale-up entry added on its way to the page."""
    _open(browser, fleet)
    shown = browser.execute_script(
        "const added = arguments[0], real = window.fetch;"
        "window.fetch = (url, options) => real(url, options).then(r => r.json()).then(state => new Response("
        "  JSON.stringify({...state, scale_up: [added]}), {headers: {'Content-Type': 'application/json'}}));"
        "return refresh().then(() => { window.fetch = real; const section = document.getElementById('scale-up');"
        "  return [section.hidden, section.querySelector('tbody').rows.length]; });",
        _scale_up_model(),
    )
    assert shown == [False, 1]
