"""What a deployment needs beside weights and KV: the activation peak, non-torch memory and CUDA graphs.

vLLM measures these at start-up by running one dummy batch; this module predicts that measurement. The shape of
each term follows what the profiling run allocates; the constants in `assumptions` are fitted to real logs.
"""

import math

from exporter.capacity import assumptions as A
from exporter.capacity.architecture import ModelArchitecture


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


def activation_peak_bytes(
    arch: ModelArchitecture, tp: int, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int = 2
) -> int:
    """Peak of vLLM's profiling run: the larger of the forward pass and the sampler pass."""
    hidden = A.ACTIVATION_HIDDEN_COPIES * arch.hidden_size
    forward = max_num_batched_tokens * (hidden + _widest_layer_per_token(arch, tp)) * dtype_bytes
    rows = min(max_num_seqs, max_num_batched_tokens)
    vocab = math.ceil(arch.vocab_size / 64) * 64
    # Logits are gathered to the full vocabulary on every rank and sampled in float32.
    sampler = rows * vocab * 4 * A.LOGITS_FP32_COPIES + max_num_batched_tokens * arch.hidden_size * dtype_bytes
    return round(max(forward, sampler))


def non_torch_bytes(tp: int, pp: int) -> int:
    return A.NON_TORCH_BYTES_SINGLE_GPU if tp * pp == 1 else A.NON_TORCH_BYTES_MULTI_GPU


def cuda_graph_bytes(in_budget: bool) -> int:
    return A.CUDA_GRAPH_BYTES if in_budget else 0
