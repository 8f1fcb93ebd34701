"""The daemon's side of the scale-up lag (exporter/core/scale_up.py): at each publish, every autoscaled model's
demand and ready replicas from the targets' latest states, fed to its lag state; what the snapshot shows of it.

A replica is a target that is up with an engine instance labelled with the workload's model (the `model` label of
its series, the one autoscaling.workloads[].model names); its data-parallel ranks are one replica, as in the
replica-count recording rule. Demand is their requests running + waiting, like the demand recording rule. A
workload without knee_concurrency has no capacity to cross (the replay refuses it too), so it gets no lag.
"""

from collections.abc import Mapping
from dataclasses import replace

from exporter.config import AutoscalingConfig, ScaledWorkload
from exporter.core.scale_up import FleetReading, ScaleUp
from exporter.daemon.snapshot import ScaleUpState, TargetState, model_label


def _fleet_reading(model: str, states: tuple[TargetState, ...], now: float) -> FleetReading:
    ready, demand = 0, 0.0
    for state in states:
        # A target that is down has no instances: only those read at their last poll count.
        serving = [i.reading for i in state.instances if model_label(state, i.reading.model) == model]
        if serving:
            ready += 1
            demand += sum((r.requests_running or 0.0) + (r.requests_waiting or 0.0) for r in serving)
    return FleetReading(now, demand, ready)


def _measured(autoscaling: AutoscalingConfig | None) -> tuple[tuple[ScaledWorkload, int], ...]:
    workloads = autoscaling.workloads if autoscaling else ()
    return tuple((w, w.knee_concurrency) for w in workloads if w.knee_concurrency is not None)


def advance(
    carried: Mapping[str, ScaleUp],
    autoscaling: AutoscalingConfig | None,
    states: tuple[TargetState, ...],
    now: float,
    settle_seconds: float,
) -> tuple[dict[str, ScaleUp], tuple[ScaleUpState, ...]]:
    """Each autoscaled model's lag state after this moment's reading, by model (a model no longer configured is
    dropped), and what the snapshot shows of each. A changed knee applies from now on, keeping the lags measured."""
    kept: dict[str, ScaleUp] = {}
    shown: list[ScaleUpState] = []
    for workload, knee in _measured(autoscaling):
        before = carried.get(workload.model, ScaleUp(knee, settle_seconds))
        reading = _fleet_reading(workload.model, states, now)
        lag = replace(before, capacity_per_replica=knee, settle_seconds=settle_seconds).observe(reading)
        kept[workload.model] = lag
        shown.append(
            ScaleUpState(
                model=workload.model,
                workload=f"{workload.kind} {workload.namespace}/{workload.name}",
                startup_seconds=workload.startup_seconds,
                knee_concurrency=knee,
                ready_replicas=reading.ready,
                demand=reading.demand,
                capacity=reading.ready * knee,
                lags=lag.lags,
                pending_seconds=lag.pending_seconds(now),
            )
        )
    return kept, tuple(shown)
