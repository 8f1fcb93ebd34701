"""The daemon's own port under crowds and hostile clients, over real HTTP on loopback.

Most tests run a real `plimsoll run` (tests/support/daemon_process.py) polling a page server of the recorded vLLM
page tests/fixtures/engines/vllm-cpu-0.32-2mib_peak.prom; the crowd test gives it 500 targets of that page, so its
snapshot is worth rendering (/api/v1/state ~430 KB, /metrics ~900 KB uncompressed). Memory is the daemon's VmRSS
from /proc, compared with the memory limit in deploy/kubernetes/daemonset.yaml, so the test follows the manifest.
The request-cap tests run build_app in this process, where a handler that waits on an event or a client that never
reads can hold a request in flight for as long as the test needs. TLS and basic auth are checked end to end by a
real Prometheus (the fetched binary) scraping a daemon with certificates made in the test (trustme).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import trustme
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.config import Config
from exporter.daemon import server
from exporter.daemon.poll import Daemon
from exporter.daemon.server import build_app
from tests.conftest import ENGINE_FIXTURES, TESTS
from tests.generate import conftest as generate_conftest
from tests.support.daemon_process import DaemonProcess, app_in_thread, running_daemon
from tests.support.prometheus import (
    LOOPBACK,
    free_port,
    prometheus_config,
    running_prometheus,
    scrape_job,
    wait_until,
)

# The generate tests' fixture: the real Prometheus, fetched once per session.
prometheus_tools = generate_conftest.prometheus_tools

PAGE = "vllm-cpu-0.32-2mib_peak.prom"
DAEMONSET = TESTS.parent / "deploy" / "kubernetes" / "daemonset.yaml"
CROWD_TARGETS = 500
CROWD_CLIENTS = 1000
CROWD_DEADLINE_S = 60.0
TARGETS_UP_TIMEOUT_S = 60.0
SLOWLORIS_CONNECTIONS = 1000
HEADER_TIMEOUT_S = 1.0
SLOWLORIS_GIVE_UP_S = 10.0
DRIBBLE_EVERY_S = 0.2
COMMAND_TIMEOUT_S = 20.0
CONDITION_TIMEOUT_S = 10.0


def _daemonset_memory_limit() -> int:
    """The container's memory limit in bytes, from a Kubernetes quantity such as 128Mi."""
    daemonset = yaml.safe_load(DAEMONSET.read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    quantity = str(container["resources"]["limits"]["memory"])
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def _engine_pages() -> web.Application:
    """Every /<anything>/metrics answers the recorded vLLM page."""
    text = (ENGINE_FIXTURES / PAGE).read_text()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{name}/metrics", page)
    return app


def _fleet(base: str | None, count: int, **extra: Any) -> dict[str, Any]:
    """A config of `count` targets at the page server `base`. Polled once a minute: a crowd meets one snapshot, as
    it would between two polls."""
    targets = [{"name": f"vllm-{i}", "url": f"{base}/{i}/metrics"} for i in range(count)]
    return {"poll_interval": "60s", "targets": targets, **extra}


def _all_up(daemon: DaemonProcess, count: int) -> None:
    daemon.wait_for_state(
        lambda state: sum(t["up"] for t in state["targets"]) == count, TARGETS_UP_TIMEOUT_S, f"{count} targets up"
    )


@dataclass
class Rss:
    """The daemon's resident memory, sampled every 20 ms from a thread: the peak while clients are connected and
    the samples taken once they have gone."""

    daemon: DaemonProcess
    during: int = 0
    after: list[int] = field(default_factory=list)
    clients_gone: bool = False

    def sample(self, stop: threading.Event) -> None:
        while not stop.wait(0.02):
            rss = self.daemon.rss_bytes()
            if self.clients_gone:
                self.after.append(rss)
            else:
                self.during = max(self.during, rss)


@contextlib.contextmanager
def _sampling(daemon: DaemonProcess) -> Iterator[Rss]:
    rss = Rss(daemon)
    stop = threading.Event()
    thread = threading.Thread(target=rss.sample, args=(stop,), name="rss-sampler")
    thread.start()
    try:
        yield rss
    finally:
        stop.set()
        thread.join()


async def _crowd(url: str, clients: int) -> list[int | str]:
    """`clients` clients at once, each on its own connection with one request: two in five on /api/v1/state (the
    page of the report), the rest on /metrics (gzip and plain) and /; each result a status, or the name of what
    went wrong (a timeout included)."""
    kinds = (
        ("/api/v1/state", {}),
        ("/api/v1/state", {}),
        ("/metrics", {}),  # aiohttp asks for gzip by default
        ("/metrics", {"Accept-Encoding": "identity"}),
        ("/", {}),
    )
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=CROWD_DEADLINE_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int) -> int | str:
            path, headers = kinds[i % len(kinds)]
            try:
                async with session.get(url + path, headers=headers) as response:
                    await response.read()
                    return response.status
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                return type(error).__name__

        return await asyncio.gather(*(one(i) for i in range(clients)))


def test_a_thousand_concurrent_clients_are_answered_and_memory_stays_under_the_daemonsets_limit(tmp_path):
    limit = _daemonset_memory_limit()
    with app_in_thread(_engine_pages()) as base, running_daemon(tmp_path, _fleet(base, CROWD_TARGETS)) as daemon:
        _all_up(daemon, CROWD_TARGETS)
        with _sampling(daemon) as rss:
            started = time.monotonic()
            results = asyncio.run(_crowd(daemon.url, CROWD_CLIENTS))
            took = time.monotonic() - started
            rss.clients_gone = True
            wait_until(lambda: len(rss.after) >= 50, CONDITION_TIMEOUT_S, "a second of memory samples after the crowd")
        daemon.assert_running()
    outcomes = Counter(results)
    assert set(outcomes) <= {200, 503}, f"every client answered 200 or 503 within {CROWD_DEADLINE_S:g}s: {outcomes}"
    assert outcomes[200] >= CROWD_CLIENTS // 10, f"the daemon served, not only refused: {outcomes}"
    mib = 1024 * 1024
    assert rss.during < limit, (
        f"peak RSS {rss.during / mib:.0f} MiB with {CROWD_CLIENTS} clients (limit {limit / mib:g})"
    )
    assert max(rss.after) < limit, f"RSS {max(rss.after) / mib:.0f} MiB after the clients left (limit {limit / mib:g})"
    print(f"{CROWD_CLIENTS} clients in {took:.1f}s: {dict(outcomes)}; peak RSS {rss.during / mib:.0f} MiB")


@dataclass
class Slowloris:
    closed_after: list[float | None]  # per connection: seconds until the daemon closed it; None: still open
    served_meanwhile: int  # the status of a normal request made while every connection was open


async def _slowloris(url: str, connections: int) -> Slowloris:
    """`connections` connections that each send a request line and then one header line every DRIBBLE_EVERY_S,
    never finishing, until the daemon closes them or SLOWLORIS_GIVE_UP_S passes; once all are open, one normal
    request. Times count from before each connection exists, so none is shorter than the daemon's own timer however
    long this process takes to see a thousand connections open."""
    host, port = url.removeprefix("http://").split(":")
    opened: list[int] = []
    all_open = asyncio.Event()

    async def one() -> float | None:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: plimsoll\r\n")
        opened.append(1)
        if len(opened) == connections:
            all_open.set()
        closed = asyncio.ensure_future(reader.read(1))
        try:
            while time.monotonic() - started < SLOWLORIS_GIVE_UP_S:
                done, _ = await asyncio.wait({closed}, timeout=DRIBBLE_EVERY_S)
                if done:
                    return time.monotonic() - started
                writer.write(b"X-Slow: 1\r\n")
            return None
        except ConnectionError:
            return time.monotonic() - started
        finally:
            closed.cancel()
            writer.close()

    async def normal_request() -> int:
        await asyncio.wait_for(all_open.wait(), SLOWLORIS_GIVE_UP_S)
        async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
            return response.status

    *closed_after, served = await asyncio.gather(*(one() for _ in range(connections)), normal_request())
    return Slowloris(closed_after, served)


def test_slowloris_connections_are_closed_after_the_header_timeout(tmp_path):
    config = _fleet(None, 0, request_header_timeout=f"{HEADER_TIMEOUT_S:g}s")
    with running_daemon(tmp_path, config) as daemon, _sampling(daemon) as rss:
        storm = asyncio.run(_slowloris(daemon.url, SLOWLORIS_CONNECTIONS))
    still_open = storm.closed_after.count(None)
    assert still_open == 0, f"{still_open} of {SLOWLORIS_CONNECTIONS} still open after {SLOWLORIS_GIVE_UP_S:g}s"
    first = min(seconds for seconds in storm.closed_after if seconds is not None)
    assert first >= HEADER_TIMEOUT_S, f"one closed after {first:.2f}s, before the header timeout"
    assert storm.served_meanwhile == 200
    assert rss.during < _daemonset_memory_limit()


@contextlib.asynccontextmanager
async def _in_process(config: Config, app_setup=None):
    """build_app over a daemon with no targets, on 127.0.0.1 in this process; yields (base URL, app)."""
    app = build_app(Daemon(config))
    if app_setup is not None:
        app_setup(app)
    test_server = TestServer(app, host=LOOPBACK)
    await test_server.start_server()
    try:
        yield f"http://{LOOPBACK}:{test_server.port}"
    finally:
        await test_server.close()


async def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + CONDITION_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {CONDITION_TIMEOUT_S:g}s: {what}")
        await asyncio.sleep(0.01)


def test_requests_past_the_cap_get_503_at_once_and_the_probes_still_answer():
    release = asyncio.Event()
    entered: list[int] = []

    async def held(request: web.Request) -> web.Response:
        entered.append(1)
        await release.wait()
        return web.Response(text="done")

    async def go():
        config = Config(nvml=False, max_concurrent_requests=2)
        async with (
            _in_process(config, lambda app: app.router.add_get("/held", held)) as base,
            aiohttp.ClientSession() as session,
        ):
            holders = [asyncio.ensure_future(session.get(base + "/held")) for _ in range(2)]
            await _wait_for(lambda: len(entered) == 2, "two requests in flight")
            refused = await session.get(base + "/metrics")
            probes = {path: await (await session.get(base + path)).text() for path in ("/healthz", "/readyz")}
            release.set()
            for holder in holders:
                assert (await holder).status == 200
            after = await session.get(base + "/api/v1/state")
            return refused.status, refused.headers.get("Retry-After"), probes, after.status

    refused, retry_after, probes, after = asyncio.run(go())
    assert (refused, retry_after) == (503, "1")
    assert probes["/healthz"] == "ok\n"
    assert not probes["/readyz"].startswith("busy"), "the readiness probe is answered past the cap"
    assert after == 200


def test_a_client_that_never_reads_holds_its_slot_only_until_the_send_timeout(monkeypatch):
    monkeypatch.setattr(server, "SEND_TIMEOUT_SECONDS", 1.0)
    big = b"x" * (32 * 1024 * 1024)  # more than the kernel buffers on both ends hold

    async def large(request: web.Request) -> web.Response:
        return web.Response(body=big)

    async def go():
        config = Config(nvml=False, max_concurrent_requests=1)
        async with _in_process(config, lambda app: app.router.add_get("/large", large)) as base:
            port = int(base.rsplit(":", 1)[1])
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.connect((LOOPBACK, port))
            reader.sendall(b"GET /large HTTP/1.1\r\nHost: plimsoll\r\n\r\n")
            statuses: list[int] = []
            async with aiohttp.ClientSession() as session:

                async def status() -> int:
                    async with session.get(base + "/metrics") as response:
                        statuses.append(response.status)
                        return response.status

                try:
                    while await status() != 503:
                        assert len(statuses) < 1000, "the unread response never held the only slot"
                    started = time.monotonic()
                    while await status() != 200:
                        assert time.monotonic() - started < CONDITION_TIMEOUT_S, "the slot was never freed"
                    freed_after = time.monotonic() - started
                finally:
                    reader.close()
            return freed_after

    freed_after = asyncio.run(go())
    assert freed_after < 5.0


def _malformed(url: str, count: int) -> list[bytes]:
    host, port = url.removeprefix("http://").split(":")
    answers = []
    for _ in range(count):
        with socket.create_connection((host, int(port)), timeout=5) as connection:
            connection.sendall(b"GET /metrics HTTP/9.9\r\nHost: plimsoll\r\n\r\n")
            answers.append(connection.recv(64))
    return answers


def test_malformed_requests_are_answered_400_and_logged_once_without_a_traceback(tmp_path):
    with running_daemon(tmp_path, _fleet(None, 0)) as daemon:
        answers = _malformed(daemon.url, 20)
        status, _ = daemon.get("/healthz")
        log = daemon.log()
    assert all(answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400") for answer in answers)
    assert status == 200
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "malformed request" in line]
    assert len(lines) == 1, log[-3000:]
    assert "127.0.0.1" in lines[0]


def test_sighup_without_a_config_file_leaves_the_daemon_running(tmp_path):
    with (
        app_in_thread(_engine_pages()) as base,
        running_daemon(tmp_path, None, args=["--target", f"{base}/0/metrics"]) as daemon,
    ):
        daemon.signal(signal.SIGHUP)
        wait_until(
            lambda: daemon.assert_running() or "SIGHUP: no --config or --web-config to reload" in daemon.log(),
            CONDITION_TIMEOUT_S,
            "the SIGHUP logged",
        )
        status, _ = daemon.get("/healthz")
        assert status == 200
        assert daemon.stop() == 0


def test_sighup_applies_a_good_config_and_keeps_the_running_one_when_the_file_is_bad(tmp_path):
    # Polled every second: a new config applies from the next poll cycle.
    with (
        app_in_thread(_engine_pages()) as base,
        running_daemon(tmp_path, _fleet(base, 1, poll_interval="1s")) as daemon,
    ):
        _all_up(daemon, 1)
        assert daemon.config_path is not None
        daemon.config_path.write_text("targets: [\n")
        daemon.signal(signal.SIGHUP)
        wait_until(
            lambda: daemon.assert_running() or "config reload rejected" in daemon.log(),
            CONDITION_TIMEOUT_S,
            "the bad file rejected",
        )
        assert set(daemon.targets()) == {"vllm-0"}
        daemon.config_path.write_text(yaml.safe_dump(_fleet(base, 2, poll_interval="1s")))
        daemon.signal(signal.SIGHUP)
        daemon.wait_for_state(
            lambda state: {t["target"] for t in state["targets"]} == {"vllm-0", "vllm-1"},
            CONDITION_TIMEOUT_S,
            "the second target from the reloaded file",
        )


def test_a_port_in_use_is_one_line_and_exit_2():
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "exporter", "run", "--listen", f"{LOOPBACK}:{port}", "--nvml", "off"],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    assert len(output.splitlines()) == 1, output
    assert f"{LOOPBACK}:{port}" in output and "address already in use" in output


# --- TLS and basic auth, scraped by a real Prometheus -------------------------------------------------------------

USER = "prometheus"
PASSWORD = "correct horse battery staple"


@dataclass(frozen=True)
class Secured:
    web_config: Path
    ca_file: Path
    password_file: Path
    wrong_password: Path
    ca: trustme.CA


def _secured(directory: Path) -> Secured:
    """A CA, a certificate for 127.0.0.1 signed by it, and a web config requiring TLS and user `prometheus`."""
    ca = trustme.CA()
    certificate = ca.issue_cert(LOOPBACK)
    certificate.private_key_and_cert_chain_pem.write_to_path(str(directory / "server.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web_config = directory / "web.yml"
    web_config.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": "server.pem", "key_file": "server.pem"},
                "basic_auth_users": {USER: hashed},
            }
        )
    )
    (directory / "password").write_text(PASSWORD)
    (directory / "wrong-password").write_text("not the password")
    return Secured(web_config, directory / "ca.pem", directory / "password", directory / "wrong-password", ca)


@contextlib.contextmanager
def _tls_daemon(workdir: Path, base: str, secured: Secured) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`plimsoll run --web-config`, ready when /healthz answers over TLS; yields its address (host:port) and
    process."""
    address = f"{LOOPBACK}:{free_port()}"
    config = workdir / "plimsoll.yaml"
    config.write_text(yaml.safe_dump({**_fleet(base, 1), "poll_interval": "1s"}))
    argv = [sys.executable, "-m", "exporter", "run", "--config", str(config), "--listen", address, "--nvml", "off"]
    log_path = workdir / "plimsoll.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([*argv, "--web-config", str(secured.web_config)], stdout=log, stderr=log)
    context = ssl.create_default_context()
    secured.ca.configure_trust(context)

    def healthy() -> bool | None:
        if process.poll() is not None:
            raise AssertionError(f"plimsoll exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        return _https_status(f"https://{address}/healthz", context) == 200 or None

    try:
        wait_until(healthy, COMMAND_TIMEOUT_S, f"plimsoll answering over TLS on {address}")
        yield address, process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _served_certificate(address: str, context: ssl.SSLContext) -> bytes:
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        served = tls.getpeercert(binary_form=True)
    assert served is not None
    return served


def test_a_certificate_renewed_on_disk_serves_new_connections_after_sighup_without_closing_the_port(tmp_path):
    secured = _secured(tmp_path)
    trust = ssl.create_default_context()
    secured.ca.configure_trust(trust)
    with app_in_thread(_engine_pages()) as base, _tls_daemon(tmp_path, base, secured) as (address, process):
        first = _served_certificate(address, trust)
        # What cert-manager does: the same files, a new certificate from the same CA.
        secured.ca.issue_cert(LOOPBACK).private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
        renewed = ssl.DER_cert_to_PEM_cert(first) not in (tmp_path / "server.pem").read_text()
        assert renewed, "the test's new certificate is the old one"
        process.send_signal(signal.SIGHUP)
        wait_until(
            lambda: _served_certificate(address, trust) != first or None,
            COMMAND_TIMEOUT_S,
            "the renewed certificate served after SIGHUP",
        )
        assert process.poll() is None
        assert _https_status(f"https://{address}/healthz", trust) == 200
    log = (tmp_path / "plimsoll.log").read_text()
    assert "certificates and client CA serve new connections" in log, log[-3000:]


def _https_status(url: str, context: ssl.SSLContext) -> int | None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def test_prometheus_scrapes_the_daemon_over_tls_with_basic_auth_and_a_wrong_password_is_refused(
    tmp_path, prometheus_tools
):
    secured = _secured(tmp_path)
    with app_in_thread(_engine_pages()) as base, _tls_daemon(tmp_path, base, secured) as (address, _):
        tls = {"ca_file": str(secured.ca_file)}
        jobs = [
            scrape_job(
                "plimsoll-tls", [address], tls_config=tls, username="prometheus", password_file=secured.password_file
            ),
            scrape_job(
                "plimsoll-wrong",
                [address],
                tls_config=tls,
                username="prometheus",
                password_file=secured.wrong_password,
            ),
        ]
        config = prometheus_config(jobs, rule_files=[])
        with running_prometheus(prometheus_tools["prometheus"], tmp_path / "prometheus", config) as prometheus:

            def scraped() -> dict[str, Any] | None:
                up = {s["metric"]["job"]: s["value"][1] for s in prometheus.query("up")}
                series = prometheus.query('plimsoll_target_up{job="plimsoll-tls"}')
                return {"up": up, "series": series} if len(up) == 2 and series else None

            seen = wait_until(scraped, 15.0, "both jobs scraped and a plimsoll series from the TLS job")
    assert seen["up"] == {"plimsoll-tls": "1", "plimsoll-wrong": "0"}
    assert seen["series"][0]["metric"]["target"] == "vllm-0"
