"""The config as the rest of the program receives it: frozen values, the report of a check, and the error that
lists every problem found in a file."""

from dataclasses import dataclass, field

from exporter.capacity.deployment import Deployment

DEFAULT_PORT = 19842
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
ENGINE_NAMES = ("auto", "vllm", "sglang", "trtllm", "tgi", "llamacpp", "lmdeploy", "nim")


class ConfigError(ValueError):
    """One or more problems in a config file; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Expansion:
    """The value of the variable `name`, written by ${NAME} into the field at `path`. A variable often holds a
    secret: a problem names the variable and never quotes its value (config/reader.py)."""

    path: str
    name: str
    value: str


@dataclass(frozen=True)
class BasicAuth:
    """HTTP basic auth for a target; the password is read from a file at each poll, so it can rotate."""

    username: str
    password_file: str


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # never carries credentials: they come from basic_auth or bearer_token_file
    engine: str = "auto"
    model: str | None = None
    gpus: tuple[str, ...] | None = None  # None: all GPUs of this host when it is the only target
    gpu_type: str | None = None  # a GPU preset, for hosts without NVML
    deployment: Deployment = field(default_factory=Deployment)  # unset fields: the engine's defaults
    timeout_seconds: float | None = None
    poll_interval_seconds: float | None = None  # None: the config's poll_interval
    basic_auth: BasicAuth | None = None
    bearer_token_file: str | None = None
    source: str = "static"
    # Why discovery could not accept this target as given (a bad engine label, say): it is shown down with this
    # reason and never polled. None for a usable target.
    problem: str | None = None


@dataclass(frozen=True)
class SloConfig:
    name: str
    threshold_seconds: float
    objective: float


@dataclass(frozen=True)
class KubernetesDiscovery:
    """Engine pods listed from the Kubernetes API (exporter/sources/kubernetes.py): those on one node (a DaemonSet's
    instance), or with `scope` "cluster" those on every node (one daemon that sees every replica of a workload)."""

    node: str  # "" with scope "cluster"
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    label_selector: str = ""
    refresh_seconds: float = 30.0
    api_url: str | None = None  # default: the in-cluster API server
    token_file: str | None = None  # default: the pod's service-account token
    ca_file: str | None = None
    scope: str = "node"  # or "cluster"


@dataclass(frozen=True)
class AlertingConfig:
    """The knobs the generated rules and dashboards both read, so a dashboard line sits where its alert fires.
    docs/alerts.md says why each default is what it is."""

    # rules/RUNBOOK.md; each alert links here with its name, lowercased, as the anchor.
    runbook_url: str = "https://github.com/plimsoll-dev/plimsoll/blob/main/rules/RUNBOOK.md"
    # Regex on the daemon's scrape job: prometheus-operator names jobs `<namespace>/<monitor>`, plain configs
    # `plimsoll`.
    exporter_job: str = ".*plimsoll.*"
    # Labels on the PrometheusRule that the operator's ruleSelector matches, as sorted (name, value) pairs so the
    # config stays hashable.
    rule_labels: tuple[tuple[str, str], ...] = (("release", "kube-prometheus-stack"),)
    fleet_headroom_min_requests: float = 10.0
    capacity_drift_ratio: float = 0.2
    vram_growth_bytes_per_hour: int = 2 * 1024**3
    saturation_gate_fraction: float = 0.6
    saturation_ahead_for_seconds: float = 300.0
    saturation_trend_window_seconds: float = 1800.0


@dataclass(frozen=True)
class ScaledWorkload:
    """One Kubernetes workload serving one model, scaled on the replicas its demand needs."""

    model: str  # the `model` label its engine series carry: demand and capacity are joined on it
    kind: str  # Deployment | StatefulSet
    name: str
    namespace: str
    min_replicas: int
    max_replicas: int
    startup_seconds: float  # from scheduling to serving: scale-up cannot be faster
    knee_concurrency: int | None  # requests one replica holds within its SLOs; None: the capacity model stands in
    gpu: str | None = None  # one replica's GPU type, priced by pricing.gpu_hour: what a replayed fleet costs
    gpus_per_replica: int = 1


@dataclass(frozen=True)
class AutoscalingConfig:
    """docs/autoscaling.md: what the replicas-needed rules and the generated scalers read."""

    prometheus: str | None  # the address KEDA and prometheus-adapter query
    margin: float  # the share of a replica's capacity to plan on
    demand_window_seconds: float  # peak demand over this drives the replicas needed
    overprovisioned_for_seconds: float
    workloads: tuple[ScaledWorkload, ...]


@dataclass(frozen=True)
class Config:
    listen: str = DEFAULT_LISTEN
    poll_interval_seconds: float = 5.0
    timeout_seconds: float = 3.0
    max_response_bytes: int = 8 * 1024 * 1024
    max_series_per_target: int = 20_000  # samples kept from one page after filtering to the adapters' names
    max_instances_per_target: int = 64  # engine instances (data-parallel ranks, Triton models) read from one page
    max_concurrent_requests: int = 64  # on the daemon's own port; past it, 503
    request_header_timeout_seconds: float = 10.0  # a client must send its request headers within this
    web_config: str | None = None  # exporter-toolkit web config: TLS and basic auth on the daemon's port
    targets: tuple[Target, ...] = ()
    target_files: tuple[str, ...] = ()
    kubernetes: KubernetesDiscovery | None = None
    scan_local_ports: bool = False
    slos: tuple[SloConfig, ...] = ()
    slo_period_seconds: float = 30 * 86400.0
    saturation_kv_usage: float = 0.90
    # More requests waiting than this count as saturated (the Saturated alert); `plimsoll loadtest` measures it
    # at the knee. None: any request waiting counts.
    saturation_queue: float | None = None
    lead_time_seconds: float = 900.0
    alerting: AlertingConfig = field(default_factory=AlertingConfig)
    autoscaling: AutoscalingConfig | None = None
    # Price of one GPU-hour by GPU type (a preset or NVML product name), sorted pairs so the config stays hashable.
    gpu_hour_prices: tuple[tuple[str, float], ...] = ()
    nvml: bool = True
    source: str = "<defaults>"
    # What each ${NAME} put where, so a problem found after loading (check-config's capacity model) hides it too.
    expansions: tuple[Expansion, ...] = field(default=(), repr=False, compare=False)

    @property
    def host(self) -> str:
        # "[::]:19842" binds "::": the brackets only keep the port apart in the written form.
        return self.listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


@dataclass(frozen=True)
class ConfigReport:
    """A config and every problem found in it. Where a field was bad the config holds its default, and every
    target entry is kept (a bad URL as ""), so check-config can go on to judge each target's model."""

    config: Config
    problems: tuple[str, ...]


# Config fields (attribute, the name users write) that the server or the NVML reader took at start; the rest,
# max_concurrent_requests included, are read from the running config and follow a reload.
_RESTART_FIELDS = (
    ("listen", "listen"),
    ("nvml", "nvml"),
    ("web_config", "web_config"),
    ("request_header_timeout_seconds", "request_header_timeout"),
)


def restart_required(old: Config, new: Config) -> tuple[str, ...]:
    """The fields, as users write them, that differ between two configs but only take effect on a restart."""
    return tuple(name for attribute, name in _RESTART_FIELDS if getattr(old, attribute) != getattr(new, attribute))
