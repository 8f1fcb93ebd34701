"""The HPA model against the worked examples of the Kubernetes documentation: "Horizontal Pod Autoscaling"
(kubernetes.io/docs/concepts/workloads/autoscaling/horizontal-pod-autoscale/: "Algorithm details", "Configurable
scaling behavior" and its examples) and the "HorizontalPodAutoscaler Walkthrough"."""

from collections.abc import Sequence

from exporter.autoscale import hpa
from exporter.scaling import Behavior, Policy, Rules, target_millis

# "Default Behavior": scale up by 100% or 4 pods per 15 s, whichever is more, no stabilization; scale down by up to
# 100% per 15 s after a 300 s window.
DEFAULT = Behavior(
    scale_up=Rules(0, "Max", (Policy("Percent", 100, 15), Policy("Pods", 4, 15))),
    scale_down=Rules(300, "Max", (Policy("Percent", 100, 15),)),
)
# Neither direction held back, for the examples about one rule at a time.
FREE = Rules(0, "Max", (Policy("Percent", 1000, 15),))


def _value(value: float, target: float, metric: str = "m") -> hpa.Reading:
    return hpa.Reading(metric, "Value", target_millis(target), value)


def _average(total: float, target: float, metric: str = "m") -> hpa.Reading:
    return hpa.Reading(metric, "AverageValue", target_millis(target), total)


def _run(
    behavior: Behavior,
    bounds: tuple[int, int],
    start: int,
    wanted: Sequence[int],
    every: float = hpa.SYNC_PERIOD_SECONDS,
) -> list[hpa.Decision]:
    """Syncs `every` seconds, the metric asking for `wanted[i]` replicas at the i-th (an AverageValue of 1 per
    replica), all replicas ready; the decisions in order."""
    history = hpa.first_history(0.0, start)
    current = start
    decisions = []
    for index, replicas in enumerate(wanted):
        decision, history = hpa.decide(
            behavior, bounds, history, index * every, current, current, [_average(replicas, 1.0)]
        )
        decisions.append(decision)
        current = decision.replicas
    return decisions


def test_algorithm_details_doubles_at_twice_the_target_and_halves_at_half() -> None:
    """ "Algorithm details": with a current metric value of 200m and a desired value of 100m the number of replicas
    doubles (200.0 / 100.0 == 2.0); at 50m it halves (50.0 / 100.0 == 0.5)."""
    assert hpa.propose(_value(0.2, 0.1), current=4, ready=4).replicas == 8
    assert hpa.propose(_value(0.05, 0.1), current=4, ready=4).replicas == 2


def test_algorithm_details_tolerance_skips_a_ratio_within_a_tenth_of_one() -> None:
    """ "Algorithm details": the control plane skips any scaling action if the ratio is sufficiently close to 1.0
    (within a globally-configurable tolerance, 0.1 by default)."""
    within = hpa.propose(_value(0.109, 0.1), current=10, ready=10)
    assert (within.replicas, within.within_tolerance) == (10, True)
    past = hpa.propose(_value(0.111, 0.1), current=10, ready=10)
    assert (past.replicas, past.within_tolerance) == (12, False)  # ceil(10 x 1.11)
    # AverageValue: the ratio is the total over (target x current replicas); past the tolerance, ceil(total / target)
    assert hpa.propose(_average(105, 10), current=10, ready=10).replicas == 10
    assert hpa.propose(_average(89, 10), current=10, ready=10).replicas == 9


def test_walkthrough_305_percent_of_a_50_percent_target_makes_7_replicas() -> None:
    """ "HorizontalPodAutoscaler Walkthrough": one php-apache replica at 305% CPU against a 50% target is resized to
    7 replicas (ceil(1 x 305 / 50))."""
    assert hpa.propose(_value(305, 50), current=1, ready=1).replicas == 7


def test_a_value_target_multiplies_the_ready_replicas_not_the_current_ones() -> None:
    """ "Algorithm details": pods not yet ready are set aside; for a Value target the controller scales the ready
    pods by the ratio (replica_calculator.go, getUsageRatioReplicaCount)."""
    assert hpa.propose(_value(3, 1), current=40, ready=20).replicas == 60


def test_the_largest_of_several_metrics_is_chosen() -> None:
    """ "Algorithm details": if multiple metrics are specified, the calculation is done for each metric, and then the
    largest of the desired replica counts is chosen."""
    behavior = Behavior(FREE, FREE)
    decision, _ = hpa.decide(
        behavior,
        (1, 100),
        hpa.first_history(0.0, 4),
        0.0,
        4,
        4,
        [_average(8, 1.0, "demand"), _value(3, 1.0, "queue")],
    )
    assert (decision.metric, decision.value, decision.replicas, decision.reason) == ("queue", 3, 12, hpa.METRIC)


def test_stabilization_window_uses_the_highest_recommendation_of_the_last_300_seconds() -> None:
    """ "Stabilization window": with scaleDown stabilizationWindowSeconds 300, when the metrics indicate the target
    should be scaled down the algorithm uses the highest desired state of the past 5 minutes."""
    behavior = Behavior(FREE, Rules(300, "Max", (Policy("Percent", 100, 15),)))
    # 10 wanted at 0 s, then 4: held at 10 while the 10 is inside the window (t - 300 < 0), 4 from 300 s
    decisions = _run(behavior, (1, 20), 10, [10, *[4] * 20])
    held = [d for d in decisions if d.time < 300]
    assert {d.replicas for d in held} == {10}
    assert {d.reason for d in held[1:]} == {hpa.SCALE_DOWN_STABILIZED}
    assert decisions[20].time == 300 and decisions[20].replicas == 4


def test_scale_up_stabilization_window_uses_the_lowest_recommendation() -> None:
    """ "Configurable scaling behavior": for scaling up the lowest recommendation over the scale-up window is used,
    so a short spike inside it does not scale."""
    behavior = Behavior(Rules(60, "Max", (Policy("Percent", 1000, 15),)), FREE)
    decisions = _run(behavior, (1, 20), 2, [2, 8, 8, 8, 8, 8])
    assert [d.replicas for d in decisions] == [2, 2, 2, 2, 8, 8]  # the 2 of 0 s leaves the window at 60 s
    assert decisions[1].reason == hpa.SCALE_UP_STABILIZED


def test_scaling_policies_pods_and_percent_80_down_to_10() -> None:
    """ "Scaling policies": Pods 4 and Percent 10 per 60 s: from 80 replicas scaled down to 10, the first step
    removes 8; at 72, 10% is 7.2, rounded up to 8; below 40 replicas the Pods policy applies and 4 go at a time.
    (The example's policies only: stabilization set to 0 to isolate them.)"""
    behavior = Behavior(FREE, Rules(0, "Max", (Policy("Pods", 4, 60), Policy("Percent", 10, 60))))
    decisions = _run(behavior, (1, 100), 80, [10] * 14, every=60)
    replicas = [d.replicas for d in decisions]
    assert replicas == [72, 64, 57, 51, 45, 40, 36, 32, 28, 24, 20, 16, 12, 10]
    assert {d.reason for d in decisions[:-1]} == {hpa.SCALE_DOWN_LIMIT}


def test_a_policy_counts_from_the_replicas_at_the_start_of_its_period() -> None:
    """ "Scaling policies": periodSeconds is the window of time for which the policy must hold true: a second sync
    inside the same 60 s removes nothing more."""
    behavior = Behavior(FREE, Rules(0, "Max", (Policy("Pods", 4, 60), Policy("Percent", 10, 60))))
    decisions = _run(behavior, (1, 100), 80, [10, 10, 10, 10, 10])  # every 15 s
    assert [d.replicas for d in decisions] == [72, 72, 72, 72, 64]  # 60 s after the first step, the next


def test_select_policy_min_removes_no_more_than_5_pods_a_minute() -> None:
    """ "Scaling policies" / "Limit scale down rate": Percent 10 and Pods 5 per 60 s with selectPolicy Min: no more
    than 5 Pods are removed per minute (from 80, 10% would be 8)."""
    behavior = Behavior(FREE, Rules(0, "Min", (Policy("Percent", 10, 60), Policy("Pods", 5, 60))))
    decisions = _run(behavior, (1, 100), 80, [10, 10, 10], every=60)
    assert [d.replicas for d in decisions] == [75, 70, 65]


def test_select_policy_max_takes_the_policy_allowing_the_largest_change() -> None:
    """ "Scaling policies": selectPolicy Max (the default) picks the policy that allows the highest amount of
    change (the same Percent 10 and Pods 5 from 80: 8 go)."""
    behavior = Behavior(FREE, Rules(0, "Max", (Policy("Percent", 10, 60), Policy("Pods", 5, 60))))
    assert [d.replicas for d in _run(behavior, (1, 100), 80, [10], every=60)] == [72]


def test_select_policy_min_on_scale_up_takes_the_policy_allowing_the_smallest_change() -> None:
    """ "Scaling policies": selectPolicy Min selects the policy which allows the smallest change in the replica
    count (scaling up 10 replicas with the default 100% and 4-pod policies: 4 more, not 10)."""
    behavior = Behavior(Rules(0, "Min", DEFAULT.scale_up.policies), FREE)
    assert [d.replicas for d in _run(behavior, (1, 100), 10, [40])] == [14]


def test_select_policy_disabled_never_scales_down() -> None:
    """ "Example: disable scale down": selectPolicy Disabled turns off scaling in that direction."""
    behavior = Behavior(FREE, Rules(0, "Disabled", (Policy("Percent", 100, 15),)))
    decisions = _run(behavior, (1, 100), 10, [2, 2, 2])
    assert [d.replicas for d in decisions] == [10, 10, 10]
    assert decisions[0].reason == hpa.SCALING_DISABLED


def test_default_scale_up_adds_4_pods_or_doubles_every_15_seconds_whichever_is_more() -> None:
    """ "Default Behavior": for scaling up there is no stabilization window; 4 pods or 100% of the current replicas
    may at most be added every 15 seconds."""
    decisions = _run(DEFAULT, (1, 100), 1, [150] * 6)
    assert [d.replicas for d in decisions] == [5, 10, 20, 40, 80, 100]
    assert [d.reason for d in decisions] == [hpa.SCALE_UP_LIMIT] * 5 + [hpa.TOO_MANY]


def test_default_scale_down_waits_300_seconds_then_may_remove_every_pod() -> None:
    """ "Default Behavior": for scaling down the stabilization window is 300 seconds, and then 100% of the replicas
    may be removed (down to minReplicas)."""
    decisions = _run(DEFAULT, (1, 100), 10, [10, *[1] * 20])
    assert {d.replicas for d in decisions if d.time < 300} == {10}
    assert decisions[20].replicas == 1


def test_min_and_max_replicas_bound_the_result() -> None:
    """ "Algorithm details": the desired count is then bounded by minReplicas and maxReplicas."""
    up = _run(Behavior(FREE, FREE), (2, 6), 4, [50])[0]
    down = _run(Behavior(FREE, FREE), (2, 6), 4, [1])[0]
    assert (up.replicas, up.reason) == (6, hpa.TOO_MANY)
    assert (down.replicas, down.reason) == (2, hpa.TOO_FEW)


def test_exactly_ten_percent_above_the_target_is_within_the_tolerance_as_kubernetes_reads_it():
    # 1100m over a target of 1000m on one replica: a ratio of 1.1, inside [0.9, 1.1] (Kubernetes 1.33 on), where
    # the older |1 - 1.1| <= 0.1 is false in floats and scaled to 2.
    proposal = hpa.propose(_average(1.1, 1.0), 1, 1)
    assert (proposal.replicas, proposal.within_tolerance) == (1, True)
    assert hpa.propose(_average(0.9, 1.0), 1, 1).within_tolerance


def test_a_proposal_is_computed_in_thousandths_as_the_controller_computes_it():
    # 51 / 0.102 is 500.00000000000006 in floats; the controller's 51000m / 102m is exactly 500.
    assert hpa.propose(_average(51, 0.102), 100, 100).replicas == 500
    # A value is read as KEDA and prometheus-adapter serve it, truncated to thousandths: 2.0009 is 2000m, twice a
    # target of 1, so 3 ready pods ask for 6 (the float 2.0009 x 3 would ask for 7).
    assert hpa.propose(_value(2.0009, 1.0), 3, 3).replicas == 6
