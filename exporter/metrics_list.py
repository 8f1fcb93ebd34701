"""Every metric `plimsoll run` exports, as data: the collector takes each family's name, help and labels from here,
and docs/metrics.md is rendered from here (`python -m exporter.metrics_list`), so a metric is renamed or
re-documented in one place. prometheus_client's own process_ and python_ series are not listed.

Names follow the Prometheus guide (docs/daemon.md "Metrics" says why some were added): `plimsoll_<what>_<unit>`
in base units, `_ratio` for 0..1, `_total` only on counters, `_info` only on info metrics. A name here is the one a
query uses, so counters end in `_total` and info metrics in `_info`.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from exporter.files import write_atomically

DOCS_PATH = Path("docs/metrics.md")  # relative to the repository root, where the command is run

# Every engine series carries these, in this order: the engine's own data-parallel index is `dp_rank` ("" when
# the engine runs one).
ENGINE = ("target", "engine", "model", "dp_rank")
GPU = ("gpu", "uuid")  # NVML index (`0/1/0` for a MIG device) and UUID


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: Literal["gauge", "counter", "info", "histogram"]
    unit: str  # the base unit the value is in ("bytes", "seconds", "ratio", "tokens", "requests"), "" for none
    labels: tuple[str, ...]
    help: str


# In the order the collector yields them, which is the order /metrics shows.
METRICS = (
    MetricSpec("plimsoll_build_info", "info", "", ("version",), "Plimsoll's version."),
    MetricSpec(
        "plimsoll_poll_duration_seconds",
        "gauge",
        "seconds",
        (),
        "How long the last cycle of discovery and NVML took. Targets are read on their own schedules: see "
        "plimsoll_target_scrape_duration_seconds.",
    ),
    MetricSpec(
        "plimsoll_saturation_threshold_ratio",
        "gauge",
        "ratio",
        (),
        "KV usage counted as saturated (configured, or calibrated by plimsoll loadtest).",
    ),
    MetricSpec("plimsoll_slo_objective_ratio", "gauge", "ratio", ("slo",), "The SLO's objective."),
    MetricSpec("plimsoll_slo_threshold_seconds", "gauge", "seconds", ("slo",), "The SLO's latency threshold."),
    MetricSpec("plimsoll_target_up", "gauge", "", ("target",), "1 when the last poll of the target succeeded."),
    MetricSpec(
        "plimsoll_target_poll_failures_total",
        "counter",
        "",
        ("target", "reason"),
        # The reasons are exporter.daemon.snapshot.FAILURE_REASONS; tests/test_metrics_list.py fails when they drift.
        "Failed polls of the target by reason (timeout, refused, http_status, redirect, too_large, not_metrics, "
        "unknown_engine, too_many_series, too_many_instances, invalid_target, error).",
    ),
    MetricSpec(
        "plimsoll_target_last_success_timestamp_seconds",
        "gauge",
        "seconds",
        ("target",),
        "Unix time of the target's last successful poll.",
    ),
    MetricSpec(
        "plimsoll_target_scrape_duration_seconds",
        "gauge",
        "seconds",
        ("target",),
        "How long the last poll of the target took.",
    ),
    MetricSpec(
        "plimsoll_target_gpu_hourly_cost",
        "gauge",
        "",  # money per hour, in whatever currency the prices are in: no base unit to name
        ("target", "model"),
        "What the GPUs the target runs on cost per hour, in the currency of pricing.gpu_hour; absent where any of "
        "them has no price.",
    ),
    MetricSpec(
        "plimsoll_scale_up_lag_seconds",
        "histogram",
        "seconds",
        ("model",),
        "Time from the model's demand (requests running + waiting) crossing its ready replicas x knee_concurrency "
        "to one more replica ready, as this daemon sees them; per autoscaling workload with a knee_concurrency.",
    ),
    MetricSpec(
        "plimsoll_scale_up_pending_seconds",
        "gauge",
        "seconds",
        ("model",),
        "How long ago the model's demand crossed its ready capacity, while no new replica has answered it; 0 when no "
        "crossing waits.",
    ),
    MetricSpec("plimsoll_nvml_up", "gauge", "", (), "1 when the last NVML read succeeded."),
    MetricSpec("plimsoll_gpu_info", "info", "", ("gpu", "uuid", "name", "driver_version"), "GPU identity."),
    MetricSpec("plimsoll_gpu_memory_total_bytes", "gauge", "bytes", GPU, "Total GPU memory (NVML memory info v2)."),
    MetricSpec("plimsoll_gpu_memory_used_bytes", "gauge", "bytes", GPU, "GPU memory in use, driver reserve excluded."),
    MetricSpec("plimsoll_gpu_memory_reserved_bytes", "gauge", "bytes", GPU, "GPU memory the driver reserves."),
    MetricSpec("plimsoll_gpu_memory_free_bytes", "gauge", "bytes", GPU, "GPU memory free."),
    MetricSpec(
        "plimsoll_gpu_process_memory_bytes",
        "gauge",
        "bytes",
        ("gpu", "pid", "target"),
        'GPU memory per process, with the engine target it is attributed to ("" when unknown).',
    ),
    MetricSpec(
        "plimsoll_vram_unexplained_bytes",
        "gauge",
        "bytes",
        ("gpu",),
        "GPU memory used beyond what the capacity models of its targets explain (leak, co-tenant, fragmentation).",
    ),
    MetricSpec("plimsoll_kv_cache_usage_ratio", "gauge", "ratio", ENGINE, "KV-cache usage the engine reports, 0..1."),
    MetricSpec(
        "plimsoll_kv_cache_capacity_tokens",
        "gauge",
        "tokens",
        (*ENGINE, "source"),
        "KV-cache capacity in tokens: what the engine allocated (source=engine) and what the capacity model "
        "predicts for the configured deployment (source=model).",
    ),
    MetricSpec(
        "plimsoll_kv_cache_used_tokens", "gauge", "tokens", ENGINE, "KV-cache tokens in use (usage x capacity)."
    ),
    MetricSpec("plimsoll_kv_cache_headroom_tokens", "gauge", "tokens", ENGINE, "KV-cache tokens that still fit."),
    MetricSpec(
        "plimsoll_headroom_requests",
        "gauge",
        "requests",
        (*ENGINE, "footprint"),
        "Requests of the observed footprint (mean or p95 prompt+output tokens) that still fit in the KV cache.",
    ),
    MetricSpec(
        "plimsoll_request_footprint_tokens",
        "gauge",
        "tokens",
        (*ENGINE, "footprint"),
        "Tokens one request holds at its end: prompt plus output.",
    ),
    MetricSpec("plimsoll_requests_running", "gauge", "requests", ENGINE, "Requests the engine is running."),
    MetricSpec("plimsoll_requests_waiting", "gauge", "requests", ENGINE, "Requests queued in the engine."),
    MetricSpec(
        "plimsoll_preemptions_total",
        "counter",
        "requests",
        ENGINE,
        "Requests the engine preempted (SGLang: retracted).",
    ),
    MetricSpec("plimsoll_prompt_tokens_total", "counter", "tokens", ENGINE, "Prompt tokens the engine processed."),
    MetricSpec("plimsoll_generation_tokens_total", "counter", "tokens", ENGINE, "Tokens the engine generated."),
    MetricSpec(
        "plimsoll_saturation_eta_seconds",
        "gauge",
        "seconds",
        ENGINE,
        "Seconds until KV usage reaches the saturation threshold at the current trend; +Inf when flat or falling.",
    ),
    MetricSpec(
        "plimsoll_slo_requests_total",
        "counter",
        "requests",
        (*ENGINE, "slo"),
        "Requests observed for each latency SLI.",
    ),
    MetricSpec(
        "plimsoll_slo_good_requests_total",
        "counter",
        "requests",
        (*ENGINE, "slo"),
        "Requests within the SLO's latency threshold.",
    ),
    MetricSpec(
        "plimsoll_model_weights_bytes",
        "gauge",
        "bytes",
        ENGINE,
        "Model weights per GPU, as the capacity model computes them.",
    ),
    MetricSpec(
        "plimsoll_model_kv_bytes_per_token", "gauge", "bytes", ENGINE, "KV-cache bytes one token costs on one GPU."
    ),
    MetricSpec(
        "plimsoll_model_activation_bytes", "gauge", "bytes", ENGINE, "Activation peak the model expects per GPU."
    ),
    MetricSpec(
        "plimsoll_model_overhead_bytes",
        "gauge",
        "bytes",
        ENGINE,
        "Non-torch and CUDA-graph memory the model expects per GPU.",
    ),
    MetricSpec(
        "plimsoll_model_capacity_error_ratio",
        "gauge",
        "ratio",
        ENGINE,
        "(engine KV capacity - model KV capacity) / model KV capacity: the model's miss, or a misconfiguration.",
    ),
)

BY_NAME = {spec.name: spec for spec in METRICS}


_INTRO = """\
# Metrics

Generated from `exporter/metrics_list.py`, the list the collector reads: edit the list, then run
`python -m exporter.metrics_list` from the repository root to write this file again
(tests/test_metrics_list.py fails while the two differ).

Names are as a query writes them: counters end in `_total`, info metrics in `_info` (value 1, the labels are the
information; the Prometheus text format types them `gauge`); a histogram's series are its name with `_bucket`
(`le`), `_sum` and `_count`. Engine series carry `target`, `engine`, `model` and
`dp_rank` (the engine's own data-parallel index; `""` when the engine runs one); GPU series carry `gpu` (the NVML
index, `0/1/0` for a MIG device) and `uuid`. With `nvml: false` there are no GPU series and no
`plimsoll_nvml_up`; with NVML down, only `plimsoll_nvml_up` (0).

| name | type | unit | labels | help |
|---|---|---|---|---|
"""


def render_markdown() -> str:
    """docs/metrics.md: the intro, then one table row per metric."""
    rows = [_INTRO]
    for spec in METRICS:
        labels = ", ".join(f"`{label}`" for label in spec.labels)
        rows.append(f"| `{spec.name}` | {spec.type} | {spec.unit} | {labels} | {_cell(spec.help)} |\n")
    return "".join(rows)


def _cell(text: str) -> str:
    """Help text as a table cell: a bare `|` would end the cell."""
    return text.replace("|", "\\|")


if __name__ == "__main__":
    # The one I/O here, run by hand after editing the list; the collector and the tests only read the data.
    write_atomically(DOCS_PATH, render_markdown())
    print(f"wrote {DOCS_PATH}")
