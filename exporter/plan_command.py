"""`plimsoll plan`: its flags (the deployment flags `loadtest` shares for its comparison) and its handler."""

import argparse
import json
from dataclasses import replace

from exporter.capacity.plan import PlanError, plan, plan_fleet
from exporter.catalog import gpu_presets, load_model, model_presets
from exporter.cli_args import Formatter, positive_int
from exporter.plan_flags import add_deployment_flags, deployment_from_args, gpu_for
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
