"""`plimsoll status` against servers that are not a well-behaved daemon: one that trickles its answer, one that
never ends it, JSON of the wrong shape, a redirect to another origin carrying the password. Each is one line naming
what is wrong, within the deadline, and the password never leaves the daemon's origin."""

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from exporter.status_client import MAX_STATE_BYTES, DaemonUnreadable, Request, fetch
from tests.status.command import run_status
from tests.support.daemon_process import app_in_thread

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

    def app(self) -> web.Application:
        async def state(request: web.Request) -> web.Response:
            text = self.document if isinstance(self.document, str) else json.dumps(self.document)
            return web.Response(text=text, content_type="application/json")

        async def trickle(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"targets": [')
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


def test_a_redirect_to_another_origin_is_not_followed_with_the_password(hostile):
    server, url = hostile
    authorization = "Basic " + base64.b64encode(b"ops:secret").decode()
    message, _ = _unreadable(url + "/redirect", authorization)
    assert "another origin" in message and "not followed" in message
    assert server.elsewhere_requests == [], "the redirect was followed"


def _with_instance(**fields: Any) -> dict[str, Any]:
    """A good state whose one up target has one vLLM instance carrying `fields`."""
    instance = {"engine": "vllm", "dp_rank": "0", "model": "m", **fields}
    target = {"target": "a", "up": True, "engine": "vllm", "last_failure": None, "last_error": None}
    return {**GOOD_STATE, "targets": [{**target, "instances": [instance]}]}


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({**GOOD_STATE, "targets": {"a": 1}}, "targets is not a list"),
        ({**GOOD_STATE, "taken_at": "1.0"}, "taken_at is not a number"),
        ({**GOOD_STATE, "saturation_kv_usage": "0.9"}, "saturation_kv_usage is not a number"),
        ({**GOOD_STATE, "targets": ["vllm"]}, "targets[0] is not an object"),
        (
            {**GOOD_STATE, "targets": [{"target": "a", "up": "yes", "engine": None}]},
            "targets[0].up is not true or false",
        ),
        (
            _with_instance(saturation_eta_seconds="soon"),
            "targets[0].instances[0].saturation_eta_seconds is not seconds",
        ),
        (
            _with_instance(kv_usage_history=[[1.0, 0.5]] * 9 + ["x"]),
            "targets[0].instances[0].kv_usage_history[9] is not a [time, ratio] pair",
        ),
        (
            {**GOOD_STATE, "nvml": {"up": True, "error": None, "driver_version": "1", "gpus": [{"gpu": 0}]}},
            "nvml.gpus[0].name is not text",
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
