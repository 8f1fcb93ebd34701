"""What the replayed scaler is judged against, over the same trace and with the same figures: a static fleet sized
at the trace's peak, and an oracle that has exactly the replicas the demand needs ready at every moment, each one
started a start-up time before it is needed and removed as soon as it is not.

Replicas needed = ceil(demand / knee_concurrency), within min and max replicas (no margin: the baselines are the
least a fleet can run without demand above its knee).
"""

import bisect
from collections.abc import Sequence

from exporter.autoscale.demand import DemandPoint
from exporter.autoscale.fleet import FleetChange, Run, replicas_needed, run
from exporter.autoscale.window import WindowPeak


def static_peak(trace: Sequence[DemandPoint], knee_concurrency: float, bounds: tuple[int, int]) -> Run:
    """One fleet size all along: the replicas the trace's peak demand needs. `bounds` is (min, max) replicas."""
    replicas = replicas_needed(max(point.demand for point in trace), knee_concurrency, bounds)
    return run(trace, [FleetChange(trace[0].time, replicas, replicas)], knee_concurrency)


def oracle(
    trace: Sequence[DemandPoint], knee_concurrency: float, startup_seconds: float, bounds: tuple[int, int]
) -> Run:
    """Ready replicas = those needed now; replicas that exist (and cost) = the most needed over the next start-up
    time, since a replica needed then must already be starting."""
    times = [point.time for point in trace]
    needed = [replicas_needed(point.demand, knee_concurrency, bounds) for point in trace]
    start, end = times[0], times[-1]
    # The count that exists changes where a sample starts or leaves the look-ahead [t, t + start-up].
    breaks = sorted({*times, *(time - startup_seconds for time in times if start < time - startup_seconds < end)})
    fleet: list[FleetChange] = []
    ahead = WindowPeak(needed)  # the most needed over the look-ahead
    for time in breaks:
        first = bisect.bisect_right(times, time) - 1
        most = ahead.over(first, bisect.bisect_right(times, time + startup_seconds))
        assert most is not None  # the look-ahead holds the sample at `time` itself
        fleet.append(FleetChange(time, most, needed[first]))
    return run(trace, fleet, knee_concurrency)
