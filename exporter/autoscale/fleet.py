"""A fleet's replicas over a demand trace, and what they cost and missed: replica-hours, and the seconds and
request-seconds of demand above the ready replicas' capacity.

Both step functions hold their value until their next change: a demand sample until the next sample, the trace
ending at its last sample's time.
"""

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.autoscale.demand import DemandPoint


@dataclass(frozen=True)
class FleetChange:
    """From `time` on: `replicas` pods exist (and cost), `ready` of them serve."""

    time: float
    replicas: int
    ready: int


@dataclass(frozen=True)
class Figures:
    replica_hours: float
    overflow_seconds: float  # how long demand was above ready replicas x knee_concurrency
    overflow_request_seconds: float  # the integral of that excess: requests held past their knee, times seconds
    peak_replicas: int


@dataclass(frozen=True)
class Run:
    """One fleet over one trace."""

    fleet: tuple[FleetChange, ...]
    figures: Figures


def replicas_needed(demand: float, per_replica: float, bounds: tuple[int, int]) -> int:
    """ceil(demand / per_replica), within `bounds` (min, max replicas)."""
    minimum, maximum = bounds
    return min(max(math.ceil(demand / per_replica), minimum), maximum)


def _merged(fleet: Sequence[FleetChange]) -> tuple[FleetChange, ...]:
    """`fleet` without the changes that leave it as it was."""
    kept: list[FleetChange] = []
    for change in fleet:
        if not kept or (kept[-1].replicas, kept[-1].ready) != (change.replicas, change.ready):
            kept.append(change)
    return tuple(kept)


def run(trace: Sequence[DemandPoint], fleet: Sequence[FleetChange], knee_concurrency: float) -> Run:
    """`fleet` (sorted by time, its first change at or before the trace's first sample) measured against
    `trace`, one replica serving `knee_concurrency` requests within its SLOs; a change to the state the fleet
    already has is dropped."""
    fleet = _merged(fleet)
    end = trace[-1].time
    times = sorted(
        {point.time for point in trace} | {change.time for change in fleet if trace[0].time < change.time < end}
    )
    replica_seconds = overflow_seconds = overflow_request_seconds = 0.0
    sample = current = 0
    for start, stop in itertools.pairwise(times):
        while sample + 1 < len(trace) and trace[sample + 1].time <= start:
            sample += 1
        while current + 1 < len(fleet) and fleet[current + 1].time <= start:
            current += 1
        length = stop - start
        replica_seconds += fleet[current].replicas * length
        excess = trace[sample].demand - fleet[current].ready * knee_concurrency
        if excess > 0:
            overflow_seconds += length
            overflow_request_seconds += excess * length
    peak = max(change.replicas for change in fleet if change.time <= end)
    return Run(fleet, Figures(replica_seconds / 3600, overflow_seconds, overflow_request_seconds, peak))
