"""What a load step measures: per-request client timings, engine readings and the step as a whole. Values only."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.loadtest.sketch import DurationSummary


def step_load(step: Mapping[str, Any]) -> float:
    """A result.json step's load: its offered rate (open loop) or its concurrency (closed loop)."""
    rate = step.get("offered_rate")
    load: float = step["concurrency"] if rate is None else rate
    return load


def open_loop(steps: Sequence[Mapping[str, Any]]) -> bool:
    """Whether result.json's steps were open loop (--rate): their loads, and the answers, are requests/s."""
    return any(step.get("offered_rate") is not None for step in steps)


def describe_load(concurrency: int, offered_rate: float | None) -> str:
    """A step's load in words: "concurrency 16" (closed loop) or "8 requests/s" (open loop)."""
    return f"concurrency {concurrency}" if offered_rate is None else f"{offered_rate:g} requests/s"


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it. Times in seconds; `sent_at` since the step started (monotonic).

    `error` is None when the request completed, else a short reason: "timeout", "stalled", "http 503",
    "connection refused", "cannot connect", "connection lost", "not streaming", "empty answer", "short answer",
    "bad response: ...", "client error: ...", "not sent: ..." (an open-loop arrival past the cap in flight).
    """

    sent_at: float
    ttft_seconds: float | None  # None when no token arrived
    e2e_seconds: float | None  # None when it did not complete
    prompt_tokens: int | None  # from the server's usage (stream_options.include_usage)
    output_tokens: int | None
    error: str | None
    # The gaps between streamed chunks that carried text: their count and sum, all the ITL objective judges (their
    # mean). The gaps themselves go into the step's summary (StepRun.itl_gaps), never into the record.
    gap_count: int = 0
    gap_total_seconds: float = 0.0

    @property
    def mean_itl_seconds(self) -> float | None:
        return self.gap_total_seconds / self.gap_count if self.gap_count else None

    @property
    def completed(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class EngineSample:
    """One reading of the engine's /metrics during a step; None where the engine does not say."""

    t: float  # seconds since the step started
    kv_cache_usage_ratio: float | None
    requests_running: float | None
    requests_waiting: float | None
    preemptions_total: float | None

    @property
    def requests_in_engine(self) -> float:
        """Requests running and waiting: the load the engine held (0 where it says neither)."""
        return (self.requests_running or 0.0) + (self.requests_waiting or 0.0)


@dataclass(frozen=True)
class SloSpec:
    """The latency objectives a step is judged by; a threshold of None is not judged."""

    ttft_seconds: float | None
    itl_seconds: float | None
    objective: float  # share of requests that must meet every threshold, e.g. 0.99

    @property
    def judges_latency(self) -> bool:
        """Whether a step can fail on latency; without a threshold only errors fail it."""
        return self.ttft_seconds is not None or self.itl_seconds is not None


class OfferedLoad:
    """What a step offered, for the step's two records (StepRun, and the judged StepSummary) alike."""

    concurrency: int
    offered_rate: float | None

    @property
    def load(self) -> float:
        """Its arrival rate (open loop) or its concurrency (closed loop): what the search orders steps by."""
        return self.concurrency if self.offered_rate is None else self.offered_rate

    @property
    def load_text(self) -> str:
        return describe_load(self.concurrency, self.offered_rate)


@dataclass(frozen=True)
class StepRun(OfferedLoad):
    """What one load step produced (warm-up already discarded)."""

    concurrency: int
    duration_seconds: float  # measured part only
    requests: tuple[RequestRecord, ...]
    engine: tuple[EngineSample, ...]  # () when /metrics is unreachable
    engine_error: str | None  # why there are no engine samples, else None
    client_lag_p99_seconds: float  # event-loop lag of the load generator (asyncio sleep overshoot)
    ended_early: str | None  # e.g. "certainly failing: upper bound 0.62 < 0.99 after 40 requests"
    # Throughput is counted over the window in which the load was held (from the warm-up's end until sending
    # stopped): every request that completed inside it, whenever it was sent. Counting only the requests judged
    # (sent inside the window) would read a short step, one that ended early, as a throughput drop: its last
    # requests are still in flight and its first completions belong to warm-up sends.
    window_seconds: float
    completed_in_window: int
    output_tokens_in_window: int
    warmup_seconds: float = 0.0  # the discarded start, over which the workers ramped in
    interrupted: bool = False  # Ctrl-C during the step
    # Open loop (--rate): requests arrived at this rate, whatever the server's pace, and `concurrency` is only the
    # cap on requests in flight. None: a closed loop of `concurrency` requests.
    offered_rate: float | None = None
    # Every gap between text chunks of the requests that completed, as a summary of bounded size: what the step's ITL
    # percentiles are read from. Only added to while the step runs.
    itl_gaps: DurationSummary = field(default_factory=DurationSummary)
