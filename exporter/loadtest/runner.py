"""One load step: N closed-loop workers against the server, the engine watched, the load generator's own lag timed.

A step runs a warm-up (requests sent then are discarded), then the measured part for the step duration. Requests
sent in the measured part are awaited to their end (each bounded by its timeout), so a slow request is a miss,
never dropped; a step whose verdict the caller finds settled (certainly failing, or passing with the requests a
pass needs), the run's time limit and Ctrl-C cut it short.
"""

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from exporter.loadtest.client import ENDPOINT_PATHS, Endpoint, Limits, send, send_explained
from exporter.loadtest.judge import MAX_EXTENSION
from exporter.loadtest.measure import RequestRecord, StepRun
from exporter.loadtest.watch import EngineRead, read_engine, watch
from exporter.loadtest.workload import TraceWorkload, Workload, WorkRequest, requests

# The ticker that measures the load generator's own event-loop lag.
LAG_TICK_SECONDS = 0.05
# How often the step asks the caller whether it is certainly failing, or needs to run longer.
CHECK_INTERVAL_SECONDS = 0.5
PREFLIGHT_TIMEOUT_SECONDS = 10.0

# Given the measured requests so far: a reason to end the step now (certainly failing), else None.
StopEarly = Callable[[Sequence[RequestRecord]], str | None]
# Given the measured requests at the step's end: whether it needs more of them to be judged.
KeepGoing = Callable[[Sequence[RequestRecord]], bool]


class LoadtestError(Exception):
    """The run cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class RunSettings:
    url: str  # the server's base URL, e.g. http://127.0.0.1:8000
    workload: Workload
    endpoint: str = "completions"  # or "chat"
    served_model: str | None = None  # None: the first model the server lists
    metrics_url: str | None = None  # None: /metrics on the server's host and port
    request_timeout_seconds: float = 60.0
    stall_timeout_seconds: float = 15.0  # the longest silence mid-stream
    step_seconds: float = 30.0
    warmup_seconds: float = 5.0
    max_duration_seconds: float = 900.0
    ignore_eos: bool = False
    api_key: str | None = field(default=None, repr=False)  # sent as a bearer token; never shown

    @property
    def engine_metrics_url(self) -> str:
        if self.metrics_url:
            return self.metrics_url
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def metrics_headers(self) -> dict[str, str]:
        """The credentials go to the metrics page only on the server's own origin, never to another host."""
        same = urlsplit(self.engine_metrics_url)[:2] == urlsplit(self.url)[:2]
        return self.auth_headers if same else {}

    def endpoint_at(self) -> Endpoint:
        return Endpoint.at(self.url, self.endpoint, self.auth_headers)

    @property
    def limits(self) -> Limits:
        return Limits(self.request_timeout_seconds, self.stall_timeout_seconds)


def api_key_from(environ: Mapping[str, str], key_file: str | None) -> str | None:
    """The API key from a file (--api-key-file) or PLIMSOLL_API_KEY; a file that cannot be read is an error."""
    if key_file:
        try:
            with open(key_file) as handle:
                key = handle.read().strip()
        except OSError as error:
            raise LoadtestError(f"--api-key-file {key_file}: cannot read it: {error.strerror}") from None
        if not key:
            raise LoadtestError(f"--api-key-file {key_file}: the file is empty")
        return key
    return environ.get("PLIMSOLL_API_KEY") or None


class Run:
    """What lives for a whole run: the HTTP session, the served model, the time limit, the engine as first read,
    and the Ctrl-C flag. Made by `open_run`."""

    def __init__(self, session: aiohttp.ClientSession, model: str, deadline: float, engine: EngineRead) -> None:
        self.session = session
        self.model = model
        self.deadline = deadline  # monotonic time at which the run's --max-duration is spent
        self.engine = engine  # engine name, KV capacity, or why /metrics cannot be read
        self.interrupted = asyncio.Event()

    def interrupt(self) -> None:
        """Ctrl-C: the step in progress ends now with what it has."""
        self.interrupted.set()


@asynccontextmanager
async def open_run(settings: RunSettings, clock: Callable[[], float] = time.monotonic) -> AsyncIterator[Run]:
    """A checked run: the server answers, streams and serves the model (else LoadtestError), the engine read once."""
    # No pool limit: at concurrency N, N requests must be in flight, not queued in the client.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = clock() + settings.max_duration_seconds
        model = await preflight(session, settings)
        engine = await read_engine(session, settings.engine_metrics_url, 0.0, settings.metrics_headers)
        yield Run(session, model, deadline, engine)


async def served_models(
    session: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The ids GET /v1/models lists, or LoadtestError saying why there are none."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with (
            asyncio.timeout(PREFLIGHT_TIMEOUT_SECONDS),
            session.get(url, headers=headers or {}) as response,
        ):
            status = response.status
            payload = await response.json(content_type=None) if status == 200 else None
    except TimeoutError:
        raise LoadtestError(f"{base_url} did not answer GET /v1/models within {PREFLIGHT_TIMEOUT_SECONDS:g}s") from None
    except aiohttp.ClientConnectorError as error:
        raise LoadtestError(_unreachable(base_url, error)) from None
    except (aiohttp.ClientError, OSError) as error:
        raise LoadtestError(f"{base_url}: GET /v1/models failed: {type(error).__name__}: {error}") from None
    except ValueError:
        raise LoadtestError(f"{url} did not answer JSON: is this an OpenAI-compatible server?") from None
    if status in (401, 403):
        raise LoadtestError(_credentials(base_url, status))
    if status == 404:
        raise LoadtestError(f"no /v1/models at {base_url}: is this an OpenAI-compatible server (--url is its base)?")
    if status != 200:
        raise LoadtestError(f"GET {url} answered HTTP {status}")
    data = payload.get("data") if isinstance(payload, dict) else None
    ids = tuple(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)) if data else ()
    if not ids:
        raise LoadtestError(f"{url} lists no models: is the server still loading one?")
    return ids


async def discover_model(
    session: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str] | None = None
) -> str:
    """The first model the server lists (what --served-model defaults to)."""
    return (await served_models(session, base_url, headers))[0]


async def preflight(session: aiohttp.ClientSession, settings: RunSettings) -> str:
    """Check that the server answers, accepts our credentials, serves the model, has the endpoint and streams,
    with one short request; return the served model. Every refusal is a LoadtestError saying what to do."""
    model = settings.served_model
    if model is None:
        model = await discover_model(session, settings.url, settings.auth_headers)
    else:
        models = await served_models(session, settings.url, settings.auth_headers)
        if model not in models:
            served = ", ".join(models)
            raise LoadtestError(f"--served-model {model!r} is not served at {settings.url}: it serves {served}")
    workload = settings.workload
    if settings.endpoint == "completions" and isinstance(workload, TraceWorkload) and workload.has_messages:
        raise LoadtestError(f"--dataset {workload.source} has chat messages: use --endpoint chat")
    endpoint = settings.endpoint_at()
    limits = Limits(min(settings.request_timeout_seconds, 30.0), settings.stall_timeout_seconds)
    _, failure = await send_explained(session, endpoint, model, "Hello", 4, limits)
    if failure is None:
        return model
    raise LoadtestError(_refusal(settings, model, failure.reason, failure.detail))


def _refusal(settings: RunSettings, model: str, reason: str, detail: str) -> str:
    path = ENDPOINT_PATHS[settings.endpoint]
    other = "completions" if settings.endpoint == "chat" else "chat"
    said = f" (the server says: {detail})" if detail else ""
    if reason == "connection refused":
        return _nothing_answers(settings.url)
    if reason in ("http 401", "http 403"):
        return _credentials(settings.url, int(reason.split()[1]))
    if reason == "http 404" and model in detail:
        return f"the server does not serve model {model!r} at {path}{said}: check --served-model"
    if reason in ("http 404", "http 405"):
        return f"no {path} here: is this an OpenAI-compatible server? try --endpoint {other}{said}"
    if reason == "not streaming":
        return f"{settings.url}{path} does not stream (it answered one JSON body): loadtest needs a streaming server"
    if reason == "stalled":
        return f"{settings.url}{path} stopped streaming mid-answer ({detail}): is the server overloaded or stuck?"
    if reason == "timeout":
        return f"a 4-token request to {settings.url}{path} got {detail}: is the server busy or stuck?"
    return f"a test request to {settings.url}{path} failed: {reason}{said}"


def _credentials(url: str, status: int) -> str:
    return (
        f"the server at {url} wants credentials (HTTP {status}): give an API key with PLIMSOLL_API_KEY or "
        "--api-key-file FILE"
    )


def _nothing_answers(url: str) -> str:
    return f"nothing answers at {url} (connection refused): is the server running, and --url right?"


def _unreachable(url: str, error: aiohttp.ClientConnectorError) -> str:
    if isinstance(error.os_error, ConnectionRefusedError):
        return _nothing_answers(url)
    return f"cannot connect to {url}: {error.os_error}"


@dataclass
class _Step:
    """The step's shared, growing state (workers append; the controller reads)."""

    measured_from: float
    records: list[RequestRecord] = field(default_factory=list)
    last_done: float = 0.0  # when the last measured request ended
    sending: bool = True
    completions: list[tuple[float, int]] = field(default_factory=list)  # (when, output tokens), warm-up sends too

    def in_window(self, until: float) -> tuple[int, int]:
        """Requests completed, and their output tokens, between the warm-up's end and `until`."""
        inside = [tokens for when, tokens in self.completions if self.measured_from <= when <= until]
        return len(inside), sum(inside)


async def run_step(
    settings: RunSettings,
    concurrency: int,
    run: Run,
    *,
    stop_early: StopEarly | None = None,
    keep_going: KeepGoing | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> StepRun:
    """Hold `concurrency` requests in flight for the warm-up and the step; see the module's docstring."""
    started = clock()
    step = _Step(measured_from=started + settings.warmup_seconds)
    endpoint = settings.endpoint_at()
    work = requests(settings.workload)
    stop_watch = asyncio.Event()
    lags: list[float] = []

    async def worker() -> None:
        while step.sending:
            request: WorkRequest = next(work)
            sent = clock()
            record = await send(
                run.session,
                endpoint,
                run.model,
                request.prompt,
                request.max_tokens,
                settings.limits,
                sent_at=sent - step.measured_from,
                ignore_eos=settings.ignore_eos,
                clock=clock,
            )
            done = clock()
            if record.completed:
                step.completions.append((done, record.output_tokens or 0))
            if record.sent_at >= 0:
                step.records.append(record)
                step.last_done = max(step.last_done, done)

    async def ticker() -> None:
        expected = clock() + LAG_TICK_SECONDS
        while True:
            await asyncio.sleep(max(0.0, expected - clock()))
            now = clock()
            if now >= step.measured_from:
                lags.append(max(0.0, now - expected))
            expected = max(expected + LAG_TICK_SECONDS, now)

    watcher = asyncio.create_task(
        watch(
            run.session, settings.engine_metrics_url, step.measured_from, stop_watch, headers=settings.metrics_headers
        )
    )
    lag = asyncio.create_task(ticker())
    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        ended_early = await _control(settings, run, step, stop_early, keep_going, clock)
        step.sending = False
        sending_stopped = clock()
        step.last_done = max(step.last_done, sending_stopped)
        if ended_early is not None or run.interrupted.is_set():
            for task in workers:
                task.cancel()
        else:
            # Each request has its own timeout, so this wait is bounded; Ctrl-C still cuts it short.
            await _wait_or_interrupt(workers, run.interrupted)
    finally:
        for task in (*workers, lag):
            task.cancel()
        await asyncio.gather(*workers, lag, return_exceptions=True)
        stop_watch.set()
        watched = await watcher
    completed, output_tokens = step.in_window(sending_stopped)
    return StepRun(
        concurrency=concurrency,
        duration_seconds=max(0.0, step.last_done - step.measured_from),
        requests=tuple(step.records),
        engine=watched.samples,
        engine_error=watched.error,
        client_lag_p99_seconds=_p99(lags),
        ended_early=ended_early,
        window_seconds=max(0.0, sending_stopped - step.measured_from),
        completed_in_window=completed,
        output_tokens_in_window=output_tokens,
        interrupted=run.interrupted.is_set(),
    )


async def _control(
    settings: RunSettings,
    run: Run,
    step: _Step,
    stop_early: StopEarly | None,
    keep_going: KeepGoing | None,
    clock: Callable[[], float],
) -> str | None:
    """Wait until the step should stop sending; return why it ended early, or None when it ran its course."""
    planned_end = step.measured_from + settings.step_seconds
    longest_end = step.measured_from + MAX_EXTENSION * settings.step_seconds
    boundaries = (step.measured_from, planned_end, longest_end, run.deadline)
    while True:
        now = clock()
        # Wake at the next check, or sooner at a boundary, so a step lasts what it was told to the millisecond.
        wake = min((b for b in boundaries if b > now), default=now)
        with suppress(TimeoutError):
            await asyncio.wait_for(run.interrupted.wait(), min(CHECK_INTERVAL_SECONDS, max(0.0, wake - now)))
        now = clock()
        if run.interrupted.is_set():
            return "interrupted (Ctrl-C)"
        if now >= run.deadline:
            return f"the run's time limit ({settings.max_duration_seconds:g}s, --max-duration) was reached"
        if now < step.measured_from:
            continue
        if stop_early is not None and (reason := stop_early(tuple(step.records))) is not None:
            return reason
        if now >= longest_end:
            return None
        if now >= planned_end and not (keep_going is not None and keep_going(tuple(step.records))):
            return None


async def _wait_or_interrupt(tasks: list[asyncio.Task[None]], interrupted: asyncio.Event) -> None:
    interrupt = asyncio.create_task(interrupted.wait())
    pending: set[asyncio.Task[None]] = set(tasks)
    try:
        while pending and not interrupted.is_set():
            done, _ = await asyncio.wait([*pending, interrupt], return_when=asyncio.FIRST_COMPLETED)
            pending -= done
    finally:
        interrupt.cancel()


def _p99(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
