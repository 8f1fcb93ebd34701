"""Every number the capacity model assumes rather than derives, in one place, with where it comes from.

The derived parts (weights, KV bytes per token, block arithmetic) follow the engines' source. What is here
either is an engine default (quoted from the engine's source) or is fitted to real startup logs; the README's
"Model accuracy" section scores the model against those logs with `python bench/model_accuracy.py`.
"""

from exporter.units import GIB

# vLLM defaults (vllm/config/cache.py, vllm/engine/arg_utils.py: EngineArgs.get_batch_defaults).
VLLM_GPU_MEMORY_UTILIZATION = 0.92  # 0.9 before 2026; pass --gpu-memory-utilization to model older versions
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
LOGITS_FP32_COPIES = 2  # float32 logits and the sampler's probabilities

# Memory outside PyTorch's allocator that grows during profiling (cuBLAS workspaces; NCCL buffers once TP > 1).
NON_TORCH_BYTES_SINGLE_GPU = round(0.15 * GIB)
NON_TORCH_BYTES_MULTI_GPU = round(0.6 * GIB)

# CUDA graphs: vLLM >= 0.21 estimates their pool and subtracts it from the KV budget unless --enforce-eager.
CUDA_GRAPH_BYTES = round(0.5 * GIB)

# SGLang reserves the CUDA context and its own workspaces before it sizes the KV pool.
SGLANG_CONTEXT_BYTES = round(1.0 * GIB)

# Tensor-parallel sizes the inverse planner tries: what fits in one node of 8 GPUs.
TENSOR_PARALLEL_CHOICES = (1, 2, 4, 8)
