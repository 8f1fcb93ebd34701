"""`plimsoll plan`: its flags (the deployment flags `loadtest` shares for its comparison) and its handler."""

import argparse
import json
from dataclasses import replace

from exporter.capacity import quantization
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import Deployment, PlanError, plan, plan_fleet
from exporter.catalog import find_gpu, gpu_presets, load_model, model_presets
from exporter.cli_args import Formatter, positive_int, ratio_arg, size_arg, version_arg
from exporter.plan_output import fleet_table, plan_table


def add_plan(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "plan",
        help="the capacity model as a calculator: what fits, how many GPUs, and why",
        formatter_class=Formatter,
        description="Per-GPU memory breakdown of one deployment (weights, activation peak, overhead, KV cache), "
        "or, with --concurrency, the GPUs and replicas a load needs.",
    )
    p.add_argument("--model", help="preset name (see --list-models), or a Hugging Face config.json or its directory")
    p.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    p.add_argument("--list-gpus", action="store_true", help="list the GPU presets and exit")
    p.add_argument("--gpu", default="H100-80GB", help="GPU preset, or 'any' with --concurrency to rank them")
    add_deployment_flags(p)
    p.add_argument("--concurrency", type=positive_int, help="inverse planning: requests in flight to hold")
    p.add_argument("--prompt-tokens", type=positive_int, help="with --concurrency: prompt tokens per request")
    p.add_argument("--output-tokens", type=positive_int, help="with --concurrency: output tokens per request")
    p.add_argument("--context", type=positive_int, help="with --concurrency: total tokens per request")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=run_plan)


def add_deployment_flags(p: argparse._ActionsContainer) -> None:
    """The deployment the capacity model plans: `plan`'s flags, which `loadtest` shares for its comparison."""
    p.add_argument("--gpu-memory", type=size_arg, help="GPU memory instead of a preset (80GiB, 81920MiB, bytes)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel size")
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


def _context_tokens(args: argparse.Namespace) -> int:
    if args.context is not None:
        return args.context
    if args.prompt_tokens is None or args.output_tokens is None:
        raise PlanError("--concurrency needs --context, or both --prompt-tokens and --output-tokens")
    return args.prompt_tokens + args.output_tokens


def run_plan(args: argparse.Namespace) -> int:
    if args.list_models:
        for preset in model_presets():
            print(f"{preset.id:<32} {preset.hf_id}")
        return 0
    if args.list_gpus:
        for gpu in gpu_presets():
            print(f"{gpu.name:<12} {gpu.memory_bytes / 1024**3:8.2f} GiB  {', '.join(gpu.aliases)}")
        return 0
    if not args.model:
        raise PlanError("--model is required (a preset name, or a path to a config.json)")
    arch = load_model(args.model)
    deployment = deployment_from_args(args)
    if args.concurrency is None:
        result = plan(arch, gpu_for(args), deployment)
        print(json.dumps(result.to_dict(), indent=2) if args.format == "json" else plan_table(result))
        return 0
    context = _context_tokens(args)
    gpus = list(gpu_presets()) if args.gpu == "any" and args.gpu_memory is None else [gpu_for(args)]
    options = plan_fleet(arch, gpus, replace(deployment, tensor_parallel=1), args.concurrency, context)
    if args.format == "json":
        answer = {
            "model": arch.name,
            "concurrency": args.concurrency,
            "context_tokens": context,
            "fits": bool(options),
            "options": [{**o.to_dict(), "plan": o.plan.to_dict()} for o in options],
        }
        print(json.dumps(answer, indent=2))
    else:
        print(fleet_table(options, args.concurrency, context))
    return 0


def deployment_from_args(args: argparse.Namespace) -> Deployment:
    return Deployment(
        engine=args.engine,
        tensor_parallel=args.tp,
        pipeline_parallel=args.pp,
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
