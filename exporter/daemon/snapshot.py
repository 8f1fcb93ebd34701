"""The daemon's view of the world after one poll: immutable, swapped whole, read by /metrics and the API."""

from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.capacity.plan import CapacityPlan
from exporter.config import SloConfig, Target
from exporter.core.headroom import Headroom
from exporter.core.scale_up import Lags
from exporter.core.slo import SloCounter
from exporter.core.trend import Point
from exporter.sources.engines.base import EngineReading
from exporter.sources.nvml import NvmlSnapshot

# Why a poll of a target failed: the label values of plimsoll_target_poll_failures_total.
FAILURE_REASONS = (
    "timeout",
    "refused",
    "http_status",
    "redirect",  # to another origin: never followed
    "too_large",
    "not_metrics",
    "unknown_engine",
    "too_many_series",
    "too_many_instances",
    "invalid_target",  # discovery could not accept it as given (a bad engine label, say); never polled
    "error",
)


@dataclass(frozen=True)
class SloState:
    slo: SloConfig
    counter: SloCounter


@dataclass(frozen=True)
class InstanceState:
    """One engine instance (a data-parallel rank) on a target's page."""

    reading: EngineReading
    headroom: Headroom
    saturation_eta_seconds: float
    model_plan: CapacityPlan | None
    model_capacity_error_ratio: float | None
    slos: tuple[SloState, ...] = ()
    # KV usage over the last polls, oldest first: the trend the ETA is fitted on, and the status page's sparkline.
    kv_usage_history: tuple[Point, ...] = ()


@dataclass(frozen=True)
class TargetState:
    target: Target
    up: bool
    engine: str | None
    last_failure: str | None  # one of FAILURE_REASONS
    failures_total: Mapping[str, int]
    last_success_timestamp: float | None
    scrape_duration_seconds: float | None
    instances: tuple[InstanceState, ...] = ()
    gpus: tuple[str, ...] = ()  # GPU indices this target runs on, as attributed
    last_error: str | None = None  # the failure in words: "HTTP 404", "timeout after 3s", ...
    warnings: tuple[str, ...] = ()  # what is wrong though the target is read (a model that is not the engine's)
    # What the target's GPUs cost per hour (pricing.gpu_hour); None where not every one of them has a price.
    gpu_hourly_cost: float | None = None


@dataclass(frozen=True)
class ScaleUpState:
    """One autoscaled model's scale-up lag as the daemon sees it (exporter/daemon/scale_up.py): every renderer shows
    these values and derives none."""

    model: str
    workload: str  # kind namespace/name, as the config's autoscaling.workloads entry names it
    startup_seconds: float  # the start-up `plimsoll autoscale replay` assumes: what the lags are checked against
    knee_concurrency: float  # requests one replica holds
    ready_replicas: int
    demand: float  # requests running + waiting over its ready replicas
    capacity: float  # ready replicas x knee_concurrency
    lags: Lags
    pending_seconds: float  # age of the crossing no replica has answered yet; 0 when none


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    ready: bool
    nvml: NvmlSnapshot | None
    targets: tuple[TargetState, ...]
    vram_unexplained_bytes: Mapping[str, float] = field(default_factory=dict)
    process_targets: Mapping[int, str] = field(default_factory=dict)  # GPU PID -> its target, "" when unattributed
    poll_duration_seconds: float = 0.0
    saturation_kv_usage: float = 0.9
    scale_up: tuple[ScaleUpState, ...] = ()  # one per autoscaling workload with a knee_concurrency


EMPTY = Snapshot(taken_at=0.0, ready=False, nvml=None, targets=())


def model_label(state: TargetState, served: str | None) -> str:
    """The `model` label of an engine series: what the engine says it serves, else the target's configured model."""
    return served or state.target.model or ""


def process_owner(snapshot: Snapshot, gpu_index: str, pid: int) -> str | None:
    """The target a GPU process belongs to, for every renderer: the one the daemon attributed its PID to, else the
    only target configured on that GPU (its `gpus`, or the sole target). A target that is on the GPU only because
    another of its processes was attributed there does not count: that would pass it a co-tenant. None when neither
    says."""
    attributed = snapshot.process_targets.get(pid)
    if attributed:
        return attributed
    configured = [
        state.target.name
        for state in snapshot.targets
        if gpu_index in state.gpus and (state.target.gpus is not None or len(snapshot.targets) == 1)
    ]
    return configured[0] if len(configured) == 1 else None
