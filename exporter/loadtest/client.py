"""One streamed request to an OpenAI-compatible server, measured as the client sees it.

TTFT is the time to the first chunk that carries text, each ITL gap the time between two such chunks, and the
token counts are the server's own `usage` (asked for with `stream_options.include_usage`), so no tokenizer is
needed. Whatever goes wrong becomes the record's `error`; `send` never raises for what the server does.

An answer with no text is an error ("empty answer"), and so is one shorter than `max_tokens` by the server's own
count ("short answer") unless the caller accepts early stops: a server that stops generating must not pass an
ITL objective it never had to meet. A count no honest server gives (far past `max_tokens`, negative, not a whole
number) is an error too, never a number the throughput is computed from.

Redirects are not followed: the request carries the API key, and a server that points elsewhere has its answer
recorded as its status with where it pointed. A 429 or 503's Retry-After is read (bounded) for the caller to wait.
"""

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from exporter.loadtest.measure import RequestRecord
from exporter.loadtest.sketch import DurationSummary

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# The reasons a request failed because the connection did, not the server's answer: all of a step's requests
# failing so means the server is gone.
CONNECTION_FAILURES = frozenset({"connection refused", "cannot connect", "connection lost"})
# Connection failures that say no server is there; a connection lost mid-answer may be one dropped connection.
NOTHING_LISTENING = frozenset({"connection refused", "cannot connect"})
# A request that ran out of time: on its whole (`--request-timeout`) or waiting for the next line of its stream.
OUT_OF_TIME = frozenset({"timeout", "stalled"})

# A chat message as the API takes it: {"role": ..., "content": ...}.
Message = Mapping[str, str]
Prompt = str | tuple[Message, ...]

# An error body is read only this far: enough for the server's message, never a whole page.
_ERROR_BODY_BYTES = 4096
# One event line, and one event's data lines together, may be long (a chunk with logprobs), but not unbounded.
_MAX_EVENT_BYTES = 1 << 20
_BYTE_ORDER_MARK = b"\xef\xbb\xbf"
# A server may count a token or two more than it was asked for (an end-of-sequence token); twice as many is no
# miscount, and such a count would make the step's throughput whatever the server chose.
_MAX_OUTPUT_SHARE = 2
# Longer than any model's context: a prompt count past it is the server's invention.
_MAX_PROMPT_TOKENS = 100_000_000
_IMPLAUSIBLE = "bad response: implausible usage"
# The longest pause a server's Retry-After may impose on a worker: the step goes on being measured meanwhile.
MAX_RETRY_AFTER_SECONDS = 10.0
# The statuses a server answers when it wants the client to come back later.
_RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "completions" | "chat"
    url: str  # the full URL requests are POSTed to
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # credentials: never shown

    @classmethod
    def at(cls, base_url: str, kind: str, headers: Mapping[str, str] | None = None) -> "Endpoint":
        return cls(kind, base_url.rstrip("/") + ENDPOINT_PATHS[kind], headers or {})


@dataclass(frozen=True)
class Limits:
    total_seconds: float  # the whole request, first byte to last
    stall_seconds: float  # the longest wait for the next line of the stream


@dataclass(frozen=True)
class Failure:
    """Why a request failed: `reason` short, for grouping ("http 404"); `detail` the server's own words, if any."""

    reason: str
    detail: str = ""
    retry_after_seconds: float | None = None  # a 429 or 503's Retry-After, bounded: wait so long before the next


def request_body(endpoint: Endpoint, model: str, prompt: Prompt, max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint.kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    else:
        body["prompt"] = prompt if isinstance(prompt, str) else "\n".join(m.get("content", "") for m in prompt)
    if ignore_eos:
        body["ignore_eos"] = True
    return body


class _Stream:
    """What the chunks of one stream said so far."""

    def __init__(self, started: float, max_tokens: int) -> None:
        self.started = started
        self.max_tokens = max_tokens
        self.last_text_at: float | None = None
        self.ttft: float | None = None
        # A summary, not a list: a long answer at high concurrency would otherwise hold a gap for every token.
        self.gaps = DurationSummary()
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.done = False

    def chunk(self, kind: str, payload: Any, now: float) -> Failure | None:
        if not isinstance(payload, dict):
            return Failure("bad response: a chunk is not a JSON object")
        # Some servers send `"error": null` in every chunk: only an error that is there fails the request.
        error = payload.get("error")
        if error is not None:
            message = error.get("message", "") if isinstance(error, dict) else str(error)
            return Failure("bad response: error in stream", str(message)[:200])
        if _has_text(kind, payload.get("choices")):
            if self.last_text_at is None:
                self.ttft = now - self.started
            else:
                self.gaps.add(now - self.last_text_at)
            self.last_text_at = now
        usage = payload.get("usage")
        return self._usage(usage) if isinstance(usage, dict) else None

    def _usage(self, usage: dict[str, Any]) -> Failure | None:
        """The server's counts, or a failure where they cannot be true: no count is kept then, so no throughput is
        computed from a number the server chose. The counts are not repeated: they may be thousands of digits."""
        prompt_tokens, output_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
        # A count that is there but no count (negative, a string, NaN) must not pass as one the server did not give:
        # the short-answer check would be skipped for it.
        for name, value in (("prompt_tokens", prompt_tokens), ("completion_tokens", output_tokens)):
            if value is not None and not _is_count(value):
                return Failure(_IMPLAUSIBLE, f"{name} is not a whole number of at least 0")
        if output_tokens is not None and output_tokens > _MAX_OUTPUT_SHARE * self.max_tokens:
            return Failure(_IMPLAUSIBLE, f"completion_tokens over {_MAX_OUTPUT_SHARE} x max_tokens ({self.max_tokens})")
        if prompt_tokens is not None and prompt_tokens > _MAX_PROMPT_TOKENS:
            return Failure(_IMPLAUSIBLE, f"prompt_tokens over {_MAX_PROMPT_TOKENS:,}")
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens
        return None

    def record(self, sent_at: float, now: float, failure: Failure | None) -> RequestRecord:
        return RequestRecord(
            sent_at=sent_at,
            ttft_seconds=self.ttft,
            e2e_seconds=None if failure else now - self.started,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            error=failure.reason if failure else None,
            gap_count=self.gaps.count,
            gap_total_seconds=self.gaps.total_seconds,
        )


def _incomplete(stream: _Stream, max_tokens: int, allow_short: bool) -> Failure | None:
    """An answer that streamed no text, or (unless early stops are allowed) fewer tokens than asked for."""
    if stream.ttft is None or stream.output_tokens == 0:
        return Failure("empty answer", "the server streamed no text")
    if not allow_short and stream.output_tokens is not None and stream.output_tokens < max_tokens:
        return Failure("short answer", f"{stream.output_tokens} of {max_tokens} tokens")
    return None


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds, cut to MAX_RETRY_AFTER_SECONDS; None where it is absent or not a number
    of seconds (an HTTP date is not read: a server that is back at a date is not a load-test's to wait for)."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _has_text(kind: str, choices: Any) -> bool:
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if kind == "chat":
            delta = choice.get("delta")
            # Reasoning models stream their thinking first; it is generated tokens all the same.
            if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
                return True
        elif choice.get("text"):
            return True
    return False


async def send(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    model: str,
    prompt: Prompt,
    max_tokens: int,
    limits: Limits,
    *,
    sent_at: float = 0.0,
    ignore_eos: bool = False,
    allow_short: bool = False,
    itl_gaps: DurationSummary | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[RequestRecord, Failure | None]:
    """Send one streamed request and measure it; `sent_at` is stored as given (the caller's step clock). Also the
    failure with the server's own words (the preflight explains them) and its Retry-After (a worker waits it).
    A request that completes merges its gaps into `itl_gaps` (its step's), which the record does not carry."""
    stream = _Stream(clock(), max_tokens)
    body = request_body(endpoint, model, prompt, max_tokens, ignore_eos)
    try:
        async with asyncio.timeout(limits.total_seconds):
            failure = await _exchange(session, endpoint, body, limits, stream, clock)
        failure = failure or _incomplete(stream, max_tokens, allow_short)
    except TimeoutError:
        failure = Failure("timeout", f"no complete answer within {limits.total_seconds:g}s")
    except aiohttp.ClientConnectorError as error:
        refused = isinstance(error.os_error, ConnectionRefusedError)
        failure = Failure("connection refused" if refused else "cannot connect", str(error.os_error))
    except (aiohttp.ClientError, OSError) as error:
        failure = Failure("connection lost", f"{type(error).__name__}: {error}")
    if failure is None and itl_gaps is not None:
        itl_gaps.merge(stream.gaps)
    return stream.record(sent_at, clock(), failure), failure


async def _exchange(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    body: dict[str, Any],
    limits: Limits,
    stream: _Stream,
    clock: Callable[[], float],
) -> Failure | None:
    async with session.post(endpoint.url, json=body, headers=endpoint.headers, allow_redirects=False) as response:
        if response.status != 200:
            return await _http_failure(response)
        if "json" in response.headers.get("Content-Type", ""):
            return await _json_answer(response)
        # One timer rescheduled per read, not a wait_for per line: at hundreds of streams a task per line is what
        # would make the load generator, not the server, the bottleneck.
        stall_timer = asyncio.timeout(None)
        try:
            async with stall_timer:
                return await _read_events(response, endpoint.kind, limits, stream, stall_timer, clock)
        except TimeoutError:
            if stall_timer.expired():
                return Failure("stalled", f"nothing streamed for {limits.stall_seconds:g}s")
            raise


async def _read_events(
    response: aiohttp.ClientResponse,
    kind: str,
    limits: Limits,
    stream: _Stream,
    stall_timer: asyncio.Timeout,
    clock: Callable[[], float],
) -> Failure | None:
    loop = asyncio.get_running_loop()
    events = _EventReader()
    while True:
        # Before the first token the request may be queued, which is latency, not a stall: only the total timeout
        # bounds that wait.
        if stream.last_text_at is not None:
            stall_timer.reschedule(loop.time() + limits.stall_seconds)
        received = await response.content.readany()
        if not received:
            return Failure("bad response: stream ended before [DONE]")
        now = clock()
        lines = events.lines(received)
        if lines is None:
            return Failure("bad response: a line over 1 MiB")
        for line in lines:
            taken = events.take(line)
            failure = _event(taken, kind, stream, now) if isinstance(taken, str) else taken
            if failure is not None:
                return failure
            if stream.done:  # the answer's end, whether or not the server closes the connection after it
                return None


class _EventReader:
    """A server-sent event stream read as the HTML standard reads one. A line ends with CRLF, LF or a lone CR; the
    stream's one leading byte-order mark is dropped; ":" starts a comment; an event's data lines (one space after
    "data:" dropped) join with LF, and a blank line ends the event."""

    def __init__(self) -> None:
        # The start of a line whose end has not come, in the pieces it was read in: joined once, when its end comes,
        # so that a long line read in many small pieces costs its length, not its length times its pieces.
        self._unended: list[bytes] = []
        self._unended_bytes = 0
        # The last read ended with a CR: its line was complete, but an LF opening the next read is the CR's own
        # (one CRLF split across two reads), not the end of a blank line that would end the event early.
        self._after_cr = False
        self._at_start = True  # no line yet: the first may open with a byte-order mark
        self._data: list[bytes] = []
        self._streaming = False  # a data line came: the body is an event stream, whose unknown fields are ignored
        self._data_bytes = 0

    def lines(self, received: bytes) -> list[bytes] | None:
        """The lines `received` completes, without their ends; None where a line is longer than the bound, whether
        or not its end has come."""
        if self._after_cr and received.startswith(b"\n"):
            received = received[1:]
        # A line is given as soon as its end is read, a CR included: holding it for a possible LF would hold an
        # event that a CR ends until the server sent more.
        self._after_cr = received.endswith(b"\r")
        if b"\n" not in received and b"\r" not in received:
            self._unended.append(received)
            self._unended_bytes += len(received)
            return None if self._unended_bytes > _MAX_EVENT_BYTES else []
        buffer = b"".join([*self._unended, received])
        lines = buffer.splitlines()
        unended = b"" if received.endswith((b"\r", b"\n")) else lines.pop()
        self._unended, self._unended_bytes = [unended], len(unended)
        # No line is longer than the buffer: most reads are far shorter than the bound, and need no line measured.
        if len(buffer) > _MAX_EVENT_BYTES and max(map(len, [unended, *lines])) > _MAX_EVENT_BYTES:
            return None
        if self._at_start and lines:
            lines[0] = lines[0].removeprefix(_BYTE_ORDER_MARK)
            self._at_start = False
        return lines

    def take(self, line: bytes) -> str | Failure | None:
        """Take one line: the data of the event it ends, if any; a failure where the line is no event stream's, or
        its event's data too long."""
        if not line:
            return self._dispatch()
        if line.startswith(b"data:"):
            value = line[5:]
            return self._add_data(value[1:] if value.startswith(b" ") else value)
        if line.startswith(b":"):
            return None
        if line == b"data":  # a field without a colon has an empty value: here an empty data line
            return self._add_data(b"")
        if self._streaming or line.partition(b":")[0] in (b"event", b"id", b"retry"):
            return None
        # The standard ignores a field it does not know, but a body that opens with such lines is no event stream.
        return Failure("not streaming", "the body is not server-sent events (no `data:` lines)")

    def _add_data(self, value: bytes) -> Failure | None:
        # The LF that joins a line to the one before counts: empty data lines are an event's LFs, as many as sent.
        self._streaming = True
        self._data_bytes += len(value) + (1 if self._data else 0)
        if self._data_bytes > _MAX_EVENT_BYTES:
            return Failure("bad response: an event over 1 MiB")
        self._data.append(value)
        return None

    def _dispatch(self) -> str | None:
        """The data of the event a blank line ended, where it had any."""
        if not self._data:
            return None
        data = b"\n".join(self._data).decode("utf-8", errors="replace")
        self._data.clear()
        self._data_bytes = 0
        return data


def _event(data: str, kind: str, stream: _Stream, now: float) -> Failure | None:
    """One event's data: the answer's end, or one of its chunks."""
    if data.strip() == "[DONE]":
        stream.done = True
        return None
    try:
        payload = json.loads(data)
    except ValueError:
        return Failure("bad response: a chunk is not JSON", data[:200])
    except RecursionError:
        return Failure("bad response: a chunk nested too deeply to read")
    return stream.chunk(kind, payload, now)


def redirected_to(response: aiohttp.ClientResponse) -> str:
    """Where a 3xx answer pointed. Loadtest follows no redirect: one to another origin would carry the API key
    there, and one within the server means --url is not the address that serves the API."""
    location = response.headers.get("Location", "nowhere")[:200]
    return f"redirected to {location} (loadtest does not follow redirects)"


async def _http_failure(response: aiohttp.ClientResponse) -> Failure:
    """A non-200 answer: its status as the reason; where it redirected to, or the server's message, as detail."""
    reason = f"http {response.status}"
    if 300 <= response.status < 400:
        return Failure(reason, redirected_to(response))
    retry = retry_after_seconds(response.headers.get("Retry-After")) if response.status in _RETRY_STATUSES else None
    return Failure(reason, await _error_message(response), retry)


async def _json_answer(response: aiohttp.ClientResponse) -> Failure:
    """A 200 with one JSON body instead of a stream. Some servers answer an error so, with status 200: its message
    says why, where "not streaming" would send the user looking for a streaming server."""
    _, payload = await _small_json(response)
    if isinstance(payload, dict) and payload.get("error"):
        return Failure("bad response: error in body", _stated_message(payload) or "")
    return Failure("not streaming", "the server answered one JSON body, not an event stream")


async def _error_message(response: aiohttp.ClientResponse) -> str:
    """The server's message from an error body ({"error": {"message"}} or {"detail"}), else its first bytes."""
    text, payload = await _small_json(response)
    return (_stated_message(payload) if isinstance(payload, dict) else None) or text.strip()[:200]


async def _small_json(response: aiohttp.ClientResponse) -> tuple[str, Any]:
    """The body's first bytes as text, and as JSON where they are that (else None): a body nested too deeply to
    read is no message either."""
    text = (await response.content.read(_ERROR_BODY_BYTES)).decode("utf-8", errors="replace")
    try:
        return text, json.loads(text)
    except (ValueError, RecursionError):
        return text, None


def _stated_message(payload: dict[str, Any]) -> str | None:
    """The message an error body states, where it states one."""
    error = payload.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:200]
    if isinstance(error, str):
        return error[:200]
    if payload.get("message") or payload.get("detail"):
        return str(payload.get("message") or payload.get("detail"))[:200]
    return None
