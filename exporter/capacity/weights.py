"""Parameter counts from the architecture, and the bytes of weights one GPU holds.

Counted as vLLM lays the model out: the vocabulary padded to a multiple of 64 and split by tensor parallelism,
attention and MLP matrices split by TP, key/value projections replicated once TP exceeds the KV heads, MLA's
down-projections and MoE routers replicated. Norms are counted but never split (they are tiny).
Pipeline parallelism gives each stage its own layers, split as vLLM splits them (`pipeline_stages`); the first
stage also holds the embedding and the last the LM head, so the plan looks at each stage (`exporter.capacity.plan`).
Data parallelism runs DP engines of TP GPUs each, and every engine keeps its own attention, dense MLPs and
embeddings. MoE experts are the exception: vLLM flattens TP across DP for the expert layers
(`FusedMoEParallelConfig.make` in vllm/model_executor/layers/fused_moe/config.py, and docs/serving/
data_parallel_deployment.md: "expert layers form a tensor parallel group of size DP x TP"), so experts are sliced
over DP x TP GPUs; with `--enable-expert-parallel` each of those GPUs holds whole experts instead,
ceil(experts / (DP x TP)) of them (docs/serving/expert_parallel_deployment.md: EP_SIZE = TP_SIZE x DP_SIZE).
Every GPU also holds the rotary embedding's cos/sin cache: max_position_embeddings x rotary dim in the model
dtype (vLLM's RotaryEmbedding registers it as a buffer, one instance shared by all layers); 32 MiB for Llama 3.1.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

from exporter.capacity import assumptions as A
from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.deployment import PipelineStage
from exporter.capacity.quantization import PART_ATTENTION, PART_EXPERTS, PART_MLP, Quantization

VOCAB_PADDING = 64
# Where the vision tower's weights sit: split by TP (vLLM's default --mm-encoder-tp-mode weights), whole on every
# TP rank (--mm-encoder-tp-mode data), or not loaded (every modality off by --limit-mm-per-prompt).
VISION_SHARDED, VISION_REPLICATED, VISION_SKIPPED = "sharded", "replicated", "skipped"
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class DtypeError(ValueError):
    """An unknown --dtype."""


def weight_dtype_bytes(arch: ModelArchitecture, dtype: str = "auto") -> int:
    """Bytes of an unquantized weight. "auto" keeps 16-bit checkpoints and serves fp32 ones in 16 bits,
    as vLLM does on GPUs."""
    if dtype == "auto":
        return 2
    if dtype not in _DTYPE_BYTES:
        raise DtypeError(f"--dtype {dtype!r} is not one of auto, bfloat16, float16, half, float32")
    return _DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer on one GPU, split by how they are stored."""

    attention: float
    dense_mlp: float
    experts: float
    replicated: float  # routers, MLA down-projections, norms: full copy on every GPU

    @property
    def total(self) -> float:
        return self.attention + self.dense_mlp + self.experts + self.replicated


@dataclass(frozen=True)
class WeightBreakdown:
    """Bytes of weights on the fullest GPU, by component, and the model's total parameter count."""

    total_parameters: int
    embedding_bytes: int
    lm_head_bytes: int
    attention_bytes: int
    mlp_bytes: int
    expert_bytes: int
    other_bytes: int
    layers_on_gpu: int

    @property
    def per_gpu_bytes(self) -> int:
        return (
            self.embedding_bytes
            + self.lm_head_bytes
            + self.attention_bytes
            + self.mlp_bytes
            + self.expert_bytes
            + self.other_bytes
        )


def _attention_params(arch: ModelArchitecture, tp: int) -> tuple[float, float]:
    """(split, replicated) parameters of one attention block on one GPU."""
    hidden, heads = arch.hidden_size, arch.num_attention_heads
    if arch.mla is not None:
        mla = arch.mla
        qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        replicated = hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
        if mla.q_lora_rank:
            replicated += hidden * mla.q_lora_rank + mla.q_lora_rank
            q_params = mla.q_lora_rank * heads * qk_head
        else:
            q_params = hidden * heads * qk_head
        split = q_params + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        split += heads * mla.v_head_dim * hidden
        return split / tp, replicated
    q_width = heads * arch.head_dim
    kv_heads_per_gpu = max(1, arch.num_kv_heads // tp)
    kv_width = kv_heads_per_gpu * arch.head_dim
    bias = (q_width / tp + 2 * kv_width) if arch.attention_bias else 0
    return 2 * hidden * q_width / tp + 2 * hidden * kv_width + bias, 0


def _mlp_params(hidden: int, intermediate: int) -> int:
    return 3 * hidden * intermediate  # gate, up and down projections


def _expert_hidden(arch: ModelArchitecture, quantization: Quantization | None) -> int:
    if quantization is not None and quantization.method == "mxfp4":
        return math.ceil(arch.hidden_size / A.MXFP4_HIDDEN_ALIGNMENT) * A.MXFP4_HIDDEN_ALIGNMENT
    return arch.hidden_size


def layer_params(
    arch: ModelArchitecture,
    layer: int,
    tp: int,
    quantization: Quantization | None = None,
    data_parallel: int = 1,
    expert_parallel: bool = False,
) -> LayerParams:
    """Parameters of one layer on one GPU; `quantization` only matters where it changes the stored layout."""
    attention, replicated = _attention_params(arch, tp)
    replicated += 2 * arch.hidden_size  # input and post-attention norms
    moe = arch.moe
    if moe is None or layer in moe.dense_layers:
        if arch.gated_mlp:
            dense = _mlp_params(arch.hidden_size, arch.intermediate_size)
        else:
            dense = 2 * arch.hidden_size * arch.intermediate_size + arch.intermediate_size + arch.hidden_size
        return LayerParams(attention, dense / tp, 0, replicated)
    per_expert = _mlp_params(_expert_hidden(arch, quantization), moe.expert_intermediate_size)
    if moe.expert_bias:
        per_expert += 2 * moe.expert_intermediate_size + arch.hidden_size
    router = arch.hidden_size * moe.num_experts + (moe.num_experts if moe.expert_bias else 0)
    shared = _mlp_params(arch.hidden_size, moe.shared_intermediate_size) / tp
    expert_gpus = tp * data_parallel
    if expert_parallel and expert_gpus > 1:
        experts: float = math.ceil(moe.num_experts / expert_gpus) * per_expert
    else:
        experts = moe.num_experts * per_expert / expert_gpus
    return LayerParams(attention, shared, experts, replicated + router)


def _vision_params(arch: ModelArchitecture) -> int:
    """The vision tower and its projector. A block is attention (q, k, v, o with biases), the MLP (fc1/fc2, or
    gate/up/down where the tower is SwiGLU) and two norms; the patch embedding is a convolution over channels x
    frames x patch^2 pixels."""
    vision = arch.vision
    if vision is None:
        return 0
    width, inner = vision.hidden_size, vision.intermediate_size
    mlp = (3 if vision.gated_mlp else 2) * width * inner + inner + width
    per_layer = 4 * width * width + 4 * width + mlp + 4 * width
    patch = vision.num_channels * vision.temporal_patch_size * vision.patch_size**2 * width
    projector = sum(inputs * outputs + outputs for inputs, outputs in vision.projector)
    return vision.num_layers * per_layer + patch + projector


def _padded_vocab(arch: ModelArchitecture) -> int:
    return math.ceil(arch.vocab_size / VOCAB_PADDING) * VOCAB_PADDING


def count_parameters(arch: ModelArchitecture) -> int:
    """Total parameters of the checkpoint (unpadded vocabulary, TP 1), for checking against published sizes."""
    layers = sum(layer_params(arch, i, 1).total for i in range(arch.num_layers))
    embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return round(layers + embeddings + arch.hidden_size + _vision_params(arch))


def _rotary_cache_elements(arch: ModelArchitecture) -> int:
    rotary_dim = arch.mla.qk_rope_head_dim if arch.mla is not None else arch.head_dim
    return arch.max_position_embeddings * rotary_dim


def weight_breakdown(
    arch: ModelArchitecture,
    tp: int = 1,
    stage: PipelineStage | None = None,
    dtype: str = "auto",
    quantization: Quantization | None = None,
    vllm_version: tuple[int, int] | None = None,
    data_parallel: int = 1,
    expert_parallel: bool = False,
    vision: str = VISION_SHARDED,
) -> WeightBreakdown:
    """Weights on one GPU of a pipeline stage (None: the whole model, no pipeline parallelism) of a DP x TP x PP
    deployment (vllm_version None: current vLLM). `vision` places the vision tower (`VISION_PLACEMENTS`); it stays
    16-bit whatever the checkpoint's quantization, as the quantized VLM checkpoints leave it out of their scheme."""
    stage = stage or PipelineStage(0, arch.num_layers)
    quant = quantization or arch.quantization
    plain = weight_dtype_bytes(arch, dtype)
    quantized = quant.bytes_per_weight_in(vllm_version) if quant is not None else plain
    layers = range(stage.first_layer, stage.first_layer + stage.layers)
    per_layer = [layer_params(arch, i, tp, quant, data_parallel, expert_parallel) for i in layers]

    def part_bytes(part: str, params: Callable[[LayerParams], float]) -> int:
        # each layer's part at the quantized size unless the checkpoint's ignore list keeps it 16-bit
        return round(
            sum(
                params(p) * (quantized if quant is not None and quant.quantizes(part, i) else plain)
                for i, p in zip(layers, per_layer, strict=True)
            )
        )

    vocab_slice = _padded_vocab(arch) * arch.hidden_size / tp
    embedding = vocab_slice * plain if stage.first else 0.0
    # Tied embeddings share one matrix only where one GPU holds both ends of the model.
    head = vocab_slice * plain if stage.last and not (arch.tie_word_embeddings and stage.whole_model) else 0.0
    vision_gpus = {VISION_SHARDED: tp, VISION_REPLICATED: 1}.get(vision)
    vision_bytes = _vision_params(arch) * plain / vision_gpus if vision_gpus and stage.whole_model else 0
    return WeightBreakdown(
        total_parameters=count_parameters(arch),
        embedding_bytes=round(embedding),
        lm_head_bytes=round(head),
        attention_bytes=part_bytes(PART_ATTENTION, lambda p: p.attention),
        mlp_bytes=part_bytes(PART_MLP, lambda p: p.dense_mlp),
        expert_bytes=part_bytes(PART_EXPERTS, lambda p: p.experts),
        other_bytes=round(
            sum(p.replicated for p in per_layer) * plain
            + vision_bytes
            + arch.hidden_size * plain
            + _rotary_cache_elements(arch) * plain
        ),
        layers_on_gpu=stage.layers,
    )
