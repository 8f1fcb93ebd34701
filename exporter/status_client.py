"""What `plimsoll status` does once its flags are parsed: read a daemon's /api/v1/state and print the status
page's rows (exporter/status_format.py gives both the same words), once or refreshed in place.

Exit 0 with a state, 1 when the daemon cannot be read (down, not Plimsoll, refused credentials: one line on stderr);
a bad flag is a ValueError, which the CLI turns into exit 2.
"""

import argparse
import asyncio
import base64
import json
import os
import ssl
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from exporter import daemon, status_format
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


class _Malformed(Exception):
    """Where the document departs from a state's shape: "targets[0].up is not true or false"."""


_NUMBER = (int, float)
_TEXT_OR_NULL = (str, type(None))


def _field(mapping: Any, key: str, kinds: tuple[type, ...], what: str, where: str) -> Any:
    if not isinstance(mapping, dict):
        raise _Malformed(f"{where or 'the document'} is not an object")
    value = mapping.get(key)
    if not isinstance(value, kinds):
        raise _Malformed(f"{where + '.' if where else ''}{key} is not {what}")
    return value


def _list(mapping: Any, key: str, where: str) -> list[Any]:
    return _field(mapping, key, (list,), "a list", where)


def _check_instance(instance: Any, where: str) -> None:
    for key in ("engine", "dp_rank"):
        _field(instance, key, (str,), "text", where)
    _field(instance, "model", _TEXT_OR_NULL, "text or null", where)
    eta = instance.get("saturation_eta_seconds")
    if not (eta is None or eta in ("+Inf", "-Inf") or (isinstance(eta, _NUMBER) and not isinstance(eta, bool))):
        raise _Malformed(f'{where}.saturation_eta_seconds is not seconds, "+Inf" or null')
    reasons = instance.get("reasons", {})
    if not isinstance(reasons, dict) or not all(isinstance(v, str) for v in reasons.values()):
        raise _Malformed(f"{where}.reasons is not an object of text")
    for n, point in enumerate(instance.get("kv_usage_history", ())):
        if not (isinstance(point, list) and len(point) == 2 and all(isinstance(x, _NUMBER) for x in point)):
            raise _Malformed(f"{where}.kv_usage_history[{n}] is not a [time, ratio] pair")


def _check_state(document: Any) -> None:
    """Raise _Malformed unless `document` has every field the rows read, of the type they read it as. A value
    that is a number or null in a daemon's state and is something else here shows as missing, not an error."""
    _field(document, "saturation_kv_usage", _NUMBER, "a number", "")
    _field(document, "taken_at", _NUMBER, "a number", "")
    for t, target in enumerate(_list(document, "targets", "")):
        where = f"targets[{t}]"
        _field(target, "target", (str,), "text", where)
        _field(target, "up", (bool,), "true or false", where)
        for key in ("engine", "last_failure", "last_error"):
            _field(target, key, _TEXT_OR_NULL, "text or null", where)
        for i, instance in enumerate(_list(target, "instances", where)):
            _check_instance(instance, f"{where}.instances[{i}]")
    nvml = _field(document, "nvml", (dict,), "an object", "")
    _field(nvml, "up", (bool,), "true or false", "nvml")
    for key in ("error", "driver_version"):
        _field(nvml, key, _TEXT_OR_NULL, "text or null", "nvml")
    for g, gpu in enumerate(_list(nvml, "gpus", "nvml")):
        where = f"nvml.gpus[{g}]"
        _field(gpu, "gpu", (str, int), "an index", where)
        _field(gpu, "name", (str,), "text", where)
        for key in ("used_bytes", "total_bytes"):
            _field(gpu, key, _NUMBER, "a number", where)
        for p, process in enumerate(_list(gpu, "processes", where)):
            _field(process, "pid", (str, int), "a PID", f"{where}.processes[{p}]")
            _field(process, "used_bytes", (*_NUMBER, type(None)), "a number or null", f"{where}.processes[{p}]")
            _field(process, "target", _TEXT_OR_NULL, "text or null", f"{where}.processes[{p}]")


def _unreadable(request: Request, fetched: daemon.Fetched) -> DaemonUnreadable:
    """The one line for a fetch that brought no document back."""
    url, detail = request.url, fetched.detail or fetched.failure
    if fetched.failure == "timeout":
        return DaemonUnreadable(f"{url}: no answer within {request.timeout_seconds:g}s")
    if fetched.failure == "refused" and detail and detail.startswith(daemon.TLS_FAILED):
        return DaemonUnreadable(f"{url}: {detail} (--ca-file names the CA of the daemon's certificate)")
    if fetched.failure == "refused":
        return DaemonUnreadable(f"cannot reach {url}: {detail} (is `plimsoll run` listening there?)")
    if detail == "HTTP 401":
        return DaemonUnreadable(
            f"{url}: 401 Unauthorized (give --basic-auth-user and the password in {PASSWORD_ENV} or --password-file)"
        )
    if fetched.failure == "redirect":
        return DaemonUnreadable(f"{url}: {detail} (give the daemon's own URL)")
    if fetched.failure == "too_large":
        detail = f"the answer is over {MAX_STATE_BYTES:,} bytes"
    elif fetched.failure == "not_metrics":
        detail = "the answer is a web page"
    if fetched.failure == "error":
        return DaemonUnreadable(f"{url}: {detail}")
    return DaemonUnreadable(f"{url}: {detail}: not a Plimsoll daemon's state")


async def _get(request: Request) -> daemon.Fetched:
    headers = {"Accept": "application/json"}
    if request.authorization:
        headers["Authorization"] = request.authorization
    connector = aiohttp.TCPConnector(ssl=request.tls or True)
    async with aiohttp.ClientSession(connector=connector) as session:
        return await daemon.fetch(session, request.url, request.timeout_seconds, MAX_STATE_BYTES, headers)


def fetch(request: Request) -> Fetched:
    """The daemon's state through the daemon's own fetch: one deadline for the whole answer, its size capped while
    it is read, and redirects followed only within the daemon's origin (the password goes nowhere else)."""
    fetched = asyncio.run(_get(request))
    if fetched.text is None:
        raise _unreadable(request, fetched)
    try:
        document: Any = json.loads(fetched.text)
        _check_state(document)
    except (ValueError, RecursionError):  # RecursionError: arrays nested deeper than the parser goes
        raise DaemonUnreadable(
            f"{request.url}: the answer is not JSON: not a Plimsoll daemon's state (wrong port?)"
        ) from None
    except _Malformed as malformed:
        raise DaemonUnreadable(f"{request.url}: {malformed}: not a Plimsoll daemon's state (wrong port?)") from None
    try:
        now = parsedate_to_datetime(fetched.date).timestamp() if fetched.date else time.time()
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
