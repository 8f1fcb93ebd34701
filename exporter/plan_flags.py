"""The deployment flags `plan` and `loadtest` share: the deployment the capacity model plans, and the GPU."""

import argparse

from exporter.capacity import quantization
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import Deployment
from exporter.catalog import find_gpu
from exporter.cli_args import positive_int, ratio_arg, size_arg, version_arg


def add_deployment_flags(p: argparse._ActionsContainer) -> None:
    """The deployment the capacity model plans: `plan`'s flags, which `loadtest` shares for its comparison."""
    p.add_argument("--gpu-memory", type=size_arg, help="GPU memory instead of a preset (80GiB, 81920MiB, bytes)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel size")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel size: engines per replica")
    p.add_argument("--enable-expert-parallel", action="store_true", help="MoE experts split over DP x TP GPUs")
    p.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    p.add_argument(
        "--gpu-memory-utilization",
        type=ratio_arg,
        help="vLLM's gpu_memory_utilization or SGLang's mem_fraction_static (default: the engine's)",
    )
    p.add_argument("--max-model-len", type=positive_int, help="context length (default: the model's)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, help="default: vLLM's for this GPU")
    p.add_argument("--max-num-seqs", type=positive_int, help="default: vLLM's for this GPU")
    p.add_argument("--dtype", default="auto", help="weights dtype: auto, bfloat16, float16, float32")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the weights' dtype) or fp8")
    p.add_argument("--block-size", type=positive_int, help="KV block size in tokens (default: vLLM's)")
    p.add_argument("--kv-cache-memory", type=size_arg, help="KV pool size per GPU, as vLLM's flag: skips profiling")
    p.add_argument("--quantization", help="online quantization of a 16-bit checkpoint: fp8 or bitsandbytes")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument(
        "--vllm-version",
        type=version_arg,
        help="model an older vLLM (e.g. 0.10): defaults, CUDA-graph budgeting and token counting changed",
    )


def gpu_for(args: argparse.Namespace) -> GpuSpec:
    if args.gpu_memory is not None:
        return GpuSpec(name=f"{args.gpu_memory / 1024**3:.2f}GiB GPU", memory_bytes=args.gpu_memory)
    return find_gpu(args.gpu)


def deployment_from_args(args: argparse.Namespace) -> Deployment:
    return Deployment(
        engine=args.engine,
        tensor_parallel=args.tp,
        pipeline_parallel=args.pp,
        data_parallel=args.dp,
        expert_parallel=args.enable_expert_parallel,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=args.block_size,
        kv_cache_memory_bytes=args.kv_cache_memory,
        enforce_eager=args.enforce_eager,
        quantization=quantization.from_flag(args.quantization) if args.quantization else None,
        vllm_version=args.vllm_version,
    )
