"""The Kubernetes manifests and the Dockerfile's config path: valid against Kubernetes' own schemas."""

import shutil
import subprocess

import pytest
import yaml
from kubernetes_validate import validate

from exporter.config import parse_config
from tests.conftest import TESTS

KUBERNETES = TESTS.parent / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"


def _documents():
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    for name in kustomization["resources"]:
        for document in yaml.safe_load_all((KUBERNETES / name).read_text()):
            yield name, document


def test_every_kustomization_resource_exists_and_parses():
    names = {name for name, _ in _documents()}
    assert names == set(yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"])


def test_builtin_kinds_validate_against_the_kubernetes_schema():
    checked = 0
    for _, document in _documents():
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: kubernetes-validate has no schema for the Prometheus Operator's kinds
        validate(document, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 3


def test_daemonset_can_attribute_gpu_processes_and_probes_the_endpoints():
    (daemonset,) = [d for _, d in _documents() if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_configmap_holds_a_valid_plimsoll_config_that_discovers_this_nodes_pods():
    (configmap,) = [d for _, d in _documents() if d["kind"] == "ConfigMap"]
    config = parse_config(configmap["data"]["plimsoll.yaml"], "configmap plimsoll", environ={"NODE_NAME": "n1"})
    assert config.port == 19842 and config.target_files
    assert config.kubernetes is not None and config.kubernetes.node == "n1"


def test_the_daemonsets_service_account_may_list_pods_and_knows_its_node():
    documents = [d for _, d in _documents()]
    (daemonset,) = [d for d in documents if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (node_name,) = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    (binding,) = [d for d in documents if d["kind"] == "ClusterRoleBinding"]
    (subject,) = binding["subjects"]
    assert subject["name"] == pod["serviceAccountName"]
    (role,) = [
        d for d in documents if d["kind"] == "ClusterRole" and d["metadata"]["name"] == binding["roleRef"]["name"]
    ]
    assert any("pods" in rule["resources"] and "list" in rule["verbs"] for rule in role["rules"])


SIDECAR = KUBERNETES / "sidecar"


def _sidecar_deployments() -> list[dict]:
    """The sidecar overlay as kubectl renders it (kustomize applies the component's patch)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the sidecar overlay cannot be rendered (its files are checked alone)")
    result = subprocess.run([kubectl, "kustomize", str(SIDECAR)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "Deployment"]


def test_sidecar_example_engine_validates_against_the_kubernetes_schema():
    for document in yaml.safe_load_all((SIDECAR / "vllm.yaml").read_text()):
        validate(document, KUBERNETES_VERSION, strict=True)


def test_rendered_sidecar_overlay_validates_and_reads_its_own_engine_over_localhost():
    (deployment,) = _sidecar_deployments()
    validate(deployment, KUBERNETES_VERSION, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert {c["name"] for c in pod["containers"]} == {"vllm", "plimsoll"}
    (plimsoll,) = [c for c in pod["containers"] if c["name"] == "plimsoll"]
    (engine,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    engine_port = next(p["containerPort"] for p in engine["ports"])
    assert f"http://127.0.0.1:{engine_port}/metrics" in plimsoll["args"]
    assert [p["name"] for p in plimsoll["ports"]] == ["plimsoll"]
    assert plimsoll["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "plimsoll"}
    assert plimsoll["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "plimsoll"}
    assert plimsoll["resources"]["limits"]["memory"] == "128Mi"
    assert deployment["spec"]["template"]["metadata"]["labels"]["plimsoll.io/sidecar"] == "true"


def test_sidecar_runs_without_the_daemonsets_attribution_privileges():
    (deployment,) = _sidecar_deployments()
    pod = deployment["spec"]["template"]["spec"]
    assert not pod.get("hostPID")
    (plimsoll,) = [c for c in pod["containers"] if c["name"] == "plimsoll"]
    context = plimsoll["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False


FLEET = KUBERNETES / "fleet"


def _fleet_documents() -> list[dict]:
    kustomization = yaml.safe_load((FLEET / "kustomization.yaml").read_text())
    return [d for name in kustomization["resources"] for d in yaml.safe_load_all((FLEET / name).read_text())]


def _fleet_config(documents: list[dict]):
    (configmap,) = [d for d in documents if d["kind"] == "ConfigMap"]
    return parse_config(configmap["data"]["plimsoll.yaml"], "configmap plimsoll-fleet", environ={})


def test_fleet_builtin_kinds_validate_against_the_kubernetes_schema():
    kinds = []
    for document in _fleet_documents():
        kinds.append(document["kind"])
        if not document["apiVersion"].startswith("monitoring.coreos.com/"):
            validate(document, KUBERNETES_VERSION, strict=True)
    assert sorted(kinds) == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service", "ServiceMonitor"]
    )


def test_fleet_daemon_is_one_replica_listing_every_nodes_pods_for_the_scale_up_lag():
    documents = _fleet_documents()
    config = _fleet_config(documents)
    assert config.kubernetes is not None and config.kubernetes.scope == "cluster" and config.kubernetes.label_selector
    assert config.nvml is False
    assert config.autoscaling is not None
    assert any(w.knee_concurrency is not None for w in config.autoscaling.workloads)  # a workload with a lag
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert not pod.get("hostPID") and "env" not in container  # no NODE_NAME, no attribution privileges
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_fleet_service_account_may_only_get_and_list_pods_in_the_namespaces_it_lists():
    documents = _fleet_documents()
    config = _fleet_config(documents)
    assert config.kubernetes is not None and config.kubernetes.namespaces  # a Role per namespace needs them named
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in documents if d["kind"] == "Role"}
    granted = set()
    for binding in (d for d in documents if d["kind"] == "RoleBinding"):
        (subject,) = binding["subjects"]
        assert (subject["name"], subject["namespace"]) == (account, deployment["metadata"]["namespace"])
        role = roles[(binding["metadata"]["namespace"], binding["roleRef"]["name"])]
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
        granted.add(binding["metadata"]["namespace"])
    assert granted == set(config.kubernetes.namespaces)


def test_fleet_service_monitor_scrapes_the_daemon_and_keeps_only_the_scale_up_series_and_build_info():
    documents = _fleet_documents()
    (service,) = [d for d in documents if d["kind"] == "Service"]
    (monitor,) = [d for d in documents if d["kind"] == "ServiceMonitor"]
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert "plimsoll" in service["metadata"]["labels"][monitor["spec"]["jobLabel"]]  # PlimsollExporterAbsent's job
    # Fields of the Prometheus Operator's API (monitoring.coreos.com/v1: ServiceMonitorSpec, Endpoint, RelabelConfig).
    assert set(monitor["spec"]) <= {"jobLabel", "selector", "namespaceSelector", "endpoints"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "metricRelabelings"}
    relabel_fields = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
    assert all(set(relabel) <= relabel_fields for relabel in endpoint["metricRelabelings"])
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["metricRelabelings"] == [
        {"sourceLabels": ["__name__"], "regex": "plimsoll_scale_up_.*|plimsoll_build_info", "action": "keep"}
    ]
    base = yaml.safe_load((KUBERNETES / "servicemonitor.yaml").read_text())
    assert monitor["metadata"]["labels"]["release"] == base["metadata"]["labels"]["release"]


def test_rendered_fleet_overlay_keeps_each_objects_namespace():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the fleet overlay cannot be rendered (its files are checked alone)")
    result = subprocess.run([kubectl, "kustomize", str(FLEET)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rendered = {(d["kind"], d["metadata"]["namespace"]) for d in yaml.safe_load_all(result.stdout)}
    assert {("Role", "inference"), ("RoleBinding", "inference"), ("Deployment", "monitoring")} <= rendered
