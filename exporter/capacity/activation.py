"""What a deployment needs beside weights and KV: the activation peak, non-torch memory and CUDA graphs.

vLLM measures these at start-up by running one dummy batch; this module predicts that measurement. The shape of
each term follows what the profiling run allocates; the constants in `assumptions` are fitted to real logs.
"""

import math
from dataclasses import dataclass

from exporter.capacity import assumptions as A
from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.deployment import Deployment

MM_ENCODER_TP_MODES = ("weights", "data")


@dataclass(frozen=True)
class EncoderProfile:
    """The dummy multimodal batch of vLLM's profiling run: `items` images of the largest size."""

    items: int
    tokens_per_item: int
    budget: int  # the encoder cache budget, in language-model tokens


def _limit(d: Deployment, modality: str) -> int:
    return dict(d.mm_limits).get(modality, A.VLLM_MM_ITEMS_PER_PROMPT)


def language_only(arch: ModelArchitecture, d: Deployment) -> bool:
    """Every modality of a multimodal model turned off by --limit-mm-per-prompt: vLLM then neither loads the
    vision tower nor profiles it (its "language-only mode")."""
    vision = arch.vision
    return vision is not None and _limit(d, "image") == 0 and not (vision.has_video and _limit(d, "video"))


def encoder_profile(
    arch: ModelArchitecture, d: Deployment, max_model_len: int, max_num_batched_tokens: int, max_num_seqs: int
) -> EncoderProfile | None:
    """What vLLM V1 profiles the vision tower with (`MultiModalBudget` in vllm/multimodal/budget.py and
    `compute_mm_encoder_budget` in vllm/v1/core/encoder_cache_manager.py, vllm-project/vllm).

    The encoder's compute budget and its cache both default to max_num_batched_tokens, raised to the largest item's
    token count so that one item always fits; the smaller of the two is the budget. The profiling batch holds as
    many largest items as the budget has room for, but at most max_num_seqs prompts' worth (a prompt holds the
    modality's limit, or as many as fit in max_model_len, at least one), and never fewer than one. Images only:
    a video's dummy (Qwen-VL, InternVL) is not modelled, nor V0's profiling (vLLM before 0.8). None for a text
    model, an image-less deployment, or a family whose largest image is not known."""
    vision = arch.vision
    if vision is None or not vision.image_tokens or not _limit(d, "image"):
        return None
    tokens = vision.image_tokens
    budget = max(max_num_batched_tokens, tokens)
    per_prompt = max(1, min(_limit(d, "image"), max_model_len // tokens))
    items = max(1, min(budget // tokens, max_num_seqs * per_prompt))
    return EncoderProfile(items=items, tokens_per_item=tokens, budget=budget)


def encoder_pass_bytes(arch: ModelArchitecture, profile: EncoderProfile, tp: int, mode: str, dtype_bytes: int) -> int:
    """Peak of the dummy images' pass through the tower on one GPU. "weights" mode splits the MLP over TP ranks;
    "data" mode gives each rank whole images, ceil(items / TP) of them.

    The pixels are held twice through the pass: as the float32 batch the image processor made (transformers'
    `image_transforms.rescale` defaults to float32) and vLLM's runner moved to the GPU unconverted
    (`MultiModalKwargs.as_kwargs(..., device=self.device)` in `GPUModelRunner.profile_run`,
    vllm/v1/worker/gpu_model_runner.py, vllm-project/vllm v0.9.0.1), and as the model-dtype copy the tower reads
    (`image_input["pixel_values"].type(self.visual.dtype)` in Qwen2.5-VL's `_process_image_input`,
    vllm/model_executor/models/qwen2_5_vl.py, same tag). Later versions cast inside the tower's first step
    (v0.32's qwen2_5_vl.py), so there the copy is transient: at most the pixels x dtype bytes over (0.14 GiB for
    Qwen2.5-VL's 65,536-patch image)."""
    vision = arch.vision
    assert vision is not None
    images = math.ceil(profile.items / tp) if mode == "data" else profile.items
    split = 1 if mode == "data" else tp
    pixels = vision.num_channels * vision.temporal_patch_size * vision.patch_size**2
    intermediates = (3 if vision.gated_mlp else 2) * vision.intermediate_size / split
    activations = A.ENCODER_HIDDEN_COPIES * vision.hidden_size + intermediates
    per_patch = (activations + pixels) * dtype_bytes + pixels * A.PROCESSOR_PIXEL_BYTES
    return round(images * vision.image_patches * per_patch)


def _widest_layer_per_token(arch: ModelArchitecture, tp: int) -> float:
    """Elements one token occupies in the widest intermediate of a layer on one GPU."""
    attention = (arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim / tp
    # gate/up output, then the activation's output (a plain MLP has no gate)
    dense = (3 if arch.gated_mlp else 2) * arch.intermediate_size / tp
    widest = max(attention, dense)
    if arch.moe is not None:
        moe = arch.moe
        # fused MoE caches: gate/up and activation outputs per routed copy, plus the down-projection output
        routed = moe.experts_per_token * (3 * moe.expert_intermediate_size / tp + arch.hidden_size)
        widest = max(widest, routed + 3 * moe.shared_intermediate_size / tp)
    return widest


@dataclass(frozen=True)
class ActivationPasses:
    """The passes of vLLM's profiling run on one GPU, in bytes: the text passes (with the dummy images' embeddings
    cached beside them) and, for a multimodal model, the vision tower's pass before them (0 without one)."""

    text: int
    encoder: int = 0

    @property
    def peak(self) -> int:
        return max(self.text, self.encoder)


def activation_passes(
    arch: ModelArchitecture,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype_bytes: int = 2,
    encoder: EncoderProfile | None = None,
    mm_encoder_tp_mode: str = "weights",
) -> ActivationPasses:
    """vLLM's profiling run, whose peak is the activation: the larger of the forward pass and the sampler pass,
    and for a multimodal model first the vision tower's pass over the dummy images (`encoder`), whose embeddings
    stay cached through the text passes."""
    hidden = A.ACTIVATION_HIDDEN_COPIES * arch.hidden_size
    forward = max_num_batched_tokens * (hidden + _widest_layer_per_token(arch, tp)) * dtype_bytes
    rows = min(max_num_seqs, max_num_batched_tokens)
    vocab = math.ceil(arch.vocab_size / 64) * 64
    # Logits are gathered to the full vocabulary on every rank and sampled in float32.
    sampler = rows * vocab * 4 * A.LOGITS_FP32_COPIES + max_num_batched_tokens * arch.hidden_size * dtype_bytes
    if encoder is None:
        return ActivationPasses(round(max(forward, sampler)))
    cached = encoder.items * encoder.tokens_per_item * arch.hidden_size * dtype_bytes
    tower = encoder_pass_bytes(arch, encoder, tp, mm_encoder_tp_mode, dtype_bytes)
    return ActivationPasses(round(cached + max(forward, sampler)), tower)


def non_torch_bytes(tp: int, pp: int) -> int:
    return A.NON_TORCH_BYTES_SINGLE_GPU if tp * pp == 1 else A.NON_TORCH_BYTES_MULTI_GPU


def cuda_graph_bytes(in_budget: bool) -> int:
    return A.CUDA_GRAPH_BYTES if in_budget else 0
