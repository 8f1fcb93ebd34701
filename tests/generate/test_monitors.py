"""The ServiceMonitor and PodMonitor: they select what the manifests deploy, name a job the rules look for, carry
the PrometheusRule's labels, and use only fields of the Prometheus Operator's monitoring.coreos.com/v1 API."""

import re
from pathlib import Path

import pytest
import yaml

from exporter.config import parse_config
from exporter.generate import monitors
from exporter.generate.command import stale

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
EXAMPLE = ROOT / "deploy" / "plimsoll.example.yaml"
EXPORTER_JOB = parse_config(EXAMPLE.read_text(), str(EXAMPLE), environ={}).alerting.exporter_job

# From the Prometheus Operator's API reference (monitoring.coreos.com/v1): the fields the generated files may use.
SERVICE_MONITOR_SPEC = {"jobLabel", "selector", "namespaceSelector", "endpoints", "targetLabels", "podTargetLabels"}
POD_MONITOR_SPEC = {"jobLabel", "selector", "namespaceSelector", "podMetricsEndpoints", "podTargetLabels"}
ENDPOINT = {"port", "path", "interval", "scrapeTimeout", "scheme", "tlsConfig", "basicAuth", "honorLabels"}
SAFE_TLS_CONFIG = {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify"}


def _load(name: str) -> dict:
    return yaml.safe_load((KUBERNETES / name).read_text())


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


def _service_monitor_job(service_monitor: dict, service: dict) -> str:
    # The Prometheus Operator's relabelling: the Service's name, replaced by the value of the Service's label named
    # by jobLabel where that label is present and non-empty.
    job = service["metadata"]["name"]
    job_label = service_monitor["spec"].get("jobLabel")
    return (service["metadata"]["labels"].get(job_label) or job) if job_label else job


def _pod_monitor_job(pod_monitor: dict, namespace: str, pod_labels: dict) -> str:
    job = f"{namespace}/{pod_monitor['metadata']['name']}"
    job_label = pod_monitor["spec"].get("jobLabel")
    return (pod_labels.get(job_label) or job) if job_label else job


def _sidecar_pod_template() -> dict:
    patch = yaml.safe_load((KUBERNETES / "sidecar" / "plimsoll" / "sidecar.yaml").read_text())
    return patch["spec"]["template"]


def _uncommented(text: str) -> dict:
    """The document with its commented secured-port fields enabled, as a user would uncomment them."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "uncomment these" in line) + 1
    enabled = [re.sub(r"^(\s*)# ", r"\1", line, count=1) for line in lines[start:]]
    return yaml.safe_load("\n".join(lines[:start] + enabled))


def test_service_monitor_selects_the_daemonsets_service_and_names_its_port():
    service_monitor, service = _load("servicemonitor.yaml"), _load("service.yaml")
    assert _matches(service_monitor["spec"]["selector"], service["metadata"]["labels"])
    ports = {port["name"] for port in service["spec"]["ports"]}
    assert [endpoint["port"] for endpoint in service_monitor["spec"]["endpoints"]] == ["metrics"]
    assert {"metrics"} <= ports


@pytest.mark.parametrize("service_name", ["plimsoll", "prod-gpu-exporter"])
def test_service_monitor_job_matches_exporter_absent_whatever_the_service_is_called(service_name):
    service_monitor, service = _load("servicemonitor.yaml"), _load("service.yaml")
    service["metadata"]["name"] = service_name  # a kustomize namePrefix or a rename
    job = _service_monitor_job(service_monitor, service)
    assert re.fullmatch(EXPORTER_JOB, job), job


def test_pod_monitor_selects_the_sidecar_pods_and_names_the_sidecars_port():
    pod_monitor, template = _load("podmonitor.yaml"), _sidecar_pod_template()
    assert _matches(pod_monitor["spec"]["selector"], template["metadata"]["labels"])
    ports = {port["name"] for container in template["spec"]["containers"] for port in container.get("ports", [])}
    (endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}  # engines live outside Plimsoll's namespace


@pytest.mark.parametrize("namespace", ["monitoring", "serving"])
def test_pod_monitor_job_matches_exporter_absent_in_any_namespace(namespace):
    pod_monitor = _load("podmonitor.yaml")
    engine_pod_labels = {"app.kubernetes.io/name": "vllm", **_sidecar_pod_template()["metadata"]["labels"]}
    job = _pod_monitor_job(pod_monitor, namespace, engine_pod_labels)
    assert re.fullmatch(EXPORTER_JOB, job), job


def test_monitors_carry_the_prometheus_rules_selection_labels():
    rule_labels = _load("prometheusrule.yaml")["metadata"]["labels"]
    selection = {k: v for k, v in rule_labels.items() if k != monitors.COMPONENT_LABEL}
    assert "release" in selection
    for name in ("servicemonitor.yaml", "podmonitor.yaml"):
        labels = _load(name)["metadata"]["labels"]
        assert {k: v for k, v in labels.items() if k != monitors.COMPONENT_LABEL} == selection, name


@pytest.mark.parametrize(
    ("name", "kind", "spec_fields", "endpoints"),
    [
        ("servicemonitor.yaml", "ServiceMonitor", SERVICE_MONITOR_SPEC, "endpoints"),
        ("podmonitor.yaml", "PodMonitor", POD_MONITOR_SPEC, "podMetricsEndpoints"),
    ],
)
def test_monitors_use_only_prometheus_operator_fields(name, kind, spec_fields, endpoints):
    document = _load(name)
    assert document["apiVersion"] == "monitoring.coreos.com/v1" and document["kind"] == kind
    assert document["metadata"]["name"]
    assert set(document["spec"]) <= spec_fields
    assert set(document["spec"]["selector"]) == {"matchLabels"}  # a LabelSelector
    assert all(isinstance(v, str) for v in document["spec"]["selector"]["matchLabels"].values())
    assert document["spec"][endpoints] and all(set(e) <= ENDPOINT for e in document["spec"][endpoints])


@pytest.mark.parametrize("name", ["servicemonitor.yaml", "podmonitor.yaml"])
def test_uncommenting_the_secured_port_fields_gives_https_tls_and_basic_auth(name):
    document = _uncommented((KUBERNETES / name).read_text())
    (endpoint,) = document["spec"].get("endpoints") or document["spec"]["podMetricsEndpoints"]
    assert set(endpoint) <= ENDPOINT
    assert endpoint["scheme"] == "https"
    assert set(endpoint["tlsConfig"]) <= SAFE_TLS_CONFIG
    assert set(endpoint["tlsConfig"]["ca"]["secret"]) == {"name", "key"}
    assert endpoint["tlsConfig"]["serverName"]
    for field in ("username", "password"):
        assert set(endpoint["basicAuth"][field]) == {"name", "key"}  # SecretKeySelector


def test_monitors_follow_the_configs_rule_labels():
    config = parse_config("alerting: {rule_labels: {release: prometheus, team: gpu}}\n", "c.yaml", environ={})
    for artifact in monitors.artifacts(config):
        labels = yaml.safe_load(artifact.text)["metadata"]["labels"]
        assert labels["release"] == "prometheus" and labels["team"] == "gpu", artifact.path


def test_committed_monitors_are_what_the_example_config_generates():
    config = parse_config(EXAMPLE.read_text(), str(EXAMPLE), environ={})
    generated = monitors.artifacts(config)
    assert [a.path for a in generated] == [monitors.SERVICE_MONITOR_PATH, monitors.POD_MONITOR_PATH]
    assert stale(generated, ROOT) == []
    assert monitors.artifacts(config) == generated  # deterministic
