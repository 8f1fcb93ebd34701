"""The knee search: the highest concurrency at which a step still passes, found by doubling then bisection.

Doubling from 1 brackets the knee in O(log max) steps; bisection then narrows the bracket until its width is
within `tolerance` of the knee (or one request), so the knee found is within that share of the true one as long
as passing is monotone in concurrency. No concurrency is run twice. The search stops at a step the user
interrupted, keeping what it knew.

What limited the run is read from the first failing step (the lowest failing concurrency) and the knee, in order
of what would make the others misleading: a load generator that could not keep up says nothing about the server;
errors are the server refusing; a filled KV cache is the cause behind latency breaking; otherwise the SLO that
lost most requests.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from exporter.loadtest.judge import StepSummary

LimitedBy = Literal["slo:ttft", "slo:itl", "errors", "kv_cache", "client", "max_concurrency", "none"]

DEFAULT_TOLERANCE = 0.1
# Above this event-loop lag the load generator was sending late: the offered load was not what it claims.
CLIENT_LAG_LIMIT_SECONDS = 0.050
KV_FULL_RATIO = 0.95


@dataclass(frozen=True)
class Search:
    knee: StepSummary | None  # None when concurrency 1 already fails, or nothing was judged
    steps: tuple[StepSummary, ...]  # in the order run
    limited_by: LimitedBy
    reason: str  # one sentence a person reads


async def find_knee(
    run_step: Callable[[int], Awaitable[StepSummary]], max_concurrency: int, tolerance: float = DEFAULT_TOLERANCE
) -> Search:
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
    steps: list[StepSummary] = []
    highest_pass: StepSummary | None = None
    lowest_fail: StepSummary | None = None

    async def judge(concurrency: int) -> bool | None:
        """Runs one step; True when it passed, False when it failed, None when the user interrupted it."""
        nonlocal highest_pass, lowest_fail
        step = await run_step(concurrency)
        steps.append(step)
        if step.interrupted:
            return None
        if step.passed:
            highest_pass = step
        else:
            lowest_fail = step
        return step.passed

    concurrency = 1
    while True:
        passed = await judge(concurrency)
        if passed is None:
            return _conclude(steps, highest_pass, lowest_fail, interrupted=True)
        if not passed or concurrency >= max_concurrency:
            break
        concurrency = min(2 * concurrency, max_concurrency)

    while highest_pass is not None and lowest_fail is not None:
        low, high = highest_pass.concurrency, lowest_fail.concurrency
        if high - low <= max(1.0, tolerance * low):
            break
        if await judge((low + high) // 2) is None:
            return _conclude(steps, highest_pass, lowest_fail, interrupted=True)
    return _conclude(steps, highest_pass, lowest_fail, interrupted=False)


def _conclude(
    steps: list[StepSummary], knee: StepSummary | None, first_fail: StepSummary | None, *, interrupted: bool
) -> Search:
    limited_by, reason = limiting_factor(knee, first_fail, interrupted=interrupted)
    return Search(knee=knee, steps=tuple(steps), limited_by=limited_by, reason=reason)


def limiting_factor(
    knee: StepSummary | None, first_fail: StepSummary | None, *, interrupted: bool
) -> tuple[LimitedBy, str]:
    """What stopped the load from rising, and one sentence saying so."""
    if first_fail is None:
        if interrupted or knee is None:
            return "none", "The run stopped before any step failed, so no limit was found."
        return (
            "max_concurrency",
            f"Every step passed up to the maximum concurrency {knee.concurrency}: the server's limit lies above it.",
        )
    at = f"at concurrency {first_fail.concurrency}"
    if first_fail.client_lag_p99_seconds > CLIENT_LAG_LIMIT_SECONDS:
        return "client", (
            f"The load generator lagged {first_fail.client_lag_p99_seconds * 1000:.0f} ms (p99) {at}: it could not "
            "send on time, so this is the client's limit, not the server's; run it from a larger machine."
        )
    if first_fail.failing_slo == "errors":
        return "errors", f"{first_fail.errors} of {first_fail.requests} requests failed {at}."
    filled = _cache_filled(first_fail, knee)
    if filled is not None:
        return "kv_cache", f"The KV cache filled ({_kv_evidence(filled)}), and latency broke the SLO {at}."
    slo = first_fail.failing_slo or "ttft"
    share = f"{first_fail.slo_attainment:.1%}" if first_fail.slo_attainment is not None else "no requests"
    limited_by: LimitedBy = "slo:itl" if slo == "itl" else "slo:ttft"
    return limited_by, (
        f"The {slo.upper()} objective broke {at} ({share} of requests met the SLOs) while the KV cache still had room."
    )


def _cache_filled(first_fail: StepSummary, knee: StepSummary | None) -> StepSummary | None:
    """The step showing the KV cache full (usage near 1 or preemptions), or a queue building past the knee."""
    for step in (first_fail, knee):
        if step is None:
            continue
        if step.kv_cache_usage_max is not None and step.kv_cache_usage_max >= KV_FULL_RATIO:
            return step
        if step.preemptions:
            return step
    # Requests arriving between two engine iterations wait a moment at any load; a queue that builds is at least
    # one request deep on average and more than twice what it was at the knee.
    waiting = first_fail.requests_waiting
    waiting_at_knee = (knee.requests_waiting or 0.0) if knee is not None else 0.0
    if waiting is not None and waiting >= 1.0 and waiting > 2 * waiting_at_knee:
        return first_fail
    return None


def _kv_evidence(step: StepSummary) -> str:
    parts = []
    if step.kv_cache_usage_max is not None:
        parts.append(f"usage up to {step.kv_cache_usage_max:.0%}")
    if step.preemptions:
        parts.append(f"{step.preemptions:.0f} preemptions")
    if step.requests_waiting:
        parts.append(f"{step.requests_waiting:.1f} requests waiting on average")
    return ", ".join(parts) + f" at concurrency {step.concurrency}"
