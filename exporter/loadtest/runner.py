"""One load step: N closed-loop workers against the server, the engine watched, the load generator's own lag timed.

A step runs a warm-up (requests sent then are discarded) over which the workers start one by one, then the
measured part for the step duration. Every request sent in the measured part is awaited to its end (each bounded
by its timeout), also when the step ends early, so a slow request is a miss, never dropped: a step ends early only
when the caller finds it certainly failing, and then the run's time limit and Ctrl-C (or SIGTERM) are the only
things that cut requests short. The one exception is a server gone: its last requests, one per slot, found nothing
listening or got not one token in their time (`server_gone`); the step stops sending as the last of them ends, the
requests in flight are cancelled, and the run ends (LoadtestError). A worker answered 429 or 503 with a Retry-After
waits that long (bounded) before its next request, or until the step stops sending. After the step the engine is
given time to return to the load it had before the run (`settle`).
"""

import asyncio
import contextlib
import json
import math
import random
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from exporter.files import read_capped
from exporter.loadtest.client import (
    ENDPOINT_PATHS,
    NOTHING_LISTENING,
    OUT_OF_TIME,
    Endpoint,
    Failure,
    Limits,
    redirected_to,
    send,
)
from exporter.loadtest.judge import MAX_EXTENSION
from exporter.loadtest.measure import EngineSample, RequestRecord, StepRun, describe_load
from exporter.loadtest.sketch import DurationSummary
from exporter.loadtest.watch import EngineRead, read_engine, watch
from exporter.loadtest.workload import TraceWorkload, Workload, WorkRequest, requests, run_marker

# The ticker that measures the load generator's own event-loop lag.
LAG_TICK_SECONDS = 0.05
# How often the step asks the caller whether it is certainly failing, or needs to run longer.
CHECK_INTERVAL_SECONDS = 0.5
PREFLIGHT_TIMEOUT_SECONDS = 10.0
PREFLIGHT_TOKENS = 4
# A request the load generator itself failed to send or read: the record's error starts so.
CLIENT_ERROR = "client error"
# An open-loop arrival while the cap of requests in flight was reached: the server had fallen that far behind.
OVER_THE_CAP = "not sent: too many in flight"
# While waiting for the server to be ready, and for the engine to be idle between steps: how often to ask.
POLL_SECONDS = 0.5
# GET /v1/models is read this far at most: thousands of models' entries, never a server's whole memory.
MAX_MODELS_BYTES = 8 << 20
# How many of the served models a refusal of --served-model names.
_MODELS_SHOWN = 10
# Longer than any model's name (a path on a hub, an adapter's): the id is sent with every request and shown.
MAX_MODEL_ID_CHARS = 1024

# Given the measured requests and the send time of the oldest one still in flight (None: none is): a reason to
# end the step now (certainly failing), else None.
StopEarly = Callable[[Sequence[RequestRecord], float | None, Sequence[EngineSample]], str | None]
# Given the same at the step's planned end, and the extension as a share of the time run: whether to run on.
KeepGoing = Callable[[Sequence[RequestRecord], float | None, float], bool]


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
    ready_timeout_seconds: float = 30.0  # how long the server may take to answer /health and /v1/models
    ignore_eos: bool = False
    allow_short_answers: bool = False  # an answer shorter than max_tokens is good, not an error
    unique_prompts: bool = True  # each prompt opens with a marker of the run and the request (workload.py)
    arrivals: str = "poisson"  # open loop: "poisson" or "constant" gaps between requests
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
    """The API key from a file (--api-key-file) or PLIMSOLL_API_KEY; a file that cannot be read, or a key that
    cannot go in a header, is an error that never shows the key."""
    if not key_file:
        key = environ.get("PLIMSOLL_API_KEY") or None
        return _header_safe(key, "PLIMSOLL_API_KEY") if key else None
    try:
        # Not a FIFO or a device: either would wait or read without end.
        raw = read_capped(key_file, _MAX_KEY_BYTES, "--api-key-file", "no API key is so long")
    except ValueError as error:
        raise LoadtestError(str(error)) from None
    key = raw.decode("utf-8", errors="replace").strip()
    if not key:
        raise LoadtestError(f"--api-key-file {key_file}: the file is empty")
    return _header_safe(key, f"--api-key-file {key_file}")


# Far longer than any bearer token.
_MAX_KEY_BYTES = 64 << 10


def _header_safe(key: str, where: str) -> str:
    """The key, where it is printable ASCII: a line break or control character would break (or inject into) the
    Authorization header, and aiohttp refuses it mid-run with words that name no flag."""
    if not (key.isascii() and key.isprintable()):
        raise LoadtestError(f"{where}: the key holds a line break, control or non-ASCII character; give the key alone")
    return key


class Run:
    """What lives for a whole run: the HTTP session, the served model, the time limit, the engine as first read,
    the one stream of requests every step draws from, and the Ctrl-C flag. Made by `open_run`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        model: str,
        deadline: float,
        engine: EngineRead,
        work: Iterator[WorkRequest],
    ) -> None:
        self.session = session
        self.model = model
        self.deadline = deadline  # monotonic time at which the run's --max-duration is spent
        self.engine = engine  # engine name, KV capacity, or why /metrics cannot be read
        self.work = work
        self.arrival_seed = 0  # open-loop arrivals: the same gaps in every run, so runs compare
        self.interrupted = asyncio.Event()

    @property
    def baseline_load(self) -> float | None:
        """Requests running and waiting in the engine before the run sent any: what idle means for it."""
        sample = self.engine.sample
        return None if sample is None else sample.requests_in_engine

    def interrupt(self) -> None:
        """Ctrl-C or SIGTERM: the step in progress ends now with what it has."""
        self.interrupted.set()


# Ctrl-C, and what a supervisor (systemd, Kubernetes, a CI job's timeout) sends to stop a process.
_STOPS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def ctrl_c_interrupts(interrupt: Callable[[], None]) -> Iterator[None]:
    """While the steps run, Ctrl-C (SIGINT) or SIGTERM ends the step in progress instead of killing the process,
    so what was measured is written; a second one is the usual immediate stop. Call it inside the running loop."""
    loop = asyncio.get_running_loop()

    def first() -> None:
        interrupt()
        for stop in _STOPS:
            loop.remove_signal_handler(stop)

    for stop in _STOPS:
        loop.add_signal_handler(stop, first)
    try:
        yield
    finally:
        for stop in _STOPS:
            loop.remove_signal_handler(stop)


@asynccontextmanager
async def open_run(settings: RunSettings, clock: Callable[[], float] = time.monotonic) -> AsyncIterator[Run]:
    """A checked run: the server answers, streams and serves the model (else LoadtestError), the engine read once."""
    # No pool limit: at concurrency N, N requests must be in flight, not queued in the client.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_ready(session, settings, clock)
        deadline = clock() + settings.max_duration_seconds
        model = await preflight(session, settings)
        engine = await read_engine(session, settings.engine_metrics_url, 0.0, settings.metrics_headers)
        marker = run_marker() if settings.unique_prompts else None
        yield Run(session, model, deadline, engine, requests(settings.workload, marker))


async def wait_ready(
    session: aiohttp.ClientSession, settings: RunSettings, clock: Callable[[], float] = time.monotonic
) -> None:
    """Wait until /health (where the server has one) and /v1/models answer, for at most the ready timeout; past
    it, the last reason is the LoadtestError. An engine still loading its model refuses connections or answers
    503 for minutes, and the first step must not be judged on that."""
    deadline = clock() + settings.ready_timeout_seconds
    while True:
        try:
            await _health(session, settings)
            await served_models(session, settings.url, settings.auth_headers)
            return
        except LoadtestError as error:
            if not _may_become_ready(str(error)):
                raise
            if clock() >= deadline:
                waited = f"waited {settings.ready_timeout_seconds:g}s, --ready-timeout"
                raise LoadtestError(f"{error} ({waited})") from None
        await asyncio.sleep(POLL_SECONDS)


async def _health(session: aiohttp.ClientSession, settings: RunSettings) -> None:
    url = settings.url + "/health"
    try:
        async with (
            asyncio.timeout(PREFLIGHT_TIMEOUT_SECONDS),
            session.get(url, headers=settings.auth_headers, allow_redirects=False) as response,
        ):
            status = response.status
    except (TimeoutError, aiohttp.ClientError, OSError):
        return  # /v1/models, asked next, says what is wrong in words
    if 300 <= status < 400:
        return  # not followed; /v1/models, asked next, says where it points if it does the same
    if status not in (200, 401, 403, 404, 405):
        raise LoadtestError(f"{url} answered HTTP {status}: {_NOT_READY}")


_NOT_READY = "the server is not ready"


def _may_become_ready(reason: str) -> bool:
    """Refusals a starting server gives: nothing listening yet, no model loaded yet, a 503 while loading, a /health
    that does not yet answer 200."""
    return any(sign in reason for sign in ("connection refused", "lists no models", "HTTP 503", _NOT_READY))


async def served_models(
    session: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The ids GET /v1/models lists, or LoadtestError saying why there are none."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with (
            asyncio.timeout(PREFLIGHT_TIMEOUT_SECONDS),
            session.get(url, headers=headers or {}, allow_redirects=False) as response,
        ):
            status = response.status
            redirect = redirected_to(response) if 300 <= status < 400 else None
            payload = await _bounded_json(response, url, MAX_MODELS_BYTES) if status == 200 else None
    except TimeoutError:
        raise LoadtestError(f"{base_url} did not answer GET /v1/models within {PREFLIGHT_TIMEOUT_SECONDS:g}s") from None
    except aiohttp.ClientConnectorError as error:
        raise LoadtestError(_unreachable(base_url, error)) from None
    except (aiohttp.ClientError, OSError) as error:
        raise LoadtestError(f"{base_url}: GET /v1/models failed: {type(error).__name__}: {error}") from None
    except (ValueError, RecursionError):
        raise LoadtestError(f"{url} did not answer JSON: is this an OpenAI-compatible server?") from None
    if redirect is not None:
        key = (headers or {}).get("Authorization", "").removeprefix("Bearer ")
        where = _without_key(redirect, key)
        raise LoadtestError(f"GET {url} {where}: give --url the address that serves the API itself")
    if status in (401, 403):
        raise LoadtestError(_credentials(base_url, status))
    if status == 404:
        raise LoadtestError(f"no /v1/models at {base_url}: is this an OpenAI-compatible server (--url is its base)?")
    if status != 200:
        raise LoadtestError(f"GET {url} answered HTTP {status}")
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise LoadtestError(f'{url} answered no model list ({{"data": [...]}}): is this an OpenAI-compatible server?')
    ids = tuple(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"])
    if not ids:
        raise LoadtestError(f"{url} lists no models: is the server still loading one?")
    longest = max(ids, key=len)
    if len(longest) > MAX_MODEL_ID_CHARS:
        raise LoadtestError(
            f"{url} lists a model id of {len(longest)} characters: no model is named so (at most "
            f"{MAX_MODEL_ID_CHARS}); is this an OpenAI-compatible server?"
        )
    return ids


async def _bounded_json(response: aiohttp.ClientResponse, url: str, limit: int) -> Any:
    """The body as JSON, read at most `limit` bytes: a longer one is a LoadtestError before it is all in memory."""
    body = bytearray()
    async for chunk in response.content.iter_chunked(64 << 10):
        body += chunk
        if len(body) > limit:
            raise LoadtestError(f"{url} answered more than {limit >> 20} MiB: that is no model list")
    return json.loads(body)


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
            # A server may list thousands: the first few say enough, the message stays one line.
            served = ", ".join(models[:_MODELS_SHOWN]) + (
                f" and {len(models) - _MODELS_SHOWN} more" if len(models) > _MODELS_SHOWN else ""
            )
            raise LoadtestError(f"--served-model {model!r} is not served at {settings.url}: it serves {served}")
    workload = settings.workload
    if settings.endpoint == "completions" and isinstance(workload, TraceWorkload) and workload.has_messages:
        raise LoadtestError(f"--dataset {workload.source} has chat messages: use --endpoint chat")
    endpoint = settings.endpoint_at()
    limits = Limits(min(settings.request_timeout_seconds, 30.0), settings.stall_timeout_seconds)
    _, failure = await send(
        session,
        endpoint,
        model,
        "Hello",
        PREFLIGHT_TOKENS,
        limits,
        ignore_eos=settings.ignore_eos,
        allow_short=settings.allow_short_answers,
    )
    if failure is None:
        return model
    raise LoadtestError(_refusal(settings, model, failure.reason, _without_key(failure.detail, settings.api_key)))


def _without_key(text: str, key: str | None) -> str:
    """A server may repeat the key it was sent in its message or where it redirects to: it is not shown."""
    return text.replace(key, "<API key>") if key else text


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
    if reason.startswith("http 3"):
        return f"{settings.url}{path} {detail}: give --url the address that serves the API itself"
    if reason == "not streaming":
        return f"{settings.url}{path} does not stream ({detail}): loadtest needs a streaming server"
    if reason == "stalled":
        return f"{settings.url}{path} stopped streaming mid-answer ({detail}): is the server overloaded or stuck?"
    if reason == "timeout":
        return f"a {PREFLIGHT_TOKENS}-token request to {settings.url}{path} got {detail}: is the server busy or stuck?"
    if reason == "short answer":
        return (
            f"a {PREFLIGHT_TOKENS}-token request to {settings.url}{path} got {detail}: the model stopped early. Pass "
            "--ignore-eos so every answer is as long as asked (the load is then the one you describe), or "
            "--allow-short-answers to judge shorter answers as good"
        )
    if reason == "empty answer":
        return f"a test request to {settings.url}{path} streamed no text: the server answers, but generates nothing"
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


def unanswered(record: RequestRecord) -> bool:
    """The server took the request and streamed not one token of it before its time ran out."""
    return record.ttft_seconds is None and record.error in OUT_OF_TIME


def server_gone(last: Sequence[RequestRecord], slots: int) -> str | None:
    """Why the `slots` requests that ended last (warm-up ones too) say the server is gone, else None: each found
    nothing listening, or each ran out of time without a token (an engine stuck behind an API server that still
    accepts connections). Checked as each request ends, so a dead server costs about one request per slot.

    An overloaded server never looks so: at most `slots` of the step's requests are out at once, and one the server
    runs streams a token before its time is out. Such a one, out when the first of the `slots` ended, ends before
    any request sent later can time out, so `slots` tokenless ends in a row leave it no room: the server ran none of
    the step's requests for a whole --request-timeout. A server that answers an error is judged, not given up on."""
    if len(last) < slots:
        return None
    newest = list(last)[-slots:]
    if not all(record.error in NOTHING_LISTENING or unanswered(record) for record in newest):
        return None
    errors = ", ".join(sorted({str(record.error) for record in newest}))
    last_ones = "the last request" if slots == 1 else f"the last {slots} requests (as many as the step holds in flight)"
    return f"{last_ones} found nothing listening or got no token in time ({errors})"


@dataclass
class _Step:
    """The step's shared, growing state (workers append; the controller reads)."""

    measured_from: float
    ended: deque[RequestRecord]  # the last requests that ended, warm-up ones too: as many as the step's concurrency
    gone: str | None = None  # why the server is gone (`server_gone`): the step stops and the run ends
    records: list[RequestRecord] = field(default_factory=list)
    itl_gaps: DurationSummary = field(default_factory=DurationSummary)  # of the measured requests that completed
    in_flight: dict[int, float] = field(default_factory=dict)  # worker -> sent_at of its measured request
    last_done: float = 0.0  # when the last measured request ended
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # set when the step stops sending
    completions: list[tuple[float, int]] = field(default_factory=list)  # (when, output tokens), warm-up sends too
    engine: list[EngineSample] = field(default_factory=list)  # the watcher appends

    def in_window(self, until: float) -> tuple[int, int]:
        """Requests completed, and their output tokens, between the warm-up's end and `until`."""
        inside = [tokens for when, tokens in self.completions if self.measured_from <= when <= until]
        return len(inside), sum(inside)

    @property
    def oldest_in_flight(self) -> float | None:
        return min(self.in_flight.values(), default=None)

    @property
    def sending(self) -> bool:
        return not self.stopped.is_set()

    async def pause(self, seconds: float) -> None:
        """Wait `seconds` (a server's Retry-After), or until the step stops sending: a pause never holds it open."""
        with suppress(TimeoutError):
            await asyncio.wait_for(self.stopped.wait(), seconds)


class _Load:
    """What sends one step's requests: closed-loop workers or open-loop arrivals, each request measured into the
    step, and the ticker that times the load generator's own lag."""

    def __init__(
        self, settings: RunSettings, run: Run, step: _Step, concurrency: int, clock: Callable[[], float]
    ) -> None:
        self.settings, self.run, self.step, self.concurrency, self.clock = settings, run, step, concurrency, clock
        self.endpoint = settings.endpoint_at()
        self.lags: list[float] = []
        self.spawned: set[asyncio.Task[tuple[RequestRecord, Failure | None]]] = set()

    async def exchange(self, key: int) -> tuple[RequestRecord, Failure | None]:
        """One request, from the run's stream, measured and recorded under `key` while in flight; also why it
        failed, in the server's words (its Retry-After)."""
        step, clock = self.step, self.clock
        sent = clock()
        measured = sent >= step.measured_from
        if measured:
            step.in_flight[key] = sent - step.measured_from
        failure = None
        try:
            request: WorkRequest = next(self.run.work)
            record, failure = await send(
                self.run.session,
                self.endpoint,
                self.run.model,
                request.prompt,
                request.max_tokens,
                self.settings.limits,
                sent_at=sent - step.measured_from,
                ignore_eos=self.settings.ignore_eos,
                allow_short=self.settings.allow_short_answers,
                itl_gaps=step.itl_gaps if measured else None,
                clock=clock,
            )
        except Exception as error:  # a bug here must be a counted miss, not a silently lost worker
            record = _missed(sent - step.measured_from, f"{CLIENT_ERROR}: {type(error).__name__}")
        done = clock()
        step.in_flight.pop(key, None)
        step.ended.append(record)
        if step.gone is None and (gone := server_gone(step.ended, self.concurrency)) is not None:
            step.gone = gone
            step.stopped.set()  # no worker sends again: the controller sees why at its next look
        if record.completed:
            step.completions.append((done, record.output_tokens or 0))
        if measured:
            step.records.append(record)
            step.last_done = max(step.last_done, done)
        return record, failure

    async def worker(self, index: int, warmup: float) -> None:
        """Closed loop: worker i sends its first request i/N of the way through the first half of the warm-up, so
        the engine is not handed one burst of prefills that all finish together."""
        await asyncio.sleep(warmup / 2 * index / self.concurrency)
        while self.step.sending:
            record, failure = await self.exchange(index)
            if record.error is not None and record.error.startswith(CLIENT_ERROR):
                return  # the miss is counted; a client that failed once would fail the same way again
            if failure is not None and failure.retry_after_seconds:
                await self.step.pause(failure.retry_after_seconds)  # the server asked to be left alone so long

    async def arrivals(self, rate: float) -> None:
        """Open loop: a request arrives every `gap` seconds, whatever the server's pace; at most `concurrency` are
        in flight, and an arrival past that is a miss (the server has fallen that far behind)."""
        step, clock = self.step, self.clock
        gaps = arrival_gaps(rate, self.settings.arrivals, self.run.arrival_seed)
        due = clock()
        number = 0
        while step.sending:
            await asyncio.sleep(max(0.0, due - clock()))
            if not step.sending:
                return
            number += 1
            if len(self.spawned) >= self.concurrency:
                if clock() >= step.measured_from:
                    step.records.append(
                        _missed(clock() - step.measured_from, f"{OVER_THE_CAP} ({self.concurrency} in flight)")
                    )
            else:
                self.spawned.add(task := asyncio.create_task(self.exchange(-number)))
                task.add_done_callback(self.spawned.discard)
            due += next(gaps)

    async def ticker(self) -> None:
        clock = self.clock
        expected = clock() + LAG_TICK_SECONDS
        while True:
            await asyncio.sleep(max(0.0, expected - clock()))
            now = clock()
            if now >= self.step.measured_from:
                self.lags.append(max(0.0, now - expected))
            expected = max(expected + LAG_TICK_SECONDS, now)


async def run_step(
    settings: RunSettings,
    concurrency: int,
    run: Run,
    *,
    offered_rate: float | None = None,
    warmup_seconds: float | None = None,
    stop_early: StopEarly | None = None,
    keep_going: KeepGoing | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> StepRun:
    """Hold `concurrency` requests in flight for the warm-up and the step (closed loop), or with `offered_rate`,
    send requests at that rate with at most `concurrency` in flight (open loop); see the module's docstring."""
    warmup = settings.warmup_seconds if warmup_seconds is None else warmup_seconds
    step = _Step(measured_from=clock() + warmup, ended=deque(maxlen=concurrency))
    load = _Load(settings, run, step, concurrency, clock)
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(
        watch(
            run.session,
            settings.engine_metrics_url,
            step.measured_from,
            stop_watch,
            step.engine,
            headers=settings.metrics_headers,
        )
    )
    lag = asyncio.create_task(load.ticker())
    if offered_rate is None:
        workers = [asyncio.create_task(load.worker(index, warmup)) for index in range(concurrency)]
    else:
        workers = [asyncio.create_task(load.arrivals(offered_rate))]
    try:
        ended_early = await _control(settings, run, step, stop_early, keep_going, clock)
        step.stopped.set()
        sending_stopped = clock()
        step.last_done = max(step.last_done, sending_stopped)
        if offered_rate is not None:
            workers[0].cancel()  # the arrivals: it may be asleep until the next one is due
        if step.gone is None and not run.interrupted.is_set() and clock() < run.deadline:
            # Each request has its own timeout, so this wait is bounded; Ctrl-C still cuts it short. With the server
            # gone the requests in flight are cancelled instead: the run ends, and on a hung server each would take
            # its whole timeout.
            await _wait_or_interrupt([*workers, *load.spawned], run.interrupted)
    finally:
        pending = [*workers, *load.spawned, lag]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        stop_watch.set()
        watched = await watcher
    if step.gone is not None:
        load_text = describe_load(concurrency, offered_rate)
        raise LoadtestError(f"the server stopped answering at {load_text}: {step.gone}; nothing was written")
    completed, output_tokens = step.in_window(sending_stopped)
    return StepRun(
        concurrency=concurrency,
        duration_seconds=max(0.0, step.last_done - step.measured_from),
        requests=tuple(step.records),
        itl_gaps=step.itl_gaps,
        engine=watched.samples,
        engine_error=watched.error,
        client_lag_p99_seconds=_p99(load.lags),
        ended_early=ended_early,
        window_seconds=max(0.0, sending_stopped - step.measured_from),
        completed_in_window=completed,
        output_tokens_in_window=output_tokens,
        warmup_seconds=warmup,
        interrupted=run.interrupted.is_set(),
        offered_rate=offered_rate,
    )


async def one_request(settings: RunSettings, run: Run) -> RequestRecord | None:
    """One request from the run's stream, sent alone and measured; None when Ctrl-C, SIGTERM or the run's time
    limit came first (or the client failed: the caller goes on without it). An answer with a Retry-After is waited
    out (within the time limit) before returning, as a worker would: the first step would otherwise send at once."""
    request = next(run.work)
    exchange = asyncio.create_task(
        send(
            run.session,
            settings.endpoint_at(),
            run.model,
            request.prompt,
            request.max_tokens,
            settings.limits,
            ignore_eos=settings.ignore_eos,
            allow_short=settings.allow_short_answers,
        )
    )
    try:
        with suppress(TimeoutError):
            # The run's time limit bounds it as it bounds a step: --max-duration may be shorter than the request.
            await asyncio.wait_for(_wait_or_interrupt([exchange], run.interrupted), run.deadline - time.monotonic())
    finally:
        if not exchange.done():
            exchange.cancel()
            await asyncio.gather(exchange, return_exceptions=True)
    if exchange.cancelled() or exchange.exception() is not None:
        return None
    record, failure = exchange.result()
    if failure is not None and failure.retry_after_seconds:
        pause = asyncio.create_task(asyncio.sleep(min(failure.retry_after_seconds, run.deadline - time.monotonic())))
        try:
            await _wait_or_interrupt([pause], run.interrupted)
        finally:
            pause.cancel()
    return record


def arrival_gaps(rate: float, kind: str, seed: int) -> Iterator[float]:
    """Seconds between arrivals: exponential (a Poisson process, what independent users make) or constant."""
    rng = random.Random(seed)
    while True:
        yield rng.expovariate(rate) if kind == "poisson" else 1.0 / rate


def _missed(sent_at: float, error: str) -> RequestRecord:
    """A request the server never answered because the client did not get it there: a miss with its reason."""
    return RequestRecord(
        sent_at=sent_at,
        ttft_seconds=None,
        e2e_seconds=None,
        prompt_tokens=None,
        output_tokens=None,
        error=error,
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
            return "interrupted (Ctrl-C or SIGTERM)"
        if now >= run.deadline:
            return f"the run's time limit ({settings.max_duration_seconds:g}s, --max-duration) was reached"
        if step.gone is not None:
            return step.gone
        if now < step.measured_from:
            continue
        records = tuple(step.records)
        engine = tuple(step.engine)
        if stop_early is not None and (reason := stop_early(records, step.oldest_in_flight, engine)) is not None:
            return reason
        if now >= longest_end:
            return None
        if now >= planned_end:
            extension = (longest_end - now) / max(now - step.measured_from, 1e-9)
            if keep_going is None or not keep_going(records, step.oldest_in_flight, extension):
                return None


async def settle(
    run: Run, settings: RunSettings, timeout_seconds: float, clock: Callable[[], float] = time.monotonic
) -> str | None:
    """Wait, at most `timeout_seconds`, until the engine runs and queues no more than it did before the run; None
    once it does (or where the engine cannot say), else why not. A step that starts on a busy engine measures the
    previous step's leftovers, or someone else's traffic."""
    baseline = run.baseline_load
    if baseline is None:
        return None
    deadline = clock() + timeout_seconds
    load = baseline
    while not run.interrupted.is_set():
        read = await read_engine(run.session, settings.engine_metrics_url, 0.0, settings.metrics_headers)
        if read.sample is None:
            return None
        load = read.sample.requests_in_engine
        if load <= baseline or clock() >= deadline:
            break
        with suppress(TimeoutError):
            await asyncio.wait_for(run.interrupted.wait(), POLL_SECONDS)
    if load <= baseline:
        return None
    return (
        f"the engine still had {load:g} requests running or waiting {timeout_seconds:g}s after the step "
        f"(before the run: {baseline:g}): other traffic, or requests the engine kept after the client gave up"
    )


async def _wait_or_interrupt(tasks: Sequence[asyncio.Task[Any]], interrupted: asyncio.Event) -> None:
    interrupt = asyncio.create_task(interrupted.wait())
    pending: set[asyncio.Task[Any]] = set(tasks)
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
