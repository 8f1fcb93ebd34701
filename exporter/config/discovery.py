"""Targets found rather than listed: Prometheus file_sd files, engine pods on this node (or every node) from the
Kubernetes API (the `discovery.kubernetes` section), and the engines' usual ports on this host when there is no
config at all."""

from collections.abc import Mapping
from typing import Any

from exporter.config.loading import load_yaml
from exporter.config.model import ENGINE_NAMES, ConfigError, KubernetesDiscovery, Target
from exporter.config.reader import Reader
from exporter.config.validators import (
    KUBERNETES_NAMESPACE,
    label_value,
    one_of,
    shown,
    text_value,
    validate_boolean,
    validate_duration,
    validate_url,
)
from exporter.core.units import value_kind

# Ports the engines listen on by default: vLLM/NIM/TGI-docker 8000, SGLang 30000, Triton metrics 8002,
# TGI/llama.cpp 8080, LMDeploy 23333.
SCAN_PORTS = (8000, 30000, 8002, 8080, 23333)

_KUBERNETES_FIELDS = (
    "enabled",
    "node",
    "namespaces",
    "label_selector",
    "refresh",
    "api_url",
    "token_file",
    "ca_file",
    "scope",
)


def parse_kubernetes(r: Reader, raw: Any, environ: Mapping[str, str]) -> KubernetesDiscovery | None:
    """Checked whole even while disabled, so turning it on later brings no surprise; only the node must wait."""
    path = "discovery.kubernetes"
    data = r.mapping(raw, path)
    r.unknown(data, path, _KUBERNETES_FIELDS)
    p = f"{path}."
    enabled = r.convert(data, "enabled", p, validate_boolean, False)
    scope = r.convert(data, "scope", p, one_of(("node", "cluster")), "node")
    node = _node(r, data, environ, enabled=enabled, cluster=scope == "cluster")
    label_selector = r.convert(data, "label_selector", p, text_value("a label selector such as app=vllm"), "")
    if scope == "cluster" and not label_selector:
        r.fail(
            f"{path}.label_selector",
            "required with scope: cluster, so that one daemon lists the engine pods rather than every pod of the "
            "cluster (e.g. app.kubernetes.io/component=vllm)",
        )
    namespaces = r.strings(data, "namespaces", p, "a list of namespace names (empty or absent: all namespaces)")
    for namespace in namespaces:  # each is written into the API's path, /api/v1/namespaces/<it>/pods
        if not KUBERNETES_NAMESPACE.fullmatch(namespace):
            r.fail(
                f"{p}namespaces",
                f"{shown(namespace)} is not a Kubernetes namespace (lowercase letters, digits and '-')",
            )
    settings = KubernetesDiscovery(
        node=node,
        namespaces=tuple(namespaces),
        label_selector=label_selector,
        refresh_seconds=r.convert(data, "refresh", p, validate_duration, 30.0),
        api_url=r.convert(data, "api_url", p, validate_url, None),
        token_file=r.convert(data, "token_file", p, text_value("the path of a token file"), None),
        ca_file=r.convert(data, "ca_file", p, text_value("the path of a CA certificate"), None),
        scope=scope,
    )
    return settings if enabled else None


def _node(r: Reader, data: Mapping[str, Any], environ: Mapping[str, str], *, enabled: bool, cluster: bool) -> str:
    """The node whose pods are listed; "" with scope cluster, where a node set in the file contradicts the scope."""
    path = "discovery.kubernetes.node"
    if cluster:
        if data.get("node") is not None:
            r.fail(path, "only with scope: node (scope: cluster lists the pods of every node): remove it")
        return ""
    node: str = r.convert(data, "node", "discovery.kubernetes.", text_value("a node name"), None) or environ.get(
        "NODE_NAME", ""
    )
    if enabled and not node:
        r.fail(
            path,
            "not set and NODE_NAME is not in the environment (give the pod NODE_NAME from the downward API, "
            "fieldRef spec.nodeName, as deploy/kubernetes/daemonset.yaml does; or scope: cluster for one daemon "
            "that lists every node's pods)",
        )
    return node


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
        raise ValueError(f"{shown(value)} is not host:port (e.g. 10.0.0.7:8000)")
    return value


def engine_problem(value: Any) -> str | None:
    """Why a discovered engine name (a file_sd label, a pod annotation) cannot be used, or None."""
    try:
        one_of(ENGINE_NAMES)(value)
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
    r = Reader(source, problems)
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
        path = r.convert(labels, "__metrics_path__", p, text_value("a URL path such as /metrics"), "/metrics")
        scheme = r.convert(labels, "__scheme__", p, one_of(("http", "https")), "http")
        name_label = r.convert(labels, "target", p, label_value("a target name"), None)
        model = r.convert(labels, "model", p, label_value("a model preset or the path of a config.json"), None)
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
                r.fail(entry, f"target name {shown(name)} is already used by {where[name]} (names must be unique)")
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
