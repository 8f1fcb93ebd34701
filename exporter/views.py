"""The snapshot as JSON (/api/v1/state, `plimsoll probe`) and as a small HTML page (/). Pure rendering."""

import html
import math
from typing import Any

from exporter.snapshot import InstanceState, Snapshot, TargetState
from exporter.sources.engines.base import EngineReading


def _number(value: float | None) -> float | str | None:
    """JSON has no infinity: +Inf travels as the string "+Inf", NaN as null."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


def reading_dict(reading: EngineReading) -> dict[str, Any]:
    return {
        "engine": reading.engine,
        "dp_rank": reading.instance,
        "model": reading.model,
        "kv_cache_usage_ratio": _number(reading.kv_cache_usage_ratio),
        "kv_cache_capacity_tokens": reading.kv_cache_capacity_tokens,
        "kv_block_size": reading.kv_block_size,
        "requests_running": _number(reading.requests_running),
        "requests_waiting": _number(reading.requests_waiting),
        "preemptions_total": _number(reading.preemptions_total),
        "prompt_tokens_total": _number(reading.prompt_tokens_total),
        "generation_tokens_total": _number(reading.generation_tokens_total),
        # A field the page carried with a value outside its domain, and why; and the fields the engine does not
        # report at all: null above means one or the other.
        "invalid": dict(reading.invalid),
        "absent": list(reading.absent_fields()),
    }


def _instance_dict(instance: InstanceState) -> dict[str, Any]:
    room, plan = instance.headroom, instance.model_plan
    return {
        **reading_dict(instance.reading),
        "kv_cache_headroom_tokens": _number(room.kv_cache_headroom_tokens),
        "headroom_requests_mean": _number(room.headroom_requests_mean),
        "headroom_requests_p95": _number(room.headroom_requests_p95),
        "request_footprint_mean_tokens": _number(room.footprint_mean_tokens),
        "request_footprint_p95_tokens": _number(room.footprint_p95_tokens),
        "saturation_eta_seconds": _number(instance.saturation_eta_seconds),
        "model_kv_cache_capacity_tokens": plan.pool.tokens if plan else None,
        "model_capacity_error_ratio": _number(instance.model_capacity_error_ratio),
        "slos": {s.slo.name: {"total": s.counter.total, "good": s.counter.good} for s in instance.slos},
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
        "instances": [_instance_dict(i) for i in state.instances],
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
                    "unexplained_bytes": _number(snapshot.vram_unexplained_bytes.get(g.index)),
                    "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in g.processes],
                }
                for g in (nvml.gpus if nvml else ())
            ],
        },
        "targets": [_target_dict(t) for t in snapshot.targets],
    }


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return "never" if math.isinf(value) else f"{value:,.2f}"
    return html.escape(str(value))


def status_page(snapshot: Snapshot) -> str:
    rows = []
    for state in snapshot.targets:
        if not state.instances:
            status = "up" if state.up else f"down ({state.last_failure})"
            rows.append(f"<tr><td>{_cell(state.target.name)}</td><td>{_cell(status)}</td>" + "<td></td>" * 6 + "</tr>")
        for instance in state.instances:
            reading, room = instance.reading, instance.headroom
            usage = reading.kv_cache_usage_ratio
            rows.append(
                "<tr>"
                f"<td>{_cell(state.target.name)}</td><td>{_cell(reading.engine)} {_cell(reading.instance)}</td>"
                f"<td>{_cell(None if usage is None else usage * 100)}%</td>"
                f"<td>{_cell(room.kv_cache_headroom_tokens)}</td><td>{_cell(room.headroom_requests_p95)}</td>"
                f"<td>{_cell(reading.requests_running)} / {_cell(reading.requests_waiting)}</td>"
                f"<td>{_cell(instance.saturation_eta_seconds)}</td>"
                f"<td>{_cell(instance.model_capacity_error_ratio)}</td>"
                "</tr>"
            )
    gpus = []
    nvml = snapshot.nvml
    for gpu in nvml.gpus if nvml and nvml.up else ():
        unexplained = snapshot.vram_unexplained_bytes.get(gpu.index)
        gpus.append(
            f"<tr><td>{_cell(gpu.index)}</td><td>{_cell(gpu.name)}</td>"
            f"<td>{gpu.used_bytes / 2**30:.2f} / {gpu.total_bytes / 2**30:.2f} GiB</td>"
            f"<td>{_cell(None if unexplained is None else unexplained / 2**30)}</td></tr>"
        )
    nvml_line = "NVML up" if nvml and nvml.up else f"NVML down: {_cell(nvml.error if nvml else 'disabled')}"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Plimsoll</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:right}}
th{{border-bottom:1px solid #999}}td:first-child,th:first-child{{text-align:left}}</style></head>
<body><h1>Plimsoll</h1>
<p>Saturation threshold {snapshot.saturation_kv_usage:.0%} KV usage. <a href="/metrics">/metrics</a>
<a href="/api/v1/state">/api/v1/state</a></p>
<h2>Targets</h2>
<table><tr><th>target</th><th>engine</th><th>KV usage</th><th>KV headroom (tokens)</th>
<th>requests that fit (p95)</th><th>running / waiting</th><th>saturation in (s)</th><th>model error</th></tr>
{"".join(rows) or '<tr><td colspan="8">no targets</td></tr>'}
</table>
<h2>GPUs</h2><p>{nvml_line}</p>
<table><tr><th>gpu</th><th>name</th><th>used / total</th><th>unexplained (GiB)</th></tr>{"".join(gpus)}</table>
</body></html>
"""
