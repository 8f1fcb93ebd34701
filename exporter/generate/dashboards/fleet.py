"""`plimsoll-fleet`: how much room is left per model across every node, what saturates first, which SLOs burn,
where the capacity model is off, whether the daemons see their targets and GPUs, and (with an `autoscaling:`
section or prices) the replicas needed and what the replicas cost.

The "Replicas and cost" row reads the replica and cost recording rules by name, so it shows exactly what the
scalers, the over-provisioning ticket and the cost records compute. Those records are per model: only the Model
variable applies to them. Its scale-up panels read the daemon's own lag series, which only a daemon that polls every
replica measures for the fleet (deploy/kubernetes/fleet).
"""

from grafanalib import core as g

from exporter.config import Config
from exporter.core.slo import burn_rate_factors
from exporter.core.units import duration
from exporter.generate.dashboards.expressions import burn
from exporter.generate.dashboards.panels import (
    DATASOURCE,
    ENGINE,
    MODEL,
    NEVER,
    NODE,
    SLO_TITLES,
    TARGET,
    Cell,
    bargauge,
    dashboard,
    eta_thresholds,
    headroom_thresholds,
    horizon_text,
    num,
    percent_text,
    place,
    query,
    seconds_text,
    shown_in_grafana,
    stat,
    steps,
    timeseries,
    usage_thresholds,
)
from exporter.generate.dashboards.schema import Table
from exporter.generate.rules import (
    CAPACITY_RECORD,
    DAILY_COST_NOT_NEEDED_RECORD,
    DAILY_COST_RUNNING_RECORD,
    DEMAND_PEAK_RECORD,
    HOURLY_COST_NOT_NEEDED_RECORD,
    HOURLY_COST_RUNNING_RECORD,
    NEEDED_RECORD,
    RUNNING_RECORD,
    saturation_gate_ratio,
)
from exporter.scaling import DEMAND_RECORD

P95_HEADROOM = f'plimsoll_headroom_requests{{{ENGINE}, footprint="p95"}}'


def fleet(config: Config) -> g.Dashboard:
    slos = _slo_burn_panels(config)
    return dashboard(
        "plimsoll-fleet",
        "Plimsoll / Fleet",
        "How much room is left per model across the fleet, what saturates first, which SLOs burn, whether the "
        "daemons see their targets and GPUs, and (with autoscaling or prices configured) the replicas needed and "
        "what the replicas cost.",
        place(
            [
                (None, _status_row(config)),
                ("Headroom", _headroom_row(config)),
                ("Saturation", _saturation_row(config)),
                ("SLOs and capacity model", [*slos, _drift_panel(config, wide=not slos)]),
                ("Replicas and cost", [*_replica_panels(config), *_scale_up_panels(config), *_cost_panels(config)]),
            ]
        ),
        config.alerting.runbook_url,
    )


def _status_row(config: Config) -> list[Cell]:
    """Whether the daemons see their targets and GPUs, the soonest saturation and the fleet's headroom."""
    return [
        (
            stat(
                "Targets down",
                "How many engine targets the daemons could not read on their last poll (plimsoll_target_up == 0). "
                "A down target reports no headroom, so the fleet figures below undercount while this is above 0.",
                f"count(plimsoll_target_up{{{TARGET}}} == 0) or vector(0)",
                "short",
                steps(("green", None), ("red", 1)),
            ),
            4,
            4,
        ),
        (
            stat(
                "Nodes with NVML down",
                "Daemons whose last NVML read failed (plimsoll_nvml_up == 0): no driver, or a lost GPU. Engine metrics "
                "keep flowing, but GPU memory and unexplained VRAM are blind on those nodes.",
                f"count(plimsoll_nvml_up{{{NODE}}} == 0) or vector(0)",
                "short",
                steps(("green", None), ("red", 1)),
            ),
            4,
            4,
        ),
        (
            stat(
                "Daemons reporting",
                "Plimsoll daemons Prometheus scrapes successfully (up == 1 on the jobs matching "
                f"{shown_in_grafana(config.alerting.exporter_job)}, which PlimsollExporterAbsent watches; one per node "
                "as a DaemonSet). A node missing here is a node whose headroom nobody sees.",
                f'count(up{{job=~"{config.alerting.exporter_job}", {NODE}}} == 1) or vector(0)',
                "short",
                steps(("red", None), ("green", 1)),
            ),
            4,
            4,
        ),
        (
            stat(
                "Soonest saturation",
                "The shortest time until any engine instance's KV usage reaches the saturation threshold "
                f"({percent_text(config.saturation_kv_usage)}) at its current trend. Red inside the horizon of the "
                f"'saturation ahead' alert, {horizon_text(config)}; 'never' when every trend is flat or falling.",
                f"min(plimsoll_saturation_eta_seconds{{{ENGINE}}})",
                "s",
                eta_thresholds(config),
                mappings=[NEVER],
            ),
            6,
            4,
        ),
        (
            stat(
                "Fleet headroom (p95 requests)",
                "Requests of the observed p95 size (prompt + output tokens) that still fit in the KV caches of every "
                "selected engine instance together: how much more load the fleet takes before it queues.",
                f"sum({P95_HEADROOM})",
                "short",
                steps(("red", None), ("green", 1)),
            ),
            6,
            4,
        ),
    ]


def _headroom_row(config: Config) -> list[Cell]:
    """Room left per model: in p95 requests now, in KV tokens and in requests over time."""
    return [
        (
            bargauge(
                "Headroom per model now (requests of p95 size)",
                "Per model, the requests of the observed p95 footprint that still fit across all its replicas "
                "(sum by model of plimsoll_headroom_requests). Red under "
                f"{num(config.alerting.fleet_headroom_min_requests)}, where PlimsollFleetHeadroomLow fires: the "
                "model needs replicas before load grows.",
                [(f"sum by (model) ({P95_HEADROOM})", "{{model}}")],
                "short",
                headroom_thresholds(config),
            ),
            8,
            8,
        ),
        (
            timeseries(
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
            timeseries(
                "Headroom per model (requests)",
                "Requests of the observed mean and p95 footprint that still fit, summed over every replica of each "
                "model. Plan against p95: the mean overstates room when request sizes vary. The line is the floor "
                f"of PlimsollFleetHeadroomLow ({num(config.alerting.fleet_headroom_min_requests)} p95 requests).",
                [
                    (f"sum by (model) ({P95_HEADROOM})", "{{model}} p95"),
                    (f'sum by (model) (plimsoll_headroom_requests{{{ENGINE}, footprint="mean"}})', "{{model}} mean"),
                ],
                "short",
                thresholds=headroom_thresholds(config),
                minimum=0,
            ),
            8,
            8,
        ),
    ]


def _saturation_row(config: Config) -> list[Cell]:
    """Time to saturation per model and target, and the fullest replica of each model against the threshold."""
    return [
        (
            Table(
                title="Time to saturation per model and target",
                description="For each model and target, the time until KV usage reaches the saturation threshold "
                f"({percent_text(config.saturation_kv_usage)}) at the current trend (a robust slope over the last "
                f"minutes). Red inside {horizon_text(config)}, where the 'saturation ahead' alert looks; 'never' "
                "when flat or falling.",
                dataSource=DATASOURCE,
                targets=[
                    query(
                        f"min by (model, target) (plimsoll_saturation_eta_seconds{{{ENGINE}}})",
                        instant=True,
                        table=True,
                    )
                ],
                unit="s",
                thresholds=eta_thresholds(config),
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
            timeseries(
                "KV usage per model (fullest replica)",
                "The highest KV-cache usage among each model's replicas, against the saturation threshold "
                f"({percent_text(config.saturation_kv_usage)}, the red line). Above it the engine queues or preempts; "
                f"above the orange line ({percent_text(saturation_gate_ratio(config))}) a rising trend may page.",
                [(f"max by (model) (plimsoll_kv_cache_usage_ratio{{{ENGINE}}})", "{{model}}")],
                "percentunit",
                thresholds=usage_thresholds(config),
                minimum=0,
                maximum=1,
            ),
            14,
            8,
        ),
    ]


def _slo_burn_panels(config: Config) -> list[Cell]:
    """The 1h burn rate per model and SLO, against the page-level burn factor of the first SLO; none without SLOs."""
    if not config.slos:
        return []
    page = burn_rate_factors(config.slos[0].objective, config.slo_period_seconds / 86400)[0]
    names = ", ".join(
        f"{SLO_TITLES[s.name]} {seconds_text(s.threshold_seconds)} at {percent_text(s.objective)}" for s in config.slos
    )
    return [
        (
            timeseries(
                "SLO burn rate over 1h, per model",
                f"How fast each model spends its error budget ({names}): the share of requests over the latency "
                "threshold in the last hour, divided by the budget (1 - objective). 1 (orange line) spends the "
                f"budget exactly over the {config.slo_period_seconds / 86400:g}-day period; "
                f"{page.factor:g} (red line) spends {percent_text(page.budget_fraction)} of it within the hour, "
                "where the page-level burn alert starts.",
                [(burn(s, "model", "1h"), f"{{{{model}}}} {s.name}") for s in config.slos],
                "short",
                thresholds=steps(("green", None), ("orange", 1), ("red", page.factor)),
                minimum=0,
            ),
            12,
            8,
        )
    ]


def _drift_panel(config: Config, *, wide: bool) -> Cell:
    """The capacity model's error per target, across the whole row where no SLO panel sits beside it."""
    drift_ratio = config.alerting.capacity_drift_ratio
    return (
        timeseries(
            "Capacity model drift per target",
            "(engine KV capacity - model KV capacity) / model capacity for every engine instance with a model. "
            f"Beyond ±{percent_text(drift_ratio)} (the lines, where PlimsollCapacityModelDrift fires) the engine "
            "allocated a pool the model did not predict: "
            "a different gpu_memory_utilization or max_num_seqs than configured, another tenant on the GPU, or a "
            "model miss. Plans and predicted headroom are only as good as this.",
            [(f"plimsoll_model_capacity_error_ratio{{{ENGINE}}}", "{{model}} {{target}} {{dp_rank}}")],
            "percentunit",
            thresholds=steps(("red", None), ("green", -drift_ratio), ("red", drift_ratio)),
        ),
        24 if wide else 12,
        8,
    )


def _replica_panels(config: Config) -> list[Cell]:
    """Replicas needed against running, and demand against capacity, per model: what the scalers and
    PlimsollOverProvisioned act on."""
    autoscaling = config.autoscaling
    if autoscaling is None:
        return []
    running = f"{RUNNING_RECORD}{{{MODEL}}}"
    window = seconds_text(autoscaling.demand_window_seconds)
    return [
        (
            timeseries(
                "Replicas needed vs running per model",
                "Per model, the replicas running (engine servers: a data-parallel engine's ranks count once) and the "
                f"replicas its peak demand over {window} needs, within each workload's min and max ({NEEDED_RECORD}, "
                "the number the KEDA and HPA scalers drive to). Running above needed for "
                f"{seconds_text(autoscaling.overprovisioned_for_seconds)} is PlimsollOverProvisioned; source says "
                "whether a replica's capacity is the measured knee or the capacity model.",
                [(running, "{{model}} running"), (f"{NEEDED_RECORD}{{{MODEL}}}", "{{model}} needed ({{source}})")],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Demand against capacity per model (requests)",
                "Per model, requests running + waiting over every replica, its peak over "
                f"{window} (what the replicas needed follow), and what the replicas running hold: one replica's "
                f"capacity x {num(autoscaling.margin)} (autoscaling.margin) x the replicas running. Demand above "
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


def _scale_up_panels(config: Config) -> list[Cell]:
    """The measured scale-up lag per model, to hold against the start-up `plimsoll autoscale replay` assumes, and how
    long a crossing has waited for a replica: only for workloads with a knee, as the daemon measures only those."""
    autoscaling = config.autoscaling
    if autoscaling is None or all(w.knee_concurrency is None for w in autoscaling.workloads):
        return []
    buckets = f"sum by (le, model) (increase(plimsoll_scale_up_lag_seconds_bucket{{{NODE}, {MODEL}}}[$__range]))"
    startups = ", ".join(
        f"{shown_in_grafana(w.model)} {seconds_text(w.startup_seconds)}"
        for w in autoscaling.workloads
        if w.knee_concurrency is not None
    )
    source = (
        "A DaemonSet's daemon sees its own node's replicas only: the fleet's lag comes from the one daemon that "
        "polls every replica (deploy/kubernetes/fleet, discovery.kubernetes.scope: cluster)."
    )
    return [
        (
            bargauge(
                "Scale-up lag per model (over the time range)",
                "Per model, the median and 90th percentile of the lags measured in the dashboard's time range: from "
                "demand (requests running + waiting) crossing the ready replicas' capacity (x knee_concurrency) to "
                "one more replica ready. Hold it against the start-up autoscale replay assumes "
                f"({startups}) plus the scaler's sync and the metric pipeline; no value where no lag was measured "
                f"in the range. {source}",
                [
                    (f"histogram_quantile(0.5, {buckets})", "{{model}} median"),
                    (f"histogram_quantile(0.9, {buckets})", "{{model}} p90"),
                ],
                "s",
                steps(("blue", None)),
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Scale-up pending per model",
                "Per model, how long demand has been over the ready replicas' capacity with no replica added yet "
                "(plimsoll_scale_up_pending_seconds; 0 when none waits): each ramp ends in a lag, or falls to 0 "
                "where demand fell back first. A ramp that keeps climbing at max_replicas is no lag: no replica is "
                f"coming. {source}",
                [(f"max by (model) (plimsoll_scale_up_pending_seconds{{{NODE}, {MODEL}}})", "{{model}}")],
                "s",
                minimum=0,
            ),
            12,
            8,
        ),
    ]


def _cost_panels(config: Config) -> list[Cell]:
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
    panels: list[Cell] = [
        (
            timeseries(
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
            stat(title, description, f"sum({record}{{{MODEL}}})", "suffix:/day", steps(("blue", None))),
            12 // len(daily),
            8,
        )
        for title, description, record in daily
    )
    return panels
