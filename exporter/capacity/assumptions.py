"""Every number the capacity model assumes rather than derives, in one place, with where it comes from.

The derived parts (weights, KV bytes per token, block arithmetic) follow the engines' source. What is here
either is an engine default (quoted from the engine's source) or is fitted to real startup logs; the README's
"Model accuracy" section scores the model against those logs with `python -m bench.model_accuracy`.
"""

from exporter.core.units import GIB

# vLLM defaults (vllm/config/cache.py, vllm/engine/arg_utils.py: EngineArgs.get_batch_defaults).
VLLM_GPU_MEMORY_UTILIZATION = 0.92
# Logs show 0.9 up to v0.19 and 0.92 by v0.29; the release that changed it was not found, so versions
# before v0.21 (where CUDA graphs entered the budget) get 0.9.
VLLM_GPU_MEMORY_UTILIZATION_OLD = 0.90
VLLM_CUDA_GRAPHS_IN_BUDGET_SINCE = (0, 21)
VLLM_BLOCK_SIZE = 16
VLLM_MLA_BLOCK_SIZE = 64  # FlashMLA's page size, which vLLM picks for MLA models on CUDA
VLLM_LARGE_GPU_BYTES = 70 * GIB  # at or above (and not an A100): the larger batch defaults
VLLM_BATCHED_TOKENS_LARGE_GPU = 8192  # OpenAI-compatible server on H100/H200/B200/MI300X
VLLM_BATCHED_TOKENS = 2048
VLLM_MAX_NUM_SEQS_LARGE_GPU = 1024
VLLM_MAX_NUM_SEQS = 256

# SGLang: mem_fraction_static is chosen per GPU size and TP by the server; 0.88 is its value for one
# 80 GB GPU. Pass --gpu-memory-utilization to state the deployment's.
SGLANG_MEM_FRACTION_STATIC = 0.88
SGLANG_PAGE_SIZE = 1

# Activation peak of vLLM's profiling run (one forward of max_num_batched_tokens, then a sampler run over
# max_num_seqs rows of logits). Fitted to logs that print "PyTorch activation peak memory".
ACTIVATION_HIDDEN_COPIES = 3  # residual, normed input and layer output live together
# The sampler's dummy run peaks at 3.7-3.8 float32 copies of the logits in every v0.19 H100 log with known
# batch flags (Llama-3.1-8B, Gemma 2 2B/27B, Qwen2.5-7B, gpt-oss-20b): logits, probabilities, sort buffers.
LOGITS_FP32_COPIES = 3.75

# Multimodal encoder in vLLM's profiling run (V1: the dummy images go through the vision tower before the text
# dummy run, and their embeddings stay in the encoder cache through it). At a tower block's MLP the residual, the
# normed input and the block's output live beside the MLP's intermediates (fc1 and its activation; gate, up and
# their product in a SwiGLU tower), and the dummy pixels stay alive throughout, twice: the processor's float32
# batch and the model-dtype copy (`activation.encoder_pass_bytes` cites the vLLM code). The copies are counted as
# the text model's are; the one check is the Qwen2.5-VL-7B L4 log in bench/data (tests/capacity/test_multimodal.py).
ENCODER_HIDDEN_COPIES = 3
# Bytes a pixel value takes as the image processor hands it to vLLM: float32, whatever the model's dtype.
PROCESSOR_PIXEL_BYTES = 4
# vLLM's default --limit-mm-per-prompt for a modality the flag does not name (999 since V1; V0 allowed 1).
VLLM_MM_ITEMS_PER_PROMPT = 999

# Memory outside PyTorch's allocator that grows during profiling (cuBLAS workspaces; NCCL buffers once TP > 1).
# vLLM v0.19 logs: 0.24-0.26 GiB on one H100, about 2.1 GiB per GPU at TP 2 and 4 (NCCL, custom all-reduce).
NON_TORCH_BYTES_SINGLE_GPU = round(0.25 * GIB)
NON_TORCH_BYTES_MULTI_GPU = round(2.1 * GIB)

# CUDA graphs: vLLM >= 0.21 estimates their pool and subtracts it from the KV budget unless --enforce-eager.
# 0.82 GiB is the median of the 31 estimates in bench/data (vLLM 0.19: 23 on H100 for 19 models, one on a GPU the log
# does not name; 0.29: 4 on L40S, 3 on an RTX PRO 4500 MIG slice; 0.05 to 1.82 GiB).
CUDA_GRAPH_BYTES = round(0.82 * GIB)

# Hybrid (sliding + full) models: v0.10 logs count tokens as blocks per group x block size, v0.19 logs as
# concurrency x max_model_len; the change lies between them and is placed at v0.12 (not pinned to a release).
VLLM_HYBRID_TOKENS_AS_CONCURRENCY_SINCE = (0, 12)

# A sliding-window layer holds its window plus the tokens not yet settled: one max_num_batched_tokens batch before
# v0.26, then one per batch in flight (VllmConfig.max_in_flight_tokens = max_concurrent_batches x
# max_num_batched_tokens, used by SlidingWindowSpec.max_admission_blocks_per_request; vllm/config/vllm.py and
# vllm/v1/kv_cache_interface.py in vLLM 0.32.0). Async scheduling runs pp + 1 batches at once on the V2 model runner
# (vLLM's default runner), PP alone pp. vllm-project/vllm PR #47728 (merged 2026-07) brought it; issue #49878
# traces the ~40% more KV memory Gemma 4 needs from v0.25.1 to v0.26 to it.
VLLM_IN_FLIGHT_SLIDING_RESERVE_SINCE = (0, 26)

# V0 engines (before v0.8) profiled one batch of max(max_model_len, 2048) tokens unless chunked prefill was on,
# which V0 enabled by default only above 32K context.
VLLM_V1_SINCE = (0, 8)
VLLM_V0_CHUNKED_PREFILL_ABOVE = 32768

# bitsandbytes 4-bit: vLLM PR #19742 (merged 2025-06-18, first in v0.9.2) dequantizes double-quantized absmax
# to float32 at load. Versions are (major, minor) here, so 0.9.x counts as before it (0.9.2 is misplaced).
VLLM_BNB_FP32_ABSMAX_SINCE = (0, 10)

# MXFP4 experts (gpt-oss) are stored with the hidden dimension padded to a multiple of 256 for vLLM's MoE
# kernels (2880 -> 3072); fitted to gpt-oss-20b/120b load logs on H100 (within 2%).
MXFP4_HIDDEN_ALIGNMENT = 256

# SGLang reserves the CUDA context and its own workspaces before it sizes the KV pool.
SGLANG_CONTEXT_BYTES = round(1.0 * GIB)

# Tensor-parallel sizes the inverse planner tries: what fits in one node of 8 GPUs.
TENSOR_PARALLEL_CHOICES = (1, 2, 4, 8)
