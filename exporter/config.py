"""The daemon's YAML config: read (with ${ENV} expansion), validated (every error collected, each naming the
file and the field path), and handed out as frozen objects.

    config.yaml: targets[1].url: "localhost:8000" is not a URL (expected http://host:port/path)
"""

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from exporter.capacity.plan import Deployment
from exporter.units import parse_duration, parse_size

DEFAULT_PORT = 19842
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
ENGINE_NAMES = ("auto", "vllm", "sglang", "trtllm", "tgi", "llamacpp", "lmdeploy", "nim")
SLO_NAMES = ("ttft", "itl", "e2e")
# Ports the engines listen on by default: vLLM/NIM/TGI-docker 8000, SGLang 30000, Triton metrics 8002,
# TGI/llama.cpp 8080, LMDeploy 23333.
SCAN_PORTS = (8000, 30000, 8002, 8080, 23333)


class ConfigError(ValueError):
    """One or more problems in a config file; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


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
    """Engine pods on one node, listed from the Kubernetes API (exporter/sources/kubernetes.py)."""

    node: str
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    label_selector: str = ""
    refresh_seconds: float = 30.0
    api_url: str | None = None  # default: the in-cluster API server
    token_file: str | None = None  # default: the pod's service-account token
    ca_file: str | None = None


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
    lead_time_seconds: float = 900.0
    nvml: bool = True
    source: str = "<defaults>"

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0] or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(text: str, environ: Mapping[str, str], problems: list[str], where: str) -> str:
    """${NAME} and ${NAME:-default}; an unset variable without a default is an error, not an empty string."""

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        problems.append(f"{where}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")
        return ""

    return _ENV.sub(substitute, text)


class _Reader:
    """Validates one mapping, collecting problems with their field paths."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{self.source}: {path}: {message}")

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        return value

    def unknown(self, data: Mapping[str, Any], path: str, known: tuple[str, ...]) -> None:
        for key in data:
            if key not in known:
                prefix = f"{path}." if path else ""
                self.fail(f"{prefix}{key}", f"unknown field (expected one of: {', '.join(known)})")

    def strings(self, data: Mapping[str, Any], key: str, path: str, expected: str) -> list[str]:
        """A list of strings under `key` (absent: empty); anything else is a problem naming what is expected."""
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.fail(f"{path}{key}", f"expected {expected}")
            return []
        return value

    def convert(self, data: Mapping[str, Any], key: str, path: str, convert: Callable[[Any], Any], default: Any) -> Any:
        if data.get(key) is None:
            return default
        try:
            return convert(data[key])
        except (TypeError, ValueError) as error:
            self.fail(f"{path}{key}", str(error))
            return default


def _ratio(value: Any) -> float:
    number = float(value)
    if not 0 < number <= 1:
        hint = f" (did you mean {number / 100:g}?)" if 1 < number <= 100 else ""
        raise ValueError(f"{value} is not a ratio between 0 and 1{hint}")
    return number


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{value!r} is not a positive integer")
    return int(value)


def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def _url(value: Any) -> str:
    text = str(value)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{text!r} is not a URL (expected http://host:port/path)")
    return text


def _listen(value: Any) -> str:
    text = str(value)
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port (e.g. 0.0.0.0:{DEFAULT_PORT})")
    return text if host else f"0.0.0.0:{port}"


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if str(value) not in options:
            raise ValueError(f"{value!r} is not one of {', '.join(options)}")
        return str(value)

    return check


_DEPLOYMENT_FIELDS = (
    "tensor_parallel",
    "pipeline_parallel",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "kv_cache_dtype",
    "dtype",
    "block_size",
    "kv_cache_memory",
    "enforce_eager",
)


def _deployment(r: _Reader, raw: Any, path: str) -> Deployment:
    data = r.mapping(raw, path)
    r.unknown(data, path, _DEPLOYMENT_FIELDS)
    p = f"{path}."
    return Deployment(
        tensor_parallel=r.convert(data, "tensor_parallel", p, _positive_int, 1),
        pipeline_parallel=r.convert(data, "pipeline_parallel", p, _positive_int, 1),
        gpu_memory_utilization=r.convert(data, "gpu_memory_utilization", p, _ratio, None),
        max_model_len=r.convert(data, "max_model_len", p, _positive_int, None),
        max_num_batched_tokens=r.convert(data, "max_num_batched_tokens", p, _positive_int, None),
        max_num_seqs=r.convert(data, "max_num_seqs", p, _positive_int, None),
        kv_cache_dtype=r.convert(data, "kv_cache_dtype", p, str, "auto"),
        dtype=r.convert(data, "dtype", p, str, "auto"),
        block_size=r.convert(data, "block_size", p, _positive_int, None),
        kv_cache_memory_bytes=r.convert(data, "kv_cache_memory", p, parse_size, None),
        enforce_eager=bool(data.get("enforce_eager", False)),
    )


_TARGET_FIELDS = ("name", "url", "engine", "model", "gpus", "gpu_type", "deployment", "timeout")


def _gpus(value: Any) -> tuple[str, ...] | None:
    if value == "auto":
        return None
    if isinstance(value, int | str):
        return (str(value),)
    if isinstance(value, list) and all(isinstance(v, int | str) for v in value):
        return tuple(str(v) for v in value)
    raise ValueError(f"{value!r} is not 'auto', a GPU index or UUID, or a list of them")


def _target(r: _Reader, raw: Any, path: str, names: set[str]) -> Target | None:
    data = r.mapping(raw, path)
    r.unknown(data, path, _TARGET_FIELDS)
    p = f"{path}."
    url = r.convert(data, "url", p, _url, None)
    if url is None:
        if "url" not in data:
            r.fail(f"{path}.url", "missing (every target needs the URL of its /metrics page)")
        return None
    name = str(data.get("name") or urlsplit(url).netloc)
    if name in names:
        r.fail(f"{path}.name", f"{name!r} is used by another target (names label every series: keep them unique)")
    names.add(name)
    return Target(
        name=name,
        url=url,
        engine=r.convert(data, "engine", p, _choice(ENGINE_NAMES), "auto"),
        model=str(data["model"]) if data.get("model") else None,
        gpus=r.convert(data, "gpus", p, _gpus, None),
        gpu_type=str(data["gpu_type"]) if data.get("gpu_type") else None,
        deployment=_deployment(r, data.get("deployment"), f"{path}.deployment"),
        timeout_seconds=r.convert(data, "timeout", p, _positive_duration, None),
    )


def _slos(r: _Reader, raw: Any) -> tuple[SloConfig, ...]:
    data = r.mapping(raw, "slos")
    r.unknown(data, "slos", SLO_NAMES)
    slos = []
    for name in SLO_NAMES:
        if name not in data:
            continue
        entry = r.mapping(data[name], f"slos.{name}")
        r.unknown(entry, f"slos.{name}", ("threshold", "objective"))
        if "threshold" not in entry:
            r.fail(f"slos.{name}.threshold", "missing (a latency such as 500ms)")
        threshold = r.convert(entry, "threshold", f"slos.{name}.", _positive_duration, None)
        objective = r.convert(entry, "objective", f"slos.{name}.", _ratio, 0.99)
        if objective == 1.0:
            r.fail(f"slos.{name}.objective", "1 leaves no error budget; use e.g. 0.999")
        if threshold is not None:
            slos.append(SloConfig(name, threshold, objective))
    return tuple(slos)


_KUBERNETES_FIELDS = (
    "enabled",
    "node",
    "namespaces",
    "label_selector",
    "refresh",
    "api_url",
    "token_file",
    "ca_file",
)


def _kubernetes(r: _Reader, raw: Any, environ: Mapping[str, str]) -> KubernetesDiscovery | None:
    path = "discovery.kubernetes"
    data = r.mapping(raw, path)
    r.unknown(data, path, _KUBERNETES_FIELDS)
    if not data.get("enabled", False):
        return None
    node = str(data.get("node") or environ.get("NODE_NAME", ""))
    if not node:
        r.fail(
            f"{path}.node",
            "not set and NODE_NAME is not in the environment (give the pod NODE_NAME from the downward API, "
            "fieldRef spec.nodeName, as deploy/kubernetes/daemonset.yaml does)",
        )
    p = f"{path}."
    namespaces = r.strings(data, "namespaces", p, "a list of namespace names (empty or absent: all namespaces)")
    return KubernetesDiscovery(
        node=node,
        namespaces=tuple(namespaces),
        label_selector=str(data.get("label_selector") or ""),
        refresh_seconds=r.convert(data, "refresh", p, _positive_duration, 30.0),
        api_url=r.convert(data, "api_url", p, _url, None),
        token_file=str(data["token_file"]) if data.get("token_file") else None,
        ca_file=str(data["ca_file"]) if data.get("ca_file") else None,
    )


_TOP_FIELDS = (
    "listen",
    "poll_interval",
    "timeout",
    "max_response_size",
    "targets",
    "slos",
    "slo_period",
    "saturation",
    "discovery",
    "nvml",
)


def parse_config(text: str, source: str, environ: Mapping[str, str] | None = None) -> Config:
    """Validate a config document; raises ConfigError listing every problem found."""
    problems: list[str] = []
    environ = os.environ if environ is None else environ
    expanded = expand_env(text, environ, problems, source)
    try:
        raw = yaml.safe_load(expanded)
    except yaml.YAMLError as error:
        raise ConfigError([f"{source}: not valid YAML: {error}"]) from None
    r = _Reader(source, problems)
    data = r.mapping(raw, "(top level)")
    r.unknown(data, "", _TOP_FIELDS)
    targets_raw = data.get("targets") or []
    if not isinstance(targets_raw, list):
        r.fail("targets", "expected a list of targets")
        targets_raw = []
    names: set[str] = set()
    targets = [_target(r, entry, f"targets[{i}]", names) for i, entry in enumerate(targets_raw)]
    saturation = r.mapping(data.get("saturation"), "saturation")
    r.unknown(saturation, "saturation", ("kv_usage", "lead_time"))
    discovery = r.mapping(data.get("discovery"), "discovery")
    r.unknown(discovery, "discovery", ("files", "kubernetes", "scan_local_ports"))
    files = r.strings(discovery, "files", "discovery.", "a list of file paths (Prometheus file_sd format)")
    base = Path(source).parent if source not in ("<defaults>", "<string>") else Path(".")
    config = Config(
        listen=r.convert(data, "listen", "", _listen, DEFAULT_LISTEN),
        poll_interval_seconds=r.convert(data, "poll_interval", "", _positive_duration, 5.0),
        timeout_seconds=r.convert(data, "timeout", "", _positive_duration, 3.0),
        max_response_bytes=r.convert(data, "max_response_size", "", parse_size, 8 * 1024 * 1024),
        targets=tuple(t for t in targets if t is not None),
        target_files=tuple(str(base / f) for f in files),
        kubernetes=_kubernetes(r, discovery.get("kubernetes"), environ),
        scan_local_ports=bool(discovery.get("scan_local_ports", False)),
        slos=_slos(r, data.get("slos")),
        slo_period_seconds=r.convert(data, "slo_period", "", _positive_duration, 30 * 86400.0),
        saturation_kv_usage=r.convert(saturation, "kv_usage", "saturation.", _ratio, 0.90),
        lead_time_seconds=r.convert(saturation, "lead_time", "saturation.", _positive_duration, 900.0),
        nvml=bool(data.get("nvml", True)),
        source=source,
    )
    if problems:
        raise ConfigError(problems)
    return config


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError([f"{path}: cannot read the config file ({error.strerror})"]) from None
    return parse_config(text, str(path), environ)


def parse_target_file(text: str, source: str) -> tuple[Target, ...]:
    """Targets from a Prometheus file_sd document (YAML or JSON: a list of {targets: [host:port], labels})."""
    problems: list[str] = []
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError([f"{source}: not valid YAML or JSON: {error}"]) from None
    if not isinstance(raw, list):
        raise ConfigError([f"{source}: expected a list of {{targets: [...], labels: {{...}}}} groups"])
    r = _Reader(source, problems)
    found: list[Target] = []
    for i, group in enumerate(raw):
        data = r.mapping(group, f"[{i}]")
        labels = r.mapping(data.get("labels"), f"[{i}].labels")
        addresses = data.get("targets") or []
        if not isinstance(addresses, list):
            r.fail(f"[{i}].targets", "expected a list of host:port")
            continue
        path = str(labels.get("__metrics_path__", "/metrics"))
        scheme = str(labels.get("__scheme__", "http"))
        for j, address in enumerate(addresses):
            url = f"{scheme}://{address}{path}"
            try:
                _url(url)
            except ValueError as error:
                r.fail(f"[{i}].targets[{j}]", str(error))
                continue
            found.append(
                Target(
                    name=str(labels.get("target", address)),
                    url=url,
                    engine=str(labels.get("engine", "auto")),
                    model=str(labels["model"]) if labels.get("model") else None,
                    source=source,
                )
            )
    if problems:
        raise ConfigError(problems)
    return tuple(found)


def scan_targets(host: str = "127.0.0.1") -> tuple[Target, ...]:
    """With no config at all: the engines' usual ports on this host."""
    return tuple(
        Target(name=f"{host}:{port}", url=f"http://{host}:{port}/metrics", source="scan") for port in SCAN_PORTS
    )
