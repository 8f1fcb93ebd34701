"""A real `plimsoll run` process on loopback, and page servers in a thread, for black-box reliability tests.

The daemon runs as users run it (`python -m exporter run --config FILE`), on a free 127.0.0.1 port with NVML off,
its stderr in a log file under the test's temporary directory. It is ready when /healthz answers; leaving the
context sends SIGTERM, then SIGKILL after a grace period, and always waits, so no process outlives the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.support.prometheus import LOOPBACK, NotReady, free_port, http, stop_process, wait_until

READY_TIMEOUT_S = 20.0


@dataclass
class DaemonProcess:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    config_path: Path | None

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, Any]:
        return http("GET", self.url + path, timeout_s=timeout_s)

    def state(self) -> dict[str, Any]:
        status, body = self.get("/api/v1/state")
        if status != 200 or not isinstance(body, dict):
            raise AssertionError(f"/api/v1/state answered {status}: {str(body)[:200]}")
        return body

    def targets(self) -> dict[str, dict[str, Any]]:
        return {t["target"]: t for t in self.state()["targets"]}

    def wait_for_state(self, check: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            self.assert_running()
            state = self.state()
            return state if check(state) else None

        return wait_until(probe, timeout_s, what)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")

    def assert_running(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"plimsoll exited with {self.process.returncode}:\n{self.log()[-4000:]}")

    def signal(self, number: int) -> None:
        self.process.send_signal(number)

    def stop(self) -> int:
        return stop_process(self.process)


def _healthy(daemon: DaemonProcess) -> bool | None:
    daemon.assert_running()
    try:
        status, _ = daemon.get("/healthz", timeout_s=2.0)
    except OSError:
        return None
    return status == 200 or None


# A port free_port found can be taken before the daemon binds it (by any process's outgoing connection): the start
# is tried again on another port, so a busy machine does not fail a test that is not about the port.
_PORT_TRIES = 3


@contextlib.contextmanager
def running_daemon(
    workdir: Path,
    config: Mapping[str, Any] | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[DaemonProcess]:
    """`plimsoll run` with `config` written to workdir/plimsoll.yaml (None: no --config) plus `args`."""
    config_path = None
    if config is not None:
        config_path = workdir / "plimsoll.yaml"
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    for attempt in range(1, _PORT_TRIES + 1):
        daemon = _started(workdir, config_path, args, env)
        try:
            wait_until(functools.partial(_healthy, daemon), READY_TIMEOUT_S, f"plimsoll answering on {daemon.url}")
        except NotReady as error:
            daemon.stop()
            raise AssertionError(f"{error}\n{daemon.log()[-4000:]}") from None
        except AssertionError:
            daemon.stop()
            if attempt < _PORT_TRIES and "address already in use" in daemon.log():
                continue
            raise
        break
    try:
        yield daemon
    finally:
        daemon.stop()


def _started(
    workdir: Path, config_path: Path | None, args: Sequence[str], env: Mapping[str, str] | None
) -> DaemonProcess:
    port = free_port()
    argv = [sys.executable, "-m", "exporter", "run", "--listen", f"{LOOPBACK}:{port}", "--nvml", "off", *args]
    if config_path is not None:
        argv += ["--config", str(config_path)]
    log_path = workdir / "plimsoll.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=None if env is None else dict(env))
    return DaemonProcess(process, f"http://{LOOPBACK}:{port}", log_path, config_path)


@contextlib.contextmanager
def app_in_thread(app: web.Application, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve an aiohttp app on a free loopback port from a thread of its own (the CLI under test runs its own event
    loop), over TLS with `tls`; yields the base URL."""
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, LOOPBACK, 0, ssl_context=tls)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        holder["port"] = server.sockets[0].getsockname()[1]
        holder["stop"] = asyncio.Event()
        holder["loop"] = asyncio.get_running_loop()
        started.set()
        try:
            await holder["stop"].wait()
        finally:
            await runner.cleanup()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    if not started.wait(10):
        raise AssertionError("page server did not start within 10 s")
    try:
        yield f"{'https' if tls else 'http'}://{LOOPBACK}:{holder['port']}"
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(10)


def interrupted_while_waiting(
    argv: Sequence[str], waiting: Callable[[], bool], timeout_seconds: float
) -> subprocess.CompletedProcess[str]:
    """`python -m exporter *argv` in a process of its own, sent Ctrl-C (SIGINT) once `waiting()` says it is waiting
    on a server; its exit status and output. Always reaped, killed if it outlives the timeout."""
    command = [sys.executable, "-m", "exporter", *argv]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(waiting, timeout_seconds, f"plimsoll {argv[0]} waiting on the server")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=timeout_seconds)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def into_a_closed_pipe(argv: Sequence[str], timeout_seconds: float) -> subprocess.CompletedProcess[str]:
    """`python -m exporter *argv` writing into a pipe nobody reads (`plimsoll ... | head -1` once head is gone: the
    first write fails with EPIPE); its exit status and stderr."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(
            [sys.executable, "-m", "exporter", *argv],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout_seconds,
        )
    finally:
        os.close(writer)
