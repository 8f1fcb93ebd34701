"""`plimsoll plan` answers as text a person can check by hand, or as JSON for scripts."""

from exporter.capacity.candidates import GPUS_PER_NODE
from exporter.capacity.fleet import FleetOption
from exporter.capacity.plan import CapacityPlan
from exporter.capacity.uncertainty import kv_cache_tokens_range
from exporter.core.units import GIB
from exporter.display import shown


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:9.2f} GiB"


def _layout(result: CapacityPlan) -> str:
    d = result.deployment
    parts = [f"TP {d.tensor_parallel}", f"PP {d.pipeline_parallel}"]
    if d.data_parallel > 1:
        parts.append(f"DP {d.data_parallel}")
    if d.expert_parallel:
        parts.append("EP")
    return ", ".join(parts)


def plan_table(result: CapacityPlan) -> str:
    d = result.deployment
    head = [
        f"model   {shown(result.model)}",
        f"gpu     {result.gpu} x {result.num_gpus} ({_layout(result)}), engine {d.engine}",
        f"flags   max_model_len {d.max_model_len}, max_num_batched_tokens {d.max_num_batched_tokens}, "
        f"max_num_seqs {d.max_num_seqs}, block_size {d.block_size}, kv_cache_dtype {d.kv_cache_dtype}",
        "",
        "per GPU",
    ]
    labels = [f"{line.sign} {line.item}" if line.sign else line.item for line in result.breakdown]
    width = max(len(label) for label in labels)
    rows = []
    for label, line in zip(labels, result.breakdown, strict=True):
        amount = f"{line.bytes:,} B" if line.item == "KV bytes per token" else _gib(line.bytes)
        rows.append(f"  {label:<{width}}  {amount:>16}  {line.how}")
    verdict = "fits" if result.fits else "DOES NOT FIT"
    tokens = f"{result.pool.tokens:,} KV tokens per replica"
    requests = f"{result.pool.max_concurrency:.2f} requests of {d.max_model_len} tokens at once"
    if d.data_parallel > 1:
        tokens = (
            f"{result.replica_kv_tokens:,} KV tokens per replica ({d.data_parallel} engines of {result.pool.tokens:,})"
        )
        requests = f"{result.pool.max_concurrency * d.data_parallel:.2f} requests of {d.max_model_len} tokens at once"
    low, high = kv_cache_tokens_range(result)
    tail = ["", f"{verdict}: {tokens}, {requests}"]
    if high > 0:  # a pool that cannot hold a block even at the high end has no range worth reading
        tail.append(
            f"  likely {low:,} to {high:,} KV tokens per engine: how far each estimated term missed in real vLLM "
            "logs (docs/plan.md)"
        )
    tail += [f"  - {s}" for s in result.suggestions]
    return "\n".join(head + rows + tail)


def _cost(option: FleetOption) -> str:
    return "-" if option.cost_per_hour is None else f"{option.cost_per_hour:,.2f}"


def fleet_table(options: list[FleetOption], concurrency: int, context: int) -> str:
    if not options:
        return (
            f"no GPU and layout of up to 4 nodes of {GPUS_PER_NODE} GPUs per replica holds one request of "
            f"{context} tokens"
        )
    priced = any(o.cost_per_hour is not None for o in options)
    lines = [
        f"{concurrency} concurrent requests of {context} tokens"
        + (", ranked by cost per hour" if priced else ", ranked by GPUs"),
        "",
        f"  {'gpu':<12} {'TP':>3} {'PP':>3} {'DP':>3} {'EP':>3} {'replicas':>9} {'GPUs':>6} "
        f"{'requests/replica':>17} {'KV tokens/replica':>18}"
        + (f" {'cost/hour':>10}" if priced else "")
        + "  precision",
    ]
    for option in options:
        d = option.plan.deployment
        precision = (
            ", ".join(option.precision.changes) + " (changes precision)" if option.precision.changes else "as asked"
        )
        lines.append(
            f"  {option.plan.gpu:<12} {d.tensor_parallel:>3} {d.pipeline_parallel:>3} {d.data_parallel:>3} "
            f"{'yes' if d.expert_parallel else 'no':>3} {option.replicas:>9} {option.gpus:>6} "
            f"{option.requests_per_replica:>17} {option.plan.replica_kv_tokens:>18,}"
            + (f" {_cost(option):>10}" if priced else "")
            + f"  {precision}"
        )
    as_asked = [o for o in options if not o.precision.changes]
    lines.append("")
    if as_asked:
        lines.append(f"best: {_describe(as_asked[0])}")
    cheaper = [
        o for o in options if o.precision.changes and (not as_asked or options.index(o) < options.index(as_asked[0]))
    ]
    if cheaper:
        lines.append(f"with {', '.join(cheaper[0].precision.changes)} (changes precision): {_describe(cheaper[0])}")
    return "\n".join(lines)


def _describe(option: FleetOption) -> str:
    d = option.plan.deployment
    layout = f"TP {d.tensor_parallel}" + (f" x PP {d.pipeline_parallel}" if d.pipeline_parallel > 1 else "")
    if d.data_parallel > 1:
        layout += f" x DP {d.data_parallel}" + (" with EP" if d.expert_parallel else "")
    cost = f", {option.cost_per_hour:,.2f} per hour" if option.cost_per_hour is not None else ""
    return f"{option.gpus} x {option.plan.gpu} as {option.replicas} replica(s) of {layout}{cost}"
