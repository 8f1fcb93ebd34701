"""What `plimsoll status` does once its flags are parsed: read a daemon's /api/v1/state and print the status
page's rows (exporter/core/status_format.py gives both the same words), once or refreshed in place.

Exit 0 with a state, 1 when the daemon cannot be read (down, not Plimsoll, refused credentials: one line on stderr);
a bad flag is a ValueError, which the CLI turns into exit 2.
"""

import argparse
import asyncio
import json
import math
import os
import ssl
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from exporter.cli_args import EXIT_INTERRUPTED
from exporter.config import redact_url
from exporter.core import status_format
from exporter.display import plain, shown
from exporter.files import ca_context, read_secret
from exporter.sources import http
from exporter.status.defaults import DEFAULT_URL, PASSWORD_ENV

STATE_PATH = "/api/v1/state"
# A daemon's state is a few kilobytes an engine instance (under 3 MB for MAX_ROWS of them): past this, not one.
MAX_STATE_BYTES = 4 * 1024 * 1024
# What a terminal can lay out in a second or two (rich takes about a millisecond a row).
MAX_ROWS = 1_000
MAX_CELL_CHARS = 200  # 1,000 rows of 4 kB errors were 17 MB of wrapped text
MAX_HISTORY_POINTS = 1_000  # a daemon keeps HISTORY_POINTS (60, exporter/daemon/poll.py) an instance
SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_POINTS = 20
LEVEL_STYLES = {"at": "bold red", "near": "bold yellow", "ok": "", "none": "dim italic"}


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """`plimsoll status | head -1`: as for every command, the CLI ends it with exit 0 (rich's own ends it with
        exit 1, this command's word for a daemon it cannot read)."""
        raise BrokenPipeError


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
    if not url.lower().startswith(("http://", "https://")):  # a scheme is case-insensitive
        raise ValueError(f"URL: {redact_url(url)!r} is not an http:// or https:// URL (e.g. {DEFAULT_URL})")
    if "?" in url or "#" in url:  # the state's path would land inside the query or the fragment
        raise ValueError(f"URL: {redact_url(url)!r} holds a query or fragment: give the daemon's base URL alone")
    base = url.rstrip("/")
    return base if base.endswith(STATE_PATH) else base + STATE_PATH


class _TooManyRows(Exception):
    """A state with more rows than `plimsoll status` lays out; the message says how many and where to see them."""


class _Malformed(Exception):
    """Where the document departs from a state's shape: "targets[0].up is not true or false"."""


_TEXT_OR_NULL = (str, type(None))
# The values each instance row shows. One that is null, "+Inf" or "-Inf" (the daemon writes JSON's missing
# infinities so), or a number past any an engine reports (status_format.MAX_SHOWN), shows as missing.
INSTANCE_VALUES = (
    "kv_cache_usage_ratio",
    "kv_cache_headroom_tokens",
    "headroom_requests_p95",
    "requests_running",
    "requests_waiting",
    "preemptions_total",
    "saturation_eta_seconds",
    "model_capacity_error_ratio",
)
_INFINITIES = ("+Inf", "-Inf")
MAX_UNIX_SECONDS = 253_402_300_799  # 9999-12-31 23:59:59 UTC, the last second a datetime can show
MAX_BYTES = 2**60  # an exbibyte: far past any GPU's memory
MAX_ID = 2**32  # a GPU index or a process id


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _field(mapping: Any, key: str, kinds: tuple[type, ...], what: str, where: str) -> Any:
    if not isinstance(mapping, dict):
        raise _Malformed(f"{where or 'the document'} is not an object")
    if key not in mapping:
        raise _Malformed(f"{_at(where, key)} is missing")
    value = mapping[key]
    # JSON's true is an int to Python; it is a number only where the field is true or false.
    if not isinstance(value, kinds) or isinstance(value, bool) is not (bool in kinds):
        raise _Malformed(f"{_at(where, key)} is not {what}")
    return value


def _number(mapping: Any, key: str, low: float, high: float, what: str, where: str) -> None:
    value = _field(mapping, key, (int, float), what, where)
    if not low <= value <= high:
        raise _Malformed(f"{_at(where, key)} is not {what}")


def _id(mapping: Any, key: str, what: str, where: str) -> None:
    """A GPU index or a process id: text, or a whole number in range."""
    value = _field(mapping, key, (str, int), what, where)
    if isinstance(value, int) and not 0 <= value < MAX_ID:
        raise _Malformed(f"{_at(where, key)} is not {what}")


def _list(mapping: Any, key: str, where: str) -> list[Any]:
    found: list[Any] = _field(mapping, key, (list,), "a list", where)
    return found


def _rows(rows: int) -> int:
    """`rows`, counted before the items that make them are looked at, unless there are more than a terminal shows."""
    if rows > MAX_ROWS:
        raise _TooManyRows(
            f"more than the {MAX_ROWS:,} rows `plimsoll status` shows (engine instances, GPUs and their processes);"
            " the daemon's status page shows them all"
        )
    return rows


def _in_range(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= status_format.MAX_SHOWN


def _check_history(instance: dict[str, Any], where: str) -> None:
    if "kv_usage_history" not in instance:
        return
    points = _list(instance, "kv_usage_history", where)
    if len(points) > MAX_HISTORY_POINTS:
        raise _Malformed(f"{where}.kv_usage_history has more than {MAX_HISTORY_POINTS:,} points")
    for n, point in enumerate(points):
        pair = isinstance(point, list) and len(point) == 2
        if not (pair and all(_in_range(x) for x in point)):
            raise _Malformed(f"{where}.kv_usage_history[{n}] is not a [time, ratio] pair")


def _check_instance(instance: Any, where: str) -> None:
    for key in ("engine", "dp_rank"):
        _field(instance, key, (str,), "text", where)
    _field(instance, "model", _TEXT_OR_NULL, "text or null", where)
    for key in INSTANCE_VALUES:
        value = _field(instance, key, (int, float, str, type(None)), "a number or null", where)
        if isinstance(value, str) and value not in _INFINITIES:
            raise _Malformed(f'{where}.{key} is not a number, "+Inf", "-Inf" or null')
    reasons = instance.get("reasons", {})
    if not isinstance(reasons, dict) or not all(isinstance(v, str) for v in reasons.values()):
        raise _Malformed(f"{where}.reasons is not an object of text")
    _check_history(instance, where)


def _check_target(target: Any, where: str, rows: int) -> int:
    """`rows` (one counted for every target already) plus the target's further engine instances: one row each."""
    _field(target, "target", (str,), "text", where)
    _field(target, "up", (bool,), "true or false", where)
    for key in ("engine", "last_failure", "last_error"):
        _field(target, key, _TEXT_OR_NULL, "text or null", where)
    instances = _list(target, "instances", where)
    rows = _rows(rows + max(len(instances), 1) - 1)
    for i, instance in enumerate(instances):
        _check_instance(instance, f"{where}.instances[{i}]")
    return rows


def _check_gpu(gpu: Any, where: str, rows: int) -> int:
    """`rows` (the GPU's own counted already) plus one per process on the GPU."""
    _id(gpu, "gpu", "a GPU index", where)
    _field(gpu, "name", (str,), "text", where)
    for key in ("used_bytes", "total_bytes"):
        _number(gpu, key, 0, MAX_BYTES, f"a number of bytes up to {MAX_BYTES:,}", where)
    _field(gpu, "unexplained_bytes", (int, float, str, type(None)), "a number or null", where)
    processes = _list(gpu, "processes", where)
    rows = _rows(rows + len(processes))
    for p, process in enumerate(processes):
        at = f"{where}.processes[{p}]"
        _id(process, "pid", "a process id", at)
        if _field(process, "used_bytes", (int, float, type(None)), "a number or null", at) is not None:
            _number(process, "used_bytes", 0, MAX_BYTES, f"a number of bytes up to {MAX_BYTES:,}", at)
        _field(process, "target", _TEXT_OR_NULL, "text or null", at)
    return rows


# Each autoscaled model's values (exporter/daemon/views.py `_scale_up_dict`); the two lags are null until measured.
SCALE_UP_NUMBERS = ("startup_seconds", "knee_concurrency", "demand_requests", "capacity_requests", "pending_seconds")
SCALE_UP_LAGS = ("last_lag_seconds", "lag_median_seconds")


def _check_scale_up(model: Any, where: str) -> None:
    for key in ("model", "workload"):
        _field(model, key, (str,), "text", where)
    for key in ("ready_replicas", "lags_count"):
        _field(model, key, (int,), "a whole number", where)
        _number(model, key, 0, MAX_ID, "a whole number", where)
    for key in SCALE_UP_NUMBERS:
        _field(model, key, (int, float), "a number", where)
    for key in SCALE_UP_LAGS:
        _field(model, key, (int, float, type(None)), "a number or null", where)


def _check_state(document: Any) -> None:
    """Raise _Malformed unless `document` has every field the rows read, of the type and in the range they read it
    as; _TooManyRows where it has more rows than a terminal shows (rich lays out about a thousand a second)."""
    _number(document, "saturation_kv_usage", 0, 1, "a ratio between 0 and 1", "")
    _number(document, "taken_at", 0, MAX_UNIX_SECONDS, "a time (unix seconds, 0 before the first poll)", "")
    targets = _list(document, "targets", "")
    rows = _rows(len(targets))
    for t, target in enumerate(targets):
        rows = _check_target(target, f"targets[{t}]", rows)
    nvml = _field(document, "nvml", (dict,), "an object", "")
    _field(nvml, "up", (bool,), "true or false", "nvml")
    for key in ("error", "driver_version"):
        _field(nvml, key, _TEXT_OR_NULL, "text or null", "nvml")
    gpus = _list(nvml, "gpus", "nvml")
    rows = _rows(rows + len(gpus))
    for g, gpu in enumerate(gpus):
        rows = _check_gpu(gpu, f"nvml.gpus[{g}]", rows)
    if "scale_up" in document:  # a daemon from before the scale-up lag has none
        models = _list(document, "scale_up", "")
        rows = _rows(rows + len(models))
        for m, model in enumerate(models):
            _check_scale_up(model, f"scale_up[{m}]")


def _finite(number: float) -> float | str:
    """JSON has no infinity or NaN: read them (and a number past a float's range) as the daemon writes them, as
    "+Inf", "-Inf" and null, so the state holds only finite numbers and --format json prints strict JSON."""
    return number if math.isfinite(number) else _INFINITIES[number < 0]


def _float(text: str) -> float | str:
    return _finite(float(text))


def _constant(name: str) -> float | str | None:
    return None if name == "NaN" else _float(name)  # NaN, Infinity or -Infinity, as Python's json writes them


def _document(text: str) -> Any:
    return json.loads(text, parse_float=_float, parse_constant=_constant)


def _unreadable(request: Request, fetched: http.Fetched) -> DaemonUnreadable:
    """The one line for a fetch that brought no document back."""
    url, detail = redact_url(request.url), fetched.detail or fetched.failure
    if fetched.failure == "timeout":
        return DaemonUnreadable(f"{url}: no answer within {request.timeout_seconds:g}s")
    if fetched.failure == "refused" and detail and detail.startswith(http.TLS_FAILED):
        untrusted = "CERTIFICATE_VERIFY_FAILED" in detail  # else no TLS there at all, most often plain HTTP
        hint = "--ca-file names the CA of the daemon's certificate" if untrusted else "is it serving https there?"
        return DaemonUnreadable(f"{url}: {detail} ({hint})")
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


async def _get(request: Request) -> http.Fetched:
    headers = {"Accept": "application/json"}
    if request.authorization:
        headers["Authorization"] = request.authorization
    connector = aiohttp.TCPConnector(ssl=request.tls or True)
    async with aiohttp.ClientSession(connector=connector) as session:
        return await http.fetch(session, request.url, request.timeout_seconds, MAX_STATE_BYTES, headers)


def fetch(request: Request) -> Fetched:
    """The daemon's state through the daemon's own fetch: one deadline for the whole answer, its size capped while
    it is read, and redirects followed only within the daemon's origin (the password goes nowhere else)."""
    fetched = asyncio.run(_get(request))
    if fetched.text is None:
        raise _unreadable(request, fetched)
    url = redact_url(request.url)
    try:
        document = _document(fetched.text)
        _check_state(document)
    except (ValueError, RecursionError):  # RecursionError: arrays nested deeper than the parser goes
        raise DaemonUnreadable(f"{url}: the answer is not JSON: not a Plimsoll daemon's state (wrong port?)") from None
    except _Malformed as malformed:
        raise DaemonUnreadable(f"{url}: {malformed}: not a Plimsoll daemon's state (wrong port?)") from None
    except _TooManyRows as too_many:
        raise DaemonUnreadable(f"{url}: {too_many}") from None
    try:
        now = parsedate_to_datetime(fetched.date).timestamp() if fetched.date else time.time()
    except (TypeError, ValueError, OverflowError):  # OverflowError: a year of more digits than a C long holds
        now = time.time()
    return Fetched(document, now)


def sparkline(history: tuple[tuple[float, float], ...]) -> str:
    values = [min(max(v, 0.0), 1.0) for _, v in history[-SPARK_POINTS:]]
    return "".join(SPARK_BLOCKS[min(int(v * len(SPARK_BLOCKS)), len(SPARK_BLOCKS) - 1)] for v in values)


def _shown(text: str, style: str = "") -> Text:
    """Text from the state in one cell, as display.plain shows it, cut at MAX_CELL_CHARS: a row is read at a
    glance, and the daemon's status page and --format json have the whole of it."""
    return plain(text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…", style)


def _text(cell: status_format.Cell, style: str = "") -> Text:
    return _shown(cell.text, "dim italic" if cell.missing else style)


def _scale_up_table(state: Mapping[str, Any]) -> Table | None:
    """Each autoscaled model's scale-up lag beside the start-up the replay assumes; None where there is none."""
    models = status_format.scale_up_rows(state)
    if not models:
        return None
    table = Table(box=None, header_style="bold", pad_edge=False, title="scale-up lag", title_justify="left")
    for name, justify in (
        ("model", "left"),
        ("workload", "left"),
        ("replicas ready", "right"),
        ("demand / capacity", "right"),
        ("last lag", "right"),
        ("median lag", "right"),
        ("waiting for a replica", "right"),
        ("start-up assumed by replay", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in models:
        table.add_row(
            _shown(row.model),
            _shown(row.workload),
            row.replicas,
            row.demand,
            _text(row.last_lag),
            _text(row.median_lag),
            row.pending,
            row.assumed,
        )
    return table


def render(fetched: Fetched, url: str, problem: str | None = None) -> RenderableType:
    state = fetched.state
    threshold = float(state["saturation_kv_usage"])
    taken_at = float(state["taken_at"])
    head = Text.assemble(
        ("plimsoll ", "bold"),
        plain(f"{url} · threshold {status_format.percent(threshold)} KV usage · snapshot "),
        f"{status_format.age(taken_at, fetched.daemon_now)} ({status_format.taken_at_text(taken_at)})",
    )
    if problem:
        head.append(plain(f" · cannot refresh: {problem}", "red"))
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
            rows.add_row(_shown(row.target), _shown(row.engine), _shown(row.down, "red"))
            continue
        rows.add_row(
            _shown(row.target),
            _shown(row.engine),
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
    parts: list[RenderableType] = [head, Text(""), rows]
    scale_up = _scale_up_table(state)
    if scale_up is not None:
        parts += [Text(""), scale_up]
    parts += [Text(""), _shown(status_format.nvml_line(state), "bold")]
    gpu_rows = status_format.gpu_rows(state)
    if not gpu_rows:
        return Group(*parts)
    gpus = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("gpu", "name", "memory used / total", "process", "memory", "target", "unexplained"):
        gpus.add_column(name)
    for gpu in gpu_rows:
        gpus.add_row(_shown(gpu.gpu), _shown(gpu.name), gpu.memory, "", "", "", _text(gpu.unexplained))
        for process in gpu.processes:
            gpus.add_row("", "", "", _shown(process.pid), process.memory, _shown(process.target), "")
    return Group(*parts, gpus)


def _authorization(args: argparse.Namespace) -> str | None:
    if args.basic_auth_user is None:
        if args.password_file:
            raise ValueError("--password-file: needs --basic-auth-user")
        return None
    user = args.basic_auth_user
    if not user or ":" in user or not user.isprintable():  # the first ":" ends the user in the header (RFC 7617)
        raise ValueError("--basic-auth-user: give a user name that is not empty, with no ':' or control character")
    if redact_url(args.url) != args.url:  # aiohttp refuses both; say which to drop before anything is sent
        raise ValueError("--basic-auth-user: the URL logs in with its user:password@ too; give the credentials once")
    if args.password_file:
        password = read_secret(args.password_file, http.MAX_SECRET_BYTES, "--password-file")
        if not password:
            raise ValueError(f"--password-file {args.password_file}: empty (no password to send)")
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    else:
        missing = f"{PASSWORD_ENV} is empty" if PASSWORD_ENV in os.environ else "needs a password"
        raise ValueError(f"--basic-auth-user: {missing}: give the password in {PASSWORD_ENV} or --password-file")
    return http.basic_authorization(user, password)


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    return None if args.ca_file is None else ca_context(args.ca_file, "--ca-file")


def _watch(request: Request, first: Fetched, url: str, interval: float, console: Console) -> int:
    last, problem = first, None
    with Live(render(first, url), console=console, auto_refresh=False, transient=False) as live:
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
    if args.watch and args.format == "json":  # a script reading one document would get a stream of them
        raise ValueError("--watch: refreshes the table in place; --format json prints the state once (loop for more)")
    console = _Console()
    if args.watch and not console.is_terminal:  # rich's Live would write nothing there until Ctrl-C
        raise ValueError("--watch: refreshes a terminal in place, and stdout is not one (without --watch: once)")
    request = Request(state_url(args.url), args.timeout, _tls(args), _authorization(args))
    try:
        fetched = fetch(request)
    except DaemonUnreadable as error:
        print(f"plimsoll status: {shown(str(error))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C while the daemon is slow to answer: the user's choice, not a crash
        return EXIT_INTERRUPTED
    if args.format == "json":
        print(json.dumps(fetched.state, indent=2))
        return 0
    if args.watch:
        return _watch(request, fetched, redact_url(args.url), args.interval, console)
    console.print(render(fetched, redact_url(args.url)))
    return 0
