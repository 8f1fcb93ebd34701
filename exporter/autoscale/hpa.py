"""One HorizontalPodAutoscaler sync, as Kubernetes documents it ("Horizontal Pod Autoscaling", "Configurable scaling
behavior") and its controller (pkg/controller/podautoscaler: replica_calculator.go, horizontal.go) computes it.

Per sync: each metric proposes replicas (no change within the 10% tolerance); the largest proposal wins; the
stabilization windows bound it by the recommendations of the recent past (the lowest over the scale-up window, the
highest over the scale-down window); the policies bound the change against the replicas at the start of each
policy's period; min and max replicas bound the result. Pure: the controller's memory is a `History` value passed
in and returned.
"""

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

from exporter.scaling import Behavior, Rules

SYNC_PERIOD_SECONDS = 15.0  # kube-controller-manager --horizontal-pod-autoscaler-sync-period, default
TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance, default

# Why a sync set the replicas it did: the rule that decided, in the words the replay reports.
METRIC = "metric"  # the winning metric's proposal, unbounded
WITHIN_TOLERANCE = "tolerance"
SCALE_UP_STABILIZED = "scale-up stabilization window"
SCALE_DOWN_STABILIZED = "scale-down stabilization window"
SCALE_UP_LIMIT = "scale-up policy"
SCALE_DOWN_LIMIT = "scale-down policy"
SCALING_DISABLED = "selectPolicy Disabled"
TOO_MANY = "max replicas"
TOO_FEW = "min replicas"


@dataclass(frozen=True)
class Reading:
    """One metric's value at one sync, and its target as the scaler holds it."""

    metric: str
    metric_type: str  # "AverageValue": `value` is the fleet's total; "Value": `value` is compared as it is
    target_millis: int  # thousandths, as the HPA's quantity holds it (exporter.scaling.target_millis)
    value: float


def _millis(value: float) -> int:
    """A metric's value as the controller reads it, in thousandths: prometheus-adapter and KEDA serve int64(value x
    1000), truncated (recent KEDA formats it with %.3f, rounded); both agree on the whole counts these signals are."""
    return int(value * 1000)


@dataclass(frozen=True)
class Proposal:
    reading: Reading
    replicas: int
    within_tolerance: bool


@dataclass(frozen=True)
class ScaleEvent:
    time: float
    change: int  # replicas added (in the scale-up events) or removed (in the scale-down events)


@dataclass(frozen=True)
class History:
    """What the controller remembers of one HPA between syncs."""

    recommendations: tuple[tuple[float, int], ...]  # (time, the largest proposal then, before any bound), by time
    scale_up: tuple[ScaleEvent, ...] = ()
    scale_down: tuple[ScaleEvent, ...] = ()


@dataclass(frozen=True)
class Decision:
    time: float
    current_replicas: int
    ready_replicas: int
    metric: str  # the metric whose proposal won
    value: float  # its value
    proposed_replicas: int  # the largest proposal
    stabilized_replicas: int
    replicas: int  # what the HPA set
    reason: str  # the rule that decided: METRIC, WITHIN_TOLERANCE, a stabilization window, a policy, min or max


def first_history(now: float, replicas: int) -> History:
    """A new HPA's memory: its current replicas as the one recommendation, so it does not scale down before a
    scale-down window of readings says so (the controller's maybeInitScaleDownStabilizationWindow)."""
    return History(recommendations=((now, replicas),))


def needed(reading: Reading) -> int:
    """The replicas an AverageValue metric asks for outside the tolerance: ceil(total / target), in thousandths."""
    return math.ceil(_millis(reading.value) / reading.target_millis)


def propose(reading: Reading, current: int, ready: int) -> Proposal:
    """The replicas one metric asks for. AverageValue: ceil(total / target), held at `current` while total /
    (target x current) is within the tolerance of 1. Value: ceil(ready x value / target), held while value /
    target is within it (the controller multiplies by the ready pods, not the current count). In whole thousandths,
    as the controller computes: 51 over a target of 102m asks for 500 replicas, where the floats' 51 / 0.102 ask for
    501."""
    usage = _millis(reading.value)
    if reading.metric_type == "AverageValue":
        ratio = usage / (reading.target_millis * current)
        wanted = needed(reading)
    else:
        ratio = usage / reading.target_millis
        wanted = math.ceil(ratio * ready)
    # Kubernetes 1.33's form (Tolerances.isWithin in replica_calculator.go); before it |1 - ratio| <= tolerance,
    # which in floats differs only at exactly +10% (1100m over 1000m: held now, scaled up then).
    if 1.0 - TOLERANCE <= ratio <= 1.0 + TOLERANCE:
        return Proposal(reading, current, True)
    return Proposal(reading, wanted, False)


def _changed_within(events: Sequence[ScaleEvent], period_seconds: float, now: float) -> int:
    return sum(event.change for event in events if event.time > now - period_seconds)


def _period_start(history: History, period_seconds: float, now: float, current: int) -> int:
    """The replicas at the start of a policy's period: the current ones less those added since, plus those
    removed since."""
    added = _changed_within(history.scale_up, period_seconds, now)
    removed = _changed_within(history.scale_down, period_seconds, now)
    return current - added + removed


def _policy_limits(rules: Rules, history: History, now: float, current: int, grow: bool) -> list[int]:
    """The replicas each policy allows now, counted from the replicas at the start of its period."""
    limits = []
    for policy in rules.policies:
        start = _period_start(history, policy.period_seconds, now, current)
        if policy.kind == "Pods":
            limits.append(start + policy.value if grow else start - policy.value)
        elif grow:
            limits.append(math.ceil(start * (1 + policy.value / 100)))  # rounded up, so a small fleet can grow
        else:
            limits.append(int(start * (1 - policy.value / 100)))  # truncated, as the controller's int32() does
    return limits


def scale_up_limit(rules: Rules, history: History, now: float, current: int) -> int:
    """The most replicas the scale-up policies allow now (selectPolicy Max: the most permissive policy)."""
    if rules.select_policy == "Disabled":
        return current
    limits = _policy_limits(rules, history, now, current, grow=True)
    return max(limits) if rules.select_policy == "Max" else min(limits)


def scale_down_limit(rules: Rules, history: History, now: float, current: int) -> int:
    """The fewest replicas the scale-down policies allow now (selectPolicy Max: the most permissive policy)."""
    if rules.select_policy == "Disabled":
        return current
    limits = _policy_limits(rules, history, now, current, grow=False)
    return min(limits) if rules.select_policy == "Max" else max(limits)


_TIME = itemgetter(0)


def _since(recommendations: tuple[tuple[float, int], ...], cutoff: float) -> tuple[tuple[float, int], ...]:
    """The recommendations after `cutoff`: a bisection and a slice, since a replay reads a window of up to an
    hour of them at every sync, in every one of the tuner's candidates."""
    return recommendations[bisect.bisect_right(recommendations, cutoff, key=_TIME) :]


def stabilize(behavior: Behavior, history: History, now: float, current: int, desired: int) -> int:
    """`desired` held between the lowest recommendation of the scale-up window and the highest of the scale-down
    window (both including `desired` itself), starting from `current`."""
    recommendations = history.recommendations
    up = _since(recommendations, now - behavior.scale_up.stabilization_window_seconds)
    down = _since(recommendations, now - behavior.scale_down.stabilization_window_seconds)
    lowest = min([desired, *(replicas for _, replicas in up)])
    highest = max([desired, *(replicas for _, replicas in down)])
    return min(max(current, lowest), highest)


def window_seconds(behavior: Behavior) -> float:
    """How far back the stabilization windows read the recommendations."""
    return max(behavior.scale_up.stabilization_window_seconds, behavior.scale_down.stabilization_window_seconds)


def _recent(events: tuple[ScaleEvent, ...], rules: Rules, now: float) -> tuple[ScaleEvent, ...]:
    """The scale events a policy of `rules` can still count at `now` or later."""
    if not events:
        return ()
    longest = max((policy.period_seconds for policy in rules.policies), default=0)
    return tuple(event for event in events if event.time > now - longest)


def _remember(behavior: Behavior, history: History, now: float, desired: int, current: int, replicas: int) -> History:
    """The history after this sync: its recommendation added, and what no window or period can read any more
    dropped."""
    window = window_seconds(behavior)
    recommendations = (*_since(history.recommendations, now - window), (now, desired))

    def kept(events: tuple[ScaleEvent, ...], rules: Rules, change: int) -> tuple[ScaleEvent, ...]:
        if not events and change <= 0:  # the usual sync: nothing to keep, nothing to add
            return ()
        recent = _recent(events, rules, now)
        return (*recent, ScaleEvent(now, change)) if change > 0 else recent

    return History(
        recommendations,
        kept(history.scale_up, behavior.scale_up, replicas - current),
        kept(history.scale_down, behavior.scale_down, current - replicas),
    )


def _bounded(
    behavior: Behavior, history: History, now: float, current: int, stabilized: int, bounds: tuple[int, int]
) -> tuple[int, str]:
    """`stabilized` within the policies and min/max replicas, and the rule that bounds it where it does."""
    minimum, maximum = bounds
    if stabilized > current:
        limit = max(scale_up_limit(behavior.scale_up, history, now, current), current)
        if maximum <= limit:
            return min(stabilized, maximum), TOO_MANY
        disabled = behavior.scale_up.select_policy == "Disabled"
        return min(stabilized, limit), SCALING_DISABLED if disabled else SCALE_UP_LIMIT
    limit = min(scale_down_limit(behavior.scale_down, history, now, current), current)
    if minimum >= limit:
        return max(stabilized, minimum), TOO_FEW
    disabled = behavior.scale_down.select_policy == "Disabled"
    return max(stabilized, limit), SCALING_DISABLED if disabled else SCALE_DOWN_LIMIT


def decide(
    behavior: Behavior,
    bounds: tuple[int, int],
    history: History,
    now: float,
    current: int,
    ready: int,
    readings: Sequence[Reading],
) -> tuple[Decision, History]:
    """One sync: the replicas the HPA sets from `current` (`ready` of them ready) given the metrics' readings, and
    the history the next sync reads. `bounds` is (min replicas, max replicas); `current` lies within them; `now` is
    no earlier than the syncs `history` remembers."""
    proposals = [propose(reading, current, ready) for reading in readings]
    winner = max(proposals, key=lambda proposal: proposal.replicas)  # the first of equals, as the controller keeps
    if winner.replicas == current:
        # Kept as it is, without the work of asking: the windows hold `current` (their lowest recommendation with it
        # is at most it, their highest at least), and no policy nor min or max acts on no change. Most syncs of a
        # replay are this one.
        stabilized, replicas = current, current
        bound = WITHIN_TOLERANCE if winner.within_tolerance else METRIC
    else:
        stabilized = stabilize(behavior, history, now, current, winner.replicas)
        replicas, bound = _bounded(behavior, history, now, current, stabilized, bounds)
        # No bound bit: a window or the metric itself decided (a proposal within the tolerance is `current`).
        if replicas == stabilized and stabilized != winner.replicas:
            bound = SCALE_UP_STABILIZED if winner.replicas > current else SCALE_DOWN_STABILIZED
        elif replicas == stabilized:
            bound = METRIC
    decision = Decision(
        now,
        current,
        ready,
        winner.reading.metric,
        winner.reading.value,
        winner.replicas,
        stabilized,
        replicas,
        bound,
    )
    return decision, _remember(behavior, history, now, winner.replicas, current, replicas)


def held(behavior: Behavior, history: History, times: Sequence[float], desired: int) -> History:
    """The history after syncs at `times` (increasing, after the syncs `history` remembers) that each proposed
    `desired` and changed nothing: what `decide` after each would leave, without stepping through them. Only the
    syncs of the last window count, so `times` may start there."""
    now = times[-1]
    window = window_seconds(behavior)
    recommendations = (*history.recommendations, *((time, desired) for time in times[:-1]))
    return History(
        (*_since(recommendations, now - window), (now, desired)),
        _recent(history.scale_up, behavior.scale_up, now),
        _recent(history.scale_down, behavior.scale_down, now),
    )
