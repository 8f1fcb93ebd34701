"""Prometheus recording and alerting rules built from the config: pure functions, deterministic text.

`artifacts(config)` returns the rule file (`rules/plimsoll.rules.yaml`) and the same groups as a prometheus-operator
`PrometheusRule` (`deploy/kubernetes/prometheusrule.yaml`).

What comes from the config: each SLO's latency threshold and objective and the SLO period (the burn-rate factors,
derived by `exporter.core.slo.burn_rate_factors`), the KV-usage saturation threshold and the lead time, and the
`alerting:` section (docs/alerts.md), which the dashboards read too: the runbook URL, the exporter's job regex, the
PrometheusRule's labels, the gate under which no trend pages with its hold and trend window, the fleet headroom
floor, and the drift and VRAM-growth limits. The other `for` durations are fixed here (documented in
rules/RUNBOOK.md).

Label conventions the expressions rely on: engine series carry `target`, `engine`, `model`, `dp_rank`; Prometheus
adds `job` and `instance` at scrape time. The daemon runs one per node (DaemonSet or systemd), so `instance` (the
daemon's address) stands for the node in the fleet aggregates. A replica is one engine server, one (`instance`,
`target`) pair: a data-parallel engine reports one series per rank (`dp_rank`), and the replica rules add its ranks
up rather than count them apart.

Recording rules follow `level:metric:operations`. SLI error ratios are per `target`, `model` and `slo`, summed over
nodes, so replicas that share a target name (one DaemonSet config on every node) are one service.
"""

from typing import Any

import yaml

from exporter.config import AlertingConfig, AutoscalingConfig, Config, ScaledWorkload, SloConfig, check_model_labels
from exporter.core.slo import BurnWindow, burn_rate_factors
from exporter.core.units import duration
from exporter.generate.artifact import Artifact
from exporter.scaling import DEMAND_RECORD, promql_string

RULES_PATH = "rules/plimsoll.rules.yaml"
PROMETHEUS_RULE_PATH = "deploy/kubernetes/prometheusrule.yaml"

GROUP_SLI = "plimsoll-sli.rules"
GROUP_FLEET = "plimsoll-fleet.rules"
GROUP_CAPACITY = "plimsoll-capacity.alerts"
GROUP_SLO = "plimsoll-slo.alerts"
GROUP_EXPORTER = "plimsoll-exporter.alerts"
GROUP_AUTOSCALING = "plimsoll-autoscaling.rules"
GROUP_AUTOSCALING_ALERTS = "plimsoll-autoscaling.alerts"
GROUP_COST = "plimsoll-cost.rules"

# The replica rules' names: the KEDA and HPA manifests (exporter/generate/autoscaling.py) and the fleet dashboard
# query them.
DEMAND_PEAK_RECORD = "model:plimsoll_demand_requests:peak"
CAPACITY_RECORD = "model:plimsoll_replica_capacity_requests"
RUNNING_RECORD = "model:plimsoll_replicas_running:count"
NEEDED_RECORD = "model:plimsoll_replicas_needed"
# The cost rules' names, in the currency of the config's `pricing.gpu_hour`.
COST_GAUGE = "plimsoll_target_gpu_hourly_cost"
HOURLY_COST_RUNNING_RECORD = "model:plimsoll_gpu_hourly_cost:running"
HOURLY_COST_NOT_NEEDED_RECORD = "model:plimsoll_gpu_hourly_cost:not_needed"
DAILY_COST_RUNNING_RECORD = "model:plimsoll_gpu_daily_cost:running"
DAILY_COST_NOT_NEEDED_RECORD = "model:plimsoll_gpu_daily_cost:not_needed"
# One replica: one engine server, whatever its data-parallel ranks.
REPLICA = "model, instance, target"

_ENGINE = "{{ $labels.model }} on {{ $labels.target }}"
_WHERE = "(node {{ $labels.instance }}{{ if $labels.dp_rank }}, dp_rank {{ $labels.dp_rank }}{{ end }})"


def _number(value: float) -> str:
    """A PromQL literal without float noise: 14.4, 0.54, 2147483648."""
    return f"{value:.12g}"


def _percent(ratio: float) -> str:
    # Twelve digits, not six: an objective of seven nines is 99.99999%, never 100%.
    return f"{ratio * 100:.12g}%"


def _size(num_bytes: float) -> str:
    """Bytes as people write them in the config: 2GiB, 512MiB, 1000B."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if num_bytes >= size:
            return f"{num_bytes / size:.3g}{unit}"
    return f"{num_bytes:g}B"


def _alert(
    alerting: AlertingConfig,
    name: str,
    expr: str,
    for_seconds: float,
    severity: str,
    summary: str,
    description: str,
    **labels: str,
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": duration(for_seconds),
        "labels": {"severity": severity, **labels},
        # The alert's name, lowercased, is its heading's anchor in rules/RUNBOOK.md.
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{alerting.runbook_url}#{name.lower()}",
        },
    }


def saturation_horizon_seconds(config: Config) -> float:
    """How far ahead "saturation ahead" looks: the lead time plus the alert's hold, so that an alert that fired
    after the hold still leaves the full lead time before saturation at a steady trend."""
    return config.lead_time_seconds + config.alerting.saturation_ahead_for_seconds


def saturation_gate_ratio(config: Config) -> float:
    """KV usage under which no trend pages: a trend from a nearly empty cache is too noisy to act on."""
    return config.alerting.saturation_gate_fraction * config.saturation_kv_usage


def sli_windows(config: Config) -> list[float]:
    """Every window the burn-rate alerts read, in seconds, shortest first."""
    if not config.slos:
        return []
    windows: set[float] = set()
    for slo in config.slos:
        for window in _burn_windows(config, slo):
            windows.update((window.long_window_seconds, window.short_window_seconds))
    return sorted(windows)


def _burn_windows(config: Config, slo: SloConfig) -> list[BurnWindow]:
    return burn_rate_factors(slo.objective, config.slo_period_seconds / 86400.0)


def error_ratio_record(window_seconds: float) -> str:
    return f"target_model_slo:plimsoll_slo_errors:ratio_rate{duration(window_seconds)}"


def _sli_group(config: Config) -> dict[str, Any]:
    rules = []
    for window in sli_windows(config):
        w = duration(window)
        rules.append(
            {
                "record": error_ratio_record(window),
                "expr": (
                    "1 - (\n"
                    f"  sum by (target, model, slo) (rate(plimsoll_slo_good_requests_total[{w}]))\n"
                    "  /\n"
                    f"  sum by (target, model, slo) (rate(plimsoll_slo_requests_total[{w}]))\n"
                    ")\n"
                ),
            }
        )
    return {"name": GROUP_SLI, "rules": rules}


# (metric, the one label value it is restricted to or None, aggregations): the fleet aggregates, by model and by
# node (instance) and model. A restricting label stays on the result (source="engine", footprint="p95"), so the
# series says what it counts.
_FLEET: tuple[tuple[str, tuple[str, str] | None, tuple[str, ...]], ...] = (
    ("plimsoll_kv_cache_capacity_tokens", ("source", "engine"), ("sum",)),
    ("plimsoll_kv_cache_used_tokens", None, ("sum",)),
    ("plimsoll_kv_cache_headroom_tokens", None, ("sum",)),
    ("plimsoll_headroom_requests", ("footprint", "p95"), ("sum",)),
    ("plimsoll_kv_cache_usage_ratio", None, ("max", "avg")),
    ("plimsoll_requests_running", None, ("sum",)),
    ("plimsoll_requests_waiting", None, ("sum",)),
)
FLEET_LEVELS = {"model": ("model",), "instance_model": ("instance", "model")}


def headroom_requests_record() -> str:
    return "model:plimsoll_headroom_requests:sum"


def _fleet_group() -> dict[str, Any]:
    rules = []
    for level, labels in FLEET_LEVELS.items():
        for metric, only, operations in _FLEET:
            by = ", ".join((*labels, only[0]) if only else labels)
            selector = f'{{{only[0]}="{only[1]}"}}' if only else ""
            for operation in operations:
                rules.append(
                    {"record": f"{level}:{metric}:{operation}", "expr": f"{operation} by ({by}) ({metric}{selector})"}
                )
        rules.append(
            {
                "record": f"{level}:plimsoll_preemptions:rate5m",
                "expr": f"sum by ({', '.join(labels)}) (rate(plimsoll_preemptions_total[5m]))",
            }
        )
    return {"name": GROUP_FLEET, "rules": rules}


def _capacity_group(config: Config) -> dict[str, Any]:
    alerting = config.alerting
    threshold = config.saturation_kv_usage
    lead = config.lead_time_seconds
    t, h, g = _number(threshold), _number(saturation_horizon_seconds(config)), _number(saturation_gate_ratio(config))
    # Unset, any request waiting counts; a queue calibrated by `plimsoll loadtest` is the depth the engine still
    # met its SLOs at.
    queue = _number(config.saturation_queue or 0)
    trend = duration(alerting.saturation_trend_window_seconds)
    # The gate holds while usage was above it at any time within the hold: a closed-loop load dips for a scrape
    # whenever requests end together, and each dip would otherwise restart the hold (measured in `make demo`: the
    # page came 24 s after the condition first held, with a 10 s hold).
    gate_window = duration(max(alerting.saturation_ahead_for_seconds, 60.0))
    ahead = _alert(
        alerting,
        "PlimsollKVCacheSaturationAhead",
        (
            f"max_over_time(plimsoll_kv_cache_usage_ratio[{gate_window}]) > {g}\n"
            "and\n"
            "(\n"
            f"  plimsoll_saturation_eta_seconds < {h}\n"
            "  or\n"
            f"  predict_linear(plimsoll_kv_cache_usage_ratio[{trend}], {h}) > {t}\n"
            ")\n"
        ),
        alerting.saturation_ahead_for_seconds,
        "page",
        f"{_ENGINE}: KV cache reaches {_percent(threshold)} within about {duration(lead)}",
        f"The KV cache of {_ENGINE} {_WHERE} was up to {{{{ $value | humanizePercentage }}}} full in the last "
        f"{gate_window} and is rising: at the "
        f"current trend it reaches the {_percent(threshold)} saturation threshold within about {duration(lead)}, "
        "after which requests queue and get preempted. Scale out or shed load now.",
    )
    saturated = _alert(
        alerting,
        "PlimsollKVCacheSaturated",
        (
            f"plimsoll_kv_cache_usage_ratio >= {t}\n"
            "and\n"
            "(\n"
            f"  plimsoll_requests_waiting > {queue}\n"
            "  or\n"
            "  increase(plimsoll_preemptions_total[5m]) > 0\n"
            ")\n"
        ),
        300,
        "page",
        f"{_ENGINE}: KV cache saturated, requests queue or are preempted",
        f"The KV cache of {_ENGINE} {_WHERE} is {{{{ $value | humanizePercentage }}}} full (threshold "
        f"{_percent(threshold)}) and requests are waiting or being preempted: latency is rising now. Scale out, "
        "shed load, or lower max_num_seqs / max_model_len.",
    )
    preemptions = _alert(
        alerting,
        "PlimsollPreemptions",
        "increase(plimsoll_preemptions_total[5m]) > 0\n",
        600,
        "ticket",
        f"{_ENGINE}: the engine keeps preempting requests",
        f"{_ENGINE} {_WHERE} preempted {{{{ $value | humanize }}}} requests in the last 5m, continuously for 10m: "
        "the KV cache runs out and running requests are evicted and recomputed.",
    )
    floor = _number(alerting.fleet_headroom_min_requests)
    drift_ratio = alerting.capacity_drift_ratio
    growth = alerting.vram_growth_bytes_per_hour
    headroom = _alert(
        alerting,
        "PlimsollFleetHeadroomLow",
        f'{headroom_requests_record()}{{footprint="p95"}} < {floor}\n',
        900,
        "ticket",
        f"{{{{ $labels.model }}}}: fewer than {floor} more p95-size requests fit across the fleet",
        "Across all replicas of {{ $labels.model }}, only {{ $value | humanize }} more requests of the p95 "
        f"footprint fit in the KV caches (floor: {floor}), for 15m. Scale out this model.",
    )
    drift = _alert(
        alerting,
        "PlimsollCapacityModelDrift",
        (
            f"plimsoll_model_capacity_error_ratio > {_number(drift_ratio)}\n"
            "or\n"
            f"plimsoll_model_capacity_error_ratio < -{_number(drift_ratio)}\n"
        ),
        1800,
        "info",
        f"{_ENGINE}: the engine's KV pool differs from the capacity model by over {_percent(drift_ratio)}",
        f"The KV pool that {_ENGINE} {_WHERE} allocated differs from what Plimsoll's capacity model predicts for its "
        "configured deployment by {{ $value | humanizePercentage }} (engine - model, relative to the model). "
        "Check gpu_memory_utilization, max_model_len, kv_cache_dtype and tensor_parallel in the config, and "
        "whether another process shares the GPU.",
    )
    vram = _alert(
        alerting,
        "PlimsollVRAMUnexplainedGrowing",
        f"deriv(plimsoll_vram_unexplained_bytes[1h]) * 3600 > {_number(growth)}\n",
        900,
        "ticket",
        "GPU {{ $labels.gpu }} on {{ $labels.instance }}: memory the capacity model does not explain keeps growing",
        "Memory on GPU {{ $labels.gpu }} (node {{ $labels.instance }}) that the capacity models of its targets do "
        "not explain grows by {{ $value | humanize1024 }}B per hour (1h trend; limit "
        f"{_size(growth)}/h): a memory leak in the engine, or another tenant on the GPU.",
    )
    return {"name": GROUP_CAPACITY, "rules": [ahead, saturated, preemptions, headroom, drift, vram]}


def _burn_threshold(window: BurnWindow, objective: float) -> str:
    if window.error_ratio >= 1:
        # The objective is too loose for this burn rate to be reachable (more errors than requests): fire when
        # every request fails instead of never.
        return ">= 1"
    # The objective as written, every digit: twelve would round 0.9999999999999 to 1, a budget of 0 that pages on
    # one slow request.
    return f"> ({_number(window.factor)} * (1 - {float(objective)!r}))"


def _slo_group(config: Config) -> dict[str, Any]:
    rules = []
    period = duration(config.slo_period_seconds)
    for slo in config.slos:
        for window in _burn_windows(config, slo):
            long, short = duration(window.long_window_seconds), duration(window.short_window_seconds)
            compare = _burn_threshold(window, slo.objective)
            selector = f'{{slo="{slo.name}"}}'
            factor = _number(window.factor)
            rules.append(
                _alert(
                    config.alerting,
                    "PlimsollSLOErrorBudgetBurn",
                    (
                        f"{error_ratio_record(window.long_window_seconds)}{selector} {compare}\n"
                        "and\n"
                        f"{error_ratio_record(window.short_window_seconds)}{selector} {compare}\n"
                    ),
                    # Half the short window, as kube-prometheus' KubeAPIErrorBudgetBurn: 2m30s, 15m, 1h, 3h.
                    window.short_window_seconds / 2,
                    window.severity,
                    f"{_ENGINE}: {slo.name} error budget burning at {factor}x or more",
                    f"{{{{ $value | humanizePercentage }}}} of {slo.name} requests to {_ENGINE} took over "
                    f"{duration(slo.threshold_seconds)} in the last {long} (and in the last {short}), against an "
                    f"objective of {_percent(slo.objective)} within it: the error budget burns at {factor}x or more "
                    f"the rate a {period} period allows, and {_percent(window.budget_fraction)} of it is gone in "
                    f"{long}.",
                    slo=slo.name,
                    long_window=long,
                    short_window=short,
                )
            )
    return {"name": GROUP_SLO, "rules": rules}


def _exporter_group(alerting: AlertingConfig) -> dict[str, Any]:
    down = _alert(
        alerting,
        "PlimsollTargetDown",
        "plimsoll_target_up == 0\n",
        300,
        "ticket",
        "Plimsoll cannot read engine target {{ $labels.target }} on {{ $labels.instance }}",
        "Plimsoll on {{ $labels.instance }} has failed to poll the engine target {{ $labels.target }} for 5m: "
        "its capacity and SLO alerts are blind. The engine is down, or its /metrics is unreachable or unreadable.",
    )
    nvml = _alert(
        alerting,
        "PlimsollNVMLDown",
        "plimsoll_nvml_up == 0\n",
        600,
        "ticket",
        "Plimsoll on {{ $labels.instance }} cannot read GPU memory through NVML",
        "NVML has not answered Plimsoll on {{ $labels.instance }} for 10m (no driver in the container, a lost "
        "GPU, or nvml disabled): engine metrics still flow, but per-GPU VRAM and unexplained memory are missing.",
    )
    absent = _alert(
        alerting,
        "PlimsollExporterAbsent",
        f'absent(up{{job=~"{alerting.exporter_job}"}} == 1)\nor\nabsent(plimsoll_build_info)\n',
        600,
        "ticket",
        "No Plimsoll exporter is being scraped",
        f'For 10m no scrape job matching job=~"{alerting.exporter_job}" has been up, or no plimsoll_build_info series '
        "exists: every Plimsoll alert is blind. The daemon is down, or Prometheus does not scrape it (under that "
        "job name).",
    )
    return {"name": GROUP_EXPORTER, "rules": [down, nvml, absent]}


def capacity_source(workload: ScaledWorkload) -> str:
    """Where a replica's capacity comes from: the measured knee, else the capacity model (the `source` label)."""
    return "knee" if workload.knee_concurrency is not None else "model"


def _capacity_rule(workload: ScaledWorkload, margin: float) -> dict[str, Any]:
    labels = {"model": workload.model, "source": capacity_source(workload)}
    if workload.knee_concurrency is not None:
        expr = f"vector({_number(workload.knee_concurrency * margin)})\n"
    else:
        # What each rank's KV pool holds of its p95 request footprint, added up over a replica's data-parallel
        # ranks (each has a pool of its own), averaged over the model's replicas.
        selector = f"model={promql_string(workload.model)}"
        expr = (
            "avg by (model) (\n"
            f"  sum by ({REPLICA}) (\n"
            f'    plimsoll_kv_cache_capacity_tokens{{source="engine", {selector}}}\n'
            "    / ignoring (source, footprint)\n"
            f'    plimsoll_request_footprint_tokens{{footprint="p95", {selector}}}\n'
            "  )\n"
            f") * {_number(margin)}\n"
        )
    return {"record": CAPACITY_RECORD, "expr": expr, "labels": labels}


def _needed_rule(workload: ScaledWorkload) -> dict[str, Any]:
    selector = f"{{model={promql_string(workload.model)}}}"
    return {
        "record": NEEDED_RECORD,
        "expr": (
            "clamp_max(\n"
            "  clamp_min(\n"
            f"    ceil({DEMAND_PEAK_RECORD}{selector} / on (model) {CAPACITY_RECORD}{selector}),\n"
            f"    {workload.min_replicas}\n"
            "  ),\n"
            f"  {workload.max_replicas}\n"
            ")\n"
        ),
        "labels": {"source": capacity_source(workload)},
    }


def _autoscaling_group(autoscaling: AutoscalingConfig) -> dict[str, Any]:
    """Demand, capacity, and the replicas running and needed, per model: one rule set for scaling up, scaling
    down and the over-provisioning ticket."""
    rules: list[dict[str, Any]] = [
        {
            "record": DEMAND_RECORD,
            # An engine silent about its queue still counts its running requests, rather than dropping out of the
            # demand (and the replicas needed) altogether.
            "expr": (
                "sum by (model) (\n"
                "  plimsoll_requests_running\n"
                "  + (plimsoll_requests_waiting or plimsoll_requests_running * 0)\n"
                ")\n"
            ),
        },
        {
            "record": DEMAND_PEAK_RECORD,
            "expr": f"max_over_time({DEMAND_RECORD}[{duration(autoscaling.demand_window_seconds)}])",
        },
        # A data-parallel engine reports each rank apart: count its (instance, target) once.
        {"record": RUNNING_RECORD, "expr": f"count by (model) (count by ({REPLICA}) (plimsoll_requests_running))"},
    ]
    rules.extend(_capacity_rule(w, autoscaling.margin) for w in autoscaling.workloads)
    rules.extend(_needed_rule(w) for w in autoscaling.workloads)
    return {"name": GROUP_AUTOSCALING, "rules": rules}


def _cost_group(autoscaling: AutoscalingConfig | None) -> dict[str, Any]:
    """What each model's replicas cost, per hour and per day, from the daemons' price of each target's GPUs; with
    an `autoscaling:` section, also what the replicas beyond those needed cost, each at the mean cost of one
    running replica of the model (replicas of one model may run on different GPUs)."""
    hourly = [(HOURLY_COST_RUNNING_RECORD, DAILY_COST_RUNNING_RECORD, f"sum by (model) ({COST_GAUGE})\n")]
    if autoscaling is not None:
        hourly.append(
            (
                HOURLY_COST_NOT_NEEDED_RECORD,
                DAILY_COST_NOT_NEEDED_RECORD,
                (
                    f"clamp_min({RUNNING_RECORD} - on (model) {NEEDED_RECORD}, 0)\n"
                    "* on (model)\n"
                    f"avg by (model) ({COST_GAUGE})\n"
                ),
            )
        )
    rules = [{"record": record, "expr": expr} for record, _, expr in hourly]
    rules.extend({"record": daily, "expr": f"24 * {record}"} for record, daily, _ in hourly)
    return {"name": GROUP_COST, "rules": rules}


# Empty, and so left out, where no replica of the model has a price (or no prices are configured at all).
_NOT_NEEDED_COST = (
    f'{{{{ with printf "{DAILY_COST_NOT_NEEDED_RECORD}{{model=%q}}" $labels.model | query }}}}'
    "They cost about {{ . | first | value | humanize }} a day (in the currency of pricing.gpu_hour). {{ end }}"
)


def _autoscaling_alerts(config: Config, autoscaling: AutoscalingConfig) -> dict[str, Any]:
    alerting = config.alerting
    window = duration(autoscaling.overprovisioned_for_seconds)
    demand_window = duration(autoscaling.demand_window_seconds)
    cost = _NOT_NEEDED_COST if config.gpu_hour_prices else ""
    over = _alert(
        alerting,
        "PlimsollOverProvisioned",
        f"{RUNNING_RECORD} - on (model) {NEEDED_RECORD} > 0\n",
        autoscaling.overprovisioned_for_seconds,
        "ticket",
        f"{{{{ $labels.model }}}}: more replicas than its peak demand needs, for {window}",
        "{{ $labels.model }} has run more replicas than its peak demand needs for all of the last "
        f"{window}: {{{{ $value }}}} replicas could go now. {cost}Needed is the peak of running + waiting requests "
        f"over {demand_window} over one replica's capacity ({CAPACITY_RECORD}), never under min_replicas; lower "
        "min_replicas, or check that the scaler scales down.",
    )
    return {"name": GROUP_AUTOSCALING_ALERTS, "rules": [over]}


def groups(config: Config) -> list[dict[str, Any]]:
    """The rule groups, as the data a Prometheus rule file holds."""
    found = []
    if config.slos:
        found.append(_sli_group(config))
    found.append(_fleet_group())
    found.append(_capacity_group(config))
    if config.slos:
        found.append(_slo_group(config))
    found.append(_exporter_group(config.alerting))
    if config.autoscaling is not None:
        check_model_labels(config.autoscaling)
        found.append(_autoscaling_group(config.autoscaling))
        found.append(_autoscaling_alerts(config, config.autoscaling))
    if config.gpu_hour_prices:
        found.append(_cost_group(config.autoscaling))
    return found


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings (the expressions) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _dump(data: Any) -> str:
    # No folding: a folded annotation is valid YAML but hard to read and to diff.
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1 << 16, allow_unicode=True)


def _header(config: Config) -> str:
    slos = ", ".join(f"{s.name} {duration(s.threshold_seconds)} at {_percent(s.objective)}" for s in config.slos)
    return (
        "# Generated by `plimsoll generate` from the config; edit the config and regenerate, not this file.\n"
        f"# SLOs: {slos or 'none'} over {duration(config.slo_period_seconds)}; "
        f"saturation: KV usage {_number(config.saturation_kv_usage)}, lead time "
        f"{duration(config.lead_time_seconds)}.\n"
        "# Runbook: rules/RUNBOOK.md\n"
    )


def prometheus_rule_labels(config: Config) -> dict[str, str]:
    """The PrometheusRule's labels: the app's name and `alerting.rule_labels` (what the operator's ruleSelector
    matches; the config's win on a clash). The ServiceMonitor and PodMonitor carry the same."""
    return {"app.kubernetes.io/name": "plimsoll", **dict(config.alerting.rule_labels)}


def _prometheus_rule(config: Config) -> str:
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "plimsoll",
            "labels": {"app.kubernetes.io/component": "alerting-rules", **prometheus_rule_labels(config)},
        },
        "spec": {"groups": groups(config)},
    }
    return (
        _header(config) + "#\n"
        "# The labels past app.kubernetes.io/* come from alerting.rule_labels in the config: kube-prometheus-stack's\n"
        "# Prometheus selects rules by `release: <Helm release name>`. Set it to your release's name, or to {} where\n"
        "# the Prometheus selects every PrometheusRule (Helm value ruleSelectorNilUsesHelmValues: false).\n"
        "# No namespace is set: apply it with -n, or set it with kustomize.\n" + _dump(resource)
    )


def artifacts(config: Config) -> list[Artifact]:
    rule_file = _header(config) + _dump({"groups": groups(config)})
    return [Artifact(RULES_PATH, rule_file), Artifact(PROMETHEUS_RULE_PATH, _prometheus_rule(config))]
