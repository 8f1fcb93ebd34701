"""The scaler spec the replay models is the one `plimsoll generate` writes: every number in the generated HPA and
ScaledObject read back from their YAML equals the spec's."""

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.autoscale.demand import DemandPoint
from exporter.autoscale.replay import replay
from exporter.config import load_config
from exporter.generate import autoscaling
from exporter.scaling import PEAK_DEMAND, QUEUED, REPLICAS_NEEDED, ScalerSpec, scaler_spec, target_millis

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "plimsoll.example.yaml"


def _generated(tmp_path: Path, saturation_queue: str) -> tuple[dict[str, dict[str, Any]], dict[str, ScalerSpec]]:
    text = EXAMPLE.read_text()
    if saturation_queue:  # as `plimsoll loadtest --write` records it
        line = "saturation: {kv_usage: 0.90, lead_time: 15m}"
        assert line in text
        text = text.replace(line, f"saturation: {{kv_usage: 0.90, lead_time: 15m, queue: {saturation_queue}}}")
    config_path = tmp_path / "plimsoll.yaml"
    config_path.write_text(text)
    config = load_config(config_path)
    assert config.autoscaling is not None
    documents = {artifact.path: yaml.safe_load(artifact.text) for artifact in autoscaling.artifacts(config)}
    specs = {
        workload.name: scaler_spec(config.autoscaling, workload, config.saturation_queue)
        for workload in config.autoscaling.workloads
    }
    return documents, specs


def _keda_millis(threshold: str) -> int:
    """The HPA target KEDA makes of a trigger's threshold, in thousandths: int64(threshold x 1000), truncated."""
    return int(float(threshold) * 1000)


def _rules(rules: Any) -> dict[str, Any]:
    return {
        "stabilizationWindowSeconds": rules.stabilization_window_seconds,
        "selectPolicy": rules.select_policy,
        "policies": [{"type": p.kind, "value": p.value, "periodSeconds": p.period_seconds} for p in rules.policies],
    }


@pytest.mark.parametrize("saturation_queue", ["", "2"])
def test_the_generated_scalers_hold_the_spec(tmp_path: Path, saturation_queue: str) -> None:
    documents, specs = _generated(tmp_path, saturation_queue)
    assert set(specs) == {"vllm-llama-8b", "vllm-tiny-llama"}
    for name, spec in specs.items():
        hpa = documents[f"{autoscaling.DIRECTORY}/{name}-hpa.yaml"]["spec"]
        keda = documents[f"{autoscaling.DIRECTORY}/{name}-scaledobject.yaml"]["spec"]
        behavior = {"scaleUp": _rules(spec.behavior.scale_up), "scaleDown": _rules(spec.behavior.scale_down)}
        assert hpa["behavior"] == keda["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == behavior
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (spec.min_replicas, spec.max_replicas)
        assert (keda["minReplicaCount"], keda["maxReplicaCount"]) == (spec.min_replicas, spec.max_replicas)
        targets = [metric["external"]["target"] for metric in hpa["metrics"]]
        assert targets == [
            {"type": "AverageValue", "averageValue": f"{target_millis(spec.demand.value)}m"},
            {"type": "AverageValue", "averageValue": f"{target_millis(spec.queue.value)}m"},
        ]
        # KEDA makes the HPA's target int64(threshold x 1000): the same thousandths
        triggers = [
            (t["metricType"], _keda_millis(t["metadata"]["threshold"]), float(t["metadata"]["activationThreshold"]))
            for t in keda["triggers"]
        ]
        assert triggers == [
            (target.metric_type, target_millis(target.value), target.activation) for target in (spec.demand, spec.queue)
        ]
    llama, tiny = specs["vllm-llama-8b"], specs["vllm-tiny-llama"]
    assert (llama.demand.measure, round(llama.demand.value, 9)) == (PEAK_DEMAND, 19.2)
    assert (tiny.demand.measure, tiny.demand.value) == (REPLICAS_NEEDED, 1.0)  # no knee: the needed-replicas rule
    tolerated = float(saturation_queue or 0)
    assert (llama.queue.measure, llama.queue.value, llama.queue.activation) == (QUEUED, tolerated + 1, tolerated)
    assert llama.demand_window_seconds == 600 and llama.margin == 0.8


def test_the_replay_holds_the_target_the_scalers_write_where_rounding_changes_the_replicas() -> None:
    # knee 6 x margin 0.7 is 4.199999999999999 in floats; the scalers write 4200m (and "4.2"), and at 21 requests
    # the controller asks for 21000 / 4200 = 5 replicas where the unrounded target asks for 6.
    config = load_config(EXAMPLE)
    assert config.autoscaling is not None
    workload = dataclasses.replace(config.autoscaling.workloads[0], knee_concurrency=6)
    section = dataclasses.replace(config.autoscaling, margin=0.7, workloads=(workload,))
    config = dataclasses.replace(config, autoscaling=section)
    documents = {artifact.path: yaml.safe_load(artifact.text) for artifact in autoscaling.artifacts(config)}
    hpa_target = documents[f"{autoscaling.DIRECTORY}/{workload.name}-hpa.yaml"]["spec"]["metrics"][0]["external"]
    (keda_demand, _) = documents[f"{autoscaling.DIRECTORY}/{workload.name}-scaledobject.yaml"]["spec"]["triggers"]
    written = int(hpa_target["target"]["averageValue"].removesuffix("m"))
    assert written == _keda_millis(keda_demand["metadata"]["threshold"]) == 4200

    spec = scaler_spec(section, workload, config.saturation_queue)
    trace = [DemandPoint(15.0 * index, 21.0) for index in range(60)]
    result = replay(trace, spec, workload.startup_seconds, 6)
    assert result.run.figures.peak_replicas == math.ceil(21 * 1000 / written) == 5
    # and from a smaller fleet, the demand's proposal is the controller's
    rising = [DemandPoint(15.0 * index, 4.0 if index < 40 else 21.0) for index in range(80)]
    decisions = [decided.decision for decided in replay(rising, spec, workload.startup_seconds, 6).decisions]
    assert decisions and {decision.proposed_replicas for decision in decisions} == {5}
