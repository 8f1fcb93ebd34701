"""The generated scaler replayed over demand traces: a burst (scale-up lag, then the slow scale-down the generated
behavior asks for), the replicas-needed signal of a workload without a knee, the runaway of the old queue trigger (the
longest queue as a Value target) shown gone, and a fleet at the largest max_replicas."""

import bisect
import dataclasses
import random
from pathlib import Path

import pytest

from exporter.autoscale import hpa
from exporter.autoscale.baselines import oracle, static_peak
from exporter.autoscale.demand import MAX_DEMAND, DemandPoint
from exporter.autoscale.fleet import FleetChange
from exporter.autoscale.replay import Syncs, replay
from exporter.config import AutoscalingConfig, ScaledWorkload, load_config
from exporter.scaling import PEAK_DEMAND, QUEUED, REPLICAS_NEEDED, Policy, Rules, ScalerSpec, scaler_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "plimsoll.example.yaml"


def _example() -> tuple[AutoscalingConfig, dict[str, ScaledWorkload], float | None]:
    config = load_config(EXAMPLE)
    assert config.autoscaling is not None
    return config.autoscaling, {w.name: w for w in config.autoscaling.workloads}, config.saturation_queue


def _trace(*spans: tuple[float, float], queue_sum: float | None = None) -> tuple[DemandPoint, ...]:
    """Samples every 15 s: each span (seconds, demand) after the one before; a last sample closes the trace."""
    points, time = [], 0.0
    for seconds, demand in spans:
        for _ in range(int(seconds // 15)):
            points.append(DemandPoint(time, demand, queue_sum=queue_sum))
            time += 15
    return (*points, DemandPoint(time, spans[-1][1], queue_sum=queue_sum))


@pytest.fixture(scope="module")
def llama() -> tuple[ScalerSpec, ScaledWorkload]:
    """The example's vllm-llama-8b: knee 24 x margin 0.8 = 19.2 per replica, 1..8 replicas, start-up 5 min,
    demand window 10 min, scale-down 1 pod per 5 min."""
    autoscaling, workloads, saturation_queue = _example()
    workload = workloads["vllm-llama-8b"]
    return scaler_spec(autoscaling, workload, saturation_queue), workload


def test_a_burst_scales_up_within_one_sync_and_overflows_for_one_start_up(
    llama: tuple[ScalerSpec, ScaledWorkload],
) -> None:
    spec, workload = llama
    trace = _trace((1200, 20), (1200, 150), (2400, 20))
    result = replay(trace, spec, workload.startup_seconds, 24)
    assert result.signals == (PEAK_DEMAND,)  # no queue_sum in the trace
    first, second = result.decisions[0].decision, result.decisions[1].decision
    # at the burst's first sample the demand asks for ceil(150 / 19.2) = 8; scale-up doubles per 15 s
    assert (first.time, first.metric, first.value, first.proposed_replicas) == (1200, PEAK_DEMAND, 150, 8)
    assert (first.replicas, first.reason) == (4, hpa.SCALE_UP_LIMIT)
    assert (second.time, second.replicas, second.reason) == (1215, 8, hpa.METRIC)
    figures = result.run.figures
    # 2 ready (48 requests) for the 300 s start-up, 4 for the next 15 s: (150 - 48) x 300 + (150 - 96) x 15
    assert (figures.overflow_seconds, figures.overflow_request_seconds) == (315, 102 * 300 + 54 * 15)
    assert figures.peak_replicas == 8
    # the 8 stays in the 10-min demand window until 3000 s and in the 600 s scale-down window until 3585 s; then
    # one pod per 300 s (the scale-down policy)
    decisions = [decided.decision for decided in result.decisions]
    downs = [d for d in decisions if d.replicas < d.current_replicas]
    assert [(d.time, d.replicas) for d in downs] == [(3585, 7), (3885, 6), (4185, 5), (4485, 4), (4785, 3)]
    assert {d.reason for d in downs} == {hpa.SCALE_DOWN_LIMIT}
    held = [d for d in decisions if 3000 <= d.time < 3585]
    assert held and {d.reason for d in held} == {hpa.SCALE_DOWN_STABILIZED}
    # the oracle never overflows and costs less; the static fleet at the peak never overflows and costs more
    best, static = oracle(trace, 24, workload.startup_seconds, (1, 8)), static_peak(trace, 24, (1, 8))
    assert best.figures.overflow_seconds == static.figures.overflow_seconds == 0
    assert best.figures.replica_hours < figures.replica_hours < static.figures.replica_hours


def test_new_replicas_serve_only_after_the_start_up(llama: tuple[ScalerSpec, ScaledWorkload]) -> None:
    spec, workload = llama
    result = replay(_trace((60, 20), (900, 150)), spec, workload.startup_seconds, 24)
    changes = [(c.time, c.replicas, c.ready) for c in result.run.fleet]
    assert changes == [(0, 2, 2), (60, 4, 2), (75, 8, 2), (360, 8, 4), (375, 8, 8)]


def test_without_a_knee_the_replicas_needed_rule_is_the_signal() -> None:
    autoscaling, workloads, saturation_queue = _example()
    tiny = workloads["vllm-tiny-llama"]  # no knee_concurrency; 1..4 replicas
    spec = scaler_spec(autoscaling, tiny, saturation_queue)
    # the capacity model's knee of 10: needed = ceil(35 / (10 x 0.8)) = 5, clamped to 4 as the rule is
    result = replay(_trace((300, 5), (600, 35)), spec, tiny.startup_seconds, 10)
    first = result.decisions[0].decision
    assert (first.metric, first.value, first.proposed_replicas) == (REPLICAS_NEEDED, 4, 4)
    assert result.run.figures.peak_replicas == 4


def test_one_replica_s_queue_does_not_grow_a_fleet_of_20(llama: tuple[ScalerSpec, ScaledWorkload]) -> None:
    """The old queue trigger's runaway: 20 replicas, one holding 3 waiting (a wedged or unlucky replica), the others
    idle. The old trigger, the longest queue as a Value target of saturation.queue + 1 = 1, asked the HPA for
    3 x 20 = 60 and, as the new replicas became ready, 3 x 40 = 120: the fleet ran to max replicas (64) and stayed
    there. The queue summed over the replicas as an AverageValue target asks for at most ceil(waiting / 1) = 3,
    below the 20 running: the fleet stays at what min replicas and the demand need."""
    spec, workload = llama
    spec = dataclasses.replace(spec, min_replicas=20, max_replicas=64)
    trace = _trace((1800, 27), queue_sum=3)  # one replica's queue: the longest and the sum alike
    old = dataclasses.replace(spec, queue=dataclasses.replace(spec.queue, metric_type="Value"))
    ran = replay(trace, old, workload.startup_seconds, 24)
    assert [d.decision.proposed_replicas for d in ran.decisions][:2] == [60, 60]
    assert ran.run.figures.peak_replicas == 64 and ran.run.fleet[-1].replicas == 64
    result = replay(trace, spec, workload.startup_seconds, 24)
    assert result.signals == (PEAK_DEMAND, QUEUED)
    assert all(d.decision.replicas == d.decision.current_replicas == 20 for d in result.decisions)
    assert result.run.figures.peak_replicas == 20
    static = static_peak(trace, 24, (spec.min_replicas, spec.max_replicas)).figures
    assert result.run.figures.replica_hours == static.replica_hours


def test_a_queue_on_every_replica_scales_the_fleet_within_one_sync(llama: tuple[ScalerSpec, ScaledWorkload]) -> None:
    """A real burst the demand peak has not caught up with: 4 replicas each holding 3 waiting (12 in all) ask for
    ceil(12 / 1) = 12 at the first sync, capped by the scale-up policy at twice the 4 running."""
    spec, workload = llama
    spec = dataclasses.replace(spec, min_replicas=4)
    trace = _trace((600, 40), queue_sum=12)
    result = replay(trace, spec, workload.startup_seconds, 24)
    first = result.decisions[0].decision
    assert (first.time, first.metric, first.value, first.proposed_replicas) == (0, QUEUED, 12, 12)
    assert (first.current_replicas, first.replicas) == (4, 8)


def test_a_scale_down_removes_the_replicas_still_starting_first(llama: tuple[ScalerSpec, ScaledWorkload]) -> None:
    """A ReplicaSet scaled down deletes its not-ready pods before its ready ones: the ready capacity stays."""
    spec, workload = llama
    free_down = Rules(0, "Max", (Policy("Percent", 100, 15),))
    spec = dataclasses.replace(
        spec, demand_window_seconds=0, behavior=dataclasses.replace(spec.behavior, scale_down=free_down)
    )
    result = replay(_trace((60, 20), (15, 150), (600, 20)), spec, workload.startup_seconds, 24)
    assert [(c.time, c.replicas, c.ready) for c in result.run.fleet] == [(0, 2, 2), (60, 4, 2), (75, 2, 2)]
    assert result.run.figures.overflow_seconds == 15


def test_the_largest_max_replicas_the_config_takes_replays_at_once(llama: tuple[ScalerSpec, ScaledWorkload]) -> None:
    """max_replicas up to the HPA's 2^31 - 1 and a demand of 10^12 are both accepted: the fleet doubles per sync to
    the bound without the replay holding a value per replica (which ran out of memory under 6 GB)."""
    spec, workload = llama
    most = 2**31 - 1
    spec = dataclasses.replace(spec, max_replicas=most)
    result = replay(_trace((60, 20), (900, MAX_DEMAND)), spec, workload.startup_seconds, 24)
    ups = [d.decision.replicas for d in result.decisions if d.decision.replicas > d.decision.current_replicas]
    assert ups == [2**k for k in range(2, 31)] + [most]
    assert result.run.figures.peak_replicas == most
    # the last doubling at 60 + 29 x 15 s, every replica ready one start-up later
    assert result.run.fleet[-1] == FleetChange(60 + 29 * 15 + workload.startup_seconds, most, most)


def test_a_queue_recorded_only_after_the_first_sample_is_still_a_signal(
    llama: tuple[ScalerSpec, ScaledWorkload],
) -> None:
    """From Prometheus, a step with demand but no queue sample has no queue_sum: a trace whose queue series starts
    late still has the queue modelled where it was recorded, and says so."""
    spec, workload = llama
    trace = (*_trace((300, 20)), *(dataclasses.replace(p, time=p.time + 315) for p in _trace((600, 20), queue_sum=9)))
    result = replay(trace, spec, workload.startup_seconds, 24)
    assert result.signals == (PEAK_DEMAND, QUEUED)
    assert any(d.decision.metric == QUEUED for d in result.decisions)


@pytest.mark.parametrize("window", [0.0, 15.0, 600.0, 86400.0])
def test_the_readings_are_the_peak_over_the_window_at_every_sync(window: float) -> None:
    """Against the definition read literally, on an uneven trace: at each sync the peak is the most demand of the
    samples within the window before it (0 where none is), the queue the last sample's."""
    rng = random.Random(int(window))
    time, trace = 0.0, []
    for _ in range(600):
        trace.append(DemandPoint(time, rng.choice([0, 3, 30, 90]) * rng.random(), queue_sum=rng.choice([None, 2.0])))
        time += rng.choice([1, 7, 15, 40, 900, 4000])
    syncs = Syncs(trace)
    reads = syncs.reads(window)
    times = [point.time for point in trace]
    for read, stop in zip(reads, [*(r.first for r in reads[1:]), syncs.count], strict=True):
        for index in range(read.first, stop):
            now = syncs.time(index)
            within = trace[bisect.bisect_left(times, now - window) : bisect.bisect_right(times, now)]
            last = trace[bisect.bisect_right(times, now) - 1]
            assert (read.peak, read.queue) == (max((p.demand for p in within), default=0.0), last.queue_sum)
