"""`plimsoll-instance`: one node or target up close: KV usage against the saturation threshold and capacity, queue
and preemptions, the latency SLIs against their objectives, request footprint, GPU memory used against what the
capacity model explains.

The daemon exports SLI counters, not latency histograms, so the latency quantiles come from vLLM's own
`vllm:*_bucket` series (`ENGINE_HISTOGRAM_PANEL`), the one panel here that does not read the daemon's series.
"""

from grafanalib import core as g

from exporter.config import Config, SloConfig
from exporter.core.units import duration
from exporter.generate.dashboards.expressions import modeled_parts, modeled_total, sli
from exporter.generate.dashboards.panels import (
    DATASOURCE,
    ENGINE,
    NEVER,
    NODE,
    SLO_MEANING,
    SLO_TITLES,
    TARGET,
    Cell,
    bargauge,
    dashboard,
    eta_thresholds,
    horizon_text,
    num,
    percent_text,
    place,
    query,
    seconds_text,
    stat,
    steps,
    timeseries,
    usage_thresholds,
)
from exporter.generate.dashboards.schema import Gauge
from exporter.generate.rules import saturation_horizon_seconds

ENGINE_HISTOGRAM_PANEL = "Latency at the objective's quantile, from vLLM's own histograms"
# vLLM's histogram for each SLI (v0.11+ names; `vllm:time_per_output_token_seconds` before ITL got its own).
VLLM_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds_bucket",
    "itl": "vllm:inter_token_latency_seconds_bucket",
    "e2e": "vllm:e2e_request_latency_seconds_bucket",
}
# The legend that tells engine instances apart: a target's data-parallel ranks are engines of their own.
ENGINE_LEGEND = "{{instance}} {{target}} {{dp_rank}}"


def instance(config: Config) -> g.Dashboard:
    return dashboard(
        "plimsoll-instance",
        "Plimsoll / Instance",
        "One node or target up close: KV usage against the saturation threshold and capacity, queue and "
        "preemptions, latency SLIs against their objectives, request footprint, and GPU memory used against what "
        "the capacity model explains.",
        place(
            [
                ("KV cache and headroom", [*_kv_usage_panels(config), *_kv_capacity_panels()]),
                ("Load", _load_row()),
                ("Latency SLOs", _latency_row(config)),
                ("Requests and polls", _requests_row()),
                ("GPU memory", [*_vram_panels(), *_unexplained_panels(config)]),
            ]
        ),
        config.alerting.runbook_url,
    )


def _kv_usage_panels(config: Config) -> list[Cell]:
    """KV usage over time with its projection, now, and the time until it reaches the saturation threshold."""
    trend_window = config.alerting.saturation_trend_window_seconds
    horizon = saturation_horizon_seconds(config)
    return [
        (
            timeseries(
                "KV cache usage vs saturation threshold",
                "KV-cache usage each engine reports (0..1), against the configured saturation threshold "
                f"({percent_text(config.saturation_kv_usage)}, the red line) and the threshold the daemon uses now "
                "(plimsoll loadtest may calibrate it). Above the threshold requests queue and get preempted. The "
                f"'projected' series: the linear trend over {seconds_text(trend_window)} projected "
                f"{seconds_text(horizon)} ahead, as the "
                "'saturation ahead' alert reads it above the orange gate.",
                [
                    (f"plimsoll_kv_cache_usage_ratio{{{ENGINE}}}", ENGINE_LEGEND),
                    (
                        f"predict_linear(plimsoll_kv_cache_usage_ratio{{{ENGINE}}}[{duration(trend_window)}], "
                        f"{num(horizon)})",
                        f"projected {ENGINE_LEGEND}",
                    ),
                    (
                        f"max by (instance) (plimsoll_saturation_threshold_ratio{{{NODE}}})",
                        "threshold in use {{instance}}",
                    ),
                ],
                "percentunit",
                thresholds=usage_thresholds(config),
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
                f"({percent_text(config.saturation_kv_usage)}).",
                dataSource=DATASOURCE,
                targets=[query(f"plimsoll_kv_cache_usage_ratio{{{ENGINE}}}", ENGINE_LEGEND, instant=True)],
                format="percentunit",
                min=0,
                max=1,
                calc="lastNotNull",
                thresholds=usage_thresholds(config),
                maxDataPoints=None,
            ),
            6,
            8,
        ),
        (
            stat(
                "Time to saturation",
                "Per target, the shortest time until KV usage reaches the saturation threshold at the current trend. "
                f"Red inside {horizon_text(config)}, where the 'saturation ahead' alert looks; 'never' when flat "
                "or falling.",
                f"min by (instance, target) (plimsoll_saturation_eta_seconds{{{ENGINE}}})",
                "s",
                eta_thresholds(config),
                mappings=[NEVER],
                legend="{{instance}} {{target}}",
            ),
            6,
            8,
        ),
    ]


def _kv_capacity_panels() -> list[Cell]:
    """KV capacity, engine against model and in use, and the requests that still fit."""
    return [
        (
            timeseries(
                "KV capacity: engine allocated vs model predicted, and in use",
                "KV-cache tokens the engine allocated (source=engine), what the capacity model predicts for the "
                "configured deployment (source=model), and tokens in use. A gap between engine and model is "
                "capacity drift; used approaching the engine's capacity is saturation.",
                [
                    (f"plimsoll_kv_cache_capacity_tokens{{{ENGINE}}}", f"{ENGINE_LEGEND} capacity ({{{{source}}}})"),
                    (f"plimsoll_kv_cache_used_tokens{{{ENGINE}}}", f"{ENGINE_LEGEND} used"),
                ],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Headroom: requests that still fit",
                "Requests of the observed mean and p95 footprint that still fit in each engine's free KV cache.",
                [(f"plimsoll_headroom_requests{{{ENGINE}}}", f"{ENGINE_LEGEND} {{{{footprint}}}}")],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
    ]


def _load_row() -> list[Cell]:
    """The queue, preemptions and token throughput: the load behind the KV usage."""
    return [
        (
            timeseries(
                "Queue: running and waiting requests",
                "Requests each engine runs and holds in its queue. Waiting requests with KV usage at the threshold "
                "mean the engine is saturated now.",
                [
                    (f"plimsoll_requests_running{{{ENGINE}}}", f"{ENGINE_LEGEND} running"),
                    (f"plimsoll_requests_waiting{{{ENGINE}}}", f"{ENGINE_LEGEND} waiting"),
                ],
                "short",
                minimum=0,
            ),
            8,
            8,
        ),
        (
            timeseries(
                "Preemptions per second",
                "Requests the engine preempted (SGLang: retracted) to free KV cache. Any sustained rate means the "
                "cache is too small for the load: each preemption recomputes or swaps a request.",
                [(f"rate(plimsoll_preemptions_total{{{ENGINE}}}[$__rate_interval])", ENGINE_LEGEND)],
                "reqps",
                minimum=0,
            ),
            8,
            8,
        ),
        (
            timeseries(
                "Token throughput",
                "Prompt and generated tokens per second per engine instance: the load behind the KV usage.",
                [
                    (f"rate(plimsoll_prompt_tokens_total{{{ENGINE}}}[$__rate_interval])", f"{ENGINE_LEGEND} prompt"),
                    (
                        f"rate(plimsoll_generation_tokens_total{{{ENGINE}}}[$__rate_interval])",
                        f"{ENGINE_LEGEND} generated",
                    ),
                ],
                "short",
                minimum=0,
            ),
            8,
            8,
        ),
    ]


def _latency_row(config: Config) -> list[Cell]:
    """One SLI panel per SLO side by side, then the engine's own latency quantiles across the row."""
    latency: list[Cell] = [(_sli_panel(slo), 24 // len(config.slos), 8) for slo in config.slos]
    if config.slos:
        latency.append((_engine_histogram_panel(config), 24, 8))
    return latency


def _requests_row() -> list[Cell]:
    """Request footprint, and why polls of a target fail."""
    return [
        (
            timeseries(
                "Request footprint (prompt + output tokens)",
                "Tokens one request holds in the KV cache at its end, mean and p95, per engine instance: the size "
                "that headroom in requests is counted in, and the context to plan with.",
                [(f"plimsoll_request_footprint_tokens{{{ENGINE}}}", f"{ENGINE_LEGEND} {{{{footprint}}}}")],
                "short",
                minimum=0,
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Target polls: failures per second by reason",
                "Why the daemon could not read a target: timeout, refused, http_status, redirect, too_large, "
                "not_metrics, unknown_engine, too_many_series, too_many_instances, invalid_target, error. A target "
                "with failures shows stale or no headroom.",
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


def _vram_panels() -> list[Cell]:
    """GPU memory used against what the capacity model explains, and the model's parts stacked."""
    attributed = f'group by (instance, gpu, target) (plimsoll_gpu_process_memory_bytes{{{TARGET}, target!=""}})'
    return [
        (
            timeseries(
                "VRAM per GPU: used vs modeled",
                "GPU memory in use and in total (NVML), and what the capacity model explains on that GPU: weights + "
                "KV pool + activation + overhead of the target running on it (shown where the GPU's processes belong "
                "to one target). Used far above modeled is memory the model does not know about.",
                [
                    (f"plimsoll_gpu_memory_used_bytes{{{NODE}}}", "{{instance}} GPU {{gpu}} used"),
                    (f"plimsoll_gpu_memory_total_bytes{{{NODE}}}", "{{instance}} GPU {{gpu}} total"),
                    (
                        f"sum by (instance, gpu) ({attributed} * on (instance, target) group_left () "
                        f"sum by (instance, target) ({modeled_total(ENGINE)}))",
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
            timeseries(
                "Modeled memory per GPU, by part",
                "What the capacity model puts on each GPU of a target, stacked: weights, KV pool (model capacity x "
                "KV bytes per token), activation peak, and overhead (non-torch memory and CUDA graphs).",
                [
                    (f"sum by (instance, target) ({expr})", f"{{{{instance}}}} {{{{target}}}} {part}")
                    for part, expr in modeled_parts(ENGINE)
                ],
                "bytes",
                stacked=True,
                minimum=0,
            ),
            12,
            8,
        ),
    ]


def _unexplained_panels(config: Config) -> list[Cell]:
    """Memory the model does not explain, how fast it grows against the growth alert, and each GPU's share used."""
    growth = config.alerting.vram_growth_bytes_per_hour
    return [
        (
            timeseries(
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
            timeseries(
                "Unexplained VRAM growth per GPU (per hour)",
                "How fast unexplained GPU memory grows: the least-squares slope over the last hour, per hour. Above "
                f"the line ({num(growth)} bytes per hour) PlimsollVRAMUnexplainedGrowing fires after 15m: a leak in "
                "the engine or another tenant on the GPU.",
                [(f"deriv(plimsoll_vram_unexplained_bytes{{{NODE}}}[1h]) * 3600", "{{instance}} GPU {{gpu}}")],
                "bytes",
                thresholds=steps(("green", None), ("red", growth)),
            ),
            12,
            8,
        ),
        (
            bargauge(
                "GPU memory used (share of total)",
                "Memory in use on each GPU as a share of its total (NVML).",
                [
                    (
                        f"plimsoll_gpu_memory_used_bytes{{{NODE}}} / plimsoll_gpu_memory_total_bytes{{{NODE}}}",
                        "{{instance}} GPU {{gpu}}",
                    )
                ],
                "percentunit",
                steps(("green", None), ("orange", 0.95)),
                maximum=1,
            ),
            12,
            8,
        ),
    ]


def _sli_panel(slo: SloConfig) -> g.TimeSeries:
    name = SLO_TITLES[slo.name]
    return timeseries(
        f"{name} SLI: requests within {seconds_text(slo.threshold_seconds)}",
        f"Share of requests whose {SLO_MEANING[slo.name]} was within {seconds_text(slo.threshold_seconds)}, per "
        f"target (plimsoll_slo_good_requests_total / plimsoll_slo_requests_total), against the objective "
        f"{percent_text(slo.objective)} (the line). Below the line the error budget burns. The daemon counts these "
        "from the engine's latency histogram at the threshold; it does not re-export latencies.",
        [(sli(slo, "instance, target", "$__rate_interval"), "{{instance}} {{target}}")],
        "percentunit",
        thresholds=steps(("red", None), ("green", slo.objective)),
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
                f"histogram_quantile({num(slo.objective)}, sum by (le, model_name) (rate({bucket}[$__rate_interval])))",
                f"{{{{model_name}}}} {slo.name} p{slo.objective * 100:g}",
            )
        )
        overrides.append(
            {
                "matcher": {"id": "byFrameRefID", "options": chr(ord("A") + i)},
                "properties": [
                    {
                        "id": "thresholds",
                        "value": {"mode": "absolute", "steps": steps(("green", None), ("red", slo.threshold_seconds))},
                    },
                    {"id": "custom.thresholdsStyle", "value": {"mode": "line"}},
                ],
            }
        )
    thresholds = ", ".join(f"{SLO_TITLES[s.name]} {seconds_text(s.threshold_seconds)}" for s in config.slos)
    return timeseries(
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
