"""The scaler spec the replay models is the one `plimsoll generate` writes: every number in the generated HPA and
ScaledObject read back from their YAML equals the spec's."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.config import load_config
from exporter.generate import autoscaling
from exporter.scaling import PEAK_DEMAND, QUEUED, REPLICAS_NEEDED, ScalerSpec, scaler_spec

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
            {"type": "AverageValue", "averageValue": f"{round(spec.demand.value * 1000)}m"},
            {"type": "AverageValue", "averageValue": f"{round(spec.queue.value * 1000)}m"},
        ]
        # KEDA's thresholds are written to 3 decimals
        triggers = [
            (t["metricType"], round(float(t["metadata"]["threshold"]), 3), float(t["metadata"]["activationThreshold"]))
            for t in keda["triggers"]
        ]
        assert triggers == [
            (target.metric_type, round(target.value, 3), target.activation) for target in (spec.demand, spec.queue)
        ]
    llama, tiny = specs["vllm-llama-8b"], specs["vllm-tiny-llama"]
    assert (llama.demand.measure, round(llama.demand.value, 9)) == (PEAK_DEMAND, 19.2)
    assert (tiny.demand.measure, tiny.demand.value) == (REPLICAS_NEEDED, 1.0)  # no knee: the needed-replicas rule
    tolerated = float(saturation_queue or 0)
    assert (llama.queue.measure, llama.queue.value, llama.queue.activation) == (QUEUED, tolerated + 1, tolerated)
    assert llama.demand_window_seconds == 600 and llama.margin == 0.8
