"""vLLM /metrics pages whose load a test sets, served on loopback: real captures with the request gauges replaced.

A page is a real capture from tests/fixtures/engines, changed in memory only (the files are never written):
- its `model_name` label says the model the test serves (the daemon labels every engine series with it);
- a page of several data-parallel ranks repeats the capture's one engine (`engine="0"`) as engine="1", ... (each
  family's rank-0 samples copied per rank, so every family stays in one block as the exposition format requires);
- `vllm:num_requests_running` and `vllm:num_requests_waiting` of every rank read what the test set last.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from tests.support.daemon_process import app_in_thread

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
CAPTURED_MODEL = "tiny-llama"  # the model_name the vLLM captures carry
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
_RANK_ZERO = 'engine="0"'
_RANK = re.compile(r'engine="(\d+)"')


@dataclass(frozen=True)
class Load:
    """What each rank of one engine server holds: requests running and waiting."""

    running: int
    waiting: int

    @property
    def demand(self) -> int:
        return self.running + self.waiting


IDLE = Load(0, 0)


def _with_ranks(capture: str, ranks: int) -> list[str]:
    """The capture's lines with its rank-0 samples repeated for ranks 1..ranks-1, family by family."""
    lines: list[str] = []
    block: list[str] = []

    def flush() -> None:
        rank_zero = [line for line in block if _RANK_ZERO in line and not line.startswith("#")]
        lines.extend(block)
        for rank in range(1, ranks):
            lines.extend(line.replace(_RANK_ZERO, f'engine="{rank}"') for line in rank_zero)
        block.clear()

    for line in capture.splitlines():
        if line.startswith("# HELP"):
            flush()
        block.append(line)
    flush()
    return lines


class EnginePage:
    """One vLLM server of `ranks` data-parallel ranks serving `model`, every rank holding the load set last."""

    def __init__(self, capture: str, model: str, ranks: int = 1):
        text = (FIXTURES / capture).read_text().replace(f'model_name="{CAPTURED_MODEL}"', f'model_name="{model}"')
        self._lines = tuple(_with_ranks(text, ranks))
        self.model = model
        self.ranks = ranks
        self._load = IDLE
        self._lock = threading.Lock()
        if not any(line.startswith(RUNNING + "{") for line in self._lines):
            raise ValueError(f"{capture}: no {RUNNING} sample to set")

    @property
    def load(self) -> Load:
        with self._lock:
            return self._load

    def set(self, load: Load) -> None:
        with self._lock:
            self._load = load

    @property
    def demand(self) -> int:
        """Running + waiting requests over all ranks: the server's share of its model's demand."""
        return self.load.demand * self.ranks

    def text(self) -> str:
        load = self.load
        values = {RUNNING: load.running, WAITING: load.waiting}
        out = []
        for line in self._lines:
            name = line.split("{", 1)[0]
            if name in values and _RANK.search(line):
                line = f"{line.rsplit(' ', 1)[0]} {float(values[name])}"
            out.append(line)
        return "\n".join(out) + "\n"


@contextlib.contextmanager
def serving(pages: Mapping[str, EnginePage]) -> Iterator[str]:
    """Serve each page at /page/<name> on a free loopback port; yields the base URL."""

    async def page(request: web.Request) -> web.Response:
        found = pages.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        return web.Response(text=found.text(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/page/{name}", page)
    with app_in_thread(app) as base_url:
        yield base_url
