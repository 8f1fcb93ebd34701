"""Judging a load step: which requests met the SLOs, whether the step passes, and what the step measured.

A request is good when it completed, streamed the tokens it was asked for, and met every latency threshold that is
set; errors, timeouts, empty and short answers are misses, never dropped.

Whether a step meets the objective is decided by Wald's sequential probability ratio test on the miss rate, which
keeps its error rates however often it is looked at. It tests a miss rate of half the allowed one (the server
meets the objective with room: "pass") against twice the allowed one ("fail"); at objective 0.99 that is 99.5%
against 98%. The step may stop as soon as the ratio crosses the fail boundary; it passes where the ratio over all its
requests is past the pass boundary at its end, and one between the two is "unsure", decided by its point estimate
(the notes say so).
Looks take only the requests sent before the oldest one still in flight, in the order they were sent, so the
slowest requests (the likely misses) are never judged after the fast ones that overtook them.

`SequentialTest.ALPHA` (a server with room failed) and `BETA` (a server at twice the allowed miss rate passed) are
the nominal error rates; the rates measured on seeded request streams are in tests/loadtest/test_statistics.py.

A step is saturated, by the engine's own account, when requests waited in at least a tenth of its samples while
the KV cache was at its ceiling, or the engine preempted: the engine could not hold the load it was offered. The
search adds the throughput plateau, which needs the steps around it (exporter.loadtest.search).
"""

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from exporter.loadtest.measure import EngineSample, OfferedLoad, RequestRecord, SloSpec, StepRun

Verdict = Literal["pass", "fail", "unsure"]
FailingSlo = Literal["ttft", "itl", "errors"]
EngineSignal = Literal["kv_full", "queue", "preemptions"]

# z for a two-sided 95% interval: the attainment interval shown beside each step (descriptive; the test decides).
_Z95 = 1.959963984540054
# A step still unsure at its planned end runs on up to this multiple of its duration.
MAX_EXTENSION = 2.0
# KV usage at or above this share is the pool's ceiling: a block pool is never 100% used (vLLM keeps a null block,
# and whole-block requests leave a remainder), so "full" is near 1, not 1.
KV_FULL_RATIO = 0.95
# Requests waiting in at least this share of the step's engine samples is a queue that persists. On the test engine
# a level under its pool showed none in any sample, and the first level over it 19-62% (one request waits for the
# next to finish); a transient admission wait on a fast engine is no saturation without a full pool or a plateau.
QUEUE_SAMPLE_SHARE = 0.1


@dataclass(frozen=True)
class SequentialTest:
    """Wald's SPRT of a miss rate `pass_rate` (half the objective's allowance) against `fail_rate` (twice it)."""

    objective: float
    ALPHA = 0.05  # nominal chance of failing a step whose true miss rate is pass_rate
    BETA = 0.05  # nominal chance of passing a step whose true miss rate is fail_rate

    @property
    def pass_rate(self) -> float:
        return (1 - self.objective) / 2

    @property
    def fail_rate(self) -> float:
        allowed = 1 - self.objective
        # Twice the allowance, or halfway to 1 where twice would reach it (objectives at or under 0.5).
        return min(2 * allowed, (1 + allowed) / 2)

    @property
    def fail_boundary(self) -> float:
        return math.log((1 - self.BETA) / self.ALPHA)

    @property
    def pass_boundary(self) -> float:
        return math.log(self.BETA / (1 - self.ALPHA))

    @property
    def _per_miss(self) -> float:
        return math.log(self.fail_rate / self.pass_rate)

    @property
    def _per_good(self) -> float:
        return math.log((1 - self.fail_rate) / (1 - self.pass_rate))  # negative

    def log_ratio(self, good: int, total: int) -> float:
        """The log likelihood ratio of failing to passing after `total` requests of which `good` were good."""
        return (total - good) * self._per_miss + good * self._per_good

    def verdict(self, good: int, total: int) -> Verdict:
        ratio = self.log_ratio(good, total)
        if ratio >= self.fail_boundary:
            return "fail"
        if ratio <= self.pass_boundary:
            return "pass"
        return "unsure"

    def good_requests_to_pass(self, good: int, total: int) -> int:
        """How many more good requests in a row would bring the test to a pass (0 when it has passed)."""
        gap = self.log_ratio(good, total) - self.pass_boundary
        return max(0, math.ceil(round(gap / -self._per_good, 9)))


def wilson_interval(good: int, total: int) -> tuple[float, float]:
    """95% Wilson score interval of good/total; (0, 1) with no observations."""
    if total == 0:
        return 0.0, 1.0
    share = good / total
    z2 = _Z95 * _Z95
    centre = (share + z2 / (2 * total)) / (1 + z2 / total)
    half = _Z95 * math.sqrt(share * (1 - share) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def misses(record: RequestRecord, slos: SloSpec) -> tuple[FailingSlo, ...]:
    """Why a request missed the SLOs; () when it was good. An error is the only reason for a failed request."""
    if not record.completed:
        return ("errors",)
    reasons: list[FailingSlo] = []
    if slos.ttft_seconds is not None and (record.ttft_seconds is None or record.ttft_seconds > slos.ttft_seconds):
        reasons.append("ttft")
    # A request with a single output token has no gaps, so it cannot miss the ITL objective.
    mean_itl = record.mean_itl_seconds
    if slos.itl_seconds is not None and mean_itl is not None and mean_itl > slos.itl_seconds:
        reasons.append("itl")
    return tuple(reasons)


def _good(records: Iterable[RequestRecord], slos: SloSpec) -> int:
    return sum(1 for record in records if not misses(record, slos))


def judged_so_far(records: Sequence[RequestRecord], oldest_in_flight: float | None) -> list[RequestRecord]:
    """The requests a look may judge: those sent before the oldest request still in flight (its `sent_at`, None when
    none is), in the order they were sent."""
    ordered = sorted(records, key=lambda record: record.sent_at)
    if oldest_in_flight is None:
        return ordered
    return [record for record in ordered if record.sent_at < oldest_in_flight]


def certainly_failing(judged: Sequence[RequestRecord], slos: SloSpec) -> str | None:
    """Why a running step is certainly failing (the StepRun.ended_early text), or None while it may pass."""
    test = SequentialTest(slos.objective)
    good = _good(judged, slos)
    if test.verdict(good, len(judged)) != "fail":
        return None
    return f"certainly failing: {len(judged) - good} of {len(judged)} requests missed (sequential test)"


def worth_extending(judged: Sequence[RequestRecord], slos: SloSpec, extension_share: float) -> bool:
    """Whether a step still unsure at its planned end should run on: only when the extension, `extension_share` of
    the time run so far, can bring the good requests a pass needs at the rate seen so far. A step at low
    concurrency that cannot would spend the extension and still be decided by its point estimate."""
    test = SequentialTest(slos.objective)
    good, total = _good(judged, slos), len(judged)
    if test.verdict(good, total) != "unsure":
        return False
    return total * extension_share >= test.good_requests_to_pass(good, total)


@dataclass(frozen=True)
class StepSummary(OfferedLoad):
    """One load step, judged: what the client measured, what the engine said, and the verdict."""

    concurrency: int  # closed loop: requests held in flight; open loop: the cap on them
    request_rate: float  # completed requests per second
    output_tokens_per_second: float
    kv_cache_usage_ratio: float | None  # p90 of the engine's samples
    kv_cache_usage_max: float | None
    requests_waiting: float | None  # mean of the samples
    requests_running: float | None
    waiting_sample_share: float | None  # share of the engine's samples with a request waiting
    preemptions: float | None  # increase over the step
    engine_signals: tuple[EngineSignal, ...]  # what the engine's samples say of its load, in a fixed order
    ttft_p50_seconds: float | None
    ttft_p99_seconds: float | None
    itl_p50_seconds: float | None  # over every gap of every completed request, within sketch.RELATIVE_ACCURACY
    itl_p99_seconds: float | None
    e2e_p50_seconds: float | None
    e2e_p99_seconds: float | None
    slo_attainment: float | None  # None without requests
    attainment_low: float
    attainment_high: float
    requests: int
    errors: int
    duration_seconds: float
    warmup_seconds: float
    verdict: Verdict
    passed: bool  # the verdict, or the point estimate where the verdict is "unsure"
    failing_slo: FailingSlo | None  # the criterion that lost most requests
    client_lag_p99_seconds: float
    ended_early: str | None
    interrupted: bool
    engine: tuple[EngineSample, ...]
    engine_error: str | None
    offered_rate: float | None = None  # open loop: requests/s offered (None: closed loop)
    # How many requests failed for each reason ("http 429": 12), most frequent first: what `errors` counts.
    error_reasons: Mapping[str, int] = field(default_factory=dict)

    @property
    def engine_saturated(self) -> bool:
        """The engine could not hold the load: a queue that persisted with the KV cache at its ceiling, or
        preemptions."""
        signals = set(self.engine_signals)
        return "preemptions" in signals or {"queue", "kv_full"} <= signals


def engine_signals(samples: Sequence[EngineSample]) -> tuple[EngineSignal, ...]:
    """kv_full (p90 usage at the ceiling), queue (requests waiting in a tenth of the samples at least),
    preemptions (the counter rose)."""
    usage = sorted(_present(s.kv_cache_usage_ratio for s in samples))
    p90 = percentile(usage, 0.90)
    share = _waiting_share(samples)
    preempted = _increase(_present(s.preemptions_total for s in samples))
    found: list[EngineSignal] = []
    if p90 is not None and p90 >= KV_FULL_RATIO:
        found.append("kv_full")
    if share is not None and share >= QUEUE_SAMPLE_SHARE:
        found.append("queue")
    if preempted:
        found.append("preemptions")
    return tuple(found)


def certainly_saturated(samples: Sequence[EngineSample], planned_samples: int) -> str | None:
    """Why a running step is certainly saturated (the StepRun.ended_early text), or None while it may not be.

    Certain means no sample still to come can change the step's signals: the engine preempted, or the samples so
    far already hold, out of the `planned_samples` a whole step would have, enough at a full KV cache for its p90 to
    be at the ceiling and enough with requests waiting for the queue's share. The step ends no sooner than a
    quarter of its planned samples, so its throughput and latencies still come from a window worth reading."""
    if len(samples) < planned_samples / 4:
        return None
    if _increase(_present(s.preemptions_total for s in samples)):
        return "certainly saturated: the engine preempted requests"
    full = sum(1 for usage in _present(s.kv_cache_usage_ratio for s in samples) if usage >= KV_FULL_RATIO)
    queued = sum(1 for waiting in _present(s.requests_waiting for s in samples) if waiting > 0)
    # `percentile` interpolates between ranks: p90 of n values is at the ceiling once its top n - floor(0.9 (n - 1))
    # are, and that count only grows with n, so reaching it for the planned n holds for any shorter step too.
    full_needed = planned_samples - math.floor(0.9 * (planned_samples - 1))
    if full < full_needed or queued < math.ceil(QUEUE_SAMPLE_SHARE * planned_samples):
        return None
    return f"certainly saturated: KV cache full in {full} and requests waiting in {queued} of {len(samples)} samples"


def _waiting_share(samples: Sequence[EngineSample]) -> float | None:
    waiting = _present(s.requests_waiting for s in samples)
    return sum(1 for value in waiting if value > 0) / len(waiting) if waiting else None


def summarize(run: StepRun, slos: SloSpec) -> StepSummary:
    records = run.requests
    completed = [record for record in records if record.completed]
    miss_counts: dict[FailingSlo, int] = {"errors": 0, "ttft": 0, "itl": 0}
    good = 0
    for record in records:
        reasons = misses(record, slos)
        good += not reasons
        for reason in reasons:
            miss_counts[reason] += 1
    total = len(records)
    low, high = wilson_interval(good, total)
    step_verdict = SequentialTest(slos.objective).verdict(good, total)
    attainment = good / total if total else None
    worst = max(miss_counts, key=lambda name: miss_counts[name])
    ttfts = sorted(r.ttft_seconds for r in completed if r.ttft_seconds is not None)
    e2es = sorted(r.e2e_seconds for r in completed if r.e2e_seconds is not None)
    usage = sorted(_present(s.kv_cache_usage_ratio for s in run.engine))
    return StepSummary(
        concurrency=run.concurrency,
        offered_rate=run.offered_rate,
        request_rate=run.completed_in_window / run.window_seconds if run.window_seconds > 0 else 0.0,
        output_tokens_per_second=run.output_tokens_in_window / run.window_seconds if run.window_seconds > 0 else 0.0,
        kv_cache_usage_ratio=percentile(usage, 0.90),
        kv_cache_usage_max=usage[-1] if usage else None,
        requests_waiting=_mean(_present(s.requests_waiting for s in run.engine)),
        requests_running=_mean(_present(s.requests_running for s in run.engine)),
        waiting_sample_share=_waiting_share(run.engine),
        preemptions=_increase(_present(s.preemptions_total for s in run.engine)),
        engine_signals=engine_signals(run.engine),
        ttft_p50_seconds=percentile(ttfts, 0.50),
        ttft_p99_seconds=percentile(ttfts, 0.99),
        itl_p50_seconds=run.itl_gaps.quantile(0.50),
        itl_p99_seconds=run.itl_gaps.quantile(0.99),
        e2e_p50_seconds=percentile(e2es, 0.50),
        e2e_p99_seconds=percentile(e2es, 0.99),
        slo_attainment=attainment,
        attainment_low=low,
        attainment_high=high,
        requests=total,
        errors=total - len(completed),
        duration_seconds=run.duration_seconds,
        warmup_seconds=run.warmup_seconds,
        verdict=step_verdict,
        passed=step_verdict == "pass" or (step_verdict == "unsure" and (attainment or 0.0) >= slos.objective),
        failing_slo=worst if miss_counts[worst] else None,
        client_lag_p99_seconds=run.client_lag_p99_seconds,
        ended_early=run.ended_early,
        interrupted=run.interrupted,
        engine=run.engine,
        engine_error=run.engine_error,
        error_reasons=dict(Counter(record.error for record in records if record.error is not None).most_common()),
    )


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default) over values sorted ascending."""
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _present(values: Iterable[float | None]) -> list[float]:
    """The values the engine reported, in time order."""
    return [value for value in values if value is not None]


def _mean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    # A page's absurd count (1e308 waiting) overflows the sum to infinity, which no JSON or threshold can hold; the
    # shares of it summed stay finite.
    return mean if math.isfinite(mean) else sum(value / len(values) for value in values)


def _increase(counter_values: Sequence[float]) -> float | None:
    # A counter that went down restarted with the engine: its count since then is a lower bound worth more than 0.
    if not counter_values:
        return None
    increase = counter_values[-1] - counter_values[0]
    return increase if increase >= 0 else counter_values[-1]
