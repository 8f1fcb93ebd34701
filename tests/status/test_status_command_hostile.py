"""`plimsoll status` against servers that are not a well-behaved daemon: one that trickles its answer, one that
never ends it, JSON of the wrong shape or with numbers out of range, a state of megabytes or of more rows than a
terminal shows, a redirect to another origin carrying the password. Each is one line naming what is wrong, within
the deadline, and the password never leaves the daemon's origin. A state whose text holds terminal escapes, markup
or pages of words prints it escaped, as sent, cut to what a cell shows; a value no engine reports shows as missing.
Ctrl-C while the answer trickles ends the command with 130, not a traceback."""

import asyncio
import base64
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from exporter.status.client import (
    INSTANCE_VALUES,
    MAX_CELL_CHARS,
    MAX_HISTORY_POINTS,
    MAX_ROWS,
    MAX_STATE_BYTES,
    DaemonUnreadable,
    Request,
    fetch,
)
from tests.status.command import COMMAND_TIMEOUT_SECONDS, run_status
from tests.support.daemon_process import app_in_thread, interrupted_while_waiting, into_a_closed_pipe

TIMEOUT_SECONDS = 1.0
# The deadline, plus what a loaded test machine needs to notice it.
DEADLINE_SLACK_SECONDS = 4.0
GOOD_STATE: dict[str, Any] = {
    "taken_at": 1.0,
    "saturation_kv_usage": 0.9,
    "targets": [],
    "nvml": {"up": False, "error": "NVML disabled", "driver_version": None, "gpus": []},
}


class Hostile:
    """A server whose /api/v1/state answers whatever `document` is, and whose other paths misbehave."""

    def __init__(self) -> None:
        self.document: Any = GOOD_STATE
        self.elsewhere_requests: list[dict[str, str]] = []
        self.elsewhere = ""  # another origin's base URL, for the redirect
        self.trickles = 0  # answers begun on /trickle
        self.date: str | None = None  # the state's Date header, where not aiohttp's own

    def app(self) -> web.Application:
        async def state(request: web.Request) -> web.Response:
            text = self.document if isinstance(self.document, str) else json.dumps(self.document)
            headers = {} if self.date is None else {"Date": self.date}
            return web.Response(text=text, content_type="application/json", headers=headers)

        async def trickle(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"targets": [')
            self.trickles += 1
            while True:  # a byte now and then, each well within the per-read timeout
                await asyncio.sleep(0.2)
                await response.write(b" ")

        async def endless(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            chunk = b" " * (1 << 20)
            while True:  # as fast as the client reads: 10 GB would come, given time
                await response.write(chunk)

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPFound(self.elsewhere + "/api/v1/state")

        app = web.Application()
        app.router.add_get("/api/v1/state", state)
        app.router.add_get("/trickle/api/v1/state", trickle)
        app.router.add_get("/endless/api/v1/state", endless)
        app.router.add_get("/redirect/api/v1/state", redirect)
        return app

    def elsewhere_app(self) -> web.Application:
        async def record(request: web.Request) -> web.Response:
            self.elsewhere_requests.append(dict(request.headers))
            return web.json_response(GOOD_STATE)

        app = web.Application()
        app.router.add_get("/api/v1/state", record)
        return app


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[Hostile, str]]:
    server = Hostile()
    with app_in_thread(server.elsewhere_app()) as elsewhere, app_in_thread(server.app()) as url:
        server.elsewhere = elsewhere
        yield server, url


def _fetch(url: str, authorization: str | None = None) -> None:
    fetch(Request(url + "/api/v1/state", TIMEOUT_SECONDS, None, authorization))


def _unreadable(url: str, authorization: str | None = None) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(DaemonUnreadable) as raised:
        _fetch(url, authorization)
    return str(raised.value), time.monotonic() - started


def test_a_well_formed_state_is_read(hostile):
    server, url = hostile
    server.document = GOOD_STATE
    _fetch(url)
    server.document = _scale_up(lags_count=0, last_lag_seconds=None, lag_median_seconds=None)
    _fetch(url)


def test_an_answer_trickled_byte_by_byte_ends_at_the_timeout(hostile):
    _, url = hostile
    message, seconds = _unreadable(url + "/trickle")
    assert f"no answer within {TIMEOUT_SECONDS:g}s" in message
    assert seconds < TIMEOUT_SECONDS + DEADLINE_SLACK_SECONDS


def test_an_answer_that_never_ends_is_cut_at_the_size_cap(hostile):
    _, url = hostile
    request = Request(url + "/endless/api/v1/state", 30.0, None, None)
    with pytest.raises(DaemonUnreadable) as raised:
        fetch(request)
    assert f"over {MAX_STATE_BYTES:,} bytes" in str(raised.value)


def test_https_to_a_server_speaking_http_asks_whether_it_serves_https(hostile):
    _, url = hostile
    message, _ = _unreadable(url.replace("http://", "https://"))
    assert "TLS failed" in message and message.endswith("(is it serving https there?)"), message


def test_a_redirect_to_another_origin_is_not_followed_with_the_password(hostile):
    server, url = hostile
    authorization = "Basic " + base64.b64encode(b"ops:secret").decode()
    message, _ = _unreadable(url + "/redirect", authorization)
    assert "another origin" in message and "not followed" in message
    assert server.elsewhere_requests == [], "the redirect was followed"


@pytest.mark.parametrize(
    "date", ["Mon, 01 Jan 99999999999999999999 00:00:00 GMT", "Mon, 01 Jan 2020 99:00:00 GMT", "soon", ""]
)
def test_a_date_header_that_is_no_time_leaves_the_age_to_the_local_clock(hostile, date):
    server, url = hostile
    server.date = date
    try:
        fetched = fetch(Request(url + "/api/v1/state", TIMEOUT_SECONDS, None, None))
    finally:
        server.date = None
    assert abs(fetched.daemon_now - time.time()) < DEADLINE_SLACK_SECONDS


@pytest.mark.parametrize("output", ["table", "json"])
def test_a_pipe_closed_before_the_rows_ends_it_with_exit_0_and_no_traceback(hostile, output):
    """`plimsoll status | head -1` under `set -o pipefail`: rich's own handling exited 1, the daemon-unreadable code."""
    _, url = hostile
    done = into_a_closed_pipe(["status", url, "--format", output], COMMAND_TIMEOUT_SECONDS)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_watch_without_a_terminal_is_refused_rather_than_silent_until_ctrl_c(hostile):
    _, url = hostile
    done = run_status(url, "--watch")  # stdout is a pipe
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.startswith("plimsoll status: --watch: refreshes a terminal in place"), done.stderr


def _instance(**fields: Any) -> dict[str, Any]:
    """An instance with every value the rows read, as a daemon writes it, then `fields`."""
    values = dict.fromkeys(INSTANCE_VALUES, 0.5)
    return {"engine": "vllm", "dp_rank": "0", "model": "m", **values, "kv_usage_history": [], "reasons": {}, **fields}


def _state(*instances: dict[str, Any], **fields: Any) -> dict[str, Any]:
    target = {"target": "a", "up": True, "engine": "vllm", "last_failure": None, "last_error": None}
    return {**GOOD_STATE, "targets": [{**target, "instances": list(instances)}], **fields}


def _scale_up(**fields: Any) -> dict[str, Any]:
    """A state with one autoscaled model's scale-up lag, as a daemon writes it, then `fields`."""
    model = {
        "model": "m",
        "workload": "Deployment serving/m",
        "startup_seconds": 300.0,
        "knee_concurrency": 8,
        "ready_replicas": 2,
        "demand_requests": 9.0,
        "capacity_requests": 16.0,
        "lags_count": 1,
        "last_lag_seconds": 250.0,
        "lag_median_seconds": 250.0,
        "pending_seconds": 0.0,
    }
    return {**GOOD_STATE, "scale_up": [{**model, **fields}]}


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({**GOOD_STATE, "targets": {"a": 1}}, "targets is not a list"),
        ({**GOOD_STATE, "scale_up": {"m": 1}}, "scale_up is not a list"),
        (_scale_up(lags_count=1.5), "scale_up[0].lags_count is not a whole number"),
        (_scale_up(ready_replicas=-1), "scale_up[0].ready_replicas is not a whole number"),
        (_scale_up(model=None), "scale_up[0].model is not text"),
        (_scale_up(pending_seconds="soon"), "scale_up[0].pending_seconds is not a number"),
        (_scale_up(last_lag_seconds="+Inf"), "scale_up[0].last_lag_seconds is not a number or null"),
        ({**GOOD_STATE, "taken_at": "1.0"}, "taken_at is not a time"),
        ({**GOOD_STATE, "saturation_kv_usage": "0.9"}, "saturation_kv_usage is not a ratio"),
        ({**GOOD_STATE, "targets": ["vllm"]}, "targets[0] is not an object"),
        (
            {**GOOD_STATE, "targets": [{"target": "a", "up": "yes", "engine": None}]},
            "targets[0].up is not true or false",
        ),
        (
            _state(_instance(saturation_eta_seconds="soon")),
            "targets[0].instances[0].saturation_eta_seconds is not a number",
        ),
        (
            _state(_instance(kv_usage_history=[[1.0, 0.5]] * 9 + ["x"])),
            "targets[0].instances[0].kv_usage_history[9] is not a [time, ratio] pair",
        ),
        (
            {**GOOD_STATE, "nvml": {"up": True, "error": None, "driver_version": "1", "gpus": [{"gpu": 0}]}},
            "nvml.gpus[0].name is missing",
        ),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
        ([1, 2], "the document is not an object"),
    ],
)
def test_json_of_the_wrong_shape_is_one_line_naming_the_field(hostile, document, named):
    server, url = hostile
    server.document = document if isinstance(document, str) else json.dumps(document)
    try:
        message, _ = _unreadable(url)
    finally:
        server.document = GOOD_STATE
    assert named in message and "not a Plimsoll daemon's state" in message


def test_the_command_against_a_wrong_shape_is_one_line_and_exit_1(hostile):
    server, url = hostile
    server.document = json.dumps({**GOOD_STATE, "targets": [{"target": "a", "up": 1}]})
    try:
        done = run_status(url)
    finally:
        server.document = GOOD_STATE
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "targets[0].up is not true or false" in done.stderr


def test_ctrl_c_while_the_daemon_is_slow_ends_with_130_and_no_traceback(hostile):
    server, url = hostile
    before = server.trickles
    done = interrupted_while_waiting(
        ["status", url + "/trickle", "--timeout", "60s"], lambda: server.trickles > before, COMMAND_TIMEOUT_SECONDS
    )
    assert done.returncode == 128 + signal.SIGINT and done.stdout == "" and "Traceback" not in done.stderr, done.stderr


def _status(server: Hostile, url: str, document: Any, *args: str) -> subprocess.CompletedProcess[str]:
    server.document = document if isinstance(document, str) else json.dumps(document)
    try:
        return run_status(url, *args)
    finally:
        server.document = GOOD_STATE


def _one_line_naming(done: subprocess.CompletedProcess[str], named: str) -> None:
    assert done.returncode == 1 and done.stdout == "", done.stdout[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert named in done.stderr, done.stderr


ESCAPES = "\x1b]0;owned\x07\x1b[2J"
GPU = {"gpu": 0, "name": "H100", "total_bytes": 2**30, "used_bytes": 2**29, "unexplained_bytes": None}


def test_control_characters_in_the_state_reach_the_terminal_escaped(hostile):
    server, url = hostile
    process = {"pid": 7, "used_bytes": 1, "target": "p" + ESCAPES}
    nvml = {
        "up": True,
        "error": None,
        "driver_version": ESCAPES,
        "gpus": [{**GPU, "name": ESCAPES, "processes": [process]}],
    }
    down = {
        "target": "d" + ESCAPES,
        "up": False,
        "engine": None,
        "last_failure": "error",
        "last_error": ESCAPES,
        "instances": [],
    }
    document = _state(
        _instance(model="m" + ESCAPES, dp_rank=ESCAPES, engine=ESCAPES),
        _instance(model=None, reasons={"model": ESCAPES}),
        nvml=nvml,
    )
    document["targets"] += [down, {**document["targets"][0], "target": "t" + ESCAPES}]
    done = _status(server, url, document)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert done.stdout.count("\\x1b]0;owned\\x07") >= 8, done.stdout


def test_a_lone_surrogate_in_the_state_prints_escaped(hostile):
    """JSON's "\\ud800" is text no encoding writes: printed raw, it was a UnicodeEncodeError and exit 2."""
    server, url = hostile
    done = _status(server, url, _state(_instance(model="m\ud800")))
    assert done.returncode == 0 and "m\\ud800" in done.stdout, done.stderr


def test_markup_in_the_state_prints_as_sent(hostile):
    server, url = hostile
    names = ("[/]", "[bold]b[/bold]", "[link=http://x]l")
    nvml = {"up": True, "error": None, "driver_version": "[/]", "gpus": [{**GPU, "name": names[1], "processes": []}]}
    document = _state(_instance(model=names[2], dp_rank=names[0]), _instance(dp_rank=names[1]), nvml=nvml)
    document["targets"][0]["target"] = names[0]
    done = _status(server, url, document)
    assert done.returncode == 0, done.stderr
    for name in names:
        assert name in done.stdout, done.stdout


def test_a_valid_state_of_a_few_megabytes_is_refused_naming_the_cap(hostile):
    """Rendering is what costs: 60 MB of targets took 76 s and 1.26 GB before the cap was a few MB."""
    server, url = hostile
    started = time.monotonic()
    done = _status(server, url, {**GOOD_STATE, "padding": "x" * 8_000_000})
    _one_line_naming(done, f"over {MAX_STATE_BYTES:,} bytes")
    assert time.monotonic() - started < COMMAND_TIMEOUT_SECONDS / 2


def test_more_rows_than_a_terminal_shows_are_refused_naming_the_limit(hostile):
    server, url = hostile
    down = {"target": "d", "up": False, "engine": None, "last_failure": None, "last_error": None, "instances": []}
    started = time.monotonic()
    done = _status(server, url, {**GOOD_STATE, "targets": [down] * (MAX_ROWS + 1)})
    _one_line_naming(done, f"more than the {MAX_ROWS:,} rows")
    assert time.monotonic() - started < COMMAND_TIMEOUT_SECONDS / 2


@pytest.mark.parametrize(
    ("document", "named"),
    [
        (_state({k: v for k, v in _instance().items() if k != "requests_running"}), "requests_running is missing"),
        (_state(_instance(kv_usage_history=5)), "instances[0].kv_usage_history is not a list"),
        (
            _state(_instance(kv_usage_history=[[1.0, 0.5]] * (MAX_HISTORY_POINTS + 1))),
            f"kv_usage_history has more than {MAX_HISTORY_POINTS:,} points",
        ),
        (_state(_instance(kv_usage_history=[[1.0, float("nan")]])), "kv_usage_history[0] is not a [time, ratio]"),
        (_state(_instance(reasons=[])), "instances[0].reasons is not an object of text"),
        (_state(_instance(requests_running=[1])), "instances[0].requests_running is not a number or null"),
        ({**GOOD_STATE, "taken_at": 1e20}, "taken_at is not a time"),
        ({**GOOD_STATE, "taken_at": float("inf")}, "taken_at is not a time"),
        ({**GOOD_STATE, "taken_at": -5}, "taken_at is not a time"),
        ({**GOOD_STATE, "saturation_kv_usage": float("nan")}, "saturation_kv_usage is not a ratio"),
        ({**GOOD_STATE, "saturation_kv_usage": 90}, "saturation_kv_usage is not a ratio"),
        (_state(_instance(), nvml={**GOOD_STATE["nvml"], "gpus": [{**GPU, "used_bytes": -1}]}), "used_bytes is not"),
        (
            _state(_instance(), nvml={**GOOD_STATE["nvml"], "gpus": [{**GPU, "total_bytes": 1e300}]}),
            "nvml.gpus[0].total_bytes is not",
        ),
        (
            _state(_instance(), nvml={**GOOD_STATE["nvml"], "gpus": [{**GPU, "processes": [{"pid": -1}]}]}),
            "nvml.gpus[0].processes[0].pid is not",
        ),
        ({**GOOD_STATE, "nvml": {**GOOD_STATE["nvml"], "gpus": [GPU]}}, "nvml.gpus[0].processes is missing"),
        ({**GOOD_STATE, "taken_at": float("nan")}, "taken_at is not a time"),
        (json.dumps(GOOD_STATE).replace('"taken_at": 1.0', '"taken_at": 1e999'), "taken_at is not a time"),
    ],
)
def test_the_command_against_a_wrong_shape_or_number_is_one_line_naming_the_field(hostile, document, named):
    server, url = hostile
    done = _status(server, url, document)
    _one_line_naming(done, named)
    assert url in done.stderr


def _row(stdout: str) -> str:
    (row,) = [line for line in stdout.splitlines() if line.startswith("a ")]
    return row


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e300, -1e300, 10**300, "+Inf"])
def test_a_value_out_of_range_shows_as_missing(hostile, value):
    server, url = hostile
    fields = ("kv_cache_headroom_tokens", "headroom_requests_p95", "requests_running", "requests_waiting")
    fields += ("preemptions_total", "model_capacity_error_ratio", "kv_cache_usage_ratio")
    done = _status(server, url, _state(_instance(**dict.fromkeys(fields, value), saturation_eta_seconds=None)))
    assert done.returncode == 0, done.stderr
    assert _row(done.stdout).split()[3:] == ["-"] * 7, done.stdout


def test_a_daemons_infinite_time_to_saturation_reads_never(hostile):
    server, url = hostile
    for value in ("+Inf", float("inf"), 1e300):
        done = _status(server, url, _state(_instance(saturation_eta_seconds=value)))
        assert done.returncode == 0 and " never " in _row(done.stdout), (value, done.stdout, done.stderr)


def test_json_out_is_strict_json_whatever_numbers_the_daemon_sent(hostile):
    server, url = hostile
    done = _status(
        server,
        url,
        '{"taken_at": 1, "saturation_kv_usage": 0.9, "targets": [], "x": [NaN, -1e999],'
        ' "nvml": {"up": false, "error": null, "driver_version": null, "gpus": []}}',
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in --format json")

    assert json.loads(done.stdout, parse_constant=refuse)["x"] == [None, "-Inf"]


def test_long_text_in_the_state_is_cut_to_what_a_cell_shows(hostile):
    """1,000 targets with 4 kB errors printed 17 MB of wrapped text in 8 s; each cell now shows MAX_CELL_CHARS."""
    server, url = hostile
    down = {"target": "d", "up": False, "engine": None, "last_failure": None, "instances": []}
    long = "z " * 50_000  # words: rich wraps them over as many lines as they take
    done = _status(
        server,
        url,
        {**GOOD_STATE, "targets": [{**down, "last_error": long}, {**down, "target": long, "last_error": "x"}]},
    )
    assert done.returncode == 0, done.stderr
    # Two cells of MAX_CELL_CHARS, every other character a z (one of them after "down: ").
    assert MAX_CELL_CHARS - 10 <= done.stdout.count("z") <= MAX_CELL_CHARS, done.stdout
    assert done.stdout.count("…") == 2, done.stdout
