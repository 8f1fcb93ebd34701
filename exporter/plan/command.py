"""`plimsoll plan`: its flags (the deployment flags `loadtest` shares for its comparison) and its handler."""

import argparse
import json

from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.fleet import plan_fleet
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import PlanError, check_inputs, plan
from exporter.catalog import gpu_presets, load_model, model_presets
from exporter.cli_args import Formatter, Subcommands, positive_int
from exporter.config import load_config
from exporter.config.pricing import validate_gpu_hour_prices
from exporter.cost import GpuHourPrices, gpu_hour_price
from exporter.deployment_flags import add_deployment_flags, at_most, deployment_from_args, gpu_for, tokens_arg
from exporter.plan.output import fleet_table, plan_table

# Requests in flight across the whole fleet: far past any real service's (a few thousand per replica), so that a
# slip is refused with the range rather than answered with billions of GPUs.
MAX_CONCURRENCY = 10_000_000


def add_plan(commands: Subcommands) -> None:
    p = commands.add_parser(
        "plan",
        help="the capacity model as a calculator: what fits, how many GPUs, and why",
        formatter_class=Formatter,
        description="Per-GPU memory breakdown of one deployment (weights, activation peak, overhead, KV cache), "
        "or, with --concurrency, the GPUs and replicas a load needs.",
    )
    p.add_argument(
        "--model",
        help="preset name (see --list-models), a Hugging Face config.json or its directory, or a repository id "
        "org/name[@revision] (the local Hugging Face cache, else its config.json from the Hub)",
    )
    p.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    p.add_argument("--list-gpus", action="store_true", help="list the GPU presets and exit")
    p.add_argument("--gpu", help="GPU preset (default H100-80GB), or 'any' with --concurrency to rank them")
    add_deployment_flags(p)
    p.add_argument(
        "--concurrency",
        type=at_most(positive_int, MAX_CONCURRENCY),
        help="inverse planning: requests in flight to hold",
    )
    p.add_argument("--prompt-tokens", type=tokens_arg, help="with --concurrency: prompt tokens per request")
    p.add_argument("--output-tokens", type=tokens_arg, help="with --concurrency: output tokens per request")
    p.add_argument("--context", type=tokens_arg, help="with --concurrency: total tokens per request")
    p.add_argument("--config", help="with --concurrency: a Plimsoll config whose pricing.gpu_hour ranks by cost")
    p.add_argument(
        "--gpu-hour-price",
        action="append",
        default=[],
        type=_price_arg,
        metavar="GPU=PRICE",
        help="with --concurrency: price of one GPU-hour (repeatable; overrides the config's)",
    )
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=run_plan)


def _price_arg(text: str) -> tuple[str, float]:
    """GPU=PRICE, checked as the config's pricing.gpu_hour checks an entry (a known GPU, a finite price above 0)."""
    gpu, separator, price = text.partition("=")
    if not separator or not gpu.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not GPU=PRICE with a price above 0 (e.g. H100-80GB=2.49)")
    try:
        ((name, value),) = validate_gpu_hour_prices({gpu.strip(): price})
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error} (e.g. H100-80GB=2.49)") from None
    return name, value


def _context_tokens(args: argparse.Namespace) -> int:
    if args.context is not None:
        if args.prompt_tokens is not None or args.output_tokens is not None:
            raise PlanError("give --context, or --prompt-tokens and --output-tokens, not both")
        return int(args.context)
    if args.prompt_tokens is None or args.output_tokens is None:
        raise PlanError("--concurrency needs --context, or both --prompt-tokens and --output-tokens")
    return int(args.prompt_tokens + args.output_tokens)


def _check_load_flags(args: argparse.Namespace) -> None:
    """Flags that only inverse planning reads are an error without it, not silently ignored."""
    if args.concurrency is not None:
        return
    given = [
        flag
        for flag, value in (
            ("--prompt-tokens", args.prompt_tokens),
            ("--output-tokens", args.output_tokens),
            ("--context", args.context),
            ("--config", args.config),
            ("--gpu-hour-price", args.gpu_hour_price or None),
        )
        if value is not None
    ]
    if given:
        raise PlanError(f"{', '.join(given)} size a load: add --concurrency N (requests in flight), or drop them")
    if args.gpu == "any":
        raise PlanError("--gpu any ranks GPUs for a load: add --concurrency N, or name one GPU")


def _prices(args: argparse.Namespace, gpus: list[GpuSpec]) -> dict[str, float]:
    """Price per GPU-hour of each GPU, by its name: --gpu-hour-price over the config's pricing.gpu_hour."""
    configured: GpuHourPrices = load_config(args.config).gpu_hour_prices if args.config else ()
    flagged: GpuHourPrices = tuple(args.gpu_hour_price)
    prices = {}
    for gpu in gpus:
        price = gpu_hour_price(flagged, gpu.name)
        if price is None:
            price = gpu_hour_price(configured, gpu.name)
        if price is not None:
            prices[gpu.name] = price
    return prices


def run_plan(args: argparse.Namespace) -> int:
    if args.list_models:
        for preset in model_presets():
            print(f"{preset.id:<32} {preset.hf_id}")
        return 0
    if args.list_gpus:
        width = max(len(gpu.name) for gpu in gpu_presets())
        for gpu in gpu_presets():
            print(f"{gpu.name:<{width}} {gpu.memory_bytes / 1024**3:8.2f} GiB  {', '.join(gpu.aliases)}")
        return 0
    if not args.model:
        raise PlanError("--model is required (a preset name, or a path to a config.json)")
    _check_load_flags(args)
    arch = load_model(args.model)
    if args.concurrency is None:
        deployment = deployment_from_args(args)
        gpu = gpu_for(args)
        check_inputs(arch, gpu, deployment)
        result = plan(arch, gpu, deployment)
        print(json.dumps(result.to_dict(), indent=2) if args.format == "json" else plan_table(result))
        return 0
    return _run_fleet(args, arch)


def _run_fleet(args: argparse.Namespace, arch: ModelArchitecture) -> int:
    context = _context_tokens(args)
    deployment = deployment_from_args(args)
    gpus = list(gpu_presets()) if args.gpu == "any" and args.gpu_memory is None else [gpu_for(args)]
    for gpu in gpus:
        check_inputs(arch, gpu, deployment)
    prices = _prices(args, gpus)
    options = plan_fleet(
        arch,
        gpus,
        deployment,
        args.concurrency,
        context,
        tensor_parallel=args.tp,
        pipeline_parallel=args.pp,
        data_parallel=args.dp,
        gpu_hour_prices=prices,
    )
    if args.format == "json":
        answer = {
            "model": arch.name,
            "concurrency": args.concurrency,
            "context_tokens": context,
            "fits": bool(options),
            "ranked_by": "cost_per_hour" if prices else "gpus",
            "options": [{**o.to_dict(), "plan": o.plan.to_dict()} for o in options],
        }
        print(json.dumps(answer, indent=2))
    else:
        print(fleet_table(options, args.concurrency, context))
    return 0
