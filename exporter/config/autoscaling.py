"""The `autoscaling` section: the workloads scaled on the replicas their demand needs, and how demand is read."""

import re
from collections.abc import Callable
from typing import Any

from exporter.capacity.plan import MAX_PARALLEL, MAX_SEQUENCES
from exporter.config.model import AutoscalingConfig, ConfigError, ScaledWorkload
from exporter.config.pricing import validate_gpu_type
from exporter.config.reader import Reader
from exporter.config.validators import (
    KUBERNETES_NAMESPACE,
    label_value,
    one_of,
    positive_int_at_most,
    shown,
    text_value,
    validate_duration,
    validate_ratio,
    validate_url,
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
    "gpu",
    "gpus_per_replica",
)
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# A Kubernetes object name (DNS-1123 subdomain).
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAME_MOST = 255 - len("-scaledobject.yaml")
_MODEL_LABEL = label_value("the model label its engine series carry, such as meta-llama/Llama-3.1-8B-Instruct")
# The generated HPA's and ScaledObject's replica counts are int32 in the Kubernetes API: past that, it refuses them.
_REPLICAS = positive_int_at_most(2**31 - 1)
_CONCURRENCY = positive_int_at_most(MAX_SEQUENCES)  # the requests one engine batches
_GPUS = positive_int_at_most(MAX_PARALLEL * MAX_PARALLEL)  # tensor x pipeline parallel, as targets' deployment
# The scalers write a workload's target, knee_concurrency x margin, in thousandths (KEDA's threshold 0.001, the
# HPA's quantity 1m): one that rounds to none is written 0, a target Kubernetes refuses.
_TARGET_THOUSANDTHS = 1000


def check_model_labels(section: AutoscalingConfig) -> None:
    """Raises ConfigError naming each workload whose model is not a label value. The generators write the model into
    YAML, PromQL and query templates; a Config built in code rather than read from a file gets the same refusal."""
    problems = []
    for index, workload in enumerate(section.workloads):
        try:
            _MODEL_LABEL(workload.model)
        except ValueError as error:
            problems.append(f"autoscaling.workloads[{index}].model: {error}")
    if problems:
        raise ConfigError(problems)


def _kubernetes_name(pattern: re.Pattern[str], what: str, most: int | None = None) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = text_value(what)(value)
        if not pattern.fullmatch(text):  # match() would let "$" take a trailing line break
            raise ValueError(f"{shown(text)} is not {what} (lowercase letters, digits and '-')")
        if most is not None and len(text) > most:
            raise ValueError(
                f"{len(text)} characters is too long: at most {most}, as the scalers are written to "
                "<name>-scaledobject.yaml and a file name holds at most 255"
            )
        return text

    return check


def _workload(r: Reader, raw: Any, path: str) -> ScaledWorkload | None:
    data = r.mapping(raw, path)
    r.unknown(data, path, _WORKLOAD_FIELDS)
    p = f"{path}."
    for key in ("model", "name", "namespace", "max_replicas"):
        if data.get(key) is None:
            r.fail(f"{p}{key}", "missing (every workload needs model, name, namespace and max_replicas)")
    model = r.convert(data, "model", p, _MODEL_LABEL, None)
    name = r.convert(data, "name", p, _kubernetes_name(_OBJECT_NAME, "a Kubernetes object name", _NAME_MOST), None)
    namespace = r.convert(data, "namespace", p, _kubernetes_name(KUBERNETES_NAMESPACE, "a Kubernetes namespace"), None)
    # At least 1: an HPA cannot scale to zero (without a feature gate), and an LLM replica takes minutes to start.
    min_replicas = r.convert(data, "min_replicas", p, _REPLICAS, 1)
    max_replicas = r.convert(data, "max_replicas", p, _REPLICAS, None)
    if max_replicas is not None and min_replicas > max_replicas:
        r.fail(f"{p}min_replicas", f"{min_replicas} is above max_replicas {max_replicas}")
    workload = ScaledWorkload(
        model=model,
        kind=r.convert(data, "kind", p, one_of(WORKLOAD_KINDS), "Deployment"),
        name=name,
        namespace=namespace,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        startup_seconds=r.convert(data, "startup", p, validate_duration, 300.0),
        knee_concurrency=r.convert(data, "knee_concurrency", p, _CONCURRENCY, None),
        gpu=r.convert(data, "gpu", p, validate_gpu_type, None),
        gpus_per_replica=r.convert(data, "gpus_per_replica", p, _GPUS, 1),
    )
    return None if None in (model, name, namespace, max_replicas) else workload


def _target_problem(workload: ScaledWorkload, margin: float) -> str | None:
    if workload.knee_concurrency is None or round(workload.knee_concurrency * margin * _TARGET_THOUSANDTHS) > 0:
        return None
    return (
        f"{workload.knee_concurrency} x autoscaling.margin {margin:g} is {workload.knee_concurrency * margin:g} "
        f"requests per replica, written 0 in the scalers of {workload.kind} {workload.namespace}/{workload.name} "
        "(they hold thousandths), a target Kubernetes refuses: raise knee_concurrency or margin"
    )


def _workloads(r: Reader, raw: Any, demand_window_seconds: float, margin: float) -> tuple[ScaledWorkload, ...]:
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
            r.fail(f"{where}.model", f"{shown(workload.model)} is also the model of {models[workload.model]}")
        problem = _target_problem(workload, margin)
        if problem:
            r.fail(f"{where}.knee_concurrency", problem)
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


def parse_autoscaling(r: Reader, raw: Any) -> AutoscalingConfig | None:
    if raw is None:
        return None
    data = r.mapping(raw, "autoscaling")
    r.unknown(data, "autoscaling", _AUTOSCALING_FIELDS)
    p = "autoscaling."
    demand_window = r.convert(data, "demand_window", p, validate_duration, 600.0)
    margin = r.convert(data, "margin", p, validate_ratio, 0.8)
    return AutoscalingConfig(
        prometheus=r.convert(data, "prometheus", p, validate_url, None),
        margin=margin,
        demand_window_seconds=demand_window,
        overprovisioned_for_seconds=r.convert(data, "overprovisioned_for", p, validate_duration, 86400.0),
        workloads=_workloads(r, data.get("workloads"), demand_window, margin),
    )
