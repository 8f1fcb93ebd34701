"""`plimsoll plan` answers as text a person can check by hand, or as JSON for scripts."""

from exporter.capacity.plan import CapacityPlan, FleetOption
from exporter.units import GIB


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:9.2f} GiB"


def plan_table(result: CapacityPlan) -> str:
    d = result.deployment
    head = [
        f"model   {result.model}",
        f"gpu     {result.gpu} x {result.num_gpus} (TP {d.tensor_parallel}, PP {d.pipeline_parallel}), "
        f"engine {d.engine}",
        f"flags   max_model_len {d.max_model_len}, max_num_batched_tokens {d.max_num_batched_tokens}, "
        f"max_num_seqs {d.max_num_seqs}, block_size {d.block_size}, kv_cache_dtype {d.kv_cache_dtype}",
        "",
        "per GPU",
    ]
    width = max(len(line.item) for line in result.breakdown)
    rows = []
    for line in result.breakdown:
        amount = f"{line.bytes:,} B" if line.item == "KV bytes per token" else _gib(line.bytes)
        rows.append(f"  {line.item:<{width}}  {amount:>16}  {line.how}")
    verdict = "fits" if result.fits else "DOES NOT FIT"
    tail = [
        "",
        f"{verdict}: {result.pool.tokens:,} KV tokens per replica, "
        f"{result.pool.max_concurrency:.2f} requests of {d.max_model_len} tokens at once",
    ]
    tail += [f"  - {s}" for s in result.suggestions]
    return "\n".join(head + rows + tail)


def fleet_table(options: list[FleetOption], concurrency: int, context: int) -> str:
    if not options:
        return f"no GPU and tensor-parallel split of up to 8 GPUs holds one request of {context} tokens"
    lines = [
        f"{concurrency} concurrent requests of {context} tokens",
        "",
        f"  {'gpu':<12} {'TP':>3} {'PP':>3} {'replicas':>9} {'GPUs':>6} "
        f"{'requests/replica':>17} {'KV tokens/replica':>18}",
    ]
    for option in options:
        d = option.plan.deployment
        lines.append(
            f"  {option.plan.gpu:<12} {d.tensor_parallel:>3} {d.pipeline_parallel:>3} {option.replicas:>9} "
            f"{option.gpus:>6} {option.requests_per_replica:>17} {option.plan.pool.tokens:>18,}"
        )
    best = options[0]
    tp = best.plan.deployment.tensor_parallel
    lines += ["", f"best: {best.gpus} x {best.plan.gpu} as {best.replicas} replica(s) of TP {tp}"]
    return "\n".join(lines)
