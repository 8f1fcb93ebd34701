"""What `plimsoll status` does once its flags are parsed: read a daemon's /api/v1/state and print the status
page's rows (exporter/status_format.py gives both the same words), once or refreshed in place.

Exit 0 with a state, 1 when the daemon cannot be read (down, not Plimsoll, refused credentials: one line on stderr);
a bad flag is a ValueError, which the CLI turns into exit 2.
"""

import argparse
import base64
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from exporter import status_format
from exporter.status_command import DEFAULT_URL, PASSWORD_ENV

STATE_PATH = "/api/v1/state"
# A daemon's state is kilobytes per target; a reply past this is not one.
MAX_STATE_BYTES = 64 * 1024 * 1024
SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_POINTS = 20
LEVEL_STYLES = {"at": "bold red", "near": "bold yellow", "ok": "", "none": "dim italic"}


class DaemonUnreadable(Exception):
    """The daemon could not be read; the message is the one line the user sees."""


@dataclass(frozen=True)
class Fetched:
    state: Mapping[str, Any]
    daemon_now: float  # the daemon's clock when it answered (its Date header), for the snapshot's age


@dataclass(frozen=True)
class Request:
    url: str  # the state document's URL
    timeout_seconds: float
    tls: ssl.SSLContext | None
    authorization: str | None


def state_url(url: str) -> str:
    """The daemon's base URL (or its state URL) as the state document's URL."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"URL: {url!r} is not an http:// or https:// URL (e.g. {DEFAULT_URL})")
    base = url.rstrip("/")
    return base if base.endswith(STATE_PATH) else base + STATE_PATH


def _is_state(document: Any) -> bool:
    return (
        isinstance(document, dict)
        and isinstance(document.get("targets"), list)
        and isinstance(document.get("nvml"), dict)
        and isinstance(document.get("saturation_kv_usage"), (int, float))
    )


def fetch(request: Request) -> Fetched:
    headers = {"Accept": "application/json"}
    if request.authorization:
        headers["Authorization"] = request.authorization
    http_request = urllib.request.Request(request.url, headers=headers)
    try:
        with urllib.request.urlopen(http_request, timeout=request.timeout_seconds, context=request.tls) as response:
            body = response.read(MAX_STATE_BYTES + 1)
            date = response.headers.get("Date")
    except urllib.error.HTTPError as error:
        if error.code == 401:
            raise DaemonUnreadable(
                f"{request.url}: 401 Unauthorized (give --basic-auth-user and the password in {PASSWORD_ENV} or "
                "--password-file)"
            ) from None
        raise DaemonUnreadable(f"{request.url}: HTTP {error.code}: not a Plimsoll daemon's state") from None
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, ssl.SSLError):
            raise DaemonUnreadable(
                f"{request.url}: TLS failed: {reason.reason or reason} (--ca-file names the CA of the daemon's "
                "certificate)"
            ) from None
        words = getattr(reason, "strerror", None) or str(reason)
        raise DaemonUnreadable(f"cannot reach {request.url}: {words} (is `plimsoll run` listening there?)") from None
    except TimeoutError:
        raise DaemonUnreadable(f"{request.url}: no answer within {request.timeout_seconds:g}s") from None
    except (OSError, ValueError) as error:
        raise DaemonUnreadable(f"{request.url}: {error}") from None
    try:
        document: Any = json.loads(body) if len(body) <= MAX_STATE_BYTES else None
    except ValueError:
        document = None
    if not _is_state(document):
        raise DaemonUnreadable(f"{request.url}: the answer is not a Plimsoll daemon's state (wrong port?)")
    try:
        now = parsedate_to_datetime(date).timestamp() if date else time.time()
    except (TypeError, ValueError):
        now = time.time()
    return Fetched(document, now)


def sparkline(history: tuple[tuple[float, float], ...]) -> str:
    values = [min(max(v, 0.0), 1.0) for _, v in history[-SPARK_POINTS:]]
    return "".join(SPARK_BLOCKS[min(int(v * len(SPARK_BLOCKS)), len(SPARK_BLOCKS) - 1)] for v in values)


def _text(cell: status_format.Cell, style: str = "") -> Text:
    return Text(cell.text, style="dim italic" if cell.missing else style)


def render(fetched: Fetched, url: str, problem: str | None = None) -> RenderableType:
    state = fetched.state
    threshold = float(state["saturation_kv_usage"])
    taken_at = float(state["taken_at"])
    head = Text.assemble(
        ("plimsoll ", "bold"),
        f"{url} · threshold {status_format.percent(threshold)} KV usage · snapshot ",
        f"{status_format.age(taken_at, fetched.daemon_now)} ({status_format.taken_at_text(taken_at)})",
    )
    if problem:
        head.append(f" · cannot refresh: {problem}", style="red")
    rows = Table(box=None, header_style="bold", pad_edge=False)
    for name, justify in (
        ("target", "left"),
        ("engine", "left"),
        ("model", "left"),
        ("KV usage", "right"),
        ("headroom tokens", "right"),
        ("headroom requests (p95)", "right"),
        ("running / waiting", "right"),
        ("preemptions", "right"),
        ("saturation in", "right"),
        ("model drift", "right"),
        ("KV history", "left"),
    ):
        rows.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in status_format.instance_rows(state):
        if row.down is not None:
            rows.add_row(row.target, row.engine, Text(row.down, style="red"))
            continue
        rows.add_row(
            row.target,
            row.engine,
            _text(row.model),
            _text(row.kv_usage, LEVEL_STYLES[row.kv_level]),
            _text(row.headroom_tokens),
            _text(row.headroom_requests_p95),
            _text(row.running_waiting),
            _text(row.preemptions),
            _text(row.saturation_in),
            _text(row.model_drift),
            sparkline(row.kv_usage_history),
        )
    nvml = Text(status_format.nvml_line(state), style="bold")
    gpu_rows = status_format.gpu_rows(state)
    if not gpu_rows:
        return Group(head, Text(""), rows, Text(""), nvml)
    gpus = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("gpu", "name", "memory used / total", "process", "memory", "target", "unexplained"):
        gpus.add_column(name)
    for gpu in gpu_rows:
        gpus.add_row(gpu.gpu, gpu.name, gpu.memory, "", "", "", _text(gpu.unexplained))
        for process in gpu.processes:
            gpus.add_row("", "", "", process.pid, process.memory, process.target, "")
    return Group(head, Text(""), rows, Text(""), nvml, gpus)


def _authorization(args: argparse.Namespace) -> str | None:
    if args.basic_auth_user is None:
        if args.password_file:
            raise ValueError("--password-file: needs --basic-auth-user")
        return None
    if args.password_file:
        try:
            password = Path(args.password_file).read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--password-file: cannot read {args.password_file}: {error}") from None
    elif PASSWORD_ENV in os.environ:
        password = os.environ[PASSWORD_ENV]
    else:
        raise ValueError(f"--basic-auth-user: needs a password, in {PASSWORD_ENV} or a file named by --password-file")
    token = base64.b64encode(f"{args.basic_auth_user}:{password}".encode()).decode()
    return f"Basic {token}"


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if args.ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=args.ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"--ca-file: cannot load {args.ca_file}: {error}") from None


def _watch(request: Request, first: Fetched, url: str, interval: float) -> int:
    last, problem = first, None
    with Live(render(first, url), auto_refresh=False, transient=False) as live:
        try:
            while True:
                time.sleep(interval)  # the refresh period the user asked for, not a wait on a condition
                try:
                    last, problem = fetch(request), None
                except DaemonUnreadable as error:
                    problem = str(error)  # keep the last rows on screen, say why they are not refreshed
                live.update(render(last, url, problem), refresh=True)
        except KeyboardInterrupt:
            return 0


def run_status(args: argparse.Namespace) -> int:
    request = Request(state_url(args.url), args.timeout, _tls(args), _authorization(args))
    try:
        fetched = fetch(request)
    except DaemonUnreadable as error:
        print(f"plimsoll status: {error}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps(fetched.state, indent=2))
        return 0
    if args.watch:
        return _watch(request, fetched, args.url, args.interval)
    Console().print(render(fetched, args.url))
    return 0
