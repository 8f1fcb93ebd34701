"""The capacity plan: what one deployment holds per GPU, whether it fits, and what it takes to serve a load.

`plan()` answers the forward question (this model, this GPU, these flags: how many KV tokens?) and
`plan_fleet()` the inverse one (this load: how many GPUs, split how?). Both are pure: the caller supplies the
architecture and the GPU, already loaded.
"""

import math
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.capacity import assumptions as A
from exporter.capacity.activation import activation_peak_bytes, cuda_graph_bytes, non_torch_bytes
from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.kv import KvLayout, KvPool, blocks_per_request, kv_dtype_bytes, kv_layout, kv_pool
from exporter.capacity.quantization import Quantization
from exporter.capacity.weights import WeightBreakdown, weight_breakdown, weight_dtype_bytes
from exporter.units import format_gib

ENGINES = ("vllm", "sglang")


class PlanError(ValueError):
    """A deployment that cannot be planned at all (as opposed to one that does not fit)."""


@dataclass(frozen=True)
class Deployment:
    """The engine flags that decide memory; None means the engine's default."""

    engine: str = "vllm"
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    # Engines of one replica, each with its own attention and KV cache (vLLM --data-parallel-size, SGLang --dp).
    data_parallel: int = 1
    # MoE experts split over data_parallel x tensor_parallel GPUs instead of tensor-sliced on each
    # (vLLM --enable-expert-parallel).
    expert_parallel: bool = False
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    quantization: Quantization | None = None
    vllm_version: tuple[int, int] | None = None  # None: current vLLM

    @property
    def cuda_graphs_in_budget(self) -> bool:
        """vLLM subtracts its CUDA-graph estimate from the KV budget since v0.21, unless graphs are off."""
        if self.enforce_eager or self.engine != "vllm":
            return False
        return self.vllm_version is None or self.vllm_version >= A.VLLM_CUDA_GRAPHS_IN_BUDGET_SINCE


@dataclass(frozen=True)
class BreakdownLine:
    item: str
    bytes: int
    how: str


@dataclass(frozen=True)
class CapacityPlan:
    model: str
    gpu: str
    gpu_memory_bytes: int
    deployment: Deployment
    weights: WeightBreakdown
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_cache_bytes: int  # the KV budget on one GPU, before rounding to whole blocks
    layout: KvLayout
    pool: KvPool
    fits: bool
    shortfall_bytes: int
    breakdown: tuple[BreakdownLine, ...]
    suggestions: tuple[str, ...] = field(default=())

    @property
    def overhead_bytes(self) -> int:
        return self.non_torch_bytes + self.cuda_graph_bytes

    @property
    def num_gpus(self) -> int:
        return self.deployment.tensor_parallel * self.deployment.pipeline_parallel

    def to_dict(self) -> dict[str, Any]:
        d = self.deployment
        return {
            "model": self.model,
            "gpu": self.gpu,
            "engine": d.engine,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "tensor_parallel": d.tensor_parallel,
            "pipeline_parallel": d.pipeline_parallel,
            "gpus": self.num_gpus,
            "gpu_memory_utilization": d.gpu_memory_utilization,
            "max_model_len": d.max_model_len,
            "max_num_batched_tokens": d.max_num_batched_tokens,
            "max_num_seqs": d.max_num_seqs,
            "block_size": d.block_size,
            "dtype": d.dtype,
            "kv_cache_dtype": d.kv_cache_dtype,
            "quantization": d.quantization.method if d.quantization else None,
            "total_parameters": self.weights.total_parameters,
            "weights_bytes": self.weights.per_gpu_bytes,
            "activation_bytes": self.activation_bytes,
            "overhead_bytes": self.overhead_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "cuda_graph_bytes": self.cuda_graph_bytes,
            "kv_cache_bytes": self.pool.pool_bytes,
            "kv_cache_budget_bytes": self.kv_cache_bytes,
            "kv_bytes_per_token": self.layout.bytes_per_token,
            "kv_cache_blocks": self.pool.num_blocks,
            "kv_cache_tokens": self.pool.tokens,
            "max_concurrency": round(self.pool.max_concurrency, 4),
            "fits": self.fits,
            "shortfall_bytes": self.shortfall_bytes,
            "breakdown": [{"item": b.item, "bytes": b.bytes, "how": b.how} for b in self.breakdown],
            "suggestions": list(self.suggestions),
        }


def resolve(deployment: Deployment, arch: ModelArchitecture, gpu: GpuSpec) -> Deployment:
    """Fill every default the engine would pick for this model and GPU, and reject impossible flags."""
    d = deployment
    if d.engine not in ENGINES:
        raise PlanError(f"--engine {d.engine!r} is not one of {', '.join(ENGINES)}")
    if d.tensor_parallel < 1 or d.pipeline_parallel < 1:
        raise PlanError("--tp and --pp must be at least 1")
    if arch.num_attention_heads % d.tensor_parallel:
        raise PlanError(
            f"--tp {d.tensor_parallel} does not divide the model's {arch.num_attention_heads} attention heads"
        )
    if d.pipeline_parallel > arch.num_layers:
        raise PlanError(f"--pp {d.pipeline_parallel} exceeds the model's {arch.num_layers} layers")
    utilization = d.gpu_memory_utilization
    if utilization is None and d.engine == "sglang":
        utilization = A.SGLANG_MEM_FRACTION_STATIC
    elif utilization is None:
        old = d.vllm_version is not None and d.vllm_version < A.VLLM_CUDA_GRAPHS_IN_BUDGET_SINCE
        utilization = A.VLLM_GPU_MEMORY_UTILIZATION_OLD if old else A.VLLM_GPU_MEMORY_UTILIZATION
    if not 0 < utilization <= 1:
        raise PlanError(f"--gpu-memory-utilization {utilization} is not a ratio in (0, 1]")
    large = gpu.memory_bytes >= A.VLLM_LARGE_GPU_BYTES and not gpu.is_a100
    max_model_len = d.max_model_len or arch.max_position_embeddings
    batched = d.max_num_batched_tokens or (A.VLLM_BATCHED_TOKENS_LARGE_GPU if large else A.VLLM_BATCHED_TOKENS)
    v0 = d.vllm_version is not None and d.vllm_version < A.VLLM_V1_SINCE
    if v0 and d.max_num_batched_tokens is None and max_model_len <= A.VLLM_V0_CHUNKED_PREFILL_ABOVE:
        batched = max(max_model_len, A.VLLM_BATCHED_TOKENS)
    if d.block_size is not None:
        block = d.block_size
    elif d.engine == "sglang":
        block = A.SGLANG_PAGE_SIZE
    else:
        block = A.VLLM_MLA_BLOCK_SIZE if arch.mla is not None else A.VLLM_BLOCK_SIZE
    return replace(
        d,
        gpu_memory_utilization=utilization,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched,
        max_num_seqs=d.max_num_seqs or (A.VLLM_MAX_NUM_SEQS_LARGE_GPU if large else A.VLLM_MAX_NUM_SEQS),
        block_size=block,
        quantization=d.quantization or arch.quantization,
    )


def plan(arch: ModelArchitecture, gpu: GpuSpec, deployment: Deployment) -> CapacityPlan:
    """The per-GPU breakdown; a deployment that does not fit also gets the changes that would make it fit."""
    result = _evaluate(arch, gpu, deployment)
    if result.fits:
        return result
    return replace(result, suggestions=tuple(_suggestions(arch, gpu, result.deployment, result)))


def _fits(arch: ModelArchitecture, gpu: GpuSpec, deployment: Deployment) -> bool:
    return _evaluate(arch, gpu, deployment).fits


def _evaluate(arch: ModelArchitecture, gpu: GpuSpec, deployment: Deployment) -> CapacityPlan:
    d = resolve(deployment, arch, gpu)
    assert d.gpu_memory_utilization is not None and d.max_model_len is not None
    assert d.max_num_batched_tokens is not None and d.max_num_seqs is not None and d.block_size is not None
    tp, pp = d.tensor_parallel, d.pipeline_parallel
    dtype_bytes = weight_dtype_bytes(arch, d.dtype)
    weights = weight_breakdown(arch, tp, pp, d.dtype, d.quantization, d.vllm_version)
    layout = kv_layout(arch, tp, pp, kv_dtype_bytes(d.kv_cache_dtype, dtype_bytes))
    budget = round(gpu.memory_bytes * d.gpu_memory_utilization)
    lines = [
        BreakdownLine("GPU memory", gpu.memory_bytes, f"{gpu.name}, total as the CUDA runtime reports it"),
    ]
    if d.kv_cache_memory_bytes is not None:
        activation = non_torch = graphs = 0
        kv_budget = d.kv_cache_memory_bytes
        lines.append(BreakdownLine("KV cache budget", kv_budget, "given by --kv-cache-memory"))
        lines.append(BreakdownLine("weights", weights.per_gpu_bytes, _weights_how(arch, weights, d)))
    else:
        activation = activation_peak_bytes(arch, tp, d.max_num_batched_tokens, d.max_num_seqs, dtype_bytes)
        non_torch = non_torch_bytes(tp, pp)
        graphs = cuda_graph_bytes(d.cuda_graphs_in_budget)
        if d.engine == "sglang":
            activation, graphs = 0, 0
            non_torch = A.SGLANG_CONTEXT_BYTES
        kv_budget = budget - weights.per_gpu_bytes - activation - non_torch - graphs
        share = "mem_fraction_static" if d.engine == "sglang" else "gpu_memory_utilization"
        lines += [
            BreakdownLine("budget", budget, f"GPU memory x {share} {d.gpu_memory_utilization:g}"),
            BreakdownLine("- weights", weights.per_gpu_bytes, _weights_how(arch, weights, d)),
            BreakdownLine(
                "- activation peak",
                activation,
                f"profiling run of {d.max_num_batched_tokens} batched tokens, {d.max_num_seqs} sequences"
                if d.engine == "vllm"
                else "inside SGLang's static fraction",
            ),
            BreakdownLine("- non-torch memory", non_torch, "CUDA context, cuBLAS and NCCL buffers"),
            BreakdownLine(
                "- CUDA graphs",
                graphs,
                "disabled by --enforce-eager" if d.enforce_eager else "vLLM >= 0.21 estimate",
            ),
            BreakdownLine("= KV cache budget", kv_budget, "what is left, per GPU"),
        ]
    legacy = d.vllm_version is not None and d.vllm_version < A.VLLM_HYBRID_TOKENS_AS_CONCURRENCY_SINCE
    pool = kv_pool(layout, kv_budget, d.block_size, d.max_model_len, d.max_num_batched_tokens, legacy)
    lines += [
        BreakdownLine("KV bytes per token", layout.bytes_per_token, _kv_how(arch, layout, tp, d)),
        BreakdownLine("KV cache in blocks", pool.pool_bytes, _pool_how(pool)),
    ]
    fits = pool.num_blocks >= pool.blocks_per_request
    shortfall = 0 if fits else pool.blocks_per_request * pool.block_bytes - kv_budget
    return CapacityPlan(
        model=arch.name,
        gpu=gpu.name,
        gpu_memory_bytes=gpu.memory_bytes,
        deployment=d,
        weights=weights,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs,
        kv_cache_bytes=kv_budget,
        layout=layout,
        pool=pool,
        fits=fits,
        shortfall_bytes=shortfall,
        breakdown=tuple(lines),
    )


def _weights_how(arch: ModelArchitecture, weights: WeightBreakdown, d: Deployment) -> str:
    quant = d.quantization.label if d.quantization else f"{d.dtype} (16-bit)" if d.dtype == "auto" else d.dtype
    split = f"split over TP {d.tensor_parallel}" + (f" x PP {d.pipeline_parallel}" if d.pipeline_parallel > 1 else "")
    return f"{weights.total_parameters / 1e9:.2f}B parameters, {quant}, {split}"


def _kv_how(arch: ModelArchitecture, layout: KvLayout, tp: int, d: Deployment) -> str:
    dtype_bytes = kv_dtype_bytes(d.kv_cache_dtype, weight_dtype_bytes(arch, d.dtype))
    if arch.mla is not None:
        head = f"MLA latent ({arch.mla.kv_lora_rank} + {arch.mla.qk_rope_head_dim}) x {dtype_bytes} B"
    else:
        heads = max(1, arch.num_kv_heads // tp)
        note = " (replicated: TP > KV heads)" if tp > arch.num_kv_heads else ""
        head = f"2 x {heads} KV heads{note} x {arch.head_dim} head_dim x {dtype_bytes} B"
    layers = f"{layout.layers} layers"
    if layout.sliding_layers:
        layers += f" ({layout.sliding_layers} sliding, window {layout.sliding_window})"
    return f"{head} x {layers}"


def _pool_how(pool: KvPool) -> str:
    return (
        f"{pool.num_blocks} blocks of {pool.block_size} tokens = {pool.tokens:,} tokens; "
        f"{pool.blocks_per_request} blocks per max-length request -> {pool.max_concurrency:.2f}x concurrency"
    )


def _suggestions(arch: ModelArchitecture, gpu: GpuSpec, d: Deployment, failed: CapacityPlan) -> list[str]:
    out = [f"short by {format_gib(failed.shortfall_bytes)} per GPU for one request of {d.max_model_len} tokens"]
    larger_tp = [
        tp for tp in A.TENSOR_PARALLEL_CHOICES if tp > d.tensor_parallel and arch.num_attention_heads % tp == 0
    ]
    for tp in larger_tp:
        if _fits(arch, gpu, replace(d, tensor_parallel=tp)):
            out.append(f"--tp {tp} fits")
            break
    if d.kv_cache_dtype == "auto" and _fits(arch, gpu, replace(d, kv_cache_dtype="fp8")):
        out.append("--kv-cache-dtype fp8 fits")
    if failed.kv_cache_bytes > 0:
        longest = _longest_context(arch, gpu, d)
        if longest:
            out.append(f"--max-model-len {longest} fits")
    raised = replace(d, gpu_memory_utilization=0.95)
    utilization = d.gpu_memory_utilization
    if d.kv_cache_memory_bytes is None and utilization is not None and utilization < 0.95 and _fits(arch, gpu, raised):
        out.append("--gpu-memory-utilization 0.95 fits")
    return out


def _longest_context(arch: ModelArchitecture, gpu: GpuSpec, d: Deployment) -> int:
    """The longest max_model_len (a multiple of the block size) that still fits one request."""
    assert d.block_size is not None and d.max_model_len is not None
    low, high = 0, d.max_model_len // d.block_size
    while low < high:
        mid = (low + high + 1) // 2
        if _fits(arch, gpu, replace(d, max_model_len=mid * d.block_size)):
            low = mid
        else:
            high = mid - 1
    return low * d.block_size


@dataclass(frozen=True)
class FleetOption:
    plan: CapacityPlan
    requests_per_replica: int
    replicas: int

    @property
    def gpus(self) -> int:
        return self.replicas * self.plan.num_gpus

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.plan.gpu,
            "tensor_parallel": self.plan.deployment.tensor_parallel,
            "pipeline_parallel": self.plan.deployment.pipeline_parallel,
            "replicas": self.replicas,
            "gpus": self.gpus,
            "requests_per_replica": self.requests_per_replica,
            "kv_cache_tokens_per_replica": self.plan.pool.tokens,
        }


def requests_per_replica(result: CapacityPlan, context_tokens: int) -> int:
    """Requests of `context_tokens` that one replica holds at once: KV blocks, capped by max_num_seqs."""
    d = result.deployment
    assert d.block_size is not None and d.max_num_batched_tokens is not None and d.max_num_seqs is not None
    per_request = blocks_per_request(result.layout, context_tokens, d.block_size, d.max_num_batched_tokens)
    return min(result.pool.num_blocks // per_request, d.max_num_seqs)


def plan_fleet(
    arch: ModelArchitecture,
    gpus: list[GpuSpec],
    deployment: Deployment,
    concurrency: int,
    context_tokens: int,
) -> list[FleetOption]:
    """Ways to hold `concurrency` requests of `context_tokens` each, fewest GPUs first.

    Each GPU type contributes its cheapest tensor-parallel split (ties go to the smaller TP: fewer collectives,
    more replicas to spread load and failures)."""
    if concurrency < 1 or context_tokens < 1:
        raise PlanError("--concurrency and the tokens per request must be at least 1")
    options: list[FleetOption] = []
    for gpu in gpus:
        best: FleetOption | None = None
        for tp in A.TENSOR_PARALLEL_CHOICES:
            if arch.num_attention_heads % tp:
                continue
            candidate = replace(deployment, tensor_parallel=tp)
            if candidate.max_model_len is None:
                candidate = replace(candidate, max_model_len=max(context_tokens, 1))
            elif candidate.max_model_len < context_tokens:
                raise PlanError(
                    f"requests of {context_tokens} tokens do not fit --max-model-len {candidate.max_model_len}"
                )
            result = _evaluate(arch, gpu, candidate)
            if not result.fits:
                continue
            per_replica = requests_per_replica(result, context_tokens)
            if per_replica < 1:
                continue
            option = FleetOption(result, per_replica, math.ceil(concurrency / per_replica))
            if best is None or option.gpus < best.gpus:
                best = option
        if best is not None:
            options.append(best)
    return sorted(options, key=lambda o: (o.gpus, o.plan.gpu_memory_bytes * o.gpus))
