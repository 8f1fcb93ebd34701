"""The figures of a fleet over a trace, and the two baselines, on traces small enough to work out by hand."""

import bisect
import math
import random

import pytest

from exporter.autoscale.baselines import oracle, static_peak
from exporter.autoscale.demand import DemandPoint
from exporter.autoscale.fleet import Figures, FleetChange, run

# 10 requests for a minute, 50 for a minute, then none; a replica holds 24.
TRACE = (DemandPoint(0, 10), DemandPoint(60, 50), DemandPoint(120, 0))


def test_figures_of_one_replica_through_a_burst() -> None:
    figures = run(TRACE, [FleetChange(0, 1, 1)], 24).figures
    # 50 - 24 = 26 requests past the knee for the minute of the burst
    assert figures == Figures(
        replica_hours=120 / 3600, overflow_seconds=60, overflow_request_seconds=26 * 60, peak_replicas=1
    )


def test_figures_count_starting_replicas_as_cost_and_only_ready_ones_as_capacity() -> None:
    # 3 replicas from 30 s, the 2 new ones ready at 90 s: 30 s of the burst is past the knee (50 - 24)
    fleet = [FleetChange(0, 1, 1), FleetChange(30, 3, 1), FleetChange(90, 3, 3)]
    figures = run(TRACE, fleet, 24).figures
    assert figures.replica_hours == pytest.approx((30 * 1 + 90 * 3) / 3600)
    assert (figures.overflow_seconds, figures.overflow_request_seconds, figures.peak_replicas) == (30, 26 * 30, 3)


def test_static_fleet_is_sized_at_the_peak_within_the_bounds() -> None:
    assert static_peak(TRACE, 24, (1, 10)).figures == Figures(360 / 3600, 0, 0, 3)  # ceil(50 / 24)
    capped = static_peak(TRACE, 24, (1, 2)).figures
    assert (capped.peak_replicas, capped.overflow_seconds, capped.overflow_request_seconds) == (2, 60, 2 * 60)
    assert static_peak(TRACE, 24, (5, 10)).figures.peak_replicas == 5


def test_oracle_has_the_replicas_needed_ready_and_starts_them_one_start_up_ahead() -> None:
    result = oracle(TRACE, 24, 30, (1, 10))
    # ready: 1, then 3 from 60 s; existing: 3 from 30 s (the burst's replicas start then), 1 again after it
    assert result.fleet == (FleetChange(0, 1, 1), FleetChange(30, 3, 1), FleetChange(60, 3, 3), FleetChange(120, 1, 1))
    assert result.figures == Figures((30 + 90 * 3) / 3600, 0, 0, 3)


def test_oracle_releases_replicas_as_soon_as_demand_falls() -> None:
    trace = (DemandPoint(0, 50), DemandPoint(60, 10), DemandPoint(300, 10))
    result = oracle(trace, 24, 120, (1, 10))
    assert result.fleet == (FleetChange(0, 3, 3), FleetChange(60, 1, 1))
    assert result.figures.overflow_seconds == 0


def test_oracle_within_max_replicas_overflows_where_the_bound_bites() -> None:
    figures = oracle(TRACE, 24, 30, (1, 2)).figures
    assert (figures.overflow_seconds, figures.overflow_request_seconds) == (60, 2 * 60)


@pytest.mark.parametrize("startup", [1, 15, 120, 3600])
def test_oracle_has_at_every_break_the_most_needed_over_the_next_start_up(startup: int) -> None:
    """Against the definition read literally, on uneven traces: the replicas that exist at each change are the most
    any sample from the one in force to the last within a start-up needs."""
    rng = random.Random(startup)
    time, trace = 0.0, []
    for _ in range(400):
        trace.append(DemandPoint(time, rng.choice([0, 5, 30, 90, 200]) * rng.random()))
        time += rng.choice([1, 7, 15, 15, 60, 900])
    times = [point.time for point in trace]
    fleet = oracle(trace, 24, startup, (1, 10)).fleet
    assert len(fleet) > 50
    for change in fleet:
        first = bisect.bisect_right(times, change.time) - 1
        ahead = trace[first : bisect.bisect_right(times, change.time + startup)]
        assert change.replicas == max(min(max(math.ceil(p.demand / 24), 1), 10) for p in ahead)
