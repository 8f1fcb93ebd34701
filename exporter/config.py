"""The daemon's YAML config: read (with ${ENV} expansion), validated (every problem of the whole file collected in
one pass, each naming the file and the field path), and handed out as frozen objects.

    config.yaml: targets[1].url: 'localhost:8000' is not a URL (expected http://host:port/path)
"""

import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from exporter.capacity.kv import KV_DTYPE_BYTES
from exporter.capacity.plan import Deployment
from exporter.catalog import gpu_presets
from exporter.units import parse_duration, parse_size, value_kind

DEFAULT_PORT = 19842
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
ENGINE_NAMES = ("auto", "vllm", "sglang", "trtllm", "tgi", "llamacpp", "lmdeploy", "nim")
SLO_NAMES = ("ttft", "itl", "e2e")
# Ports the engines listen on by default: vLLM/NIM/TGI-docker 8000, SGLang 30000, Triton metrics 8002,
# TGI/llama.cpp 8080, LMDeploy 23333.
SCAN_PORTS = (8000, 30000, 8002, 8080, 23333)
MAX_CONFIG_BYTES = 1024 * 1024
# Nodes that YAML aliases may add beyond what a document spells out. Anchors that share a deployment block
# between targets add tens; "billion laughs" (anchors of lists of aliases of anchors...) adds 10**9 from a few
# hundred bytes. PyYAML builds aliased values by reference, so the bomb only goes off when something walks the
# result (validation, a message quoting a value): counting the expansion on the composed node graph, where each
# anchor is one node, refuses it in microseconds before anything is built.
MAX_ALIAS_EXPANSION = 100_000
_SHOWN_CHARS = 80  # of a bad value quoted in a message: a 1 MiB label value is not repeated whole


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
class AlertingConfig:
    """The knobs the generated rules and dashboards both read, so a dashboard line sits where its alert fires.
    README "Alerts" says why each default is what it is."""

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


@dataclass(frozen=True)
class AutoscalingConfig:
    """README "Autoscaling rules": what the replicas-needed rules and the generated scalers read."""

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


def redact_url(url: str) -> str:
    """The URL fit to show: everything between the scheme and the last "@" masked. That is the userinfo, and also
    a password holding an unescaped "/" or "#", which a URL parser reads as the start of the path."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    else:
        scheme += separator
    if "@" not in rest:
        return url
    return f"{scheme}***@{rest.rpartition('@')[2]}"


def _shown(value: Any) -> str:
    """A bad value as a message quotes it: repr, cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}...'"


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


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's message without its snippet of the document: that line may hold a secret."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return " ".join(str(error).split())  # a reader error: the character and its position, on one line
    mark = error.problem_mark or error.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = f" ({error.context})" if error.context else ""
    return f"{where}{error.problem}{context}"


def _expanded_nodes(root: yaml.Node) -> tuple[int, int]:
    """(nodes the document spells out, nodes it holds once every alias is expanded), counted on the node graph
    in time linear in its size; an alias inside the collection it names is refused (it expands without end)."""
    sizes: dict[int, int] = {}
    open_collections: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_collections:
            raise ValueError("an alias refers to the collection that contains it")
        open_collections.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                total += size(key_node) + size(value_node)
        open_collections.discard(key)
        sizes[key] = total
        return total

    expanded = size(root)
    return len(sizes), expanded


def _document(text: str) -> Any:
    # Not libyaml's CSafeLoader, though it composes three times faster: its recursive composer overflows the C
    # stack on a few hundred kilobytes of "[[[[..." and the process dies; Python's raises RecursionError.
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        spelled_out, expanded = _expanded_nodes(node)
        if expanded - spelled_out > MAX_ALIAS_EXPANSION:
            raise ValueError(
                f"aliases expand this document to {expanded:,} values from {spelled_out:,} written "
                f"(at most {MAX_ALIAS_EXPANSION:,} more are allowed)"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml(text: str, source: str) -> Any:
    """One YAML document, safely: no tags that build objects, and no aliases that expand without bound."""
    try:
        return _document(text)
    except yaml.YAMLError as error:
        raise ConfigError([f"{source}: not valid YAML: {_yaml_problem(error)}"]) from None
    except ValueError as error:  # too many aliases, or a value the constructor rejects (2001-13-01)
        raise ConfigError([f"{source}: not usable YAML: {error}"]) from None
    except RecursionError:
        raise ConfigError([f"{source}: not usable YAML: nested too deeply"]) from None


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
            self.fail(path, f"expected a map, got {value_kind(value)}")
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
        except ValueError as error:
            self.fail(f"{path}{key}", str(error))
            return default


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected {what}, got {value_kind(value)}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{_shown(value)} is not {what}") from None
    if not math.isfinite(number):
        raise ValueError(f"{_shown(value)} is not {what}")
    return number


def _ratio(value: Any) -> float:
    number = _number(value, "a ratio between 0 and 1")
    if not 0 < number <= 1:
        hint = f" (did you mean {number / 100:g}?)" if 1 < number <= 100 else ""
        raise ValueError(f"{value} is not a ratio between 0 and 1{hint}")
    return number


def _request_count(value: Any) -> float:
    number = _number(value, "a number of requests")
    if number < 0:
        raise ValueError(f"{_shown(value)} is not a number of requests (0 or more)")
    return number


def _positive_int(value: Any) -> int:
    number = _number(value, "a positive integer")
    if number != int(number) or number < 1:
        raise ValueError(f"{_shown(value)} is not a positive integer")
    return int(number)


def validate_duration(value: Any) -> float:
    """A duration longer than zero, with its unit (5s, 500ms, 1h30m)."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


_BOOLEAN_WORDS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}


def validate_boolean(value: Any) -> bool:
    """YAML's true/false, and the words people quote ("off"): a quoted string must not count as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLEAN_WORDS:
        return _BOOLEAN_WORDS[value.strip().lower()]
    raise ValueError(f"expected true or false (or on/off, yes/no), got {_shown(value)}")


def _text(what: str) -> Callable[[Any], str]:
    """A scalar written as text; numbers are fine (a name of 7), collections and booleans are a mistake."""

    def check(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"expected {what}, got {value_kind(value)}")
        return str(value)

    return check


def validate_url(value: Any) -> str:
    """An http(s) URL without credentials; a message about a bad one never repeats a password."""
    text = _text("a URL such as http://127.0.0.1:8000/metrics")(value)
    not_a_url = ValueError(f"{_shown(redact_url(text))} is not a URL (expected http://host:port/path)")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError:
        raise not_a_url from None
    if "@" in parts.netloc:
        raise ValueError(
            "credentials in the URL would show in labels and logs; use basic_auth.password_file or bearer_token_file"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise not_a_url
    return text


def validate_listen(value: Any) -> str:
    """host:port (or a bare port: every interface) to serve on."""
    text = _text(f"host:port such as 0.0.0.0:{DEFAULT_PORT}")(value)
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/@ "):
        raise ValueError(f"{_shown(text)} is not host:port (e.g. 0.0.0.0:{DEFAULT_PORT})")
    return text if host else f"0.0.0.0:{port}"


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError(f"{_shown(value)} is not one of {', '.join(options)}")
        return value

    return check


def readable_file(base: Path, what: str) -> Callable[[Any], str]:
    """A path relative to the config file's directory, checked now so a typo is named at load, not at the first
    poll. Only the path is ever shown: the file holds a secret."""

    def check(value: Any) -> str:
        path = base / _text(f"the path of {what}")(value)
        try:
            mode = os.stat(path).st_mode
        except OSError as error:
            raise ValueError(f"cannot read {path}: {error.strerror}") from None
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not a regular file")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{path} is not readable by this user")
        return str(path)

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
        kv_cache_dtype=r.convert(data, "kv_cache_dtype", p, _choice(("auto", *KV_DTYPE_BYTES)), "auto"),
        dtype=r.convert(data, "dtype", p, _text("a dtype such as bfloat16"), "auto"),
        block_size=r.convert(data, "block_size", p, _positive_int, None),
        kv_cache_memory_bytes=r.convert(data, "kv_cache_memory", p, parse_size, None),
        enforce_eager=r.convert(data, "enforce_eager", p, validate_boolean, False),
    )


def _gpus(value: Any) -> tuple[str, ...] | None:
    if value == "auto":
        return None
    if isinstance(value, int | str) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, list) and all(isinstance(v, int | str) and not isinstance(v, bool) for v in value):
        return tuple(str(v) for v in value)
    raise ValueError(f"{_shown(value)} is not 'auto', a GPU index or UUID, or a list of them")


def _basic_auth(r: _Reader, raw: Any, path: str, base: Path) -> BasicAuth | None:
    if raw is None:
        return None
    data = r.mapping(raw, path)
    if "password" in data:
        r.fail(
            f"{path}.password",
            "a password in the config shows wherever the config does: put it in a file and "
            "name the file in password_file",
        )
    r.unknown({k: v for k, v in data.items() if k != "password"}, path, ("username", "password_file"))
    p = f"{path}."
    username = r.convert(data, "username", p, _text("a user name"), None)
    password_file = r.convert(data, "password_file", p, readable_file(base, "the password file"), None)
    for key in ("username", "password_file"):
        if data.get(key) is None:
            r.fail(f"{p}{key}", "missing (basic_auth needs username and password_file)")
    if username is None or password_file is None:
        return None
    return BasicAuth(username, password_file)


_TARGET_FIELDS = (
    "name",
    "url",
    "engine",
    "model",
    "gpus",
    "gpu_type",
    "deployment",
    "timeout",
    "poll_interval",
    "basic_auth",
    "bearer_token_file",
)


def _target(r: _Reader, raw: Any, path: str, base: Path) -> Target:
    """Every field of one target entry is checked, whatever else is wrong with it."""
    data = r.mapping(raw, path)
    r.unknown(data, path, _TARGET_FIELDS)
    p = f"{path}."
    if data.get("url") is None:
        r.fail(f"{p}url", "missing (every target needs the URL of its /metrics page)")
    target_url = r.convert(data, "url", p, validate_url, "")
    deployment = _deployment(r, data.get("deployment"), f"{p}deployment")
    gpus = r.convert(data, "gpus", p, _gpus, None)
    needed = deployment.tensor_parallel * deployment.pipeline_parallel
    if gpus is not None and len(gpus) != needed:
        listed = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
        r.fail(
            f"{p}gpus",
            f"lists {listed} but tensor_parallel {deployment.tensor_parallel} x pipeline_parallel "
            f"{deployment.pipeline_parallel} needs {needed}",
        )
    basic_auth = _basic_auth(r, data.get("basic_auth"), f"{p}basic_auth", base)
    bearer_token_file = r.convert(data, "bearer_token_file", p, readable_file(base, "the token file"), None)
    if data.get("basic_auth") is not None and data.get("bearer_token_file") is not None:
        r.fail(f"{p}bearer_token_file", "give basic_auth or bearer_token_file, not both (one Authorization header)")
    return Target(
        name=r.convert(data, "name", p, _text("a target name"), None) or urlsplit(target_url).netloc or path,
        url=target_url,
        engine=r.convert(data, "engine", p, _choice(ENGINE_NAMES), "auto"),
        model=r.convert(data, "model", p, _text("a model preset or the path of a config.json"), None),
        gpus=gpus,
        gpu_type=r.convert(data, "gpu_type", p, _text("a GPU preset such as H100"), None),
        deployment=deployment,
        timeout_seconds=r.convert(data, "timeout", p, validate_duration, None),
        poll_interval_seconds=r.convert(data, "poll_interval", p, validate_duration, None),
        basic_auth=basic_auth,
        bearer_token_file=bearer_token_file,
    )


def _targets(r: _Reader, raw: Any, base: Path) -> tuple[Target, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.fail("targets", f"expected a list of targets, got {value_kind(raw)}")
        return ()
    targets = tuple(_target(r, entry, f"targets[{i}]", base) for i, entry in enumerate(raw))
    seen: set[str] = set()
    for i, target in enumerate(targets):
        if target.name in seen:
            r.fail(
                f"targets[{i}].name",
                f"{target.name!r} is used by another target (names label every series: keep them unique)",
            )
        seen.add(target.name)
    return targets


def _slos(r: _Reader, raw: Any) -> tuple[SloConfig, ...]:
    data = r.mapping(raw, "slos")
    r.unknown(data, "slos", SLO_NAMES)
    slos = []
    for name in SLO_NAMES:
        if name not in data:
            continue
        entry = r.mapping(data[name], f"slos.{name}")
        r.unknown(entry, f"slos.{name}", ("threshold", "objective"))
        if entry.get("threshold") is None:
            r.fail(f"slos.{name}.threshold", "missing (a latency such as 500ms)")
        threshold = r.convert(entry, "threshold", f"slos.{name}.", validate_duration, None)
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
    """Checked whole even while disabled, so turning it on later brings no surprise; only the node must wait."""
    path = "discovery.kubernetes"
    data = r.mapping(raw, path)
    r.unknown(data, path, _KUBERNETES_FIELDS)
    p = f"{path}."
    enabled = r.convert(data, "enabled", p, validate_boolean, False)
    node = r.convert(data, "node", p, _text("a node name"), None) or environ.get("NODE_NAME", "")
    if enabled and not node:
        r.fail(
            f"{path}.node",
            "not set and NODE_NAME is not in the environment (give the pod NODE_NAME from the downward API, "
            "fieldRef spec.nodeName, as deploy/kubernetes/daemonset.yaml does)",
        )
    namespaces = r.strings(data, "namespaces", p, "a list of namespace names (empty or absent: all namespaces)")
    settings = KubernetesDiscovery(
        node=node,
        namespaces=tuple(namespaces),
        label_selector=r.convert(data, "label_selector", p, _text("a label selector such as app=vllm"), ""),
        refresh_seconds=r.convert(data, "refresh", p, validate_duration, 30.0),
        api_url=r.convert(data, "api_url", p, validate_url, None),
        token_file=r.convert(data, "token_file", p, _text("the path of a token file"), None),
        ca_file=r.convert(data, "ca_file", p, _text("the path of a CA certificate"), None),
    )
    return settings if enabled else None


_ALERTING_FIELDS = (
    "runbook_url",
    "exporter_job",
    "rule_labels",
    "fleet_headroom_min_requests",
    "capacity_drift_ratio",
    "vram_growth_per_hour",
    "saturation_gate_fraction",
    "saturation_ahead_for",
    "saturation_trend_window",
)
# A Kubernetes label name: an optional DNS-subdomain prefix and "/", then 63 characters at most of [A-Za-z0-9-_.],
# starting and ending alphanumeric. Values are the same without the prefix, and may be empty.
_LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _runbook_url(value: Any) -> str:
    """An http(s) page; anchors are appended, so the URL must not carry its own."""
    text = _text("the URL of the runbook, such as https://example.com/RUNBOOK.md")(value)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{_shown(text)} is not an http(s) URL (expected e.g. https://example.com/RUNBOOK.md)")
    if parts.fragment or text.endswith("#"):
        raise ValueError(f"{_shown(text)} has a #fragment; give the page: each alert adds #<its name, lowercased>")
    return text


def _job_regex(value: Any) -> str:
    """A regex written inside a PromQL string (job=~"..."): it must compile and hold no quote or backslash."""
    text = _text("a regex on the scrape job name, such as .*plimsoll.*")(value)
    if not text or any(c in text for c in '"\\'):
        raise ValueError(f"{_shown(text)} must be a non-empty regex without quotes or backslashes")
    try:
        re.compile(text)
    except re.error as error:
        raise ValueError(f"{_shown(text)} is not a regex ({error})") from None
    return text


def _rule_labels(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a map of label names to text values, got {value_kind(value)}")
    problems = []
    for name, label in value.items():
        if not isinstance(name, str) or not _LABEL_NAME.match(name):
            problems.append(f"{_shown(name)} is not a Kubernetes label name")
        elif not isinstance(label, str):
            problems.append(f"{name}: {_shown(label)} is {value_kind(label)}, not text (quote it)")
        elif not _LABEL_VALUE.match(label):
            problems.append(f"{name}: {_shown(label)} is not a Kubernetes label value (63 of A-Z a-z 0-9 - _ .)")
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(sorted(value.items()))


def _growth_per_hour(value: Any) -> int:
    size = parse_size(value)
    if size <= 0:
        raise ValueError(f"{_shown(value)} must be more than zero bytes per hour (e.g. 2GiB)")
    return size


def _alerting(r: _Reader, raw: Any) -> AlertingConfig:
    data = r.mapping(raw, "alerting")
    r.unknown(data, "alerting", _ALERTING_FIELDS)
    p = "alerting."
    default = AlertingConfig()
    return AlertingConfig(
        runbook_url=r.convert(data, "runbook_url", p, _runbook_url, default.runbook_url),
        exporter_job=r.convert(data, "exporter_job", p, _job_regex, default.exporter_job),
        rule_labels=r.convert(data, "rule_labels", p, _rule_labels, default.rule_labels),
        fleet_headroom_min_requests=r.convert(
            data, "fleet_headroom_min_requests", p, _request_count, default.fleet_headroom_min_requests
        ),
        capacity_drift_ratio=r.convert(data, "capacity_drift_ratio", p, _ratio, default.capacity_drift_ratio),
        vram_growth_bytes_per_hour=r.convert(
            data, "vram_growth_per_hour", p, _growth_per_hour, default.vram_growth_bytes_per_hour
        ),
        saturation_gate_fraction=r.convert(
            data, "saturation_gate_fraction", p, _ratio, default.saturation_gate_fraction
        ),
        saturation_ahead_for_seconds=r.convert(
            data, "saturation_ahead_for", p, validate_duration, default.saturation_ahead_for_seconds
        ),
        saturation_trend_window_seconds=r.convert(
            data, "saturation_trend_window", p, validate_duration, default.saturation_trend_window_seconds
        ),
    )


_AUTOSCALING_FIELDS = ("prometheus", "margin", "demand_window", "overprovisioned_for", "workloads")
_WORKLOAD_FIELDS = (
    "model",
    "kind",
    "name",
    "namespace",
    "min_replicas",
    "max_replicas",
    "startup",
    "knee_concurrency",
)
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# A Kubernetes object name (DNS-1123 subdomain) and namespace (DNS-1123 label).
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _model_label(value: Any) -> str:
    """A `model` label value, written inside a PromQL string: no quote or backslash."""
    text = _text("the model label its engine series carry, such as meta-llama/Llama-3.1-8B-Instruct")(value)
    if not text or any(c in text for c in '"\\\n'):
        raise ValueError(f"{_shown(text)} must be a non-empty model label without quotes, backslashes or newlines")
    return text


def _kubernetes_name(pattern: re.Pattern[str], what: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = _text(what)(value)
        if not pattern.match(text):
            raise ValueError(f"{_shown(text)} is not {what} (lowercase letters, digits and '-')")
        return text

    return check


def _workload(r: _Reader, raw: Any, path: str) -> ScaledWorkload | None:
    data = r.mapping(raw, path)
    r.unknown(data, path, _WORKLOAD_FIELDS)
    p = f"{path}."
    for key in ("model", "name", "namespace", "max_replicas"):
        if data.get(key) is None:
            r.fail(f"{p}{key}", "missing (every workload needs model, name, namespace and max_replicas)")
    model = r.convert(data, "model", p, _model_label, None)
    name = r.convert(data, "name", p, _kubernetes_name(_OBJECT_NAME, "a Kubernetes object name"), None)
    namespace = r.convert(data, "namespace", p, _kubernetes_name(_NAMESPACE, "a Kubernetes namespace"), None)
    # At least 1: an HPA cannot scale to zero (without a feature gate), and an LLM replica takes minutes to start.
    min_replicas = r.convert(data, "min_replicas", p, _positive_int, 1)
    max_replicas = r.convert(data, "max_replicas", p, _positive_int, None)
    if max_replicas is not None and min_replicas > max_replicas:
        r.fail(f"{p}min_replicas", f"{min_replicas} is above max_replicas {max_replicas}")
    workload = ScaledWorkload(
        model=model,
        kind=r.convert(data, "kind", p, _choice(WORKLOAD_KINDS), "Deployment"),
        name=name,
        namespace=namespace,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        startup_seconds=r.convert(data, "startup", p, validate_duration, 300.0),
        knee_concurrency=r.convert(data, "knee_concurrency", p, _positive_int, None),
    )
    return None if None in (model, name, namespace, max_replicas) else workload


def _workloads(r: _Reader, raw: Any, demand_window_seconds: float) -> tuple[ScaledWorkload, ...]:
    path = "autoscaling.workloads"
    if not isinstance(raw, list) or not raw:
        r.fail(path, "expected a list of at least one workload (model, kind, name, namespace, max_replicas, ...)")
        return ()
    found: list[ScaledWorkload] = []
    objects: dict[tuple[str, str, str], str] = {}
    models: dict[str, str] = {}
    for i, entry in enumerate(raw):
        where = f"{path}[{i}]"
        workload = _workload(r, entry, where)
        if workload is None:
            continue
        key = (workload.namespace, workload.kind, workload.name)
        if key in objects:
            r.fail(f"{where}.name", f"{workload.kind} {workload.namespace}/{workload.name} is also {objects[key]}")
        elif workload.model in models:
            # Demand is summed per model label: two workloads of one model could not be told apart.
            r.fail(f"{where}.model", f"{workload.model!r} is also the model of {models[workload.model]}")
        if workload.startup_seconds > demand_window_seconds:
            r.fail(
                f"{where}.startup",
                f"{workload.startup_seconds:g}s is longer than autoscaling.demand_window "
                f"({demand_window_seconds:g}s): the peak would be forgotten before a new replica serves; "
                "lengthen demand_window",
            )
        objects.setdefault(key, where)
        models.setdefault(workload.model, where)
        found.append(workload)
    return tuple(found)


def _autoscaling(r: _Reader, raw: Any) -> AutoscalingConfig | None:
    if raw is None:
        return None
    data = r.mapping(raw, "autoscaling")
    r.unknown(data, "autoscaling", _AUTOSCALING_FIELDS)
    p = "autoscaling."
    demand_window = r.convert(data, "demand_window", p, validate_duration, 600.0)
    return AutoscalingConfig(
        prometheus=r.convert(data, "prometheus", p, validate_url, None),
        margin=r.convert(data, "margin", p, _ratio, 0.8),
        demand_window_seconds=demand_window,
        overprovisioned_for_seconds=r.convert(data, "overprovisioned_for", p, validate_duration, 86400.0),
        workloads=_workloads(r, data.get("workloads"), demand_window),
    )


_NVML_NAME_PREFIXES = ("NVIDIA ", "Tesla ", "Quadro ")


def _gpu_hour_prices(value: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a map of GPU type to price per GPU-hour (H100-80GB: 2.49), got {value_kind(value)}")
    problems, prices = [], []
    for gpu, price in value.items():
        if not isinstance(gpu, str) or not gpu.strip():
            problems.append(f"{_shown(gpu)} is not a GPU type (a preset or NVML product name)")
            continue
        if not gpu.startswith(_NVML_NAME_PREFIXES) and not any(preset.matches(gpu) for preset in gpu_presets()):
            # A typo here would silently leave every GPU of that type unpriced (no cost series at all).
            problems.append(
                f"{gpu}: neither a GPU preset (`plimsoll plan --list-gpus`) nor an NVML product name "
                "(as `nvidia-smi -L` shows it, e.g. NVIDIA A40)"
            )
            continue
        try:
            number = _number(price, "a price per GPU-hour")
        except ValueError as error:
            problems.append(f"{gpu}: {error}")
            continue
        if number <= 0:
            problems.append(f"{gpu}: {_shown(price)} is not a price (more than 0 per GPU-hour)")
        prices.append((gpu, number))
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(sorted(prices))


def _pricing(r: _Reader, raw: Any) -> tuple[tuple[str, float], ...]:
    data = r.mapping(raw, "pricing")
    r.unknown(data, "pricing", ("gpu_hour",))
    return r.convert(data, "gpu_hour", "pricing.", _gpu_hour_prices, ())


_TOP_FIELDS = (
    "listen",
    "poll_interval",
    "timeout",
    "max_response_size",
    "max_series_per_target",
    "max_instances_per_target",
    "max_concurrent_requests",
    "request_header_timeout",
    "web_config",
    "targets",
    "slos",
    "slo_period",
    "saturation",
    "discovery",
    "alerting",
    "autoscaling",
    "pricing",
    "nvml",
)


def _base_directory(source: str) -> Path:
    """Where relative paths in the config start: the config file's directory."""
    return Path(source).parent if source not in ("<defaults>", "<string>") else Path(".")


def check_config(text: str, source: str, environ: Mapping[str, str] | None = None) -> ConfigReport:
    """Validate a config document; never raises: every problem of every section is in the report."""
    problems: list[str] = []
    environ = os.environ if environ is None else environ
    expanded = expand_env(text, environ, problems, source)
    try:
        raw = load_yaml(expanded, source)
    except ConfigError as error:
        return ConfigReport(Config(source=source), (*problems, *error.problems))
    r = _Reader(source, problems)
    base = _base_directory(source)
    data = r.mapping(raw, "(top level)")
    r.unknown(data, "", _TOP_FIELDS)
    saturation = r.mapping(data.get("saturation"), "saturation")
    r.unknown(saturation, "saturation", ("kv_usage", "queue", "lead_time"))
    discovery = r.mapping(data.get("discovery"), "discovery")
    r.unknown(discovery, "discovery", ("files", "kubernetes", "scan_local_ports"))
    files = r.strings(discovery, "files", "discovery.", "a list of file paths (Prometheus file_sd format)")
    config = Config(
        listen=r.convert(data, "listen", "", validate_listen, DEFAULT_LISTEN),
        poll_interval_seconds=r.convert(data, "poll_interval", "", validate_duration, 5.0),
        timeout_seconds=r.convert(data, "timeout", "", validate_duration, 3.0),
        max_response_bytes=r.convert(data, "max_response_size", "", parse_size, 8 * 1024 * 1024),
        max_series_per_target=r.convert(data, "max_series_per_target", "", _positive_int, 20_000),
        max_instances_per_target=r.convert(data, "max_instances_per_target", "", _positive_int, 64),
        max_concurrent_requests=r.convert(data, "max_concurrent_requests", "", _positive_int, 64),
        request_header_timeout_seconds=r.convert(data, "request_header_timeout", "", validate_duration, 10.0),
        web_config=r.convert(data, "web_config", "", readable_file(base, "the web config"), None),
        targets=_targets(r, data.get("targets"), base),
        target_files=tuple(str(base / f) for f in files),
        kubernetes=_kubernetes(r, discovery.get("kubernetes"), environ),
        scan_local_ports=r.convert(discovery, "scan_local_ports", "discovery.", validate_boolean, False),
        slos=_slos(r, data.get("slos")),
        slo_period_seconds=r.convert(data, "slo_period", "", validate_duration, 30 * 86400.0),
        saturation_kv_usage=r.convert(saturation, "kv_usage", "saturation.", _ratio, 0.90),
        saturation_queue=r.convert(saturation, "queue", "saturation.", _request_count, None),
        lead_time_seconds=r.convert(saturation, "lead_time", "saturation.", validate_duration, 900.0),
        alerting=_alerting(r, data.get("alerting")),
        autoscaling=_autoscaling(r, data.get("autoscaling")),
        gpu_hour_prices=_pricing(r, data.get("pricing")),
        nvml=r.convert(data, "nvml", "", validate_boolean, True),
        source=source,
    )
    return ConfigReport(config, tuple(problems))


def parse_config(text: str, source: str, environ: Mapping[str, str] | None = None) -> Config:
    """Validate a config document; raises ConfigError listing every problem found."""
    report = check_config(text, source, environ)
    if report.problems:
        raise ConfigError(list(report.problems))
    return report.config


def read_config_text(path: str | Path, what: str = "config file") -> str:
    """The text of the config, a web config or a file_sd file, refused past MAX_CONFIG_BYTES without reading
    further: each is a few kilobytes, and a daemon that re-reads files must not load whatever lands there."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError([f"{path}: cannot read the {what} ({error.strerror})"]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{path}: over 1 MiB; a {what} is a few kilobytes (is this the right file?)"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError([f"{path}: not UTF-8 text (byte {error.start})"]) from None


def check_config_file(path: str | Path, environ: Mapping[str, str] | None = None) -> ConfigReport:
    """check_config on a file; a file that cannot be read is one problem in the report, not an exception."""
    try:
        text = read_config_text(path)
    except ConfigError as error:
        return ConfigReport(Config(source=str(path)), tuple(error.problems))
    return check_config(text, str(path), environ)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """The config in a file; raises ConfigError listing every problem found."""
    report = check_config_file(path, environ)
    if report.problems:
        raise ConfigError(list(report.problems))
    return report.config


def _host_port(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected host:port, got {value_kind(value)}")
    if "@" in value:
        raise ValueError(
            "credentials in an address would show in labels and logs; a target that needs them belongs in the "
            "config's targets, with basic_auth.password_file or bearer_token_file"
        )
    host, separator, port = value.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/?# "):
        raise ValueError(f"{_shown(value)} is not host:port (e.g. 10.0.0.7:8000)")
    return value


def engine_problem(value: Any) -> str | None:
    """Why a discovered engine name (a file_sd label, a pod annotation) cannot be used, or None."""
    try:
        _choice(ENGINE_NAMES)(value)
    except ValueError as error:
        return str(error)
    return None


def parse_target_file(text: str, source: str) -> tuple[Target, ...]:
    """Targets from a Prometheus file_sd document (YAML or JSON: a list of {targets: [host:port], labels}).

    A problem with the file itself (not YAML, an address that is not host:port, one name twice) refuses the whole
    file: it is likely half-written, and the daemon keeps its last good version. A bad engine label only marks
    the targets of its group, which are then shown down with the reason."""
    problems: list[str] = []
    raw = load_yaml(text, source)
    if not isinstance(raw, list):
        raise ConfigError([f"{source}: expected a list of {{targets: [...], labels: {{...}}}} groups"])
    r = _Reader(source, problems)
    found: list[Target] = []
    where: dict[str, str] = {}
    for i, group in enumerate(raw):
        data = r.mapping(group, f"[{i}]")
        labels = r.mapping(data.get("labels"), f"[{i}].labels")
        addresses = data.get("targets") or []
        if not isinstance(addresses, list):
            r.fail(f"[{i}].targets", "expected a list of host:port")
            continue
        p = f"[{i}].labels."
        path = r.convert(labels, "__metrics_path__", p, _text("a URL path such as /metrics"), "/metrics")
        scheme = r.convert(labels, "__scheme__", p, _choice(("http", "https")), "http")
        name_label = r.convert(labels, "target", p, _text("a target name"), None)
        model = r.convert(labels, "model", p, _text("a model preset or the path of a config.json"), None)
        engine = labels.get("engine", "auto")
        bad_engine = engine_problem(engine)
        problem = f"{source}: [{i}].labels.engine: {bad_engine}" if bad_engine else None
        for j, address in enumerate(addresses):
            entry = f"[{i}].targets[{j}]"
            try:
                target_url = validate_url(f"{scheme}://{_host_port(address)}/{path.lstrip('/')}")
            except ValueError as error:
                r.fail(entry, str(error))
                continue
            name = name_label or address
            if name in where:
                r.fail(entry, f"target name {name!r} is already used by {where[name]} (names must be unique)")
                continue
            where[name] = entry
            found.append(
                Target(
                    name=name,
                    url=target_url,
                    engine="auto" if bad_engine else engine,
                    model=model,
                    source=source,
                    problem=problem,
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
