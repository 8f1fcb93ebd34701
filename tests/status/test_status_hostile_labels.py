"""`plimsoll status` against a real `plimsoll run` that polls an engine whose labels (data-parallel rank, model)
and whose target's name hold rich markup and terminal escapes: the rows print them as sent, escaped, and nothing
in them acts on the terminal or on rich."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.status.command import run_status
from tests.support.daemon_process import DaemonProcess, app_in_thread, running_daemon

TARGET = "[/]target"
RANKS = ("[/]0", "[bold]1[/bold]")
MODEL = "[link=http://x]m\x1b]0;owned\x07\x1b[2J"
_LINES = {"vllm:num_requests_running": "3", "vllm:kv_cache_usage_perc": "0.25"}
# Prometheus text: a label value may hold any character but a backslash, a quote or a line break unescaped.
PAGE = "".join(
    f"# TYPE {name} gauge\n" + "".join(f'{name}{{engine="{rank}",model_name="{MODEL}"}} {value}\n' for rank in RANKS)
    for name, value in _LINES.items()
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    app = web.Application()
    app.router.add_get("/metrics", page)
    with app_in_thread(app) as pages:
        config = {"poll_interval": "500ms", "targets": [{"name": TARGET, "url": f"{pages}/metrics"}]}
        workdir: Path = tmp_path_factory.mktemp("labels")
        with running_daemon(workdir, config) as process:
            process.wait_for_state(
                lambda state: bool(state["targets"] and state["targets"][0]["instances"]), 20.0, "the first poll"
            )
            yield process


def test_markup_and_escapes_in_engine_labels_print_as_sent(daemon: DaemonProcess):
    done = run_status(daemon.url)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith(TARGET + " ")]
    assert len(rows) == 2, done.stdout
    for rank, row in zip(RANKS, rows, strict=True):
        assert f" vllm {rank} " in row, row
        assert "[link=http://x]m\\x1b]0;owned\\x07" in row, row  # the column may cut what follows
