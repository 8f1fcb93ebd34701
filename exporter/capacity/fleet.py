"""Inverse planning: how many GPUs, of which type and split how, hold a load of concurrent requests.

Pure, like the forward plan it searches with: the caller supplies the architecture and the GPUs, already loaded.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.candidates import Layout, Precision, layouts, precisions
from exporter.capacity.deployment import Deployment
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.kv import blocks_per_request
from exporter.capacity.plan import CapacityPlan, PlanError, evaluate
from exporter.display import shown


@dataclass(frozen=True)
class FleetOption:
    plan: CapacityPlan
    requests_per_replica: int
    replicas: int
    gpu_hour_price: float | None = None
    precision: Precision = field(default_factory=Precision)  # what the search changed from the deployment asked for

    @property
    def gpus(self) -> int:
        return self.replicas * self.plan.num_gpus

    @property
    def cost_per_hour(self) -> float | None:
        return None if self.gpu_hour_price is None else round(self.gpu_hour_price * self.gpus, 4)

    def to_dict(self) -> dict[str, Any]:
        d = self.plan.deployment
        return {
            "gpu": self.plan.gpu,
            "tensor_parallel": d.tensor_parallel,
            "pipeline_parallel": d.pipeline_parallel,
            "data_parallel": d.data_parallel,
            "expert_parallel": d.expert_parallel,
            "gpus_per_replica": self.plan.num_gpus,
            "replicas": self.replicas,
            "gpus": self.gpus,
            "requests_per_replica": self.requests_per_replica,
            "kv_cache_tokens_per_replica": self.plan.replica_kv_tokens,
            "quantization": d.quantization.method if d.quantization else None,
            "kv_cache_dtype": d.kv_cache_dtype,
            "changes_precision": list(self.precision.changes),
            "gpu_hour_price": self.gpu_hour_price,
            "cost_per_hour": self.cost_per_hour,
        }


def requests_per_replica(result: CapacityPlan, context_tokens: int) -> int:
    """Requests of `context_tokens` one replica holds at once: each DP engine's KV blocks, capped by its
    max_num_seqs, times the engines."""
    d = result.deployment
    assert d.block_size is not None and d.max_num_batched_tokens is not None and d.max_num_seqs is not None
    per_request = blocks_per_request(result.layout, context_tokens, d.block_size, d.in_flight_tokens)
    return d.data_parallel * min(result.pool.num_blocks // per_request, d.max_num_seqs)


def _rank(option: FleetOption) -> tuple[float, int, int, int]:
    """Cheapest per hour when priced (unpriced after every priced one), then fewest GPUs, then the simpler
    layout: fewer pipeline stages and engines (fewer hops), then the smaller GPU."""
    cost = option.cost_per_hour if option.cost_per_hour is not None else math.inf
    d = option.plan.deployment
    return (cost, option.gpus, d.pipeline_parallel * d.data_parallel, option.plan.gpu_memory_bytes * option.gpus)


def plan_fleet(
    arch: ModelArchitecture,
    gpus: list[GpuSpec],
    deployment: Deployment,
    concurrency: int,
    context_tokens: int,
    *,
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
    data_parallel: int | None = None,
    gpu_hour_prices: Mapping[str, float] | None = None,
) -> list[FleetOption]:
    """Ways to hold `concurrency` requests of `context_tokens` each, best first.

    Layouts span up to 4 nodes of 8 GPUs; a size given here is kept, the others are searched (the
    deployment's own tensor/pipeline/data-parallel sizes are replaced by the search). Each GPU type contributes
    its best option at the deployment's precision and, when fp8 weights or KV beat it, its best option with
    fp8 (labelled). `gpu_hour_prices` (by GPU name) ranks by the fleet's cost per hour."""
    if concurrency < 1 or context_tokens < 1:
        raise PlanError("--concurrency and the tokens per request must be at least 1")
    if deployment.max_model_len is None:
        limit = arch.context_limit(deployment.engine)
        if context_tokens > limit.tokens:
            raise PlanError(
                f"requests of {context_tokens} tokens are longer than {shown(arch.name)}'s maximum of {limit.tokens} "
                f"tokens ({limit.derivation}): size the requests at {limit.tokens} tokens or fewer"
            )
        deployment = replace(deployment, max_model_len=context_tokens)
    elif deployment.max_model_len < context_tokens:
        raise PlanError(
            f"requests of {context_tokens} tokens do not fit --max-model-len {deployment.max_model_len}: raise it, or "
            "size the requests smaller"
        )
    prices = gpu_hour_prices or {}
    candidates = layouts(arch, tensor_parallel, pipeline_parallel, data_parallel)
    if data_parallel:
        candidates = [replace(c, expert_parallel=deployment.expert_parallel) for c in candidates]
    options: list[FleetOption] = []
    for gpu in gpus:
        found = []
        for precision in precisions(arch, deployment, gpu):
            best = _best_layout(arch, gpu, precision.applied(deployment), candidates, concurrency, context_tokens)
            if best is not None:
                found.append(replace(best, gpu_hour_price=prices.get(gpu.name), precision=precision))
        asked = [o for o in found if not o.precision.changes]
        changed = sorted((o for o in found if o.precision.changes), key=_rank)
        options += asked
        if changed and (not asked or _rank(changed[0]) < _rank(asked[0])):
            options.append(changed[0])
    return sorted(options, key=_rank)


def _best_layout(
    arch: ModelArchitecture,
    gpu: GpuSpec,
    deployment: Deployment,
    candidates: list[Layout],
    concurrency: int,
    context_tokens: int,
) -> FleetOption | None:
    best: FleetOption | None = None
    for layout in candidates:
        if best is not None and layout.gpus > best.gpus:
            break  # a replica larger than the whole best fleet cannot need fewer GPUs
        try:
            result = evaluate(arch, gpu, layout.applied(deployment))
        except PlanError:
            continue
        if not result.fits:
            continue
        per_replica = requests_per_replica(result, context_tokens)
        if per_replica < 1:
            continue
        option = FleetOption(result, per_replica, math.ceil(concurrency / per_replica))
        if best is None or _rank(option) < _rank(best):
            best = option
    return best
