"""`plimsoll autoscale replay --prometheus` against a Prometheus that never finishes answering, through the real CLI:
the whole read has a budget (--prometheus-timeout, or its environment twin), and running out of it is one line naming
the server and what to do, exit 2, nothing written. The server holds every query open until the test ends, far past
the per-query deadline's 60 s, so only the budget can end the run within the test's time."""

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from exporter.cli import main
from tests.support.daemon_process import app_in_thread

CONFIG = """autoscaling:
  workloads:
    - model: chat
      name: vllm-chat
      namespace: inference
      min_replicas: 1
      max_replicas: 10
      startup: 60s
      knee_concurrency: 4
"""


@dataclass
class Stalled:
    url: str = ""
    asked: threading.Event = field(default_factory=threading.Event)  # a query arrived
    release: threading.Event = field(default_factory=threading.Event)  # the test is over: answer


@contextlib.contextmanager
def _stalled() -> Iterator[Stalled]:
    """A query API on a free loopback port that holds each query until the test ends."""
    stalled = Stalled()

    async def respond(request: web.Request) -> web.Response:
        stalled.asked.set()
        while not stalled.release.is_set():
            await asyncio.sleep(0.02)
        return web.json_response({"status": "error", "error": "released"}, status=503)

    app = web.Application()
    app.router.add_get("/api/v1/query_range", respond)
    with app_in_thread(app) as url:
        stalled.url = url
        try:
            yield stalled
        finally:
            stalled.release.set()  # before the server stops: it waits for the queries it holds


@pytest.mark.parametrize("given", ["flag", "environment"])
def test_a_prometheus_slower_than_the_budget_is_one_line_naming_it_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    config = tmp_path / "plimsoll.yaml"
    config.write_text(CONFIG)
    out_dir = tmp_path / "out"
    if given == "flag":
        budget = ["--prometheus-timeout", "300ms"]
    else:
        budget = []
        monkeypatch.setenv("PLIMSOLL_PROMETHEUS_TIMEOUT", "300ms")
    with _stalled() as stalled:
        argv = ["autoscale", "replay", "--config", str(config), "--prometheus", stalled.url, "--since", "10m"]
        status = main([*argv, *budget, "--out", str(out_dir)])
        asked = stalled.asked.is_set()
    captured = capsys.readouterr()
    assert asked, "no query reached the server"
    assert status == 2
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert stalled.url in captured.err
    assert (
        "longer than --prometheus-timeout 300ms" in captured.err
        and "give a longer --prometheus-timeout" in captured.err
    )
    assert not out_dir.exists()
