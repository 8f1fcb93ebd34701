"""The capacity plan: what one deployment holds per GPU, whether it fits, and if not, what would make it fit.

`plan()` answers the forward question (this model, this GPU, these flags: how many KV tokens?); the inverse one
(this load: how many GPUs, split how?) is `exporter.capacity.fleet`. Both are pure: the caller supplies the
architecture and the GPU, already loaded.
"""

import math
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.capacity import assumptions as A
from exporter.capacity.activation import (
    ActivationPasses,
    EncoderProfile,
    activation_passes,
    cuda_graph_bytes,
    encoder_profile,
    language_only,
    non_torch_bytes,
)
from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.candidates import GPUS_PER_NODE, MAX_GPUS_PER_REPLICA, layouts, precisions
from exporter.capacity.deployment import Deployment, PipelineStage, pipeline_stages
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.kv import (
    VLLM_MLA_CACHE_SINCE,
    VLLM_V0_DEEPSEEK_HEAD_SIZE,
    KvLayout,
    KvPool,
    kv_dtype_bytes,
    kv_layout,
    kv_pool,
)
from exporter.capacity.uncertainty import kv_cache_tokens_range
from exporter.capacity.weights import (
    VISION_REPLICATED,
    VISION_SHARDED,
    VISION_SKIPPED,
    WeightBreakdown,
    weight_breakdown,
    weight_dtype_bytes,
)
from exporter.core.units import format_gib
from exporter.display import shown

ENGINES = ("vllm", "sglang")


class PlanError(ValueError):
    """A deployment that cannot be planned at all (as opposed to one that does not fit)."""


# Upper bounds of a deployment's settings, each far past any real deployment's (in brackets), so that a slip or a
# hostile value, from a flag or a config, is refused with the range instead of planned into a figure nobody could use.
MAX_GPU_TIB = 4  # (288 GB on the largest GPUs)
MAX_GPU_MEMORY_BYTES = MAX_GPU_TIB * 1024**4
MAX_PARALLEL = 1024  # per parallel dimension (TP 8 or 16; DP a few hundred in wide expert parallelism)
MAX_SEQUENCES = 1_048_576  # requests one engine batches (vLLM's defaults are 256 and 1024)


@dataclass(frozen=True)
class BreakdownLine:
    item: str  # words only; the table adds `sign`
    bytes: int
    how: str
    sign: str = ""  # "-" subtracted from the budget above, "=" what is left


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
    # What the activation peak is the larger of, for its range (`uncertainty`); all 0 where nothing is estimated.
    activation_passes: ActivationPasses
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
        return self.deployment.gpus

    @property
    def replica_kv_tokens(self) -> int:
        """KV tokens of the whole replica: every data-parallel engine has its own pool."""
        return self.pool.tokens * self.deployment.data_parallel

    def to_dict(self) -> dict[str, Any]:
        d = self.deployment
        return {
            "model": self.model,
            "gpu": self.gpu,
            "engine": d.engine,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "tensor_parallel": d.tensor_parallel,
            "pipeline_parallel": d.pipeline_parallel,
            "data_parallel": d.data_parallel,
            "expert_parallel": d.expert_parallel,
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
            # Per engine, like kv_cache_tokens: where the real figure may fall (docs/plan.md).
            "kv_cache_tokens_range": list(kv_cache_tokens_range(self)),
            "kv_cache_tokens_per_replica": self.replica_kv_tokens,
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
    if d.tensor_parallel < 1 or d.pipeline_parallel < 1 or d.data_parallel < 1:
        raise PlanError("--tp, --pp and --dp must be at least 1")
    if arch.num_attention_heads % d.tensor_parallel:
        raise PlanError(
            f"--tp {d.tensor_parallel} does not divide the model's {arch.num_attention_heads} attention heads"
        )
    if d.pipeline_parallel > arch.num_layers:
        raise PlanError(f"--pp {d.pipeline_parallel} exceeds the model's {arch.num_layers} layers")
    partition = d.pp_layer_partition
    if partition is not None and (len(partition) != d.pipeline_parallel or sum(partition) != arch.num_layers):
        # vLLM refuses the same two mistakes at startup (get_pp_indices).
        raise PlanError(
            f"--pp-layer-partition {','.join(map(str, partition))} must give {d.pipeline_parallel} stages (--pp) "
            f"whose layers add up to the model's {arch.num_layers}"
        )
    utilization = d.gpu_memory_utilization
    if utilization is None and d.engine == "sglang":
        utilization = A.SGLANG_MEM_FRACTION_STATIC
    elif utilization is None:
        old = d.vllm_version is not None and d.vllm_version < A.VLLM_CUDA_GRAPHS_IN_BUDGET_SINCE
        utilization = A.VLLM_GPU_MEMORY_UTILIZATION_OLD if old else A.VLLM_GPU_MEMORY_UTILIZATION
    if not 0 < utilization <= 1:
        raise PlanError(f"--gpu-memory-utilization {utilization} is not a ratio in (0, 1]")
    large = gpu.memory_bytes >= A.VLLM_LARGE_GPU_BYTES and not gpu.is_a100
    max_model_len = d.max_model_len or arch.context_limit(d.engine).tokens
    batched = d.max_num_batched_tokens or (A.VLLM_BATCHED_TOKENS_LARGE_GPU if large else A.VLLM_BATCHED_TOKENS)
    v0 = d.v0_engine
    if v0 and d.max_num_batched_tokens is None and max_model_len <= A.VLLM_V0_CHUNKED_PREFILL_ABOVE:
        batched = max(max_model_len, A.VLLM_BATCHED_TOKENS)
    if d.block_size is not None:
        block = d.block_size
    elif d.engine == "sglang":
        block = A.SGLANG_PAGE_SIZE
    else:
        # V0 kept its 16-token default for MLA too (FlashMLA's 64 came with V1 and its backend selection).
        block = A.VLLM_MLA_BLOCK_SIZE if arch.mla is not None and not v0 else A.VLLM_BLOCK_SIZE
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
    result = evaluate(arch, gpu, deployment)
    if result.fits:
        return result
    return replace(result, suggestions=tuple(_suggestions(arch, gpu, result.deployment, result)))


def _fits(arch: ModelArchitecture, gpu: GpuSpec, deployment: Deployment) -> bool:
    return evaluate(arch, gpu, deployment).fits


def evaluate(arch: ModelArchitecture, gpu: GpuSpec, deployment: Deployment) -> CapacityPlan:
    """The per-GPU breakdown alone, without searching for fixes: what searches call for each candidate.

    With pipeline parallelism each stage sizes its pool from its own weights and layers, then vLLM gives every stage
    the block count of the smallest (`get_kv_cache_configs` in vllm/v1/core/kv_cache_utils.py): the engine holds
    what its tightest stage holds, so that stage's breakdown is the answer (one that does not fit first)."""
    d = resolve(deployment, arch, gpu)
    stages = dict.fromkeys(pipeline_stages(arch.num_layers, d.pipeline_parallel, d.pp_layer_partition))
    # A stage made only of layers that read an earlier layer's KV (Gemma 4's num_kv_shared_layers) has no pool to
    # constrain; the first stage always holds a layer with its own cache.
    stages = dict.fromkeys(s for s in stages if kv_layout(arch, 1, s).layers)
    return min((_evaluate_stage(arch, gpu, d, stage) for stage in stages), key=lambda p: (p.fits, p.pool.tokens))


def _evaluate_stage(arch: ModelArchitecture, gpu: GpuSpec, d: Deployment, stage: PipelineStage) -> CapacityPlan:
    assert d.gpu_memory_utilization is not None and d.max_model_len is not None
    assert d.max_num_batched_tokens is not None and d.max_num_seqs is not None and d.block_size is not None
    tp, pp = d.tensor_parallel, d.pipeline_parallel
    sglang = d.engine == "sglang"
    dtype_bytes = weight_dtype_bytes(arch, d.dtype)
    weights = weight_breakdown(
        arch,
        tp,
        stage,
        d.dtype,
        d.quantization,
        d.vllm_version,
        d.data_parallel,
        d.expert_parallel,
        _vision_placement(arch, d),
    )
    # Each data-parallel engine keeps its own KV pool, laid out as one TP x PP engine's.
    layout = kv_layout(arch, tp, stage, kv_dtype_bytes(d.kv_cache_dtype, dtype_bytes), d.vllm_version, dtype_bytes)
    budget = round(gpu.memory_bytes * d.gpu_memory_utilization)
    lines = [
        BreakdownLine("GPU memory", gpu.memory_bytes, f"{gpu.name}, total as the CUDA runtime reports it"),
    ]
    if d.kv_cache_memory_bytes is not None:
        activation = non_torch = graphs = 0
        passes = ActivationPasses(0)
        kv_budget = d.kv_cache_memory_bytes
        lines.append(BreakdownLine("KV cache budget", kv_budget, "given by --kv-cache-memory"))
        lines.append(BreakdownLine("weights", weights.per_gpu_bytes, _weights_how(arch, weights, d)))
        # vLLM allocates the pool it is told to; weights beside it must still fit on the GPU.
        room = gpu.memory_bytes - weights.per_gpu_bytes
    else:
        encoder = encoder_profile(arch, d, d.max_model_len, d.max_num_batched_tokens, d.max_num_seqs)
        passes = activation_passes(
            arch, tp, d.max_num_batched_tokens, d.max_num_seqs, dtype_bytes, encoder, d.mm_encoder_tp_mode
        )
        activation = passes.peak
        non_torch = non_torch_bytes(tp * d.data_parallel, pp)
        graphs = cuda_graph_bytes(d.cuda_graphs_in_budget)
        if sglang:
            activation, graphs, passes = 0, 0, ActivationPasses(0)
            non_torch = A.SGLANG_CONTEXT_BYTES
        kv_budget = budget - weights.per_gpu_bytes - activation - non_torch - graphs
        room = kv_budget
        share = "mem_fraction_static" if sglang else "gpu_memory_utilization"
        lines += [
            BreakdownLine("budget", budget, f"GPU memory x {share} {d.gpu_memory_utilization:g}"),
            BreakdownLine("weights", weights.per_gpu_bytes, _weights_how(arch, weights, d), "-"),
            BreakdownLine("activation peak", activation, _activation_how(d, encoder), "-"),
            BreakdownLine(
                "non-torch memory",
                non_torch,
                "CUDA context and SGLang's workspaces, reserved before the pool is sized"
                if sglang
                else "CUDA context, cuBLAS and NCCL buffers",
                "-",
            ),
            BreakdownLine("CUDA graphs", graphs, _graphs_how(d), "-"),
            BreakdownLine("KV cache budget", kv_budget, "what is left, per GPU", "="),
        ]
    legacy = d.vllm_version is not None and d.vllm_version < A.VLLM_HYBRID_TOKENS_AS_CONCURRENCY_SINCE
    pool = kv_pool(layout, kv_budget, d.block_size, d.max_model_len, d.in_flight_tokens, legacy)
    lines += [
        BreakdownLine("KV bytes per token", layout.bytes_per_token, _kv_how(arch, layout, tp, d)),
        BreakdownLine(f"KV cache in {'pages' if sglang else 'blocks'}", pool.pool_bytes, _pool_how(pool, d)),
    ]
    request_bytes = pool.blocks_per_request * pool.block_bytes
    fits = pool.num_blocks >= pool.blocks_per_request and room >= request_bytes
    shortfall = 0 if fits else request_bytes - min(room, kv_budget)
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
        activation_passes=passes,
        layout=layout,
        pool=pool,
        fits=fits,
        shortfall_bytes=shortfall,
        breakdown=tuple(lines),
    )


def _activation_how(d: Deployment, encoder: EncoderProfile | None) -> str:
    if d.engine == "sglang":
        return "outside mem_fraction_static: SGLang leaves the rest of the GPU to activations"
    how = f"profiling run of {d.max_num_batched_tokens} batched tokens, {d.max_num_seqs} sequences"
    if encoder is not None:
        images = f"{encoder.items} image{'s' if encoder.items > 1 else ''}"
        tokens, budget = f"{encoder.tokens_per_item:,}", f"{encoder.budget:,}"
        how += f", after {images} of {tokens} tokens through the vision tower (encoder budget {budget})"
    return how


def _vision_placement(arch: ModelArchitecture, d: Deployment) -> str:
    if language_only(arch, d):
        return VISION_SKIPPED
    return VISION_REPLICATED if d.mm_encoder_tp_mode == "data" else VISION_SHARDED


def _graphs_how(d: Deployment) -> str:
    if d.engine == "sglang":
        return "outside mem_fraction_static: SGLang captures them in the rest of the GPU"
    if d.enforce_eager:
        return "disabled by --enforce-eager"
    if d.cuda_graphs_in_budget:
        return "vLLM >= 0.21 estimate"
    return "outside the KV budget before vLLM 0.21"


def _weights_how(arch: ModelArchitecture, weights: WeightBreakdown, d: Deployment) -> str:
    quant = d.quantization.label if d.quantization else f"{d.dtype} (16-bit)" if d.dtype == "auto" else d.dtype
    split = f"split over TP {d.tensor_parallel}"
    if d.pipeline_parallel > 1:
        split += f" x PP {d.pipeline_parallel} (the stage of {weights.layers_on_gpu} layers holding the fewest tokens)"
    if d.data_parallel > 1:
        experts = "whole experts (EP)" if d.expert_parallel else "experts sliced"
        split += f", DP {d.data_parallel} engines with {experts} over DP x TP {d.data_parallel * d.tensor_parallel}"
    elif d.expert_parallel and d.tensor_parallel > 1:
        split += ", whole experts (EP)"
    vision = {VISION_SKIPPED: ", vision tower not loaded", VISION_REPLICATED: ", vision tower whole on each GPU"}
    tower = vision.get(_vision_placement(arch, d), "") if arch.vision is not None else ""
    return f"{weights.total_parameters / 1e9:.2f}B parameters, {quant}, {split}{tower}"


def _kv_how(arch: ModelArchitecture, layout: KvLayout, tp: int, d: Deployment) -> str:
    dtype_bytes = kv_dtype_bytes(d.kv_cache_dtype, weight_dtype_bytes(arch, d.dtype))
    if arch.mla is None:
        heads = max(1, arch.num_kv_heads // tp)
        note = " (replicated: TP > KV heads)" if tp > arch.num_kv_heads else ""
        head = f"2 x {heads} KV heads{note} x {arch.head_dim} head_dim x {dtype_bytes} B"
    elif not d.v0_engine:
        head = f"MLA latent ({arch.mla.kv_lora_rank} + {arch.mla.qk_rope_head_dim}) x {dtype_bytes} B"
        if tp > 1:
            head += " (whole on every TP rank)"
    elif d.vllm_version is not None and d.vllm_version < VLLM_MLA_CACHE_SINCE:
        heads = max(1, arch.num_kv_heads // tp)
        head = f"2 x {heads} heads x head size {VLLM_V0_DEEPSEEK_HEAD_SIZE} (V0 before MLA caching) x {dtype_bytes} B"
    else:
        elements = layout.bytes_per_token_per_layer // dtype_bytes
        latent = f"{arch.mla.kv_lora_rank} + {arch.mla.qk_rope_head_dim}"
        head = f"MLA latent ({latent}) padded to {elements} (V0's 256-byte alignment) x {dtype_bytes} B"
    if arch.full_head_dim is not None or arch.full_kv_heads is not None:
        return _two_shapes_how(arch, layout, tp, head, dtype_bytes)
    layers = f"{layout.layers} layers"
    if layout.sliding_layers:
        layers += f" ({layout.sliding_layers} sliding, window {layout.sliding_window})"
    return f"{head} x {layers}"


def _two_shapes_how(arch: ModelArchitecture, layout: KvLayout, tp: int, sliding_head: str, dtype_bytes: int) -> str:
    """Gemma 4's full-attention layers have their own head_dim and KV heads, so each kind gets its own product."""
    heads = max(1, (arch.full_kv_heads or arch.num_kv_heads) // tp)
    full_head = f"2 x {heads} KV heads x {arch.full_head_dim or arch.head_dim} head_dim x {dtype_bytes} B"
    parts = []
    if layout.sliding_layers:
        parts.append(f"{sliding_head} x {layout.sliding_layers} sliding layers (window {layout.sliding_window})")
    if layout.full_layers:
        parts.append(f"{full_head} x {layout.full_layers} full layers")
    return " + ".join(parts)


def _pool_how(pool: KvPool, d: Deployment) -> str:
    unit = "pages" if d.engine == "sglang" else "blocks"
    engines = f"; each of the {d.data_parallel} DP engines has its own" if d.data_parallel > 1 else ""
    return (
        f"{pool.num_blocks} {unit} of {pool.block_size} tokens = {pool.tokens:,} tokens; "
        f"{pool.blocks_per_request} {unit} per max-length request -> {pool.max_concurrency:.2f}x concurrency"
        f"{engines}"
    )


def _suggestions(arch: ModelArchitecture, gpu: GpuSpec, d: Deployment, failed: CapacityPlan) -> list[str]:
    """What would make `d` fit, each re-planned: only changes that fit are offered."""
    out = [f"short by {format_gib(failed.shortfall_bytes)} per GPU for one request of {d.max_model_len} tokens"]
    fixes: list[str] = []
    larger_tp = [
        tp for tp in A.TENSOR_PARALLEL_CHOICES if tp > d.tensor_parallel and arch.num_attention_heads % tp == 0
    ]
    for tp in larger_tp:
        if _fits(arch, gpu, replace(d, tensor_parallel=tp)):
            fixes.append(f"--tp {tp} fits")
            break
    for precision in precisions(arch, d, gpu)[1:]:
        if _fits(arch, gpu, precision.applied(d)):
            fixes.append(f"{precision.flags} fits (changes precision: {', '.join(precision.changes)})")
            break
    if failed.kv_cache_bytes > 0:
        longest = _longest_context(arch, gpu, d)
        if longest:
            fixes.append(f"--max-model-len {longest} fits")
    raised = replace(d, gpu_memory_utilization=0.95)
    utilization = d.gpu_memory_utilization
    if d.kv_cache_memory_bytes is None and utilization is not None and utilization < 0.95 and _fits(arch, gpu, raised):
        fixes.append("--gpu-memory-utilization 0.95 fits")
    if not any(fix.startswith("--tp") for fix in fixes):
        fixes += _larger_layouts(arch, gpu, d)
    if not fixes:
        fixes.append(f"nothing up to {MAX_GPUS_PER_REPLICA} {gpu.name} GPUs per replica holds one such request")
    return out + fixes


def _larger_layouts(arch: ModelArchitecture, gpu: GpuSpec, d: Deployment) -> list[str]:
    """The smallest layout beyond one node's TP that fits: pipeline stages across nodes, and for MoE models
    data-parallel engines with expert parallelism; at the deployment's precision, else with fp8."""
    for precision in precisions(arch, d, gpu):
        found: list[str] = []
        for kind in ("pp", "dp"):
            for layout in layouts(arch):
                if layout.gpus <= d.gpus or (layout.pipeline_parallel > 1) != (kind == "pp"):
                    continue
                if kind == "dp" and layout.data_parallel == 1:
                    continue
                if _fits(arch, gpu, precision.applied(layout.applied(d))):
                    note = f"changes precision: {', '.join(precision.changes)}; " if precision.changes else ""
                    flags = f"{layout.flags} {precision.flags}".strip()
                    found.append(f"{flags} fits ({note}{layout.gpus} GPUs, {_nodes(layout.gpus)})")
                    break
        if found:
            return found
    return []


def _nodes(gpus: int) -> str:
    nodes = math.ceil(gpus / GPUS_PER_NODE)
    return "1 node" if nodes == 1 else f"{nodes} nodes of {GPUS_PER_NODE}"


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


def check_inputs(arch: ModelArchitecture, gpu: GpuSpec, d: Deployment) -> None:
    """What a person asked for that the engine would refuse or ignore. Only for flags a person typed: the daemon
    plans what an engine really runs (which may, for instance, have been allowed a longer context)."""
    if d.kv_cache_memory_bytes is not None and d.kv_cache_memory_bytes > gpu.memory_bytes:
        raise PlanError(
            f"--kv-cache-memory {format_gib(d.kv_cache_memory_bytes)} is more than the {gpu.name}'s "
            f"{format_gib(gpu.memory_bytes)}: give the KV pool of one GPU, not of the whole replica"
        )
    if d.kv_cache_memory_bytes is not None and d.engine == "sglang":
        raise PlanError("--kv-cache-memory is vLLM's flag; SGLang sizes its pool from --gpu-memory-utilization")
    if d.vllm_version is not None and d.engine == "sglang":
        raise PlanError("--vllm-version models an older vLLM; drop it with --engine sglang")
    if d.expert_parallel and arch.moe is None:
        raise PlanError(f"--enable-expert-parallel: {shown(arch.name)} has no MoE experts to split; drop the flag")
    limit = arch.context_limit(d.engine)
    if d.max_model_len is not None and d.max_model_len > limit.tokens:
        override = (
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" if d.engine == "sglang" else "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
        raise PlanError(
            f"--max-model-len {d.max_model_len} is above {shown(arch.name)}'s maximum of {limit.tokens} tokens "
            f"({limit.derivation}); {d.engine} refuses it unless {override} is set, and the model's "
            f"output past its trained length is unreliable. Use --max-model-len {limit.tokens} or less"
        )
