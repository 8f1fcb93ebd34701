"""`plimsoll-capacity-plan`: the capacity model's breakdown per target (weights, KV bytes per token, activation,
overhead, KV capacity engine vs model) and per GPU, and the fleet's size per model, for the people who size the
fleet."""

from collections.abc import Sequence

from grafanalib import core as g

from exporter.config import Config
from exporter.generate.dashboards.expressions import modeled_parts, with_gpu_name
from exporter.generate.dashboards.panels import (
    DATASOURCE,
    ENGINE,
    INSTANCE_KEY,
    NODE,
    Cell,
    bargauge,
    dashboard,
    place,
    query,
    steps,
    timeseries,
)
from exporter.generate.dashboards.schema import Table


def capacity_plan(config: Config) -> g.Dashboard:
    return dashboard(
        "plimsoll-capacity-plan",
        "Plimsoll / Capacity plan",
        "The capacity model's breakdown per target and per GPU, engine against model, and the fleet's size per "
        "model, for the people who size the fleet.",
        place(
            [
                ("Per target", _breakdown_row()),
                ("Memory per GPU", _parts_row()),
                ("Fleet per model", _fleet_size_row()),
                ("GPUs", _gpus_row()),
            ]
        ),
        config.alerting.runbook_url,
    )


def _breakdown_row() -> list[Cell]:
    """The capacity model per target and GPU, engine against model, as one table."""
    columns = _plan_columns()
    return [
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


def _parts_row() -> list[Cell]:
    """Each target's GPU memory by part, and its KV capacity engine against model."""
    return [
        (
            bargauge(
                "Modeled memory per GPU, by part",
                "Per target, each part of one GPU's memory in the capacity model: weights, KV pool, activation peak "
                "and overhead. The KV pool is what is left after the others; a bigger model or more overhead "
                "shrinks it first.",
                [(f"max by (target) ({expr})", f"{{{{target}}}} {part}") for part, expr in modeled_parts(ENGINE)],
                "bytes",
                steps(("blue", None)),
            ),
            12,
            10,
        ),
        (
            bargauge(
                "KV capacity per target: engine vs model (tokens)",
                "KV-cache tokens per engine instance as allocated by the engine and as predicted by the capacity "
                "model. Bars of different length: see the capacity error column above.",
                [(f"plimsoll_kv_cache_capacity_tokens{{{ENGINE}}}", "{{target}} {{dp_rank}} {{source}}")],
                "short",
                steps(("blue", None)),
            ),
            12,
            10,
        ),
    ]


def _fleet_size_row() -> list[Cell]:
    """Per model across the fleet: KV capacity, engine instances and the p95 request footprint."""
    return [
        (
            bargauge(
                "KV capacity per model across the fleet (tokens)",
                "KV-cache tokens the engines allocated, summed over every replica of each model: the fleet's total "
                "room per model at empty.",
                [(f'sum by (model) (plimsoll_kv_cache_capacity_tokens{{{ENGINE}, source="engine"}})', "{{model}}")],
                "short",
                steps(("blue", None)),
            ),
            8,
            8,
        ),
        (
            bargauge(
                "Engine instances per model",
                "Engine instances (replicas, data-parallel ranks counted apart) serving each model.",
                [(f"count by (model) (plimsoll_requests_running{{{ENGINE}}})", "{{model}}")],
                "short",
                steps(("blue", None)),
            ),
            8,
            8,
        ),
        (
            timeseries(
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


def _gpus_row() -> list[Cell]:
    """Every GPU's memory, and what the capacity model leaves unexplained on it."""
    return [
        (
            _merged_table(
                "GPUs: memory and what the model leaves unexplained",
                "Every GPU the daemons see (NVML): its product name, total and used memory, and memory used beyond "
                "what the capacity models of its targets explain.",
                [
                    (with_gpu_name(f"plimsoll_gpu_memory_total_bytes{{{NODE}}}"), "total", "bytes"),
                    (with_gpu_name(f"plimsoll_gpu_memory_used_bytes{{{NODE}}}"), "used", "bytes"),
                    (with_gpu_name(f"plimsoll_vram_unexplained_bytes{{{NODE}}}"), "unexplained", "bytes"),
                ],
                ["instance", "gpu", "name"],
            ),
            24,
            8,
        ),
    ]


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
        targets=[
            query(expr, "", ref, instant=True, table=True) for ref, (expr, _, _) in zip(refs, columns, strict=True)
        ],
        unit="short",
        thresholds=steps(("text", None)),
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
