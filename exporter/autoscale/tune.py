"""`plimsoll autoscale replay --tune`: the config's own scaling knobs searched, over the same trace, for the fewest
replica-hours whose overflow stays within a budget.

The knobs are the two the config owns and the generator honours: `autoscaling.margin` (the demand target is
knee x margin) and `autoscaling.demand_window` (the peak demand signal's window and the scale-down stabilization
window, `exporter/scaling.py` `behavior()`). The scale-up policy is fixed by the generator (100% per 15 s, no
stabilization), so it is not searched. The budget is overflow request-seconds (demand above the ready replicas'
knee, integrated over time) as a share of the demand's own request-seconds, per workload: one number that means the
same on a quiet trace and a busy one, and counts a long small shortfall and a short large one alike.

The grid is small and bounded: margins 0.50 to 1.00 in steps of 0.05 (and the config's own), windows from the
config's down to the longest start-up of its workloads (the shortest the config accepts) in at most
`WINDOW_STEPS` steps; every candidate replays every workload: at most 12 x 4 replays per workload. Each trace is read
once for all of them (`replay.Syncs`: its readings once per window, as stretches of syncs that read the same, so a
long steady trace costs each candidate a few syncs), the answer the same as replaying each candidate from its raw
trace (tests/autoscale/test_tune.py holds it to that).
"""

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.autoscale.demand import DemandPoint
from exporter.autoscale.replay import Syncs, replay_syncs
from exporter.config import AutoscalingConfig, ScaledWorkload
from exporter.core.units import duration
from exporter.scaling import scaler_spec

MARGINS = tuple(round(0.5 + 0.05 * step, 2) for step in range(11))
WINDOW_STEPS = 4
DEFAULT_OVERFLOW_BUDGET = 0.005  # 0.5% of demand request-seconds
# Intermediate windows land on whole minutes, the unit a person writes a window in.
_WINDOW_ROUNDING_SECONDS = 60.0


@dataclass(frozen=True)
class Knobs:
    margin: float
    demand_window_seconds: float


@dataclass(frozen=True)
class Outcome:
    """One candidate's replay over every workload's trace."""

    knobs: Knobs
    replica_hours: tuple[float, ...]  # per workload, in the order given
    overflow_request_seconds: tuple[float, ...]
    overflow_seconds: tuple[float, ...]
    peak_replicas: tuple[int, ...]
    overflow_shares: tuple[float, ...]  # overflow request-seconds / demand request-seconds, per workload
    meets_budget: bool

    @property
    def total_replica_hours(self) -> float:
        return sum(self.replica_hours)

    @property
    def worst_share(self) -> float:
        return max(self.overflow_shares)


@dataclass(frozen=True)
class Tuning:
    budget: float  # the overflow share each workload must stay at or under
    current: Outcome  # the config's own knobs
    chosen: Outcome | None  # the fewest replica-hours within budget; None: no candidate met it
    lowest_overflow: Outcome  # the candidate with the least overflow, said where none met the budget
    replays: int
    margins: tuple[float, ...]  # the grid searched, each margin with each window
    demand_windows_seconds: tuple[float, ...]


def parse_overflow_budget(text: str) -> float:
    """A percentage of demand request-seconds ("0.5%") as a share (0.005): 0 or more, under 100."""
    hint = "give a share of demand request-seconds as a percentage, such as 0.5%"
    stripped = text.strip()
    if not stripped.endswith("%"):
        raise ValueError(f"{text!r} is not a percentage; {hint}")
    try:
        percent = float(stripped[:-1])
    except ValueError:
        raise ValueError(f"{text!r} is not a percentage; {hint}") from None
    if not (math.isfinite(percent) and 0 <= percent < 100):
        raise ValueError(f"{text!r} is not between 0% and 100%; {hint}")
    return percent / 100


def demand_request_seconds(trace: Sequence[DemandPoint]) -> float:
    """The demand integrated over the trace, each sample holding until the next (as `fleet.run` counts overflow)."""
    return sum(point.demand * (after.time - point.time) for point, after in itertools.pairwise(trace))


def windows(current_seconds: float, shortest_seconds: float) -> tuple[float, ...]:
    """The config's window, down to the shortest the config accepts, longest first."""
    if current_seconds <= shortest_seconds:
        return (current_seconds,)
    span = current_seconds - shortest_seconds
    between = (
        round((current_seconds - span * step / (WINDOW_STEPS - 1)) / _WINDOW_ROUNDING_SECONDS)
        * _WINDOW_ROUNDING_SECONDS
        for step in range(1, WINDOW_STEPS - 1)
    )
    inside = {window for window in between if shortest_seconds < window < current_seconds}
    return (current_seconds, *sorted(inside, reverse=True), shortest_seconds)


@dataclass(frozen=True)
class _Replayed:
    """One workload's trace, read once for every candidate."""

    workload: ScaledWorkload
    syncs: Syncs
    knee_concurrency: int
    demand_request_seconds: float


def _outcome(
    autoscaling: AutoscalingConfig,
    knobs: Knobs,
    workloads: Sequence[_Replayed],
    saturation_queue: float | None,
    budget: float,
) -> Outcome:
    tuned = dataclasses.replace(autoscaling, margin=knobs.margin, demand_window_seconds=knobs.demand_window_seconds)
    hours: list[float] = []
    overflow: list[float] = []
    seconds: list[float] = []
    peaks: list[int] = []
    shares: list[float] = []
    for replayed in workloads:
        workload, demand = replayed.workload, replayed.demand_request_seconds
        spec = scaler_spec(tuned, workload, saturation_queue)
        figures = replay_syncs(replayed.syncs, spec, workload.startup_seconds, replayed.knee_concurrency).run.figures
        hours.append(figures.replica_hours)
        overflow.append(figures.overflow_request_seconds)
        seconds.append(figures.overflow_seconds)
        peaks.append(figures.peak_replicas)
        # No demand at all: nothing could overflow, and no share of nothing is over budget.
        shares.append(figures.overflow_request_seconds / demand if demand > 0 else 0.0)
    return Outcome(
        knobs,
        tuple(hours),
        tuple(overflow),
        tuple(seconds),
        tuple(peaks),
        tuple(shares),
        all(share <= budget for share in shares),
    )


def tune(
    autoscaling: AutoscalingConfig,
    workloads: Sequence[tuple[ScaledWorkload, Sequence[DemandPoint], int]],
    saturation_queue: float | None,
    budget: float,
) -> Tuning:
    """Every candidate of the grid replayed over each (workload, trace, knee_concurrency); the config's margin and
    window are one for every workload, so a candidate meets the budget only where each workload does."""
    current = Knobs(autoscaling.margin, autoscaling.demand_window_seconds)
    shortest = max(workload.startup_seconds for workload in autoscaling.workloads)
    margins = tuple(sorted({*MARGINS, autoscaling.margin}, reverse=True))
    searched = windows(current.demand_window_seconds, shortest)
    candidates = [Knobs(margin, window) for window in searched for margin in margins]
    read = [
        _Replayed(workload, Syncs(trace), knee, demand_request_seconds(trace)) for workload, trace, knee in workloads
    ]
    outcomes = [_outcome(autoscaling, knobs, read, saturation_queue, budget) for knobs in candidates]
    within = [outcome for outcome in outcomes if outcome.meets_budget]
    # Ties go to the config's own knobs: no change where a change buys nothing.
    chosen = min(within, key=lambda o: (o.total_replica_hours, o.worst_share, o.knobs != current), default=None)
    lowest = min(outcomes, key=lambda o: (o.worst_share, o.total_replica_hours))
    (own,) = (outcome for outcome in outcomes if outcome.knobs == current)
    return Tuning(budget, own, chosen, lowest, len(outcomes) * len(workloads), margins, searched)


def config_change(knobs: Knobs) -> str:
    """The YAML lines to paste into the config, the margin with every digit it has (it scales every target)."""
    margin = repr(knobs.margin).removesuffix(".0")
    return f"autoscaling:\n  margin: {margin}\n  demand_window: {duration(knobs.demand_window_seconds)}\n"
