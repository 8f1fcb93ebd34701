"""The generated scaler stepped through a demand trace: what it would have decided at each HPA sync, and the fleet
that followed.

Each sync (every 15 s from the trace's first sample) reads the signals as the generated queries would: the demand
signal is the peak of demand over the demand window (`model:plimsoll_demand_requests:peak`), and the queue signal
the trace's `queue_sum` at that time (`sum(plimsoll_requests_waiting)`), modelled only where the trace has it, each
against its target as the manifests write it (`scaling.target_millis`), never the unrounded knee x margin. The
HPA model (`hpa.py`) decides; added replicas serve one start-up time later, removed ones stop at once, the ones not
yet ready first (as a ReplicaSet deletes them).

KEDA feeds the same HPA. Its pollingInterval only paces the 0 <-> 1 activation check: between 1 and N replicas its
metrics server queries Prometheus on each HPA request (unless useCachedMetrics is set, which the generator does
not), and the config's min_replicas is at least 1, so activation never acts and no polling delay is modelled.
Prometheus' own scrape and rule-evaluation delays are not modelled either: the trace is what the queries read.
"""

import bisect
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter.autoscale import hpa
from exporter.autoscale.demand import DemandPoint
from exporter.autoscale.fleet import FleetChange, Run, replicas_needed, run
from exporter.autoscale.window import WindowPeak
from exporter.scaling import PEAK_DEMAND, ScalerSpec, Target, target_millis


@dataclass(frozen=True)
class Decided:
    """Consecutive syncs that decided exactly the same, every field but the time: a stretch held by one rule at one
    reading is one of these, not one per sync."""

    decision: hpa.Decision  # the first of them
    syncs: int  # how many: the k-th (from 0) at decision.time + k x SYNC_PERIOD_SECONDS


@dataclass(frozen=True)
class Replay:
    run: Run
    decisions: tuple[Decided, ...]  # every sync that changed the replicas or was held back from a change
    signals: tuple[str, ...]  # the signals modelled: the queue only where the trace has queue_sum


@dataclass(frozen=True)
class Reads:
    """What the queries read at sync `first` and at each one after it, up to the next `Reads`."""

    first: int
    peak: float  # max_over_time of the demand over the window, `or vector(0)` where no sample falls in it
    queue: float | None  # the trace's queue_sum then


def _entered(sample: float) -> Callable[[float], bool]:
    """Whether a sync at `at` reads the sample at `sample` (`bisect_right`'s comparison)."""
    return lambda at: at >= sample


def _left(sample: float, window: float) -> Callable[[float], bool]:
    """Whether the window of a sync at `at` has left the sample at `sample` (`bisect_left`'s comparison)."""
    return lambda at: sample < at - window


class Syncs:
    """The trace as the queries read it at each sync (every 15 s from its first sample to its last), as stretches of
    syncs that read the same: a reading changes only where a sample enters or leaves the window, so a trace costs
    its samples, not its span. Built once per trace and shared by every replay of it, so the tuner's candidates
    that share a demand window share its readings."""

    def __init__(self, trace: Sequence[DemandPoint]) -> None:
        self.points = trace
        self.times = [point.time for point in trace]
        self.demands = [point.demand for point in trace]
        self.start = trace[0].time
        end = trace[-1].time
        self.count = self._first(0, lambda now: now > end)  # the syncs: those at or before the last sample
        self.queued = any(point.queue_sum is not None for point in trace)  # whether the queue signal is modelled
        self._reads: dict[float, tuple[Reads, ...]] = {}

    def time(self, index: int) -> float:
        return self.start + index * hpa.SYNC_PERIOD_SECONDS

    def _first(self, after: int, reached: Callable[[float], bool]) -> int:
        """The first sync from `after` on whose time has `reached` (false up to some sync, true from it on): a
        gallop then a bisection, each step the comparison a sync-by-sync walk would make."""
        if reached(self.time(after)):
            return after
        low, step = after, 1  # low: not reached
        while not reached(self.time(low + step)):
            low, step = low + step, step * 2
        high = low + step
        while high - low > 1:
            middle = (low + high) // 2
            if reached(self.time(middle)):
                high = middle
            else:
                low = middle
        return high

    def reads(self, window_seconds: float) -> tuple[Reads, ...]:
        """The readings with a demand window of `window_seconds`; computed the first time a window is asked for."""
        if window_seconds not in self._reads:
            self._reads[window_seconds] = self._walk(window_seconds)
        return self._reads[window_seconds]

    def _walk(self, window: float) -> tuple[Reads, ...]:
        times, demands, last = self.times, self.demands, len(self.times)
        reads: list[Reads] = []
        peaks = WindowPeak(demands)
        index = 0
        while index < self.count:
            now = self.time(index)
            low, high = bisect.bisect_left(times, now - window), bisect.bisect_right(times, now)
            peak, queue = peaks.over(low, high) or 0.0, self.points[high - 1].queue_sum
            if not reads or (reads[-1].peak, reads[-1].queue) != (peak, queue):
                reads.append(Reads(index, peak, queue))
            # Next: the first sync a later sample enters the window at, or the first one the window leaves a sample.
            entering = self._first(index + 1, _entered(times[high])) if high < last else self.count
            leaving = self._first(index + 1, _left(times[low], window)) if low < last else self.count
            index = min(entering, leaving, self.count)
        return tuple(reads)


def _reading(target: Target, value: float) -> hpa.Reading:
    return hpa.Reading(target.measure, target.metric_type, target_millis(target.value), value)


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


# The pods, as groups (ready time, how many) by ready time: those ready as one group, then one per scale-up still
# starting. A fleet of any size is a few entries, so a max_replicas in the millions costs what 2 does.
Pods = tuple[tuple[float, int], ...]


def _ready(pods: Pods, now: float) -> int:
    if pods[-1][0] <= now:  # most syncs: every group ready
        return sum(count for _, count in pods)
    return sum(count for ready_at, count in pods if ready_at <= now)


def _resized(pods: Pods, current: int, replicas: int, now: float, ready_at: float) -> Pods:
    """The `current` pods after the HPA sets `replicas` at `now`: new ones ready at `ready_at`, removals the
    latest-ready first (as a ReplicaSet deletes the not-ready ones first)."""
    if replicas == current and (len(pods) == 1 or pods[1][0] > now):
        return pods  # most syncs: nothing added or removed, and no starting group turned ready to merge
    ready = _ready(pods, now)
    groups = [*(((now, ready),) if ready else ()), *((at, count) for at, count in pods if at > now)]
    if replicas > current:
        groups.append((ready_at, replicas - current))
    kept: list[tuple[float, int]] = []
    left = replicas
    for at, count in groups:
        if left == 0:
            break
        kept.append((at, min(count, left)))
        left -= kept[-1][1]
    return tuple(kept)


def _changes(pods: Pods, replicas: int, now: float, until: float) -> list[FleetChange]:
    """The fleet of `replicas` pods from `now` until the next sync at `until`: as it is now, then as each starting
    group turns ready."""
    ready_times = [at for at, _ in pods if now < at < until]
    return [FleetChange(time, replicas, _ready(pods, time)) for time in [now, *ready_times]]


def _settled(fleet: list[FleetChange], pods: Pods, replicas: int, now: float) -> bool:
    """Whether the fleet of `replicas` pods stays as its last change left it until the next sync: every pod ready,
    as many as then. Most syncs; `fleet.run` would drop their changes as no change."""
    last = fleet[-1] if fleet else None
    return last is not None and pods[-1][0] <= now and last.replicas == last.ready == replicas


def _repeats(decision: hpa.Decision, history: hpa.History) -> bool:
    """Whether every later sync that reads the same decides as this one did from `history`: it changed nothing,
    every pod is ready, and the controller remembers nothing but this proposal (every recommendation it, no scale
    event for a policy to count), so no window or policy can come out otherwise as time goes on."""
    return (
        decision.replicas == decision.current_replicas == decision.ready_replicas
        and not history.scale_up
        and not history.scale_down
        and all(replicas == decision.proposed_replicas for _, replicas in history.recommendations)
    )


def _same(decided: Decided, decision: hpa.Decision) -> bool:
    return dataclasses.replace(decided.decision, time=decision.time) == decision


def replay(trace: Sequence[DemandPoint], spec: ScalerSpec, startup_seconds: float, knee_concurrency: float) -> Replay:
    """The scaler `spec` over `trace` (at least two samples, times increasing), starting from the replicas the
    first sample needs, all ready; one replica takes `startup_seconds` to serve and holds `knee_concurrency`
    requests within its SLOs."""
    return replay_syncs(Syncs(trace), spec, startup_seconds, knee_concurrency)


def replay_syncs(syncs: Syncs, spec: ScalerSpec, startup_seconds: float, knee_concurrency: float) -> Replay:
    """`replay` over a trace already read into its syncs. A sync that `_repeats` stands for the rest of its
    stretch of equal readings, which are not stepped through: a steady month costs a few syncs."""
    bounds = (spec.min_replicas, spec.max_replicas)
    # What the demand signal asks for at the first sample, as the controller computes it from the written target.
    first_ask = hpa.needed(_readings(syncs.points[0].demand, None, spec, knee_concurrency)[0])
    initial = min(max(first_ask, spec.min_replicas), spec.max_replicas)
    pods: Pods = ((syncs.start, initial),)
    current = initial
    history = hpa.first_history(syncs.start, initial)
    fleet: list[FleetChange] = []
    decided: list[Decided] = []
    recorded_until = 0  # the sync after the last one `decided` holds
    # The recommendations a held history keeps: those of the longest window's syncs, and two for rounding.
    kept_syncs = int(hpa.window_seconds(spec.behavior) // hpa.SYNC_PERIOD_SECONDS) + 2
    reads = syncs.reads(spec.demand_window_seconds)
    stops = [read.first for read in reads[1:]] + [syncs.count]
    for read, stop in zip(reads, stops, strict=True):
        readings = _readings(read.peak, read.queue, spec, knee_concurrency)
        index = read.first
        while index < stop:
            now = syncs.time(index)
            before = history
            decision, history = hpa.decide(spec.behavior, bounds, history, now, current, _ready(pods, now), readings)
            count = 1
            # Checking costs a pass over the recommendations: worth it only where it may skip more syncs than that.
            if stop - index > len(before.recommendations) and _repeats(decision, before):
                count = stop - index
                held = [syncs.time(later) for later in range(max(index + 1, stop - kept_syncs), stop)]
                history = hpa.held(spec.behavior, history, held, decision.proposed_replicas)
            if decision.replicas != current or decision.proposed_replicas != current:
                if decided and recorded_until == index and _same(decided[-1], decision):
                    decided[-1] = Decided(decided[-1].decision, decided[-1].syncs + count)
                else:
                    decided.append(Decided(decision, count))
                recorded_until = index + count
            pods = _resized(pods, current, decision.replicas, now, now + startup_seconds)
            current = decision.replicas
            if not _settled(fleet, pods, current, now):
                fleet.extend(_changes(pods, current, now, now + hpa.SYNC_PERIOD_SECONDS))
            index += count
    signals = (spec.demand.measure, spec.queue.measure) if syncs.queued else (spec.demand.measure,)
    return Replay(run(syncs.points, fleet, knee_concurrency), tuple(decided), signals)
