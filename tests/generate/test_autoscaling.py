"""The scaler manifests: each signal asks for the replicas the rules say are needed, the KEDA fields are those of its
documented spec, the HPA validates against Kubernetes' schema, and the lint refuses each known-bad shape."""

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import validate

from exporter.autoscale import hpa
from exporter.config import AutoscalingConfig, Config, ConfigError, ScaledWorkload, parse_config
from exporter.generate import autoscaling, rules
from exporter.generate.command import stale
from tests.generate.conftest import promtool_rule_tests

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "plimsoll.example.yaml"
KUBERNETES_VERSION = "1.30.0"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# From KEDA's ScaledObject specification (keda.sh/docs/2.x/reference/scaledobject-spec) and its prometheus scaler
# page (keda.sh/docs/2.x/scalers/prometheus): the fields the generated files may use.
SCALED_OBJECT_SPEC = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
SCALE_TARGET_REF = {"apiVersion", "kind", "name", "envSourceContainerName"}
ADVANCED = {"restoreToOriginalReplicaCount", "horizontalPodAutoscalerConfig", "scalingModifiers"}
HPA_CONFIG = {"name", "behavior"}
TRIGGER = {"type", "metadata", "name", "useCachedMetrics", "authenticationRef", "metricType"}
PROMETHEUS_METADATA = {
    "serverAddress",
    "query",
    "queryParameters",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
    "timeout",
}
METRIC_TYPES = {"AverageValue", "Value", "Utilization"}


def _workload(**overrides) -> ScaledWorkload:
    fields = {
        "model": MODEL,
        "kind": "Deployment",
        "name": "vllm-llama-8b",
        "namespace": "inference",
        "min_replicas": 1,
        "max_replicas": 8,
        "startup_seconds": 300.0,
        "knee_concurrency": 24,
    }
    return ScaledWorkload(**{**fields, **overrides})


def _config(*workloads: ScaledWorkload, demand_window_seconds: float = 600.0, **config) -> Config:
    section = AutoscalingConfig(
        prometheus="http://prometheus-operated.monitoring:9090",
        margin=0.8,
        demand_window_seconds=demand_window_seconds,
        overprovisioned_for_seconds=86400.0,
        workloads=workloads or (_workload(),),
    )
    return dataclasses.replace(Config(), autoscaling=section, **config)


def _documents(config: Config) -> dict[str, dict]:
    return {item.path: yaml.safe_load(item.text) for item in autoscaling.artifacts(config)}


def _scaled_object(config: Config) -> dict:
    return _documents(config)[f"{autoscaling.DIRECTORY}/vllm-llama-8b-scaledobject.yaml"]


def _hpa(config: Config) -> dict:
    return _documents(config)[f"{autoscaling.DIRECTORY}/vllm-llama-8b-hpa.yaml"]


def _keda_millis(threshold: str) -> int:
    """The HPA target KEDA makes of a trigger's threshold, in thousandths: int64(threshold x 1000), truncated."""
    return int(float(threshold) * 1000)


def _hpa_desired(current: int, value: float, trigger: dict) -> int:
    """What the HPA model (exporter/autoscale/hpa.py, checked against the Kubernetes documentation's examples) asks
    for on this trigger's metric (KEDA hands its targets to the HPA as thousandths), with every replica ready."""
    reading = hpa.Reading("m", trigger["metricType"], _keda_millis(trigger["metadata"]["threshold"]), value)
    return hpa.propose(reading, current, current).replicas


def test_demand_trigger_asks_for_ceil_of_peak_demand_over_knee_times_margin():
    (demand, _) = _scaled_object(_config())["spec"]["triggers"]
    assert demand["metricType"] == "AverageValue"
    assert demand["metadata"]["query"] == f'sum(model:plimsoll_demand_requests:peak{{model="{MODEL}"}}) or vector(0)'
    assert demand["metadata"]["threshold"] == "19.2"  # 24 x 0.8
    # 100 requests at peak over 19.2 per replica: the 6 replicas model:plimsoll_replicas_needed says, from any count.
    assert {_hpa_desired(current, 100, demand) for current in (1, 3, 9)} == {6}


def test_without_a_knee_the_scaler_follows_the_replicas_needed_rule_one_per_replica():
    (demand, _) = _scaled_object(_config(_workload(knee_concurrency=None)))["spec"]["triggers"]
    assert demand["metadata"]["query"] == f'sum(model:plimsoll_replicas_needed{{model="{MODEL}"}}) or vector(0)'
    assert (demand["metricType"], demand["metadata"]["threshold"]) == ("AverageValue", "1")
    assert _hpa_desired(2, 5, demand) == 5


def test_queue_trigger_is_the_fleet_s_queue_over_one_above_what_a_replica_tolerates_at_its_knee():
    (_, queue) = _scaled_object(_config(saturation_queue=4.0))["spec"]["triggers"]
    assert queue["metricType"] == "AverageValue"
    assert queue["metadata"]["query"] == f'sum(plimsoll_requests_waiting{{model="{MODEL}"}}) or vector(0)'
    assert (queue["metadata"]["threshold"], queue["metadata"]["activationThreshold"]) == ("5", "4")
    # Four replicas each 3x past the target (15 waiting each) ask for three times the fleet.
    assert _hpa_desired(4, 4 * 15, queue) == 12
    # One replica 3x past it in a fleet of 20 asks for 3, below the 20 running: no scale-up, whatever the fleet's
    # size (the longest queue as a Value target asked for 60).
    assert _hpa_desired(20, 15, queue) == 3
    (_, unset) = _scaled_object(_config())["spec"]["triggers"]
    assert unset["metadata"]["threshold"] == "1"  # saturation.queue unset: any request waiting is past the knee


def test_a_large_threshold_is_written_without_an_exponent_that_kubectl_would_read_as_a_number():
    (item,) = [
        item
        for item in autoscaling.artifacts(_config(_workload(knee_concurrency=2_000_000), saturation_queue=1e7))
        if item.path.endswith("-scaledobject.yaml")
    ]
    assert "e+" not in item.text
    (demand, queue) = yaml.safe_load(item.text)["spec"]["triggers"]
    assert demand["metadata"]["threshold"] == "1600000"
    assert (queue["metadata"]["threshold"], queue["metadata"]["activationThreshold"]) == ("10000001", "10000000")


def test_keda_and_the_hpa_hold_one_target_where_the_threshold_s_text_would_be_cut_to_one_thousandth_less():
    # knee 3 x margin 0.67 is 2.01 per replica: the text "2.01" parses to a float just below, and KEDA's
    # int64(threshold x 1000) would make it 2009m while the HPA holds 2010m; at 201 requests they would ask for 101
    # and 100 replicas.
    config = _config(_workload(knee_concurrency=3))
    assert config.autoscaling is not None
    config = dataclasses.replace(config, autoscaling=dataclasses.replace(config.autoscaling, margin=0.67))
    (keda_demand, _) = _scaled_object(config)["spec"]["triggers"]
    (hpa_demand, _) = _hpa(config)["spec"]["metrics"]
    assert hpa_demand["external"]["target"]["averageValue"] == "2010m"
    assert _keda_millis(keda_demand["metadata"]["threshold"]) == 2010
    assert float(keda_demand["metadata"]["threshold"]) == pytest.approx(2.01, abs=1e-12)
    assert _hpa_desired(1, 201, keda_demand) == 100


def test_scaled_object_uses_only_fields_of_kedas_documented_spec():
    document = _scaled_object(_config())
    assert (document["apiVersion"], document["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = document["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC
    assert set(spec["scaleTargetRef"]) <= SCALE_TARGET_REF
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-llama-8b"}
    assert set(spec["advanced"]) <= ADVANCED and set(spec["advanced"]["horizontalPodAutoscalerConfig"]) <= HPA_CONFIG
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 8)
    for trigger in spec["triggers"]:
        assert set(trigger) <= TRIGGER and trigger["type"] == "prometheus" and trigger["metricType"] in METRIC_TYPES
        assert set(trigger["metadata"]) <= PROMETHEUS_METADATA and "metricName" not in trigger["metadata"]
        # KEDA's trigger metadata is a map of strings: a bare number is refused.
        assert all(isinstance(value, str) for value in trigger["metadata"].values())
        assert trigger["metadata"]["serverAddress"] == "http://prometheus-operated.monitoring:9090"
    # The HPA's behavior API, which KEDA passes on: validated as part of a real HPA.
    behavior_holder = copy.deepcopy(_hpa(_config()))
    behavior_holder["spec"]["behavior"] = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    validate(behavior_holder, KUBERNETES_VERSION, strict=True)


def test_hpa_validates_against_the_kubernetes_schema_with_the_same_targets_as_keda():
    config = _config(_workload(kind="StatefulSet"))
    hpa = _hpa(config)
    validate(hpa, KUBERNETES_VERSION, strict=True)
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    demand, queue = hpa["spec"]["metrics"]
    assert demand["external"]["target"] == {"type": "AverageValue", "averageValue": "19200m"}
    assert queue["external"]["target"] == {"type": "AverageValue", "averageValue": "1000m"}


def test_adapter_rules_serve_each_hpa_metric_with_the_query_keda_runs():
    config = _config(_workload(), _workload(name="vllm-qwen", model="Qwen/Qwen2.5-7B", knee_concurrency=None))
    documents = _documents(config)
    rules = {rule["name"]["as"]: rule for rule in documents[autoscaling.ADAPTER_RULES_PATH]["externalRules"]}
    for name in ("vllm-llama-8b", "vllm-qwen"):
        hpa = documents[f"{autoscaling.DIRECTORY}/{name}-hpa.yaml"]
        keda = documents[f"{autoscaling.DIRECTORY}/{name}-scaledobject.yaml"]
        for metric, trigger in zip(hpa["spec"]["metrics"], keda["spec"]["triggers"], strict=True):
            rule = rules[metric["external"]["metric"]["name"]]
            assert rule["metricsQuery"] == trigger["metadata"]["query"]
            assert rule["resources"] == {"namespaced": False}  # the recording rules carry no namespace label
            assert rule["seriesQuery"] in rule["metricsQuery"]
    assert len(rules) == 4


def test_scale_up_is_immediate_and_scale_down_one_replica_per_startup_within_kubernetes_limits():
    scaling = _scaled_object(_config(demand_window_seconds=7200.0))["spec"]["advanced"]
    behavior = scaling["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleUp"]["policies"] == [{"type": "Percent", "value": 100, "periodSeconds": 15}]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 3600  # a 2 h demand window, capped
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
    short = _scaled_object(_config(_workload(startup_seconds=5.0)))["spec"]["advanced"]
    assert short["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert short["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["policies"][0]["periodSeconds"] == 60


def test_generation_is_deterministic_and_absent_without_an_autoscaling_section():
    assert autoscaling.artifacts(_config()) == autoscaling.artifacts(_config())
    assert autoscaling.artifacts(Config()) == []


def _bad(mutate) -> list[str]:
    document = _scaled_object(_config())
    mutate(document["spec"])
    return autoscaling.lint([("so.yaml", document)], {MODEL})


def _set_query(query: str):
    def mutate(spec: dict) -> None:
        spec["triggers"][0]["metadata"]["query"] = query

    return mutate


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (
            _set_query(f'sum(vllm:time_to_first_token_seconds_sum{{model="{MODEL}"}})'),
            "spec.triggers[0].metricType: AverageValue on a latency",
        ),
        (
            _set_query(f'model:plimsoll_demand_requests:peak{{model="{MODEL}"}}'),
            "spec.triggers[0].metadata.query: 'model:plimsoll_demand_requests:peak{model=",
        ),
        (
            _set_query(f'sum by (pod) (plimsoll_requests_waiting{{model="{MODEL}"}})'),
            "can return more than one element",
        ),
        (
            _set_query('sum(model:plimsoll_demand_requests:peak{model="llama-8b"})'),
            'spec.triggers[0].metadata.query: selects model="llama-8b", which no',
        ),
        (
            lambda spec: spec["triggers"][0]["metadata"].update(metricName="demand"),
            "spec.triggers[0].metadata.metricName: deprecated",
        ),
        (lambda spec: spec.update(minReplicaCount=9), "spec.minReplicaCount: min replicas 9 above max replicas 8"),
        # Kubernetes reads these as whole numbers: YAML's .nan or a 1.5 is no count, and .nan would pass every check.
        (lambda spec: spec.update(maxReplicaCount=math.nan), "spec.maxReplicaCount: nan is not a number of replicas"),
        (lambda spec: spec.update(minReplicaCount=1.5), "spec.minReplicaCount: 1.5 is not a number of replicas"),
        (
            lambda spec: spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"].update(
                stabilizationWindowSeconds=math.inf
            ),
            "behavior.scaleDown.stabilizationWindowSeconds: inf is not a number of seconds",
        ),
        (
            lambda spec: spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"].update(
                stabilizationWindowSeconds=3601
            ),
            "behavior.scaleDown.stabilizationWindowSeconds: 3601 above 3600",
        ),
        (
            lambda spec: spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"].update(
                policies=[{"type": "Percent", "value": 100, "periodSeconds": 5}]
            ),
            "horizontalPodAutoscalerConfig.behavior.scaleDown: reacts faster than scaleUp",
        ),
    ],
)
def test_lint_refuses_each_known_bad_scaler_shape_with_its_reason(mutate, reason):
    (problem,) = _bad(mutate)
    assert problem.startswith("so.yaml: ScaledObject inference/vllm-llama-8b: ") and reason in problem


def test_lint_passes_what_is_generated_and_refuses_a_latency_average_in_an_hpa():
    documents = _documents(_config(_workload(knee_concurrency=None)))
    assert autoscaling.lint(documents.items(), {MODEL}) == []
    hpa = documents[f"{autoscaling.DIRECTORY}/vllm-llama-8b-hpa.yaml"]
    hpa["spec"]["metrics"][0]["external"]["metric"]["name"] = "vllm_ttft_seconds_p95"
    (problem,) = autoscaling.lint([("hpa.yaml", hpa)], {MODEL})
    assert problem.startswith(
        "hpa.yaml: HorizontalPodAutoscaler inference/vllm-llama-8b: spec.metrics[0].external.target.type: "
        "AverageValue on a latency (vllm_ttft_seconds_p95)"
    )


def test_generate_refuses_a_workload_whose_scaler_would_be_refused():
    with pytest.raises(ConfigError) as raised:
        autoscaling.artifacts(_config(_workload(min_replicas=5, max_replicas=2)))
    assert (
        f"{autoscaling.DIRECTORY}/vllm-llama-8b-hpa.yaml: HorizontalPodAutoscaler inference/vllm-llama-8b: "
        "spec.minReplicas: min replicas 5 above max replicas 2: the scaler is refused or pinned"
    ) in raised.value.problems


def test_generate_refuses_two_workloads_of_one_name_whose_scalers_would_overwrite_each_other():
    with pytest.raises(ConfigError) as raised:
        autoscaling.artifacts(_config(_workload(), _workload(namespace="other", model="Qwen/Qwen2.5-7B")))
    (problem,) = raised.value.problems
    assert problem.startswith("autoscaling.workloads[1].name: 'vllm-llama-8b' is also autoscaling.workloads[0]'s")


def test_generate_refuses_two_workloads_whose_hpas_would_read_one_external_metric():
    dotted = _workload(name="vllm.llama-8b", model="Qwen/Qwen2.5-7B")
    with pytest.raises(ConfigError) as raised:
        autoscaling.artifacts(_config(_workload(name="vllm-llama-8b"), dotted))
    (problem,) = raised.value.problems
    assert problem.startswith(
        "autoscaling.workloads[1].name: 'vllm.llama-8b' in namespace inference gives the external metric names of "
        "autoscaling.workloads[0] (plimsoll_demand_inference_vllm_llama_8b)"
    )


def test_committed_scalers_are_current_lint_clean_and_the_hpas_valid_kubernetes():
    config = parse_config(EXAMPLE.read_text(), str(EXAMPLE), environ={})
    assert config.autoscaling is not None
    items = autoscaling.artifacts(config)
    assert stale(items, ROOT) == []
    committed = {path.relative_to(ROOT).as_posix() for path in (ROOT / autoscaling.DIRECTORY).glob("*.yaml")}
    assert committed == {item.path for item in items}  # no scaler left behind by a workload since removed
    documents = [(path, yaml.safe_load((ROOT / path).read_text())) for path in sorted(committed)]
    assert autoscaling.lint(documents, {workload.model for workload in config.autoscaling.workloads}) == []
    hpas = [document for _, document in documents if document.get("kind") == "HorizontalPodAutoscaler"]
    for document in hpas:
        validate(document, KUBERNETES_VERSION, strict=True)
    assert len(hpas) == len(config.autoscaling.workloads)


LLAMA, TINY = MODEL, "tiny-llama"
# Three llama replicas with 30 running and 10, 4, 0 waiting (demand 104); two tiny-llama replicas with 2 running and
# 2 waiting each (demand 8), each with 4096 KV tokens and a 1024-token p95 footprint (capacity 4 x 0.8 = 3.2).
FLEET = [
    *(
        (f'plimsoll_requests_{what}{{model="{LLAMA}", target="{replica}", instance="{replica}:19842"}}', value)
        for replica, waiting in (("l-a", 10), ("l-b", 4), ("l-c", 0))
        for what, value in (("running", 30), ("waiting", waiting))
    ),
    *(
        (f'plimsoll_{name}{{model="{TINY}", target="{replica}", instance="{replica}:19842"{extra}}}', value)
        for replica in ("t-a", "t-b")
        for name, extra, value in (
            ("requests_running", "", 2),
            ("requests_waiting", "", 2),
            ("kv_cache_capacity_tokens", ', source="engine"', 4096),
            ("request_footprint_tokens", ', footprint="p95"', 1024),
        )
    ),
]


def test_every_generated_scaler_query_returns_one_element_with_the_replicas_the_rules_need(prometheus_tools, tmp_path):
    """promtool evaluates the example config's recording rules over a fleet, then each KEDA query (the adapter runs
    the same text): one element, and the replicas the HPA derives from it equal model:plimsoll_replicas_needed."""
    config = parse_config(EXAMPLE.read_text(), str(EXAMPLE), environ={})
    (rule_file,) = [item for item in rules.artifacts(config) if item.path == "rules/plimsoll.rules.yaml"]
    (tmp_path / "rules.yaml").write_text(rule_file.text)
    documents = _documents(config)
    expected = {  # query -> (its value, the replicas model:plimsoll_replicas_needed says), requests waiting
        LLAMA: ((104, math.ceil(104 / 19.2)), 10 + 4 + 0),
        TINY: ((math.ceil(8 / 3.2), math.ceil(8 / 3.2)), 2 + 2),
    }
    tests = []
    for workload in config.autoscaling.workloads:
        keda = documents[f"{autoscaling.DIRECTORY}/{workload.name}-scaledobject.yaml"]
        demand, queue = keda["spec"]["triggers"]
        (demand_value, needed), waiting = expected[workload.model]
        assert _hpa_desired(1, demand_value, demand) == needed
        tests += [
            {
                "expr": demand["metadata"]["query"],
                "eval_time": "5m",
                "exp_samples": [{"labels": "{}", "value": demand_value}],
            },
            {
                "expr": queue["metadata"]["query"],
                "eval_time": "5m",
                "exp_samples": [{"labels": "{}", "value": waiting}],
            },
            {
                "expr": f'sum({rules.NEEDED_RECORD}{{model="{workload.model}"}})',
                "eval_time": "5m",
                "exp_samples": [{"labels": "{}", "value": needed}],
            },
        ]
    unit = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": f"{value}x10"} for series, value in FLEET],
                "promql_expr_test": tests,
            }
        ],
    }
    promtool_rule_tests(prometheus_tools["promtool"], tmp_path, unit)
