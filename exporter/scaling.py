"""What the generated scalers scale on, as values: each signal's target, the HPA `behavior`, the replica bounds.

`plimsoll generate` renders these into KEDA ScaledObjects and HPAs, and `plimsoll autoscale replay` models the HPA
holding them; both read the one spec here, so the replay judges the scaler that is actually written.

Two signals per workload, chosen by what each measures:
- demand (proportional): peak demand (running + waiting requests) over the demand window, with one replica's
  capacity as its `AverageValue` target: the HPA asks for ceil(demand / capacity) replicas, the recording rule
  `model:plimsoll_replicas_needed`, so scaling and the over-provisioning ticket agree. Without a measured knee the
  signal is that rule itself, one per replica.
- queue (cliff): the requests waiting, summed over the replicas, as an `AverageValue` target one above the queue a
  replica tolerates at its knee: the HPA asks for ceil(waiting / (tolerated + 1)) replicas. A queue stays near zero
  until replicas pass their knee, so it says only that more are needed, and catches a burst before the demand peak
  has moved. Summed, one replica's queue (a wedged pod, a load balancer's imbalance) can ask for no more replicas
  than it has requests waiting; the longest queue as a `Value` target multiplied the whole fleet by it (a fleet of
  20 with one replica queueing 3 asked for 60). When every replica queues, both ask for the same.
"""

from dataclasses import dataclass

from exporter.config import AutoscalingConfig, ScaledWorkload

# Kubernetes refuses a longer stabilization window (and KEDA passes the window to the HPA unchanged); the HPA API
# refuses a policy period above 1800 s.
MAX_STABILIZATION_SECONDS = 3600
MAX_POLICY_PERIOD_SECONDS = 1800
# Scale-up doubles the fleet every 15 s (the HPA's sync period) from the first reading past the target.
SCALE_UP_PERIOD_SECONDS = 15
MIN_SCALE_DOWN_PERIOD_SECONDS = 60

# What a signal's value is, so a model of the scaler can compute it from a demand trace.
PEAK_DEMAND = "peak_demand"  # requests in flight summed over replicas, the peak over the demand window
REPLICAS_NEEDED = "replicas_needed"  # ceil(peak demand / one replica's capacity)
QUEUED = "queued"  # requests waiting, summed over the replicas

# The recording rule of requests in flight per model (running + waiting, summed over the replicas): `generate`
# writes it and scales on it, and `autoscale replay --prometheus` reads its history.
DEMAND_RECORD = "model:plimsoll_demand_requests:sum"


@dataclass(frozen=True)
class Target:
    """One signal's HPA metric target, and KEDA's activation threshold for it."""

    measure: str  # PEAK_DEMAND, REPLICAS_NEEDED or QUEUED
    metric_type: str  # "AverageValue": ceil(value / target) replicas; "Value": replicas x value / target
    value: float
    activation: float  # KEDA scales 0 -> 1 above it; with min_replicas >= 1 (the config's floor) it never acts


@dataclass(frozen=True)
class Policy:
    """One HPA scaling policy: at most `value` pods (Pods) or percent of the replicas (Percent) per period."""

    kind: str  # "Pods" or "Percent"
    value: int
    period_seconds: int


@dataclass(frozen=True)
class Rules:
    """The HPA `behavior` for one direction."""

    stabilization_window_seconds: int
    select_policy: str  # "Max", "Min" or "Disabled"
    policies: tuple[Policy, ...]


@dataclass(frozen=True)
class Behavior:
    scale_up: Rules
    scale_down: Rules


@dataclass(frozen=True)
class ScalerSpec:
    """Everything one workload's generated scaler decides on."""

    demand: Target
    queue: Target
    behavior: Behavior
    min_replicas: int
    max_replicas: int
    demand_window_seconds: float  # the peak demand signal is the maximum over this window
    margin: float  # replicas needed = ceil(peak demand / (one replica's capacity x margin))


def target_millis(value: float) -> int:
    """The target `value` as the applied scaler holds it: a whole number of thousandths, the milli-units of the
    Kubernetes quantity the HPA controller computes with. `generate` writes the HPA's target as that many `m` and
    KEDA's threshold as a text KEDA turns back into exactly as many (it truncates threshold x 1000), and the replay
    holds its HPA to the same number, so the replay and the controller never part at a rounding edge."""
    return round(value * 1000)


def promql_string(text: str) -> str:
    """`text` as a PromQL string literal. A label value may hold quotes and backslashes; never a line break or other
    control character (exporter.config.label_value refuses them), so these two escapes are all it needs."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def demand_target(workload: ScaledWorkload, margin: float) -> Target:
    if workload.knee_concurrency is None:
        return Target(REPLICAS_NEEDED, "AverageValue", 1.0, 0.0)
    return Target(PEAK_DEMAND, "AverageValue", workload.knee_concurrency * margin, 0.0)


def queue_target(saturation_queue: float | None) -> Target:
    # The queue a replica holds at its knee (saturation.queue, from `plimsoll loadtest --write`) is its noise floor.
    tolerated = saturation_queue or 0.0
    return Target(QUEUED, "AverageValue", tolerated + 1, tolerated)


def behavior(autoscaling: AutoscalingConfig, workload: ScaledWorkload) -> Behavior:
    """Scale up at once, down one replica per start-up time once demand has stayed low for the demand window: a
    replica removed in error is back within one start-up."""
    scale_down_period = min(max(workload.startup_seconds, MIN_SCALE_DOWN_PERIOD_SECONDS), MAX_POLICY_PERIOD_SECONDS)
    return Behavior(
        scale_up=Rules(0, "Max", (Policy("Percent", 100, SCALE_UP_PERIOD_SECONDS),)),
        scale_down=Rules(
            int(min(autoscaling.demand_window_seconds, MAX_STABILIZATION_SECONDS)),
            "Min",
            (Policy("Pods", 1, int(scale_down_period)),),
        ),
    )


def scaler_spec(autoscaling: AutoscalingConfig, workload: ScaledWorkload, saturation_queue: float | None) -> ScalerSpec:
    return ScalerSpec(
        demand=demand_target(workload, autoscaling.margin),
        queue=queue_target(saturation_queue),
        behavior=behavior(autoscaling, workload),
        min_replicas=workload.min_replicas,
        max_replicas=workload.max_replicas,
        demand_window_seconds=autoscaling.demand_window_seconds,
        margin=autoscaling.margin,
    )
