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


class Syncs:
    """The trace as the queries read it at each sync (every 15 s from its first sample to its last): built once per
    trace and shared by every replay of it, so the tuner's candidates that share a demand window share its peaks."""

    def __init__(self, trace: Sequence[DemandPoint]) -> None:
        self.points = trace
        self.times = [point.time for point in trace]
        self.demands = [point.demand for point in trace]
        start, end = trace[0].time, trace[-1].time
        self.sync_times: list[float] = []
        while (now := start + len(self.sync_times) * hpa.SYNC_PERIOD_SECONDS) <= end:
            self.sync_times.append(now)
        self.queues = [self.points[bisect.bisect_right(self.times, now) - 1].queue_sum for now in self.sync_times]
        self._peaks: dict[float, list[float]] = {}

    def peaks(self, window_seconds: float) -> list[float]:
        """max_over_time over the window at each sync, `or vector(0)` where no sample falls in it; computed the first
        time a window is asked for."""
        if window_seconds not in self._peaks:
            times, demands = self.times, self.demands
            self._peaks[window_seconds] = [
                max(
                    demands[bisect.bisect_left(times, now - window_seconds) : bisect.bisect_right(times, now)],
                    default=0.0,
                )
                for now in self.sync_times
            ]
        return self._peaks[window_seconds]


def _reading(target: Target, value: float) -> hpa.Reading:
    return hpa.Reading(target.measure, target.metric_type, target.value, value)


def _readings(peak: float, queue: float | None, spec: ScalerSpec, knee_concurrency: float) -> list[hpa.Reading]:
    """The signals at one sync from the demand's peak over the window and the summed queue, where the trace has it."""
    if spec.demand.measure == PEAK_DEMAND:
        demand = peak
    else:  # the replicas-needed rule, clamped to the bounds as the rule is
        demand = replicas_needed(peak, knee_concurrency * spec.margin, (spec.min_replicas, spec.max_replicas))
    readings = [_reading(spec.demand, demand)]
    if queue is not None:
        readings.append(_reading(spec.queue, queue))
    return readings


def _resized(pods: list[float], replicas: int, ready_at: float) -> list[float]:
    """The pods (each its ready time, in order: one added is ready last) after the HPA sets `replicas`: new ones
    ready at `ready_at`, removals the latest-ready first."""
    if replicas >= len(pods):
        return pods + [ready_at] * (replicas - len(pods))
    return pods[:replicas]


def _changes(pods: list[float], now: float, until: float) -> list[FleetChange]:
    """The fleet from `now` until the next sync at `until`: as it is now, then as each starting pod turns ready."""
    ready_times = sorted(set(pods[bisect.bisect_right(pods, now) : bisect.bisect_left(pods, until)]))
    return [FleetChange(time, len(pods), bisect.bisect_right(pods, time)) for time in [now, *ready_times]]


def _settled(fleet: list[FleetChange], pods: list[float], now: float) -> bool:
    """Whether the fleet stays as its last change left it until the next sync: every pod ready, as many as then.
    Most syncs; `fleet.run` would drop their changes as no change."""
    last = fleet[-1] if fleet else None
    return last is not None and (not pods or pods[-1] <= now) and last.replicas == last.ready == len(pods)


def replay(trace: Sequence[DemandPoint], spec: ScalerSpec, startup_seconds: float, knee_concurrency: float) -> Replay:
    """The scaler `spec` over `trace` (at least two samples, times increasing), starting from the replicas the
    first sample needs, all ready; one replica takes `startup_seconds` to serve and holds `knee_concurrency`
    requests within its SLOs."""
    return replay_syncs(Syncs(trace), spec, startup_seconds, knee_concurrency)


def replay_syncs(syncs: Syncs, spec: ScalerSpec, startup_seconds: float, knee_concurrency: float) -> Replay:
    """`replay` over a trace already read into its syncs."""
    start = syncs.sync_times[0]
    bounds = (spec.min_replicas, spec.max_replicas)
    initial = replicas_needed(syncs.points[0].demand, knee_concurrency * spec.margin, bounds)
    pods = [start] * initial  # each pod's ready time, in order
    history = hpa.first_history(start, initial)
    fleet: list[FleetChange] = []
    decisions: list[hpa.Decision] = []
    peaks = syncs.peaks(spec.demand_window_seconds)
    for now, peak, queue in zip(syncs.sync_times, peaks, syncs.queues, strict=True):
        ready = bisect.bisect_right(pods, now)
        readings = _readings(peak, queue, spec, knee_concurrency)
        decision, history = hpa.decide(spec.behavior, bounds, history, now, len(pods), ready, readings)
        if decision.replicas != len(pods) or decision.proposed_replicas != len(pods):
            decisions.append(decision)
        pods = _resized(pods, decision.replicas, now + startup_seconds)
        if not _settled(fleet, pods, now):
            fleet.extend(_changes(pods, now, now + hpa.SYNC_PERIOD_SECONDS))
    signals = tuple(reading.metric for reading in _readings(peaks[0], syncs.queues[0], spec, knee_concurrency))
    return Replay(run(syncs.points, fleet, knee_concurrency), tuple(decisions), signals)
