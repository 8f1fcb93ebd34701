"""Judging a load step: which requests met the SLOs, how sure we are of the share, and what the step measured.

A request is good when it completed and met every latency threshold that is set; errors and timeouts are misses,
never dropped. The share of good requests (SLO attainment) is judged with a 95% Wilson score interval rather than
the point estimate alone, because a step at low concurrency sees few requests:

- "fail" when even the interval's upper bound is under the objective: certain, so a step may end early once it has
  `EARLY_FAIL_MIN_REQUESTS`;
- "pass" when the step saw `min_requests(objective)` requests and the point estimate meets the objective;
- "unsure" otherwise: the runner extends the step, and if it is still unsure the point estimate decides
  (`StepSummary.passed`) and the result says so.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from exporter.loadtest.measure import EngineSample, RequestRecord, SloSpec, StepRun

Verdict = Literal["pass", "fail", "unsure"]
FailingSlo = Literal["ttft", "itl", "errors"]

# z for a two-sided 95% interval.
_Z95 = 1.959963984540054
# Below this many requests one early miss is too likely to be bad luck to stop a step on.
EARLY_FAIL_MIN_REQUESTS = 10
# A step still unsure at its planned end runs on up to this multiple of its duration.
MAX_EXTENSION = 2.0


def min_requests(objective: float) -> int:
    """Requests a step needs before it may pass: enough that 3 misses are expected at the objective (0.99 -> 300)."""
    # Rounded before ceil: 3 / (1 - 0.9) is 30.000000000000004 in floating point.
    return max(20, math.ceil(round(3 / (1 - objective), 6)))


def wilson_interval(good: int, total: int) -> tuple[float, float]:
    """95% Wilson score interval of good/total; (0, 1) with no observations."""
    if total == 0:
        return 0.0, 1.0
    share = good / total
    z2 = _Z95 * _Z95
    centre = (share + z2 / (2 * total)) / (1 + z2 / total)
    half = _Z95 * math.sqrt(share * (1 - share) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def verdict(good: int, total: int, objective: float) -> Verdict:
    _, high = wilson_interval(good, total)
    if total > 0 and high < objective:
        return "fail"
    if total >= min_requests(objective) and good / total >= objective:
        return "pass"
    return "unsure"


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


def early_failure(requests: Sequence[RequestRecord], slos: SloSpec) -> str | None:
    """Why a step running now is certainly failing (the StepRun.ended_early text), or None while it may pass."""
    total = len(requests)
    if total < EARLY_FAIL_MIN_REQUESTS:
        return None
    good = sum(1 for record in requests if not misses(record, slos))
    _, high = wilson_interval(good, total)
    if high >= slos.objective:
        return None
    return f"certainly failing: upper bound {high:.2f} < {slos.objective:g} after {total} requests"


def settled(requests: Sequence[RequestRecord], slos: SloSpec) -> str | None:
    """Why a running step may end now (the StepRun.ended_early text), or None while its verdict is open: certainly
    failing, or passing with the requests a pass needs, where running on would only refine a share already at the
    objective. Ending at the first moment a pass is reached favours a lucky moment a little; needing the requests
    in which 3 misses are expected at the objective keeps that small."""
    failing = early_failure(requests, slos)
    if failing is not None:
        return failing
    good = sum(1 for record in requests if not misses(record, slos))
    if verdict(good, len(requests), slos.objective) == "pass":
        return f"passing: {good} of {len(requests)} requests met the SLOs"
    return None


def worth_extending(requests: Sequence[RequestRecord], slos: SloSpec) -> bool:
    """Whether a step still unsure at its planned end should run on: only when MAX_EXTENSION times its length can
    reach the requests a pass needs at the rate seen so far. A step at low concurrency that cannot (at 0.99 a pass
    needs 300 requests) would spend the extension and still be decided by its point estimate."""
    good = sum(1 for record in requests if not misses(record, slos))
    unsure = verdict(good, len(requests), slos.objective) == "unsure"
    return unsure and len(requests) * MAX_EXTENSION >= min_requests(slos.objective)


@dataclass(frozen=True)
class StepSummary:
    """One load step, judged: what the client measured, what the engine said, and the verdict."""

    concurrency: int
    request_rate: float  # completed requests per second
    output_tokens_per_second: float
    kv_cache_usage_ratio: float | None  # p90 of the engine's samples
    kv_cache_usage_max: float | None
    requests_waiting: float | None  # mean of the samples
    requests_running: float | None
    preemptions: float | None  # increase over the step
    ttft_p50_seconds: float | None
    ttft_p99_seconds: float | None
    itl_p50_seconds: float | None  # over every gap of every request
    itl_p99_seconds: float | None
    e2e_p99_seconds: float | None
    slo_attainment: float | None  # None without requests
    attainment_low: float
    attainment_high: float
    requests: int
    errors: int
    duration_seconds: float
    verdict: Verdict
    passed: bool  # the verdict, or the point estimate where the verdict is "unsure"
    failing_slo: FailingSlo | None  # the criterion that lost most requests
    client_lag_p99_seconds: float
    ended_early: str | None
    interrupted: bool
    engine: tuple[EngineSample, ...]
    engine_error: str | None


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
    step_verdict_ = verdict(good, total, slos.objective)
    attainment = good / total if total else None
    worst = max(miss_counts, key=lambda name: miss_counts[name])
    duration = run.duration_seconds
    ttfts = sorted(r.ttft_seconds for r in completed if r.ttft_seconds is not None)
    gaps = sorted(gap for r in completed for gap in r.itl_seconds)
    e2es = sorted(r.e2e_seconds for r in completed if r.e2e_seconds is not None)
    return StepSummary(
        concurrency=run.concurrency,
        request_rate=run.completed_in_window / run.window_seconds if run.window_seconds > 0 else 0.0,
        output_tokens_per_second=run.output_tokens_in_window / run.window_seconds if run.window_seconds > 0 else 0.0,
        kv_cache_usage_ratio=percentile(sorted(_present(s.kv_cache_usage_ratio for s in run.engine)), 0.90),
        kv_cache_usage_max=max(_present(s.kv_cache_usage_ratio for s in run.engine), default=None),
        requests_waiting=_mean(_present(s.requests_waiting for s in run.engine)),
        requests_running=_mean(_present(s.requests_running for s in run.engine)),
        preemptions=_increase(_present(s.preemptions_total for s in run.engine)),
        ttft_p50_seconds=percentile(ttfts, 0.50),
        ttft_p99_seconds=percentile(ttfts, 0.99),
        itl_p50_seconds=percentile(gaps, 0.50),
        itl_p99_seconds=percentile(gaps, 0.99),
        e2e_p99_seconds=percentile(e2es, 0.99),
        slo_attainment=attainment,
        attainment_low=low,
        attainment_high=high,
        requests=total,
        errors=total - len(completed),
        duration_seconds=duration,
        verdict=step_verdict_,
        passed=step_verdict_ == "pass" or (step_verdict_ == "unsure" and (attainment or 0.0) >= slos.objective),
        failing_slo=worst if miss_counts[worst] else None,
        client_lag_p99_seconds=run.client_lag_p99_seconds,
        ended_early=run.ended_early,
        interrupted=run.interrupted,
        engine=run.engine,
        engine_error=run.engine_error,
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
    return sum(values) / len(values) if values else None


def _increase(counter_values: Sequence[float]) -> float | None:
    # A counter that went down restarted with the engine: its count since then is a lower bound worth more than 0.
    if not counter_values:
        return None
    increase = counter_values[-1] - counter_values[0]
    return increase if increase >= 0 else counter_values[-1]
