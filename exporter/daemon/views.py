"""The snapshot as JSON (/api/v1/state, `plimsoll probe`, `plimsoll status`) and as the status page (/). Pure
rendering; the page's HTML, CSS and script are exporter/data/status.html, read once when this module loads."""

import html
import json
import math
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

from exporter.core import status_format
from exporter.daemon.snapshot import InstanceState, ScaleUpState, Snapshot, TargetState, process_owner
from exporter.sources.engines.base import EngineReading, json_number, reading_dict

ENGINE_SILENT = "engine does not report it"
STATUS_TEMPLATE = (resources.files("exporter") / "data" / "status.html").read_text(encoding="utf-8")


def _raw_reason(reading: EngineReading, field: str) -> str | None:
    """Why the engine's own value for `field` is missing, or None when it is there."""
    if field in reading.invalid:
        return f"invalid: {reading.invalid[field]}"
    return ENGINE_SILENT if getattr(reading, field) is None else None


def _reasons(state: TargetState, instance: InstanceState) -> dict[str, str]:
    """For each value the status page and `plimsoll status` show that is null here: why, in words."""
    reading, room = instance.reading, instance.headroom
    reasons = {
        field: why
        for field in ("kv_cache_usage_ratio", "requests_running", "requests_waiting", "preemptions_total")
        if (why := _raw_reason(reading, field)) is not None
    }
    if reading.model is None:
        reasons["model"] = ENGINE_SILENT
    usage = reasons.get("kv_cache_usage_ratio")
    model_given = state.target.model is not None
    if room.kv_cache_headroom_tokens is None:
        no_model = "no model given" if not model_given else "the model makes no prediction"
        reasons["kv_cache_headroom_tokens"] = usage or f"engine does not report its KV capacity and {no_model}"
    if room.headroom_requests_p95 is None:
        if room.kv_cache_headroom_tokens is None:
            reasons["headroom_requests_p95"] = reasons["kv_cache_headroom_tokens"]
        elif reading.request_prompt_tokens is None or reading.request_generation_tokens is None:
            reasons["headroom_requests_p95"] = "engine does not report request sizes"
        else:
            reasons["headroom_requests_p95"] = "no finished requests yet"
    if math.isnan(instance.saturation_eta_seconds) and usage is not None:
        reasons["saturation_eta_seconds"] = usage
    if instance.model_capacity_error_ratio is None:
        if not model_given:
            reasons["model_capacity_error_ratio"] = "no model given"
        elif reading.kv_cache_capacity_tokens is None:
            reasons["model_capacity_error_ratio"] = "engine does not report its KV capacity"
        else:
            reasons["model_capacity_error_ratio"] = "no prediction: GPU size unknown (gpu_type) or model unreadable"
    return reasons


def _instance_dict(state: TargetState, instance: InstanceState) -> dict[str, Any]:
    room, plan = instance.headroom, instance.model_plan
    return {
        **reading_dict(instance.reading),
        "kv_cache_headroom_tokens": json_number(room.kv_cache_headroom_tokens),
        "headroom_requests_mean": json_number(room.headroom_requests_mean),
        "headroom_requests_p95": json_number(room.headroom_requests_p95),
        "request_footprint_mean_tokens": json_number(room.footprint_mean_tokens),
        "request_footprint_p95_tokens": json_number(room.footprint_p95_tokens),
        "saturation_eta_seconds": json_number(instance.saturation_eta_seconds),
        "model_kv_cache_capacity_tokens": plan.pool.tokens if plan else None,
        "model_capacity_error_ratio": json_number(instance.model_capacity_error_ratio),
        "slos": {s.slo.name: {"total": s.counter.total, "good": s.counter.good} for s in instance.slos},
        # Rounded for the sparkline (ms, 0.01%): the full floats would double the document's size.
        "kv_usage_history": [[round(p.t, 3), round(p.value, 4)] for p in instance.kv_usage_history],
        "reasons": _reasons(state, instance),
    }


def _target_dict(state: TargetState) -> dict[str, Any]:
    return {
        "target": state.target.name,
        "url": state.target.url,
        "up": state.up,
        "engine": state.engine,
        "last_failure": state.last_failure,
        "last_error": state.last_error,
        "warnings": list(state.warnings),
        "failures_total": dict(state.failures_total),
        "last_success_timestamp": state.last_success_timestamp,
        "scrape_duration_seconds": state.scrape_duration_seconds,
        "gpus": list(state.gpus),
        "instances": [_instance_dict(state, i) for i in state.instances],
        "configured_model": state.target.model,
    }


def _scale_up_dict(model: ScaleUpState) -> dict[str, Any]:
    return {
        "model": model.model,
        "workload": model.workload,
        "startup_seconds": model.startup_seconds,  # what `plimsoll autoscale replay` assumes
        "knee_concurrency": model.knee_concurrency,
        "ready_replicas": model.ready_replicas,
        "demand_requests": model.demand,
        "capacity_requests": model.capacity,
        "lags_count": model.lags.count,
        "last_lag_seconds": model.lags.last_seconds,
        "lag_median_seconds": model.lags.median_seconds,
        "pending_seconds": model.pending_seconds,
    }


def state_dict(snapshot: Snapshot) -> dict[str, Any]:
    nvml = snapshot.nvml
    return {
        "taken_at": snapshot.taken_at,
        "poll_duration_seconds": snapshot.poll_duration_seconds,
        "ready": snapshot.ready,
        "saturation_kv_usage": snapshot.saturation_kv_usage,
        "nvml": {
            "up": bool(nvml and nvml.up),
            "error": nvml.error if nvml else "NVML disabled",
            "driver_version": nvml.driver_version if nvml else None,
            "gpus": [
                {
                    "gpu": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "total_bytes": g.total_bytes,
                    "used_bytes": g.used_bytes,
                    "reserved_bytes": g.reserved_bytes,
                    "free_bytes": g.free_bytes,
                    "unexplained_bytes": json_number(snapshot.vram_unexplained_bytes.get(g.index)),
                    "processes": [
                        {
                            "pid": p.pid,
                            "used_bytes": p.used_bytes,
                            "target": process_owner(snapshot, g.index, p.pid),
                        }
                        for p in g.processes
                    ],
                }
                for g in (nvml.gpus if nvml else ())
            ],
        },
        "targets": [_target_dict(t) for t in snapshot.targets],
        "scale_up": [_scale_up_dict(model) for model in snapshot.scale_up],
    }


def _td(cell: status_format.Cell, css: str = "") -> str:
    classes = " ".join(c for c in (css, "missing" if cell.missing else "") if c)
    return f'<td class="{classes}">{html.escape(cell.text)}</td>' if classes else f"<td>{html.escape(cell.text)}</td>"


SPARK_WIDTH, SPARK_HEIGHT = 120, 24


def sparkline(history: tuple[tuple[float, float], ...], threshold: float) -> str:
    """KV usage over the polls the daemon keeps, 0..1 bottom to top, with the threshold as a dashed line."""
    line_y = f"{(1 - threshold) * SPARK_HEIGHT:.1f}"
    points = ""
    if history:
        start, span = history[0][0], max(history[-1][0] - history[0][0], 1e-9)
        points = " ".join(
            f"{(t - start) / span * SPARK_WIDTH if len(history) > 1 else SPARK_WIDTH:.1f},"
            f"{(1 - min(max(v, 0.0), 1.0)) * SPARK_HEIGHT:.1f}"
            for t, v in history
        )
    return (
        f'<svg class="spark" width="{SPARK_WIDTH}" height="{SPARK_HEIGHT}" viewBox="0 0 {SPARK_WIDTH} {SPARK_HEIGHT}">'
        f'<line x1="0" x2="{SPARK_WIDTH}" y1="{line_y}" y2="{line_y}"/><polyline points="{points}"/></svg>'
    )


def _row(row: status_format.InstanceRow, threshold: float) -> str:
    target = html.escape(row.target)
    head = f'<tr data-target="{target}"><td>{target}</td><td>{html.escape(row.engine)}</td>'
    if row.down is not None:
        return f'{head}<td colspan="9" class="missing down">{html.escape(row.down)}</td></tr>'
    width = 0.0 if row.kv_usage_ratio is None else min(max(row.kv_usage_ratio, 0.0), 1.0) * 100
    bar = (
        f'<td class="kv {row.kv_level}"><span class="bar"><span class="fill" style="width:{width:.1f}%"></span>'
        f'<span class="mark" style="left:{threshold * 100:.1f}%"></span></span>'
        f'<span class="{"missing" if row.kv_usage.missing else "value"}">{html.escape(row.kv_usage.text)}</span></td>'
    )
    return (
        head
        + _td(row.model)
        + bar
        + _td(row.headroom_tokens, "num")
        + _td(row.headroom_requests_p95, "num")
        + _td(row.running_waiting, "num")
        + _td(row.preemptions, "num")
        + _td(row.saturation_in, "num eta")
        + _td(row.model_drift, "num")
        + f"<td>{sparkline(row.kv_usage_history, threshold)}</td></tr>"
    )


def _gpu_rows(gpu: status_format.GpuRow) -> str:
    first = (
        f'<tr class="gpu"><td>{html.escape(gpu.gpu)}</td><td>{html.escape(gpu.name)}</td>'
        f'<td class="num">{html.escape(gpu.memory)}</td><td></td><td></td><td></td>{_td(gpu.unexplained, "num")}</tr>'
    )
    processes = "".join(
        f'<tr class="process"><td></td><td></td><td></td><td class="num">{html.escape(p.pid)}</td>'
        f'<td class="num">{html.escape(p.memory)}</td><td>{html.escape(p.target)}</td><td></td></tr>'
        for p in gpu.processes
    )
    return first + processes


def _scale_up_row(row: status_format.ScaleUpRow) -> str:
    return (
        f"<tr><td>{html.escape(row.model)}</td><td>{html.escape(row.workload)}</td>"
        f'<td class="num">{html.escape(row.replicas)}</td><td class="num">{html.escape(row.demand)}</td>'
        + _td(row.last_lag, "num")
        + _td(row.median_lag, "num")
        + f'<td class="num">{html.escape(row.pending)}</td><td class="num">{html.escape(row.assumed)}</td></tr>'
    )


def status_page(snapshot: Snapshot) -> str:
    """The page as served before its script runs: the rows of this snapshot, so it reads with scripts off too."""
    state = state_dict(snapshot)
    threshold = snapshot.saturation_kv_usage
    rows = "".join(_row(r, threshold) for r in status_format.instance_rows(state))
    gpus = "".join(_gpu_rows(g) for g in status_format.gpu_rows(state))
    scale_up = "".join(_scale_up_row(r) for r in status_format.scale_up_rows(state))
    fields: Mapping[str, str] = {
        "threshold": html.escape(status_format.percent(threshold)),
        "taken_at": html.escape(status_format.taken_at_text(snapshot.taken_at)),
        "rows": rows or '<tr><td colspan="11" class="missing">no targets</td></tr>',
        "gpus": gpus,
        "scale_up": scale_up,
        "scale_up_hidden": "" if scale_up else " hidden",
        "nvml": html.escape(status_format.nvml_line(state)),
        "max_shown": json.dumps(status_format.MAX_SHOWN),  # one limit for the script and `plimsoll status`
    }
    # One pass, so a target named "{{gpus}}" stays text.
    return re.sub(r"\{\{(\w+)\}\}", lambda match: fields[match.group(1)], STATUS_TEMPLATE)
