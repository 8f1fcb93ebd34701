"""A fleet's replicas over a demand trace, and what they cost and missed: replica-hours, and the seconds and
request-seconds of demand above the ready replicas' capacity.

Both step functions hold their value until their next change: a demand sample until the next sample, the trace
ending at its last sample's time.
"""

import itertools
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


def run(trace: Sequence[DemandPoint], fleet: Sequence[FleetChange], knee_concurrency: float) -> Run:
    """`fleet` (sorted by time, its first change at or before the trace's first sample) measured against
    `trace`, one replica serving `knee_concurrency` requests within its SLOs."""
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
    return Run(tuple(fleet), Figures(replica_seconds / 3600, overflow_seconds, overflow_request_seconds, peak))
