"""Real Prometheus and Alertmanager processes on loopback, a webhook receiver, and deadline polling.

Each process gets a free 127.0.0.1 port, its own data directory under the caller's (temporary) work directory and a
log file there; it is ready when its `/-/ready` answers 200, polled until a deadline (a process that exits first
fails at once, with its log). Leaving the context stops it: SIGTERM, then SIGKILL after a grace period, and always
a wait, so no process outlives the test. Every request this module makes goes to loopback, never through a proxy.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import yaml

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
_POLL_S = 0.1
_START_ATTEMPTS = 3  # a free port can be taken between asking for it and the process binding it
_LOG_TAIL = 4000
# A proxy from the environment must never carry loopback traffic elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

T = TypeVar("T")


class NotReady(AssertionError):
    """A condition polled until a deadline never held."""


def wait_until(probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Call `probe` until it returns something other than None (or False), or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() >= deadline:
            raise NotReady(f"not within {timeout_s:g}s: {what}")
        time.sleep(_POLL_S)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def http(method: str, url: str, body: Any = None, timeout_s: float = 10.0) -> tuple[int, Any]:
    """(status, parsed JSON or text) of a request to loopback; HTTP errors are returned, not raised."""
    host = urllib.parse.urlsplit(url).hostname
    if host not in (LOOPBACK, "localhost"):
        raise ValueError(f"{url}: only loopback")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    text = raw.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@dataclass
class ToolProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    url: str

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-_LOG_TAIL:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        stop_process(self.process)


def stop_process(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL after a grace period, and always a wait: no process outlives its test."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def _ready(tool: ToolProcess) -> bool | None:
    if tool.process.poll() is not None:
        raise NotReady(f"{tool.name} exited with {tool.process.returncode}:\n{tool.log_tail()}")
    try:
        status, _ = http("GET", f"{tool.url}/-/ready", timeout_s=2.0)
    except OSError:
        return None
    return status == 200 or None


@contextlib.contextmanager
def _running(name: str, argv_for_port: Callable[[int], list[str]], workdir: Path) -> Iterator[ToolProcess]:
    """Start the tool on a free port (retrying when another process took the port first), wait until ready, and
    stop it on exit, whatever happened."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        port = free_port()
        log_path = workdir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv_for_port(port), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir
            )
        tool = ToolProcess(name, process, log_path, f"http://{LOOPBACK}:{port}")
        try:
            wait_until(lambda tool=tool: _ready(tool), READY_TIMEOUT_S, f"{name} ready on {tool.url}")
        except NotReady:
            tool.stop()
            if "address already in use" in tool.log_tail() and attempt < _START_ATTEMPTS:
                continue
            raise
        break
    try:
        yield tool
    finally:
        tool.stop()


# --- Prometheus ---------------------------------------------------------------------------------------------------


@dataclass
class Prometheus:
    tool: ToolProcess

    @property
    def url(self) -> str:
        return self.tool.url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) `expr` gives now; a PromQL error raises `QueryError`."""
        status, body = http("GET", f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            raise QueryError(expr, status, body)
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def get(self, path: str) -> Any:
        status, body = http("GET", f"{self.url}{path}")
        assert status == 200 and body.get("status") == "success", (path, status, body)
        return body["data"]


class QueryError(AssertionError):
    def __init__(self, expr: str, status: int, body: Any):
        detail = body.get("error") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {detail}\nquery: {expr}")
        self.status = status


def prometheus_config(
    scrape_configs: Sequence[Mapping[str, Any]],
    rule_files: Sequence[Path],
    alertmanager: str | None = None,
    interval: str = "1s",
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": list(scrape_configs),
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"api_version": "v2", "static_configs": [{"targets": [alertmanager]}]}]}
    return config


def scrape_job(
    job: str,
    targets: Sequence[str],
    *,
    tls_config: Mapping[str, Any] | None = None,
    username: str | None = None,
    password_file: Path | None = None,
) -> dict[str, Any]:
    """A static scrape config for `targets` (host:port): over HTTPS when `tls_config` is given (Prometheus'
    tls_config, e.g. {"ca_file": ...}), with basic auth when `username` is (the password read from `password_file`
    at each scrape, as Prometheus does)."""
    config: dict[str, Any] = {"job_name": job, "static_configs": [{"targets": list(targets)}]}
    if tls_config is not None:
        config["scheme"] = "https"
        config["tls_config"] = dict(tls_config)
    if username is not None:
        config["basic_auth"] = {"username": username, "password_file": str(password_file)}
    return config


@contextlib.contextmanager
def running_prometheus(binary: str, workdir: Path, config: Mapping[str, Any]) -> Iterator[Prometheus]:
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def argv(port: int) -> list[str]:
        return [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{port}",
            # Alerts that fire are sent at once; re-sent every second rather than every minute.
            "--rules.alert.resend-delay=1s",
        ]

    with _running("prometheus", argv, workdir) as tool:
        yield Prometheus(tool)


# --- Alertmanager -------------------------------------------------------------------------------------------------


@dataclass
class Alertmanager:
    tool: ToolProcess

    @property
    def url(self) -> str:
        return self.tool.url

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    def post(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        status, body = http("POST", f"{self.url}/api/v2/alerts", list(alerts))
        assert status == 200, (status, body)

    def alerts(self, *matchers: str) -> list[dict[str, Any]]:
        """GET /api/v2/alerts with each matcher (`alertname="X"`) as a filter; active, silenced and inhibited."""
        query = urllib.parse.urlencode([("filter", m) for m in matchers])
        status, body = http("GET", f"{self.url}/api/v2/alerts?{query}")
        assert status == 200, (status, body)
        return body


def webhooks_to(config: Mapping[str, Any], base_url: str) -> dict[str, Any]:
    """An Alertmanager config with every webhook URL's scheme, host and port replaced by `base_url`'s (the path is
    kept, so the receiver can tell the routes apart)."""
    copy = json.loads(json.dumps(config))
    for receiver in copy.get("receivers", []):
        for webhook in receiver.get("webhook_configs", []):
            path = urllib.parse.urlsplit(webhook["url"]).path
            webhook["url"] = base_url.rstrip("/") + path
    return copy


def with_short_waits(config: Mapping[str, Any], wait: str = "1s") -> dict[str, Any]:
    """The same routing tree with group_wait and group_interval `wait` at every level: notifications go out within
    a second instead of after the production waits (10s to 1h). Not zero: a group flushed the instant its first
    alert arrives can go out before the inhibitor has seen an alert that arrived with it, which no production
    config (group_wait 10s or more) does."""
    copy = json.loads(json.dumps(config))

    def fast(route: dict[str, Any]) -> None:
        route["group_wait"] = wait
        route["group_interval"] = wait
        for child in route.get("routes", []):
            fast(child)

    fast(copy["route"])
    return copy


# Debian's alertmanager build reads its notification templates (default.tmpl) from this directory, compiled in, and
# exits when they are missing; upstream builds embed them.
DEBIAN_ASSETS = b"/usr/share/prometheus/alertmanager"
_ASSETS_LINK = b"assets"


def _with_fetched_assets(binary: str, workdir: Path) -> str:
    """The binary to run: `binary` itself, or, for a Debian build whose templates were fetched into the cache
    rather than installed under /usr/share, a copy in `workdir` with the compiled-in directory rewritten to a
    relative path of the same length (`./././...assets`), resolved in `workdir` (its working directory), where a
    link points at the fetched templates. Nothing outside `workdir` is written."""
    real = Path(binary).resolve()
    data = real.read_bytes()
    if DEBIAN_ASSETS not in data or Path(DEBIAN_ASSETS.decode()).is_dir():
        return binary
    fetched = real.parents[1] / "share" / "prometheus" / "alertmanager"  # <root>/usr/bin/x -> <root>/usr/share/...
    if not (fetched / "default.tmpl").is_file():
        raise FileNotFoundError(f"{binary} reads its templates from {DEBIAN_ASSETS.decode()}; none at {fetched}")
    relative = b"./" * ((len(DEBIAN_ASSETS) - len(_ASSETS_LINK)) // 2) + _ASSETS_LINK
    assert len(relative) == len(DEBIAN_ASSETS)
    (workdir / _ASSETS_LINK.decode()).symlink_to(fetched, target_is_directory=True)
    copy = workdir / real.name
    copy.write_bytes(data.replace(DEBIAN_ASSETS, relative))
    copy.chmod(0o755)
    return str(copy)


@contextlib.contextmanager
def running_alertmanager(binary: str, workdir: Path, config: Mapping[str, Any]) -> Iterator[Alertmanager]:
    workdir.mkdir(parents=True, exist_ok=True)
    binary = _with_fetched_assets(binary, workdir)
    config_path = workdir / "alertmanager.yml"
    config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def argv(port: int) -> list[str]:
        return [
            binary,
            f"--config.file={config_path}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{port}",
            "--cluster.listen-address=",  # no gossip port: a single instance, nothing on 0.0.0.0
        ]

    with _running("alertmanager", argv, workdir) as tool:
        yield Alertmanager(tool)


# --- Webhook receiver ---------------------------------------------------------------------------------------------


@dataclass
class WebhookReceiver:
    """Alertmanager's webhook payloads as they arrive: (path, payload), in order."""

    url: str
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    arrival_times: list[float] = field(default_factory=list)  # time.monotonic() of each of `received`
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self, path: str | None = None) -> list[dict[str, Any]]:
        """Every alert received so far (on `path` only, when given), each with its payload's `receiver`."""
        with self.lock:
            found = []
            for got_path, payload in self.received:
                if path is None or got_path == path:
                    found.extend({**alert, "receiver": payload.get("receiver")} for alert in payload.get("alerts", []))
            return found


@contextlib.contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            payload = json.loads(self.rfile.read(length) or b"{}")
            with receiver.lock:
                receiver.received.append((self.path, payload))
                receiver.arrival_times.append(time.monotonic())
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    receiver.url = f"http://{LOOPBACK}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
