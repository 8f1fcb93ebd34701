"""The generated scaler stepped through a demand trace: what it would have decided at each HPA sync, and the fleet
that followed.

Each sync (every 15 s from the trace's first sample) reads the signals as the generated queries would: the demand
signal is the peak of demand over the demand window (`model:plimsoll_demand_requests:peak`), and the queue signal
the trace's `queue_sum` at that time (`sum(plimsoll_requests_waiting)`), modelled only where the trace has it. The
HPA model (`hpa.py`) decides; added replicas serve one start-up time later, removed ones stop at once, the ones not
yet ready first (as a ReplicaSet deletes them).

KEDA feeds the same HPA. Its pollingInterval only paces the 0 <-> 1 activation check: between 1 and N replicas its
metrics server queries Prometheus on each HPA request (unless useCachedMetrics is set, which the generator does
not), and the config's min_replicas is at least 1, so activation never acts and no polling delay is modelled.
Prometheus' own scrape and rule-evaluation delays are not modelled either: the trace is what the queries read.
"""

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.autoscale import hpa
from exporter.autoscale.demand import DemandPoint
from exporter.autoscale.fleet import FleetChange, Run, replicas_needed, run
from exporter.scaling import PEAK_DEMAND, ScalerSpec, Target


@dataclass(frozen=True)
class Replay:
    run: Run
    decisions: tuple[hpa.Decision, ...]  # every sync that changed the replicas or was held back from a change
    signals: tuple[str, ...]  # the signals modelled: the queue only where the trace has queue_sum


class _Trace:
    """The trace as the queries read it at a sync time."""

    def __init__(self, trace: Sequence[DemandPoint]) -> None:
        self.points = trace
        self.times = [point.time for point in trace]

    def at(self, time: float) -> DemandPoint:
        return self.points[bisect.bisect_right(self.times, time) - 1]

    def peak(self, time: float, window_seconds: float) -> float:
        """max_over_time over the window; `or vector(0)` where no sample falls in it."""
        first = bisect.bisect_left(self.times, time - window_seconds)
        last = bisect.bisect_right(self.times, time)
        return max((point.demand for point in self.points[first:last]), default=0.0)


def _reading(target: Target, value: float) -> hpa.Reading:
    return hpa.Reading(target.measure, target.metric_type, target.value, value)


def _readings(trace: _Trace, spec: ScalerSpec, time: float, knee_concurrency: float) -> list[hpa.Reading]:
    peak = trace.peak(time, spec.demand_window_seconds)
    if spec.demand.measure == PEAK_DEMAND:
        demand = peak
    else:  # the replicas-needed rule, clamped to the bounds as the rule is
        demand = replicas_needed(peak, knee_concurrency * spec.margin, (spec.min_replicas, spec.max_replicas))
    readings = [_reading(spec.demand, demand)]
    queue = trace.at(time).queue_sum
    if queue is not None:
        readings.append(_reading(spec.queue, queue))
    return readings


def _resized(pods: list[float], replicas: int, ready_at: float) -> list[float]:
    """The pods (each its ready time) after the HPA sets `replicas`: new ones ready at `ready_at`, removals the
    latest-ready first."""
    if replicas >= len(pods):
        return pods + [ready_at] * (replicas - len(pods))
    return sorted(pods)[:replicas]


def _changes(pods: list[float], now: float, until: float) -> list[FleetChange]:
    """The fleet from `now` until the next sync at `until`: as it is now, then as each starting pod turns ready."""
    ready_times = sorted({ready for ready in pods if now < ready < until})
    return [FleetChange(time, len(pods), sum(1 for ready in pods if ready <= time)) for time in [now, *ready_times]]


def replay(trace: Sequence[DemandPoint], spec: ScalerSpec, startup_seconds: float, knee_concurrency: float) -> Replay:
    """The scaler `spec` over `trace` (at least two samples, times increasing), starting from the replicas the
    first sample needs, all ready; one replica takes `startup_seconds` to serve and holds `knee_concurrency`
    requests within its SLOs."""
    view = _Trace(trace)
    start, end = trace[0].time, trace[-1].time
    bounds = (spec.min_replicas, spec.max_replicas)
    initial = replicas_needed(trace[0].demand, knee_concurrency * spec.margin, bounds)
    pods = [start] * initial
    history = hpa.first_history(start, initial)
    fleet: list[FleetChange] = []
    decisions: list[hpa.Decision] = []
    step = 0
    while (now := start + step * hpa.SYNC_PERIOD_SECONDS) <= end:
        ready = sum(1 for ready_time in pods if ready_time <= now)
        readings = _readings(view, spec, now, knee_concurrency)
        decision, history = hpa.decide(spec.behavior, bounds, history, now, len(pods), ready, readings)
        if decision.replicas != len(pods) or decision.proposed_replicas != len(pods):
            decisions.append(decision)
        pods = _resized(pods, decision.replicas, now + startup_seconds)
        fleet.extend(_changes(pods, now, now + hpa.SYNC_PERIOD_SECONDS))
        step += 1
    signals = tuple(reading.metric for reading in _readings(view, spec, start, knee_concurrency))
    return Replay(run(trace, fleet, knee_concurrency), tuple(decisions), signals)
