"""The search: the SLO knee and the saturation point, found by doubling then bisection, confirmed by repetition.

Two answers come from the same steps:

- the *SLO knee*: the highest concurrency whose step meets the SLOs at the objective, every level below it too;
- the *saturation point*: the lowest concurrency at which the engine could not hold the load it was offered, by
  its own metrics: a queue that persists while the KV cache is at its ceiling, or preemptions
  (`StepSummary.engine_saturated`); or a queue while the throughput has plateaued (within `PLATEAU_SHARE` of the
  median throughput of the higher concurrencies measured), which is how a batch-slot limit shows. The throughput
  plateau is a signal of its own, judged the same way.

The rise starts at 1, or where the engine's reported KV pool says it still holds every request (`pool_start`): on
a KV-limited engine that is one level under the saturation point, so concurrency 1 and the doublings under the
pool are never run. Doubling from there goes on until both are bracketed (a failing step; a saturated one) or the
maximum is reached. Past the saturation point load only queues, so the rise goes on by a quarter at a time
(`PAST_SATURATION_TOLERANCE`) up to twice it: the first level where the SLOs fail brackets the SLO knee as closely
as it needs to be there, with no bisection (with no latency SLO to judge, the first quarter is the last level:
nothing but errors can fail past it). Past the first failing step it goes on at most to
`SATURATION_SEARCH_PAST_FAIL` times it (the saturation point is then reported as not reached, if it was not). Each
bracket is then bisected, the lower one first, until it is within `tolerance` of its lower end (or one request); a
bracket with nothing measured under it reaches down to 0, so a start that already failed or saturated, or queued
at the maximum, is bisected down to 1 where need be. Where the engine saturated with its KV cache full, the first
probes into its bracket are where the pool should run out by the KV usage measured under it (`_pool_guess`): right,
they settle it in one or two steps instead of log2 of its width; wrong, they cost one or two steps before plain
bisection goes on. Last, the operating point (the lower of the two answers, the one thresholds and autoscaling
take) and the level above it are run again: a level passes only if every run of it passed, and is saturated if any
run was. Where the runs disagree the answer is reported as a range. The search stops at a step the user or the time
limit interrupted, keeping what it knew.

What limited the run is whichever came first: saturation (`kv_cache` where the pool was full or the engine
preempted, else `saturation`), or the first failing step, read in order of what would make the others misleading:
a load generator that could not keep up says nothing about the server; errors are the server refusing; otherwise
the SLO that lost most requests.
"""

import math
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from exporter.loadtest.judge import KV_FULL_RATIO, StepSummary
from exporter.loadtest.model import held_tokens

LimitedBy = Literal["slo:ttft", "slo:itl", "errors", "kv_cache", "saturation", "client", "max_concurrency", "none"]
Signal = Literal["throughput_plateau", "kv_full", "queue", "preemptions"]

DEFAULT_TOLERANCE = 0.1
# Above this event-loop lag the load generator was sending late: the offered load was not what it claims.
CLIENT_LAG_LIMIT_SECONDS = 0.050
# Throughput within this share of the median of the higher concurrencies' is a plateau: more load bought nothing.
# The median, not the most: a step that failed its SLOs ends early, and a short window's throughput is lumpy
# (requests finish in batches), so the highest of several steps is an outlier that would hide the plateau under it.
PLATEAU_SHARE = 0.05

# Past the first failing step, doubling goes on looking for the saturation point up to this multiple of it: an
# engine limited by compute may take far more load before it queues, and those steps answer nothing new.
SATURATION_SEARCH_PAST_FAIL = 4
# An SLO knee above the saturation point is where queueing alone breaks the SLO; nothing is calibrated from it (the
# operating point is the lower of the two), so its bracket is closed only to this share of its lower end.
PAST_SATURATION_TOLERANCE = 0.25
# Runs one step at a concurrency; the search awaits it.
RunStep = Callable[[int], Awaitable[StepSummary]]


@dataclass(frozen=True)
class Saturation:
    step: StepSummary  # the lowest saturated concurrency's last run
    signals: tuple[Signal, ...]  # what its runs showed
    below: float | None  # the highest load measured unsaturated under it (None: it saturated at the lowest)


@dataclass(frozen=True)
class Search:
    knee: StepSummary | None  # the SLO knee's last run; None when concurrency 1 already fails, or nothing ran
    knee_range: tuple[float, float] | None  # (knee, highest level that passed at least once below the levels that
    #   never passed): the two differ when repeated runs disagreed
    saturation: Saturation | None  # None when no step saturated the engine (or it reported nothing)
    steps: tuple[StepSummary, ...]  # in the order run
    limited_by: LimitedBy
    reason: str  # one sentence a person reads

    @property
    def operating_point(self) -> StepSummary | None:
        """The lower of the knee and the saturation point: what thresholds and autoscaling are calibrated from."""
        saturated = None if self.saturation is None else self.saturation.step
        candidates = [step for step in (self.knee, saturated) if step is not None]
        return min(candidates, key=lambda step: step.load, default=None)


class _Levels:
    """Every judged run so far, by load (concurrency, or offered rate in an open loop), and the answers they give."""

    def __init__(self, steps: Sequence[StepSummary]) -> None:
        self.runs: dict[float, list[StepSummary]] = {}
        for step in steps:
            if not step.interrupted:
                self.runs.setdefault(step.load, []).append(step)

    def last(self, level: float) -> StepSummary:
        return self.runs[level][-1]

    @property
    def lowest_fail(self) -> float | None:
        return min((level for level, runs in self.runs.items() if not all(r.passed for r in runs)), default=None)

    @property
    def knee(self) -> float | None:
        ceiling = self.lowest_fail
        passing = [level for level in self.runs if ceiling is None or level < ceiling]
        return max(passing, default=None)

    @property
    def knee_high(self) -> float | None:
        never = [level for level, runs in self.runs.items() if not any(r.passed for r in runs)]
        ceiling = min(never, default=None)
        passed = [
            level
            for level, runs in self.runs.items()
            if any(r.passed for r in runs) and (ceiling is None or level < ceiling)
        ]
        return max(passed, default=None)

    def throughput(self, level: float) -> float:
        runs = self.runs[level]
        return sum(r.request_rate for r in runs) / len(runs)

    def plateau(self, level: float) -> bool:
        above = [self.throughput(other) for other in self.runs if other > level]
        return bool(above) and self.throughput(level) >= (1 - PLATEAU_SHARE) * statistics.median(above)

    def signals(self, level: float) -> tuple[Signal, ...]:
        seen = {signal for run in self.runs[level] for signal in run.engine_signals}
        ordered: list[Signal] = ["kv_full", "queue", "preemptions"]
        found: list[Signal] = ["throughput_plateau"] if self.plateau(level) else []
        return (*found, *(signal for signal in ordered if signal in seen))

    @property
    def engine_reports(self) -> bool:
        """Whether the engine's metrics were read at all: without them no step can show saturation."""
        return any(run.engine for runs in self.runs.values() for run in runs)

    def saturated(self, level: float) -> bool:
        runs = self.runs[level]
        if any(run.engine_saturated for run in runs):
            return True
        return any("queue" in run.engine_signals for run in runs) and self.plateau(level)

    @property
    def saturation(self) -> float | None:
        return min((level for level in self.runs if self.saturated(level)), default=None)

    def unsaturated_below(self, level: float) -> float | None:
        return max((other for other in self.runs if other < level and not self.saturated(other)), default=None)

    @property
    def queued_alone(self) -> float | None:
        """The one level run, where requests waited at it: a search that started at the maximum has nothing above it
        to judge a throughput plateau by, nor under it to say where the queue began."""
        if len(self.runs) != 1:
            return None
        ((level, runs),) = self.runs.items()
        return level if any("queue" in run.engine_signals for run in runs) else None


def _needs_split(low: float | None, high: float | None, tolerance: float) -> bool:
    return low is not None and high is not None and high - low > max(1.0, tolerance * low)


async def find_knee(
    run_step: RunStep,
    max_concurrency: int,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    latency_slos: bool,
    start: int = 1,
) -> Search:
    """`latency_slos`: whether the steps are judged on a TTFT or ITL objective (without one, only errors fail).
    `start`: the first level (`pool_start`), at most `max_concurrency`."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
    steps: list[StepSummary] = []

    async def run(concurrency: int) -> bool:
        """Runs one step; False when the user or the time limit interrupted it (the search ends)."""
        step = await run_step(concurrency)
        steps.append(step)
        return not step.interrupted

    concurrency = max(1, min(start, max_concurrency))
    while True:
        if not await run(concurrency):
            return conclude(steps, interrupted=True)
        levels = _Levels(steps)
        saturation = levels.saturation
        if concurrency >= max_concurrency:
            break
        if saturation is not None and (
            levels.lowest_fail is not None
            or concurrency >= 2 * saturation
            or (not latency_slos and concurrency >= _past_saturation(saturation))
        ):
            break
        fail = levels.lowest_fail
        if fail is not None and (not levels.engine_reports or concurrency >= SATURATION_SEARCH_PAST_FAIL * fail):
            break
        concurrency = _next_rise(_Levels(steps), concurrency, max_concurrency)

    guess = _pool_guess(_Levels(steps))
    while (level := _next_bisection(_Levels(steps), tolerance, guess)) is not None:
        if not await run(level):
            return conclude(steps, interrupted=True)

    for level in _confirmation(_Levels(steps)):
        if not await run(level):
            return conclude(steps, interrupted=True)
    return conclude(steps, interrupted=False)


def pool_start(capacity_tokens: int, block_size: int | None, footprint_tokens: int) -> int:
    """The first level of a search on an engine that reports its KV pool, for requests that each hold
    `footprint_tokens`: as many as the pool holds less one block, in whole blocks. Engines keep a block or so back
    (vLLM one, never handed out), and a start one level low costs one step, where a start that saturates costs a
    bisection down from it."""
    held = held_tokens(footprint_tokens, block_size)
    return max(1, math.floor((capacity_tokens - (block_size or 0)) / held)) if held > 0 else 1


def _pool_prediction(levels: _Levels, below: float | None = None) -> int | None:
    """The lowest concurrency a KV-limited engine should saturate at, from the highest level measured (under
    `below`) that reported its KV usage: where that level held the pool full, the next one; else, as the usage grows
    with the requests held, the pool holds `level / usage` of them and one more waits. None where no level reported
    its usage."""
    measured = [
        (level, usage)
        for level in levels.runs
        if (below is None or level < below) and (usage := levels.last(level).kv_cache_usage_ratio) is not None
    ]
    if not measured:
        return None
    level, usage = max(measured)
    if usage >= KV_FULL_RATIO:
        return math.floor(level) + 1
    return math.floor(level / usage) + 1 if usage > 0 else None


def _pool_guess(levels: _Levels) -> int | None:
    """Where the engine saturated with its KV cache full, where its pool should have run out by the usage measured
    under it; with no usage measured under it (a start from the pool that saturated already), one past the requests
    the engine ran there, the ones its pool held. Else None."""
    saturation = levels.saturation
    if saturation is None or "kv_full" not in levels.signals(saturation):
        return None
    predicted = _pool_prediction(levels, below=saturation)
    if predicted is not None:
        return predicted
    running = levels.last(saturation).requests_running
    # The mean lies a little under what the pool holds: requests end and the next start between samples.
    return None if running is None else min(math.ceil(running) + 1, int(saturation))


def _past_saturation(level: float) -> int:
    """The level a quarter above `level`: past the saturation point, where the SLOs fail there the knee is
    bracketed."""
    return math.ceil(level * (1 + PAST_SATURATION_TOLERANCE))


def _next_rise(levels: _Levels, concurrency: int, max_concurrency: int) -> int:
    """The next level up: double, except where the KV usage measured says the pool runs out beyond the doubling
    and within the maximum. Then the rise goes straight to the last level the pool should hold, and from there to
    the one the usage measured there says should saturate it: on a KV-limited engine the saturation bracket closes
    in two steps instead of every doubling up to it and a bisection. A wrong prediction costs nothing that doubling
    would not: the search goes on from there. Past the saturation point, a quarter more at a time."""
    saturation = levels.saturation
    if saturation is not None:
        return min(max(_past_saturation(max(concurrency, saturation)), concurrency + 1), max_concurrency)
    doubled = 2 * concurrency
    predicted = _pool_prediction(levels)
    if predicted is None:
        return min(doubled, max_concurrency)
    if doubled < predicted - 1 < max_concurrency:
        return predicted - 1
    below = max((level for level in levels.runs if level < concurrency), default=None)
    jumped = concurrency > 2 * below if below is not None else concurrency > 1  # a start above 1 was a jump too
    if jumped and concurrency < predicted <= min(doubled, max_concurrency):
        return predicted  # once only: the level after it was not reached by a jump
    return min(doubled, max_concurrency)


def _next_bisection(levels: _Levels, tolerance: float, pool_guess: int | None) -> int | None:
    """The next level to run in the lower bracket still wider than the tolerance (next to the pool guess first,
    inside the saturation bracket; else its middle), or None when both are narrow enough."""
    brackets: list[tuple[float | None, float | None, float]] = []
    saturation, knee = levels.saturation, levels.knee
    if saturation is not None:
        brackets.append((levels.unsaturated_below(saturation) or 0, saturation, tolerance))
    elif (queued := levels.queued_alone) is not None:
        brackets.append((0, queued, tolerance))  # the saturation point may lie under it: bisected down to it
    past_saturation = saturation is not None and knee is not None and knee >= saturation
    brackets.append(
        (knee or 0, levels.lowest_fail, max(tolerance, PAST_SATURATION_TOLERANCE) if past_saturation else tolerance)
    )
    wide = [(low, high) for low, high, within in brackets if _needs_split(low, high, within)]
    if not wide:
        return None
    low, high = min(wide, key=lambda bracket: bracket[1] or 0)
    assert low is not None and high is not None  # _needs_split checked both
    if high == saturation and pool_guess is not None:
        # The last level the pool should hold first; then, by its answer, the guess itself or one lower still (the
        # usage a step reports lags the peak its requests reach). Strictly inside the bracket is never measured,
        # so at most two of these run.
        guesses = [level for level in (pool_guess - 1, pool_guess, pool_guess - 2) if low < level < high]
        if guesses:
            return guesses[0]
    return int(low + high) // 2


def _confirmation(levels: _Levels) -> tuple[int, ...]:
    """The operating point and the level above it, where both were measured (an answer at the maximum tried, or
    at concurrency 1, has no pair to tell apart)."""
    knee, saturation = levels.knee, levels.saturation
    pair: tuple[float | None, float | None]
    if saturation is not None and (knee is None or saturation <= knee):
        pair = (levels.unsaturated_below(saturation), saturation)
    else:
        pair = (knee, levels.lowest_fail)
    low, high = pair
    return () if low is None or high is None else (int(low), int(high))


def conclude(steps: Sequence[StepSummary], *, interrupted: bool) -> Search:
    """The answers the steps give (also for a fixed list of concurrencies, run without a search)."""
    levels = _Levels(steps)
    knee_level, fail_level, saturation_level = levels.knee, levels.lowest_fail, levels.saturation
    knee = None if knee_level is None else levels.last(knee_level)
    high = levels.knee_high
    knee_range = None if knee_level is None else (knee_level, max(knee_level, high or knee_level))
    saturation = None
    if saturation_level is not None:
        saturation = Saturation(
            levels.last(saturation_level), levels.signals(saturation_level), levels.unsaturated_below(saturation_level)
        )
    first_fail = None if fail_level is None else levels.last(fail_level)
    limited_by, reason = limiting_factor(knee, first_fail, saturation, interrupted=interrupted)
    return Search(
        knee=knee,
        knee_range=knee_range,
        saturation=saturation,
        steps=tuple(steps),
        limited_by=limited_by,
        reason=reason,
    )


def limiting_factor(
    knee: StepSummary | None,
    first_fail: StepSummary | None,
    saturation: Saturation | None,
    *,
    interrupted: bool,
) -> tuple[LimitedBy, str]:
    """What stopped the load from rising, and one sentence saying so."""
    saturated_first = saturation is not None and (first_fail is None or saturation.step.load <= first_fail.load)
    limit = saturation.step if saturation is not None and saturated_first else first_fail
    if limit is not None and limit.client_lag_p99_seconds > CLIENT_LAG_LIMIT_SECONDS:
        return "client", (
            f"The load generator lagged {limit.client_lag_p99_seconds * 1000:.0f} ms (p99) at {limit.load_text}: "
            "it could not send on time, so this is the client's limit, not the server's; run it from a larger "
            "machine."
        )
    if saturation is not None and saturated_first:
        return _saturation_reason(saturation, first_fail)
    if first_fail is None:
        if interrupted or knee is None:
            return "none", "The run stopped before any step failed or saturated the engine, so no limit was found."
        return (
            "max_concurrency",
            f"Every step passed up to the highest load tried, {knee.load_text}, and the engine never saturated: "
            "the server's limit lies above it.",
        )
    at = f"at {first_fail.load_text}"
    if first_fail.failing_slo == "errors":
        return "errors", f"{first_fail.errors} of {first_fail.requests} requests failed {at}."
    slo = first_fail.failing_slo or "ttft"
    share = f"{first_fail.slo_attainment:.1%}" if first_fail.slo_attainment is not None else "no requests"
    limited_by: LimitedBy = "slo:itl" if slo == "itl" else "slo:ttft"
    return limited_by, (
        f"The {slo.upper()} objective broke {at} ({share} of requests met the SLOs) before the engine saturated."
    )


def _saturation_reason(saturation: Saturation, first_fail: StepSummary | None) -> tuple[LimitedBy, str]:
    step = saturation.step
    evidence = _evidence(step, saturation.signals)
    slo = "" if first_fail is None else f"; the SLOs broke at {first_fail.load_text}"
    if "kv_full" in saturation.signals or "preemptions" in saturation.signals:
        return (
            "kv_cache",
            f"The engine saturated at {step.load_text}: its KV cache filled ({evidence}){slo}.",
        )
    return "saturation", (
        f"The engine saturated at {step.load_text} with room in its KV cache ({evidence}): a batch "
        f"limit (max running requests) or compute holds it{slo}."
    )


def _evidence(step: StepSummary, signals: Sequence[Signal]) -> str:
    parts = []
    if step.kv_cache_usage_ratio is not None:
        parts.append(f"KV usage {step.kv_cache_usage_ratio:.0%} (p90)")
    if "queue" in signals and step.waiting_sample_share is not None:
        parts.append(f"requests waiting in {step.waiting_sample_share:.0%} of the engine's samples")
    if step.preemptions:
        parts.append(f"{step.preemptions:.0f} preemptions")
    if "throughput_plateau" in signals:
        parts.append(f"throughput flat at {step.request_rate:.1f} requests/s")
    return ", ".join(parts)
