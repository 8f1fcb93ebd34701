"""Grafana dashboards, built with grafanalib from the config's SLOs, saturation threshold and lead time.

Every threshold line that mirrors an alert reads the value the alert reads: the config's `alerting:` section
(drift ratio, fleet headroom floor, VRAM growth limit, the saturation gate, hold and trend window, the exporter's
job, the runbook) and the horizon and gate that `rules` derives from it, so a line sits exactly where its alert
fires.

Three dashboards, each answering one kind of question:

- `plimsoll-fleet`: how much room is left per model across every node, what saturates first, which SLOs burn,
  where the capacity model is off, and whether the daemons see their targets and GPUs;
- `plimsoll-instance`: one node or target up close: KV usage against the saturation threshold and capacity,
  queue and preemptions, the latency SLIs against their objectives, request footprint, GPU memory used against
  what the capacity model explains;
- `plimsoll-capacity-plan`: the capacity model's breakdown per target (weights, KV bytes per token, activation,
  overhead, KV capacity engine vs model), for the people who size the fleet.

Queries use the daemon's own series (README "Metrics") and Prometheus' `up` of its scrape jobs, so the dashboards
work the moment Prometheus scrapes a daemon. Two exceptions, each saying so: the daemon exports SLI counters, not
latency histograms, so latency quantiles come from vLLM's own `vllm:*_bucket` series (`ENGINE_HISTOGRAM_PANEL`);
and the fleet dashboard's "Replicas and cost" row, there only where the config has an `autoscaling:` section or
prices, reads the replica and cost recording rules by name, so it shows exactly what the scalers, the
over-provisioning ticket and the cost records compute. Those records are per model: only the Model variable
applies to them.

Every query filters on the dashboard variables with regex matchers (`instance=~"$node"`, `target=~"$target"`,
`model=~"$model"`; "All" is `.*`) and rates over `$__rate_interval`. `queries(config)` lists every panel's
expressions as written in the dashboards; `render(expr)` substitutes the variables (all `.*`, `$__rate_interval`
as `5m`) so an expression can run against a plain Prometheus.

grafanalib 0.7.1 writes Grafana 6-era JSON for some panels (bar gauge options under `fieldOptions`, gauge reduce
options under `fieldConfig`, table mappings outside `fieldConfig`) and legacy query fields; the small subclasses
below emit the current schema instead, so Grafana runs no migration on these files (`schemaVersion` 39).
"""

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attr
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from exporter.config import Config, SloConfig
from exporter.generate import Artifact
from exporter.generate.rules import (
    CAPACITY_RECORD,
    DAILY_COST_NOT_NEEDED_RECORD,
    DAILY_COST_RUNNING_RECORD,
    DEMAND_PEAK_RECORD,
    DEMAND_RECORD,
    HOURLY_COST_NOT_NEEDED_RECORD,
    HOURLY_COST_RUNNING_RECORD,
    NEEDED_RECORD,
    RUNNING_RECORD,
    duration,
    saturation_gate_ratio,
    saturation_horizon_seconds,
)
from exporter.slo import burn_rate_factors

SCHEMA_VERSION = 39  # Grafana 10.3+/11: no migration runs on load
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["plimsoll"]
ENGINE_HISTOGRAM_PANEL = "Latency at the objective's quantile, from vLLM's own histograms"
# What `render` puts in place of each dashboard variable: every value, and a rate window Prometheus accepts.
RENDER_DEFAULTS: Mapping[str, str] = {"node": ".*", "model": ".*", "target": ".*", "__rate_interval": "5m"}

# Label matchers for the three kinds of series (README "Metrics"): engine series carry target, engine, model and
# dp_rank; target health series carry target; GPU and daemon series carry neither. Prometheus adds `instance`.
ENGINE = 'instance=~"$node", target=~"$target", model=~"$model"'
TARGET = 'instance=~"$node", target=~"$target"'
NODE = 'instance=~"$node"'
# The per-model recording rules carry only `model` (and `source` where a capacity is behind them).
MODEL = 'model=~"$model"'
# The labels that tell engine instances apart across a fleet of daemons (target names may repeat across nodes).
INSTANCE_KEY = "instance, target, model, dp_rank"

SLO_TITLES = {"ttft": "TTFT", "itl": "ITL", "e2e": "End-to-end"}
SLO_MEANING = {
    "ttft": "time to first token",
    "itl": "inter-token latency",
    "e2e": "end-to-end request latency",
}
# vLLM's histogram for each SLI (v0.11+ names; `vllm:time_per_output_token_seconds` before ITL got its own).
VLLM_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds_bucket",
    "itl": "vllm:inter_token_latency_seconds_bucket",
    "e2e": "vllm:e2e_request_latency_seconds_bucket",
}

# Value mappings: the daemon reports +Inf for "no saturation in sight"; Grafana shows the JSON number as Infinity.
NEVER = g.StatValueMappings(
    g.StatValueMappingItem("never", "+Inf", "green", 0),
    g.StatValueMappingItem("never", "Infinity", "green", 1),
)


# --- grafanalib 0.7.1 gaps: current-schema JSON for queries, gauges, bar gauges and tables -------------------------


class PromTarget(g.Target):
    """A Prometheus query in Grafana's current query model (grafanalib's adds legacy `step`, `intervalFactor`...)."""

    def to_json_data(self) -> dict[str, Any]:
        return {
            "datasource": self.datasource,
            "editorMode": "code",
            "expr": self.expr,
            "format": self.format,
            "instant": self.instant,
            "legendFormat": self.legendFormat,
            "range": not self.instant,
            "refId": self.refId,
        }


def _gauge_field_config(panel: g.GaugePanel | g.BarGauge, **extra: Any) -> dict[str, Any]:
    """The fieldConfig current Grafana reads for gauges and bar gauges (grafanalib writes the Grafana 6 one)."""
    defaults = {
        "decimals": panel.decimals,
        "mappings": panel.valueMaps,
        "max": panel.max,
        "min": panel.min,
        "unit": panel.format,
        **extra,
    }
    return {"defaults": defaults, "overrides": []}


def _reduce_options(panel: g.GaugePanel | g.BarGauge) -> dict[str, Any]:
    return {"calcs": [panel.calc], "fields": "", "values": panel.allValues}


class Gauge(g.GaugePanel):
    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json(
            {
                "fieldConfig": _gauge_field_config(self),
                "options": {
                    "orientation": "auto",
                    "reduceOptions": _reduce_options(self),
                    "showThresholdLabels": self.thresholdLabels,
                    "showThresholdMarkers": self.thresholdMarkers,
                },
                "type": g.GAUGE_TYPE,
            }
        )


class BarGauge(g.BarGauge):
    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json(
            {
                "fieldConfig": _gauge_field_config(self, color={"mode": "thresholds"}),
                "options": {
                    "displayMode": self.displayMode,
                    "orientation": self.orientation,
                    "reduceOptions": _reduce_options(self),
                    "showUnfilled": True,
                    "valueMode": "color",
                },
                "type": g.BARGAUGE_TYPE,
            }
        )


class Table(g.Table):
    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json(
            {
                "fieldConfig": {
                    "defaults": {
                        "custom": {
                            "align": self.align,
                            "cellOptions": {"type": self.displayMode},
                            "filterable": self.filterable,
                        },
                        "mappings": self.mappings,
                        "unit": self.unit,
                    },
                    "overrides": self.overrides,
                },
                "options": {"showHeader": self.showHeader, "sortBy": self.sortBy},
                "type": g.TABLE_TYPE,
            }
        )


# --- building blocks ------------------------------------------------------------------------------------------------


def _steps(*steps: tuple[str, float | None]) -> list[dict[str, Any]]:
    """Threshold steps, lowest first; the first one is the base (value null)."""
    return [
        {"color": color, "value": None if i == 0 or value is None else float(value)}
        for i, (color, value) in enumerate(steps)
    ]


def _num(value: float) -> str:
    """A number as PromQL reads it: 0.99, 14.4, 900."""
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def _seconds_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:g} min"
    return f"{seconds / 3600:g} h"


def _percent_text(ratio: float) -> str:
    return f"{ratio * 100:g}%"


def _q(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, table: bool = False) -> PromTarget:
    return PromTarget(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        format=g.TABLE_TARGET_FORMAT if table else g.TIME_SERIES_TARGET_FORMAT,
        datasource=DATASOURCE,
    )


def _refs(queries: Sequence[tuple[str, str]], *, instant: bool = False, table: bool = False) -> list[PromTarget]:
    """(expr, legend) pairs as queries A, B, C..."""
    return [
        _q(expr, legend, chr(ord("A") + i), instant=instant, table=table) for i, (expr, legend) in enumerate(queries)
    ]


def _timeseries(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    thresholds: list[dict[str, Any]] | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    stacked: bool = False,
    log: int | None = None,
    overrides: list[dict[str, Any]] | None = None,
) -> g.TimeSeries:
    return g.TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_refs(queries),
        unit=unit,
        thresholds=thresholds or _steps(("green", None)),
        thresholdsStyleMode="line" if thresholds else "off",
        valueMin=minimum,
        valueMax=maximum,
        fillOpacity=30 if stacked else 0,
        stacking={"group": "A", "mode": "normal"} if stacked else {"group": "A", "mode": "none"},
        scaleDistributionType="log" if log else "linear",
        scaleDistributionLog=log or 2,
        overrides=overrides or [],
        legendDisplayMode="list",
        tooltipMode="multi",
        tooltipSort="desc",
        maxDataPoints=None,
    )


def _stat(
    title: str,
    description: str,
    expr: str,
    unit: str,
    thresholds: list[dict[str, Any]],
    *,
    mappings: list[Any] | None = None,
    legend: str = "",
    no_value: str = "no data",
) -> g.Stat:
    return g.Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[_q(expr, legend)],
        format=unit,
        thresholds=thresholds,
        mappings=mappings or [],
        reduceCalc="lastNotNull",
        graphMode="area",
        colorMode="value",
        noValue=no_value,
        maxDataPoints=None,
    )


def _bargauge(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    thresholds: list[dict[str, Any]],
    *,
    maximum: float | None = None,
) -> BarGauge:
    return BarGauge(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_refs(queries, instant=True),
        format=unit,
        thresholds=thresholds,
        calc="lastNotNull",
        displayMode=g.GAUGE_DISPLAY_MODE_GRADIENT,
        orientation=g.ORIENTATION_HORIZONTAL,
        min=0,
        max=maximum,
        maxDataPoints=None,
    )


def _eta_thresholds(config: Config) -> list[dict[str, Any]]:
    """Red inside the "saturation ahead" alert's horizon, orange within twice it."""
    horizon = saturation_horizon_seconds(config)
    return _steps(("red", None), ("orange", horizon), ("green", 2 * horizon))


def _horizon_text(config: Config) -> str:
    hold = config.alerting.saturation_ahead_for_seconds
    return (
        f"{_seconds_text(saturation_horizon_seconds(config))} (the lead time, "
        f"{_seconds_text(config.lead_time_seconds)}, plus the alert's {_seconds_text(hold)} hold)"
    )


def _usage_thresholds(config: Config) -> list[dict[str, Any]]:
    """Orange above the gate where a rising trend may page, red at the saturation threshold."""
    return _steps(("green", None), ("orange", saturation_gate_ratio(config)), ("red", config.saturation_kv_usage))


def _headroom_thresholds(config: Config) -> list[dict[str, Any]]:
    """Red under the floor of the fleet headroom alert."""
    return _steps(("red", None), ("green", config.alerting.fleet_headroom_min_requests))


def _place(sections: Iterable[tuple[str | None, Sequence[tuple[g.Panel, int, int]]]]) -> list[g.Panel]:
    """Lay panels out left to right on Grafana's 24-column grid, a row header before each titled section."""
    placed: list[g.Panel] = []
    y = 0
    for title, items in sections:
        if not items:
            continue
        if title:
            placed.append(g.RowPanel(title=title, gridPos=g.GridPos(h=1, w=24, x=0, y=y)))
            y += 1
        x = row_height = 0
        for panel, width, height in items:
            if x + width > 24:
                y, x, row_height = y + row_height, 0, 0
            placed.append(attr.evolve(panel, gridPos=g.GridPos(h=height, w=width, x=x, y=y)))
            x, row_height = x + width, max(row_height, height)
        y += row_height
    return placed


def _variables() -> list[g.Template]:
    datasource = g.Template(
        name="datasource",
        label="Data source",
        type="datasource",
        query="prometheus",
        includeAll=False,
        multi=False,
        regex="",
    )
    everything = {"selected": True, "text": ["All"], "value": ["$__all"]}
    variables = [datasource]
    for name, label, query in (
        ("node", "Node", "label_values(plimsoll_build_info, instance)"),
        ("model", "Model", 'label_values(plimsoll_requests_running{instance=~"$node"}, model)'),
        ("target", "Target", 'label_values(plimsoll_target_up{instance=~"$node"}, target)'),
    ):
        variable = g.Template(
            name=name,
            label=label,
            query=query,
            dataSource=DATASOURCE,
            multi=True,
            includeAll=True,
            allValue=".*",
            refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
            sort=g.SORT_ALPHA_ASC,
            regex="",
        )
        variable._current = dict(everything)  # "All" selected until the user picks (grafanalib has no parameter)
        variables.append(variable)
    return variables


def _dashboard(uid: str, title: str, description: str, panels: list[g.Panel], runbook_url: str) -> g.Dashboard:
    return g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=TAGS,
        panels=panels,
        templating=g.Templating(list=_variables()),
        links=[
            g.DashboardLink(title="Plimsoll", tags=TAGS, asDropdown=True, includeVars=True, keepTime=True),
            g.DashboardLink(
                title="Runbook",
                type="link",
                uri=runbook_url,
                tooltip="What each Plimsoll alert means and what to do",
                targetBlank=True,
                keepTime=False,
            ),
        ],
        time=g.Time("now-6h", "now"),
        refresh="30s",
        timezone="browser",
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        schemaVersion=SCHEMA_VERSION,
        editable=True,
    ).auto_panel_ids()


# --- expressions ----------------------------------------------------------------------------------------------------


def _sli(slo: SloConfig, by: str, window: str) -> str:
    """Share of requests within the SLO's threshold: good / total over `window`."""
    good = f'plimsoll_slo_good_requests_total{{{ENGINE}, slo="{slo.name}"}}'
    total = f'plimsoll_slo_requests_total{{{ENGINE}, slo="{slo.name}"}}'
    return f"sum by ({by}) (rate({good}[{window}])) / sum by ({by}) (rate({total}[{window}]))"


def _burn(slo: SloConfig, by: str, window: str) -> str:
    """Error ratio over `window` divided by the error budget (1 - objective): 1 spends the budget over the period."""
    return f"(1 - ({_sli(slo, by, window)})) / (1 - {_num(slo.objective)})"


def _modeled_parts(scope: str) -> list[tuple[str, str]]:
    """What the capacity model puts on one GPU of a target, part by part. The KV pool is capacity x bytes per token
    (exact for models whose layers share one attention kind; the daemon's unexplained figure uses the exact pool)."""
    return [
        ("weights", f"plimsoll_model_weights_bytes{{{scope}}}"),
        (
            "KV pool",
            f"plimsoll_model_kv_bytes_per_token{{{scope}}}"
            f' * ignoring (source) plimsoll_kv_cache_capacity_tokens{{{scope}, source="model"}}',
        ),
        ("activation", f"plimsoll_model_activation_bytes{{{scope}}}"),
        ("overhead", f"plimsoll_model_overhead_bytes{{{scope}}}"),
    ]


def _modeled_total(scope: str) -> str:
    return " + ".join(f"({expr})" if part == "KV pool" else expr for part, expr in _modeled_parts(scope))


def _with_gpu_name(expr: str) -> str:
    """Label a per-GPU series with the GPU's product name from plimsoll_gpu_info."""
    return (
        f"max by (instance, gpu, name) ({expr}"
        f" * on (instance, gpu) group_left (name) max by (instance, gpu, name) (plimsoll_gpu_info{{{NODE}}}))"
    )


# --- the dashboards -------------------------------------------------------------------------------------------------


def fleet(config: Config) -> g.Dashboard:
    page = burn_rate_factors(config.slos[0].objective, config.slo_period_seconds / 86400)[0] if config.slos else None
    p95_headroom = f'plimsoll_headroom_requests{{{ENGINE}, footprint="p95"}}'
    status = [
        (
            _stat(
                "Targets down",
                "How many engine targets the daemons could not read on their last poll (plimsoll_target_up == 0). "
                "A down target reports no headroom, so the fleet figures below undercount while this is above 0.",
                f"count(plimsoll_target_up{{{TARGET}}} == 0) or vector(0)",
                "short",
                _steps(("green", None), ("red", 1)),
            ),
            4,
            4,
        ),
        (
            _stat(
                "Nodes with NVML down",
                "Daemons whose last NVML read failed (plimsoll_nvml_up == 0): no driver, or a lost GPU. Engine metrics "
                "keep flowing, but GPU memory and unexplained VRAM are blind on those nodes.",
                f"count(plimsoll_nvml_up{{{NODE}}} == 0) or vector(0)",
                "short",
                _steps(("green", None), ("red", 1)),
            ),
            4,
            4,
        ),
        (
            _stat(
                "Daemons reporting",
                "Plimsoll daemons Prometheus scrapes successfully (up == 1 on the jobs matching "
                f"{config.alerting.exporter_job}, which PlimsollExporterAbsent watches; one per node as a DaemonSet). "
                "A node missing here is a node whose headroom nobody sees.",
                f'count(up{{job=~"{config.alerting.exporter_job}", {NODE}}} == 1) or vector(0)',
                "short",
                _steps(("red", None), ("green", 1)),
            ),
            4,
            4,
        ),
        (
            _stat(
                "Soonest saturation",
                "The shortest time until any engine instance's KV usage reaches the saturation threshold "
                f"({_percent_text(config.saturation_kv_usage)}) at its current trend. Red inside the horizon of the "
                f"'saturation ahead' alert, {_horizon_text(config)}; 'never' when every trend is flat or falling.",
                f"min(plimsoll_saturation_eta_seconds{{{ENGINE}}})",
                "s",
                _eta_thresholds(config),
                mappings=[NEVER],
            ),
            6,
            4,
        ),
        (
            _stat(
                "Fleet headroom (p95 requests)",
                "Requests of the observed p95 size (prompt + output tokens) that still fit in the KV caches of every "
                "selected engine instance together: how much more load the fleet takes before it queues.",
                f"sum({p95_headroom})",
                "short",
                _steps(("red", None), ("green", 1)),
            ),
            6,
            4,
        ),
    ]
    headroom = [
        (
            _bargauge(
                "Headroom per model now (requests of p95 size)",
                "Per model, the requests of the observed p95 footprint that still fit across all its replicas "
                "(sum by model of plimsoll_headroom_requests). Red under "
                f"{_num(config.alerting.fleet_headroom_min_requests)}, where PlimsollFleetHeadroomLow fires: the "
                "model needs replicas before load grows.",
                [(f"sum by (model) ({p95_headroom})", "{{model}}")],
                "short",
                _headroom_thresholds(config),
            ),
            8,
            8,
        ),
        (
            _timeseries(
                "Headroom per model (KV tokens)",
                "KV-cache tokens that still fit, summed over every replica of each model: the raw room left, "
                "independent of request size.",
                [(f"sum by (model) (plimsoll_kv_cache_headroom_tokens{{{ENGINE}}})", "{{model}}")],
                "short",
                minimum=0,
            ),
            8,
            8,
        ),
        (
            _timeseries(
                "Headroom per model (requests)",
                "Requests of the observed mean and p95 footprint that still fit, summed over every replica of each "
                "model. Plan against p95: the mean overstates room when request sizes vary. The line is the floor "
                f"of PlimsollFleetHeadroomLow ({_num(config.alerting.fleet_headroom_min_requests)} p95 requests).",
                [
                    (f"sum by (model) ({p95_headroom})", "{{model}} p95"),
                    (f'sum by (model) (plimsoll_headroom_requests{{{ENGINE}, footprint="mean"}})', "{{model}} mean"),
                ],
                "short",
                thresholds=_headroom_thresholds(config),
                minimum=0,
            ),
            8,
            8,
        ),
    ]
    saturation = [
        (
            Table(
                title="Time to saturation per model and target",
                description="For each model and target, the time until KV usage reaches the saturation threshold "
                f"({_percent_text(config.saturation_kv_usage)}) at the current trend (a robust slope over the last "
                f"minutes). Red inside {_horizon_text(config)}, where the 'saturation ahead' alert looks; 'never' "
                "when flat or falling.",
                dataSource=DATASOURCE,
                targets=[
                    _q(
                        f"min by (model, target) (plimsoll_saturation_eta_seconds{{{ENGINE}}})",
                        instant=True,
                        table=True,
                    )
                ],
                unit="s",
                thresholds=_eta_thresholds(config),
                mappings=[NEVER],
                displayMode="color-text",
                sortBy=[g.TableSortByField(displayName="time to saturation", desc=False)],
                transformations=[
                    {
                        "id": "organize",
                        "options": {
                            "excludeByName": {"Time": True},
                            "indexByName": {"model": 0, "target": 1, "Value": 2},
                            "renameByName": {"Value": "time to saturation"},
                        },
                    }
                ],
                maxDataPoints=None,
            ),
            10,
            8,
        ),
        (
            _timeseries(
                "KV usage per model (fullest replica)",
                "The highest KV-cache usage among each model's replicas, against the saturation threshold "
                f"({_percent_text(config.saturation_kv_usage)}, the red line). Above it the engine queues or preempts; "
                f"above the orange line ({_percent_text(saturation_gate_ratio(config))}) a rising trend may page.",
                [(f"max by (model) (plimsoll_kv_cache_usage_ratio{{{ENGINE}}})", "{{model}}")],
                "percentunit",
                thresholds=_usage_thresholds(config),
                minimum=0,
                maximum=1,
            ),
            14,
            8,
        ),
    ]
    slos: list[tuple[g.Panel, int, int]] = []
    if config.slos and page is not None:
        names = ", ".join(
            f"{SLO_TITLES[s.name]} {_seconds_text(s.threshold_seconds)} at {_percent_text(s.objective)}"
            for s in config.slos
        )
        slos.append(
            (
                _timeseries(
                    "SLO burn rate over 1h, per model",
                    f"How fast each model spends its error budget ({names}): the share of requests over the latency "
                    "threshold in the last hour, divided by the budget (1 - objective). 1 (orange line) spends the "
                    f"budget exactly over the {config.slo_period_seconds / 86400:g}-day period; "
                    f"{page.factor:g} (red line) spends {_percent_text(page.budget_fraction)} of it within the hour, "
                    "where the page-level burn alert starts.",
                    [(_burn(s, "model", "1h"), f"{{{{model}}}} {s.name}") for s in config.slos],
                    "short",
                    thresholds=_steps(("green", None), ("orange", 1), ("red", page.factor)),
                    minimum=0,
                ),
                12,
                8,
            )
        )
    drift_ratio = config.alerting.capacity_drift_ratio
    drift = (
        _timeseries(
            "Capacity model drift per target",
            "(engine KV capacity - model KV capacity) / model capacity for every engine instance with a model. "
            f"Beyond ±{_percent_text(drift_ratio)} (the lines, where PlimsollCapacityModelDrift fires) the engine "
            "allocated a pool the model did not predict: "
            "a different gpu_memory_utilization or max_num_seqs than configured, another tenant on the GPU, or a "
            "model miss. Plans and predicted headroom are only as good as this.",
            [(f"plimsoll_model_capacity_error_ratio{{{ENGINE}}}", "{{model}} {{target}} {{dp_rank}}")],
            "percentunit",
            thresholds=_steps(("red", None), ("green", -drift_ratio), ("red", drift_ratio)),
        ),
        12 if slos else 24,
        8,
    )
    return _dashboard(
        "plimsoll-fleet",
        "Plimsoll / Fleet",
        "How much room is left per model across the fleet, what saturates first, which SLOs burn, whether the "
        "daemons see their targets and GPUs, and (with autoscaling or prices configured) the replicas needed and "
        "what the replicas cost.",
        _place(
            [
                (None, status),
                ("Headroom", headroom),
                ("Saturation", saturation),
                ("SLOs and capacity model", [*slos, drift]),
                ("Replicas and cost", [*_replica_panels(config), *_cost_panels(config)]),
            ]
        ),
        config.alerting.runbook_url,
    )


def _replica_panels(config: Config) -> list[tuple[g.Panel, int, int]]:
    """Replicas needed against running, and demand against capacity, per model: what the scalers and
    PlimsollOverProvisioned act on."""
    autoscaling = config.autoscaling
    if autoscaling is None:
        return []
    running = f"{RUNNING_RECORD}{{{MODEL}}}"
    window = _seconds_text(autoscaling.demand_window_seconds)
    return [
        (
            _timeseries(
                "Replicas needed vs running per model",
                "Per model, the replicas running (engine servers: a data-parallel engine's ranks count once) and the "
                f"replicas its peak demand over {window} needs, within each workload's min and max ({NEEDED_RECORD}, "
                "the number the KEDA and HPA scalers drive to). Running above needed for "
                f"{_seconds_text(autoscaling.overprovisioned_for_seconds)} is PlimsollOverProvisioned; source says "
                "whether a replica's capacity is the measured knee or the capacity model.",
                [(running, "{{model}} running"), (f"{NEEDED_RECORD}{{{MODEL}}}", "{{model}} needed ({{source}})")],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
        (
            _timeseries(
                "Demand against capacity per model (requests)",
                "Per model, requests running + waiting over every replica, its peak over "
                f"{window} (what the replicas needed follow), and what the replicas running hold: one replica's "
                f"capacity x {_num(autoscaling.margin)} (autoscaling.margin) x the replicas running. Demand above "
                "the capacity line queues; far below it for long, replicas could go.",
                [
                    (f"{DEMAND_RECORD}{{{MODEL}}}", "{{model}} demand"),
                    (
                        f"{DEMAND_PEAK_RECORD}{{{MODEL}}}",
                        f"{{{{model}}}} peak over {duration(autoscaling.demand_window_seconds)}",
                    ),
                    (
                        f"{CAPACITY_RECORD}{{{MODEL}}} * on (model) {running}",
                        "{{model}} capacity of the replicas running",
                    ),
                ],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
    ]


def _cost_panels(config: Config) -> list[tuple[g.Panel, int, int]]:
    """What the replicas running cost, and those beyond the replicas needed (with an `autoscaling:` section), per
    hour and per day, in the currency of the config's prices."""
    if not config.gpu_hour_prices:
        return []
    currency = "in the currency of pricing.gpu_hour"
    hourly = [(f"{HOURLY_COST_RUNNING_RECORD}{{{MODEL}}}", "{{model}} running")]
    daily = [
        (
            "GPU cost per day, replicas running",
            "What the GPUs of every replica running cost per day at the current rate, summed over the selected "
            f"models ({DAILY_COST_RUNNING_RECORD}, {currency}). Replicas on a GPU without a price are left out.",
            DAILY_COST_RUNNING_RECORD,
        )
    ]
    if config.autoscaling is not None:
        hourly.append((f"{HOURLY_COST_NOT_NEEDED_RECORD}{{{MODEL}}}", "{{model}} not needed"))
        daily.append(
            (
                "GPU cost per day, replicas not needed",
                "What the replicas running beyond those needed would cost per day at the current rate, each at the "
                f"mean cost of one running replica of its model ({DAILY_COST_NOT_NEEDED_RECORD}, {currency}): what "
                "scaling down to the replicas needed saves.",
                DAILY_COST_NOT_NEEDED_RECORD,
            )
        )
    panels: list[tuple[g.Panel, int, int]] = [
        (
            _timeseries(
                "GPU cost per hour per model",
                "Per model, what the GPUs of its replicas running cost per hour, and what those beyond the replicas "
                f"needed cost ({currency}). The daemon prices each target's GPUs from pricing.gpu_hour.",
                hourly,
                "suffix:/h",
                minimum=0,
            ),
            12,
            8,
        )
    ]
    panels.extend(
        (
            _stat(title, description, f"sum({record}{{{MODEL}}})", "suffix:/day", _steps(("blue", None))),
            12 // len(daily),
            8,
        )
        for title, description, record in daily
    )
    return panels


def _sli_panel(slo: SloConfig) -> g.TimeSeries:
    name = SLO_TITLES[slo.name]
    return _timeseries(
        f"{name} SLI: requests within {_seconds_text(slo.threshold_seconds)}",
        f"Share of requests whose {SLO_MEANING[slo.name]} was within {_seconds_text(slo.threshold_seconds)}, per "
        f"target (plimsoll_slo_good_requests_total / plimsoll_slo_requests_total), against the objective "
        f"{_percent_text(slo.objective)} (the line). Below the line the error budget burns. The daemon counts these "
        "from the engine's latency histogram at the threshold; it does not re-export latencies.",
        [(_sli(slo, "instance, target", "$__rate_interval"), "{{instance}} {{target}}")],
        "percentunit",
        thresholds=_steps(("red", None), ("green", slo.objective)),
        maximum=1,
    )


def _engine_histogram_panel(config: Config) -> g.TimeSeries:
    """Latency quantiles straight from vLLM's histograms, one query per SLO, each with its own threshold line.
    The quantile is the objective: at 99% the p99 must stay under the threshold for the SLO to hold."""
    queries = []
    overrides = []
    for i, slo in enumerate(config.slos):
        bucket = f'{VLLM_HISTOGRAMS[slo.name]}{{model_name=~"$model"}}'
        queries.append(
            (
                f"histogram_quantile({_num(slo.objective)}, "
                f"sum by (le, model_name) (rate({bucket}[$__rate_interval])))",
                f"{{{{model_name}}}} {slo.name} p{slo.objective * 100:g}",
            )
        )
        overrides.append(
            {
                "matcher": {"id": "byFrameRefID", "options": chr(ord("A") + i)},
                "properties": [
                    {
                        "id": "thresholds",
                        "value": {"mode": "absolute", "steps": _steps(("green", None), ("red", slo.threshold_seconds))},
                    },
                    {"id": "custom.thresholdsStyle", "value": {"mode": "line"}},
                ],
            }
        )
    thresholds = ", ".join(f"{SLO_TITLES[s.name]} {_seconds_text(s.threshold_seconds)}" for s in config.slos)
    return _timeseries(
        ENGINE_HISTOGRAM_PANEL,
        "Raw latency quantiles for vLLM engines, read from vLLM's own histograms (vllm:*_seconds_bucket, scraped "
        "from the engines themselves, not from Plimsoll), at the quantile each objective names, against the SLO "
        f"thresholds ({thresholds}; one line per series). Only the Model variable applies: vLLM labels its "
        "series model_name and its instance is the engine, not the node. Other engines: query their histograms "
        "(e.g. sglang:time_to_first_token_seconds_bucket) the same way.",
        queries,
        "s",
        log=10,
        overrides=overrides,
    )


def instance(config: Config) -> g.Dashboard:
    engine_legend = "{{instance}} {{target}} {{dp_rank}}"
    trend_window = config.alerting.saturation_trend_window_seconds
    horizon = saturation_horizon_seconds(config)
    growth = config.alerting.vram_growth_bytes_per_hour
    kv = [
        (
            _timeseries(
                "KV cache usage vs saturation threshold",
                "KV-cache usage each engine reports (0..1), against the configured saturation threshold "
                f"({_percent_text(config.saturation_kv_usage)}, the red line) and the threshold the daemon uses now "
                "(plimsoll loadtest may calibrate it). Above the threshold requests queue and get preempted. The "
                f"'projected' series: the linear trend over {_seconds_text(trend_window)} projected "
                f"{_seconds_text(horizon)} ahead, as the "
                "'saturation ahead' alert reads it above the orange gate.",
                [
                    (f"plimsoll_kv_cache_usage_ratio{{{ENGINE}}}", engine_legend),
                    (
                        f"predict_linear(plimsoll_kv_cache_usage_ratio{{{ENGINE}}}[{duration(trend_window)}], "
                        f"{_num(horizon)})",
                        f"projected {engine_legend}",
                    ),
                    (
                        f"max by (instance) (plimsoll_saturation_threshold_ratio{{{NODE}}})",
                        "threshold in use {{instance}}",
                    ),
                ],
                "percentunit",
                thresholds=_usage_thresholds(config),
                minimum=0,
                maximum=1,
            ),
            12,
            8,
        ),
        (
            Gauge(
                title="KV cache usage now",
                description="Current KV-cache usage per engine instance; red at the saturation threshold "
                f"({_percent_text(config.saturation_kv_usage)}).",
                dataSource=DATASOURCE,
                targets=[_q(f"plimsoll_kv_cache_usage_ratio{{{ENGINE}}}", engine_legend, instant=True)],
                format="percentunit",
                min=0,
                max=1,
                calc="lastNotNull",
                thresholds=_usage_thresholds(config),
                maxDataPoints=None,
            ),
            6,
            8,
        ),
        (
            _stat(
                "Time to saturation",
                "Per target, the shortest time until KV usage reaches the saturation threshold at the current trend. "
                f"Red inside {_horizon_text(config)}, where the 'saturation ahead' alert looks; 'never' when flat "
                "or falling.",
                f"min by (instance, target) (plimsoll_saturation_eta_seconds{{{ENGINE}}})",
                "s",
                _eta_thresholds(config),
                mappings=[NEVER],
                legend="{{instance}} {{target}}",
            ),
            6,
            8,
        ),
        (
            _timeseries(
                "KV capacity: engine allocated vs model predicted, and in use",
                "KV-cache tokens the engine allocated (source=engine), what the capacity model predicts for the "
                "configured deployment (source=model), and tokens in use. A gap between engine and model is "
                "capacity drift; used approaching the engine's capacity is saturation.",
                [
                    (f"plimsoll_kv_cache_capacity_tokens{{{ENGINE}}}", f"{engine_legend} capacity ({{{{source}}}})"),
                    (f"plimsoll_kv_cache_used_tokens{{{ENGINE}}}", f"{engine_legend} used"),
                ],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
        (
            _timeseries(
                "Headroom: requests that still fit",
                "Requests of the observed mean and p95 footprint that still fit in each engine's free KV cache.",
                [(f"plimsoll_headroom_requests{{{ENGINE}}}", f"{engine_legend} {{{{footprint}}}}")],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
    ]
    load = [
        (
            _timeseries(
                "Queue: running and waiting requests",
                "Requests each engine runs and holds in its queue. Waiting requests with KV usage at the threshold "
                "mean the engine is saturated now.",
                [
                    (f"plimsoll_requests_running{{{ENGINE}}}", f"{engine_legend} running"),
                    (f"plimsoll_requests_waiting{{{ENGINE}}}", f"{engine_legend} waiting"),
                ],
                "short",
                minimum=0,
            ),
            8,
            8,
        ),
        (
            _timeseries(
                "Preemptions per second",
                "Requests the engine preempted (SGLang: retracted) to free KV cache. Any sustained rate means the "
                "cache is too small for the load: each preemption recomputes or swaps a request.",
                [(f"rate(plimsoll_preemptions_total{{{ENGINE}}}[$__rate_interval])", engine_legend)],
                "reqps",
                minimum=0,
            ),
            8,
            8,
        ),
        (
            _timeseries(
                "Token throughput",
                "Prompt and generated tokens per second per engine instance: the load behind the KV usage.",
                [
                    (f"rate(plimsoll_prompt_tokens_total{{{ENGINE}}}[$__rate_interval])", f"{engine_legend} prompt"),
                    (
                        f"rate(plimsoll_generation_tokens_total{{{ENGINE}}}[$__rate_interval])",
                        f"{engine_legend} generated",
                    ),
                ],
                "short",
                minimum=0,
            ),
            8,
            8,
        ),
    ]
    latency: list[tuple[g.Panel, int, int]] = [(_sli_panel(slo), 24 // len(config.slos), 8) for slo in config.slos]
    if config.slos:
        latency.append((_engine_histogram_panel(config), 24, 8))
    requests = [
        (
            _timeseries(
                "Request footprint (prompt + output tokens)",
                "Tokens one request holds in the KV cache at its end, mean and p95, per engine instance: the size "
                "that headroom in requests is counted in, and the context to plan with.",
                [(f"plimsoll_request_footprint_tokens{{{ENGINE}}}", f"{engine_legend} {{{{footprint}}}}")],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
        (
            _timeseries(
                "Target polls: failures per second by reason",
                "Why the daemon could not read a target: timeout, refused, http_status, too_large, not_metrics, "
                "unknown_engine, error. A target with failures shows stale or no headroom.",
                [
                    (
                        f"sum by (instance, target, reason) "
                        f"(rate(plimsoll_target_poll_failures_total{{{TARGET}}}[$__rate_interval]))",
                        "{{instance}} {{target}} {{reason}}",
                    )
                ],
                "reqps",
                minimum=0,
            ),
            12,
            8,
        ),
    ]
    attributed = f'group by (instance, gpu, target) (plimsoll_gpu_process_memory_bytes{{{TARGET}, target!=""}})'
    gpu = [
        (
            _timeseries(
                "VRAM per GPU: used vs modeled",
                "GPU memory in use and in total (NVML), and what the capacity model explains on that GPU: weights + "
                "KV pool + activation + overhead of the target running on it (shown where the GPU's processes belong "
                "to one target). Used far above modeled is memory the model does not know about.",
                [
                    (f"plimsoll_gpu_memory_used_bytes{{{NODE}}}", "{{instance}} GPU {{gpu}} used"),
                    (f"plimsoll_gpu_memory_total_bytes{{{NODE}}}", "{{instance}} GPU {{gpu}} total"),
                    (
                        f"sum by (instance, gpu) ({attributed} * on (instance, target) group_left () "
                        f"sum by (instance, target) ({_modeled_total(ENGINE)}))",
                        "{{instance}} GPU {{gpu}} modeled",
                    ),
                ],
                "bytes",
                minimum=0,
            ),
            12,
            8,
        ),
        (
            _timeseries(
                "Modeled memory per GPU, by part",
                "What the capacity model puts on each GPU of a target, stacked: weights, KV pool (model capacity x "
                "KV bytes per token), activation peak, and overhead (non-torch memory and CUDA graphs).",
                [
                    (f"sum by (instance, target) ({expr})", f"{{{{instance}}}} {{{{target}}}} {part}")
                    for part, expr in _modeled_parts(ENGINE)
                ],
                "bytes",
                stacked=True,
                minimum=0,
            ),
            12,
            8,
        ),
        (
            _timeseries(
                "Unexplained VRAM per GPU",
                "GPU memory used beyond what the capacity models of the GPU's targets explain "
                "(plimsoll_vram_unexplained_bytes; only on GPUs where every target has a model). Growing: a leak or "
                "a co-tenant; steady and large: fragmentation, or a model that misses this deployment.",
                [(f"plimsoll_vram_unexplained_bytes{{{NODE}}}", "{{instance}} GPU {{gpu}}")],
                "bytes",
            ),
            12,
            8,
        ),
        (
            _timeseries(
                "Unexplained VRAM growth per GPU (per hour)",
                "How fast unexplained GPU memory grows: the least-squares slope over the last hour, per hour. Above "
                f"the line ({_num(growth)} bytes per hour) PlimsollVRAMUnexplainedGrowing fires after 15m: a leak in "
                "the engine or another tenant on the GPU.",
                [(f"deriv(plimsoll_vram_unexplained_bytes{{{NODE}}}[1h]) * 3600", "{{instance}} GPU {{gpu}}")],
                "bytes",
                thresholds=_steps(("green", None), ("red", growth)),
            ),
            12,
            8,
        ),
        (
            _bargauge(
                "GPU memory used (share of total)",
                "Memory in use on each GPU as a share of its total (NVML).",
                [
                    (
                        f"plimsoll_gpu_memory_used_bytes{{{NODE}}} / plimsoll_gpu_memory_total_bytes{{{NODE}}}",
                        "{{instance}} GPU {{gpu}}",
                    )
                ],
                "percentunit",
                _steps(("green", None), ("orange", 0.95)),
                maximum=1,
            ),
            12,
            8,
        ),
    ]
    return _dashboard(
        "plimsoll-instance",
        "Plimsoll / Instance",
        "One node or target up close: KV usage against the saturation threshold and capacity, queue and "
        "preemptions, latency SLIs against their objectives, request footprint, and GPU memory used against what "
        "the capacity model explains.",
        _place(
            [
                ("KV cache and headroom", kv),
                ("Load", load),
                ("Latency SLOs", latency),
                ("Requests and polls", requests),
                ("GPU memory", gpu),
            ]
        ),
        config.alerting.runbook_url,
    )


# Columns of the capacity-plan table: (query, column title, unit).
def _plan_columns() -> list[tuple[str, str, str]]:
    def by(expr: str) -> str:
        return f"max by ({INSTANCE_KEY}) ({expr})"

    return [
        (by(f"plimsoll_model_weights_bytes{{{ENGINE}}}"), "weights / GPU", "bytes"),
        (by(f"plimsoll_model_kv_bytes_per_token{{{ENGINE}}}"), "KV bytes / token / GPU", "bytes"),
        (by(f"plimsoll_model_activation_bytes{{{ENGINE}}}"), "activation / GPU", "bytes"),
        (by(f"plimsoll_model_overhead_bytes{{{ENGINE}}}"), "overhead / GPU", "bytes"),
        (by(f'plimsoll_kv_cache_capacity_tokens{{{ENGINE}, source="engine"}}'), "KV tokens (engine)", "short"),
        (by(f'plimsoll_kv_cache_capacity_tokens{{{ENGINE}, source="model"}}'), "KV tokens (model)", "short"),
        (by(f"plimsoll_model_capacity_error_ratio{{{ENGINE}}}"), "capacity error", "percentunit"),
        (
            by(f'plimsoll_kv_cache_capacity_tokens{{{ENGINE}, source="engine"}}')
            + " / "
            + by(f'plimsoll_request_footprint_tokens{{{ENGINE}, footprint="p95"}}'),
            "requests of p95 size at full KV",
            "short",
        ),
    ]


def _merged_table(title: str, description: str, columns: Sequence[tuple[str, str, str]], keys: Sequence[str]) -> Table:
    """Instant queries, one column each, merged on their labels into one row per series."""
    refs = [chr(ord("A") + i) for i in range(len(columns))]
    names = {f"Value #{ref}": name for ref, (_, name, _) in zip(refs, columns, strict=True)}
    order = {key: i for i, key in enumerate(keys)} | {f"Value #{ref}": len(keys) + i for i, ref in enumerate(refs)}
    return Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[_q(expr, "", ref, instant=True, table=True) for ref, (expr, _, _) in zip(refs, columns, strict=True)],
        unit="short",
        thresholds=_steps(("text", None)),
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True}, "indexByName": order, "renameByName": names},
            },
        ],
        overrides=[
            {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
            for _, name, unit in columns
        ],
        filterable=True,
        maxDataPoints=None,
    )


def capacity_plan(config: Config) -> g.Dashboard:
    columns = _plan_columns()
    breakdown = [
        (
            _merged_table(
                "Capacity model per target (per GPU)",
                "For every engine instance with a model: what the capacity model puts on each of its GPUs (weights, "
                "KV bytes per token, activation peak, overhead), the KV capacity the engine allocated against the one "
                "the model predicts and their relative error, and how many requests of the observed p95 size fit in "
                "a full KV cache. The same breakdown as `plimsoll plan`, for the deployments as they run.",
                columns,
                ["instance", "target", "model", "dp_rank"],
            ),
            24,
            9,
        ),
    ]
    parts = [
        (
            _bargauge(
                "Modeled memory per GPU, by part",
                "Per target, each part of one GPU's memory in the capacity model: weights, KV pool, activation peak "
                "and overhead. The KV pool is what is left after the others; a bigger model or more overhead "
                "shrinks it first.",
                [(f"max by (target) ({expr})", f"{{{{target}}}} {part}") for part, expr in _modeled_parts(ENGINE)],
                "bytes",
                _steps(("blue", None)),
            ),
            12,
            10,
        ),
        (
            _bargauge(
                "KV capacity per target: engine vs model (tokens)",
                "KV-cache tokens per engine instance as allocated by the engine and as predicted by the capacity "
                "model. Bars of different length: see the capacity error column above.",
                [(f"plimsoll_kv_cache_capacity_tokens{{{ENGINE}}}", "{{target}} {{dp_rank}} {{source}}")],
                "short",
                _steps(("blue", None)),
            ),
            12,
            10,
        ),
    ]
    fleet_size = [
        (
            _bargauge(
                "KV capacity per model across the fleet (tokens)",
                "KV-cache tokens the engines allocated, summed over every replica of each model: the fleet's total "
                "room per model at empty.",
                [(f'sum by (model) (plimsoll_kv_cache_capacity_tokens{{{ENGINE}, source="engine"}})', "{{model}}")],
                "short",
                _steps(("blue", None)),
            ),
            8,
            8,
        ),
        (
            _bargauge(
                "Engine instances per model",
                "Engine instances (replicas, data-parallel ranks counted apart) serving each model.",
                [(f"count by (model) (plimsoll_requests_running{{{ENGINE}}})", "{{model}}")],
                "short",
                _steps(("blue", None)),
            ),
            8,
            8,
        ),
        (
            _timeseries(
                "Request footprint per model (p95 tokens)",
                "The largest p95 request footprint (prompt + output tokens) among each model's replicas: the context "
                "to size with (plimsoll plan --concurrency N --context this).",
                [(f'max by (model) (plimsoll_request_footprint_tokens{{{ENGINE}, footprint="p95"}})', "{{model}}")],
                "short",
                minimum=0,
            ),
            8,
            8,
        ),
    ]
    gpus = [
        (
            _merged_table(
                "GPUs: memory and what the model leaves unexplained",
                "Every GPU the daemons see (NVML): its product name, total and used memory, and memory used beyond "
                "what the capacity models of its targets explain.",
                [
                    (_with_gpu_name(f"plimsoll_gpu_memory_total_bytes{{{NODE}}}"), "total", "bytes"),
                    (_with_gpu_name(f"plimsoll_gpu_memory_used_bytes{{{NODE}}}"), "used", "bytes"),
                    (_with_gpu_name(f"plimsoll_vram_unexplained_bytes{{{NODE}}}"), "unexplained", "bytes"),
                ],
                ["instance", "gpu", "name"],
            ),
            24,
            8,
        ),
    ]
    return _dashboard(
        "plimsoll-capacity-plan",
        "Plimsoll / Capacity plan",
        "The capacity model's breakdown per target and per GPU, engine against model, and the fleet's size per "
        "model, for the people who size the fleet.",
        _place(
            [
                ("Per target", breakdown),
                ("Memory per GPU", parts),
                ("Fleet per model", fleet_size),
                ("GPUs", gpus),
            ]
        ),
        config.alerting.runbook_url,
    )


# --- output ---------------------------------------------------------------------------------------------------------

DASHBOARDS = (
    ("dashboards/plimsoll-fleet.json", fleet),
    ("dashboards/plimsoll-instance.json", instance),
    ("dashboards/plimsoll-capacity-plan.json", capacity_plan),
)


def to_json(dashboard: g.Dashboard) -> str:
    """Deterministic JSON: sorted keys, fixed uid and panel ids, no timestamps."""
    return json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def artifacts(config: Config) -> list[Artifact]:
    return [Artifact(path, to_json(build(config))) for path, build in DASHBOARDS]


def _panels(dashboard: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(config: Config) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, PromQL) for every query of every panel, as written in the dashboards:
    with `$node`, `$model`, `$target` and `$__rate_interval` in them. Pass an expression through `render` to run
    it against Prometheus. The `ENGINE_HISTOGRAM_PANEL` queries read vLLM's series, not the daemon's."""
    found = []
    for item in artifacts(config):
        dashboard = json.loads(item.text)
        for panel in _panels(dashboard):
            for target in panel.get("targets", []):
                found.append((dashboard["title"], panel["title"], target["expr"]))
    return found


def render(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Substitute dashboard variables as Grafana would: `$model` etc. by `RENDER_DEFAULTS` (every value: `.*`, the
    regex Grafana sends for "All"), `$__rate_interval` by 5m; `variables` overrides any of them."""
    values = {**RENDER_DEFAULTS, **(variables or {})}

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for dashboard variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)
