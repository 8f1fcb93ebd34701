"""The `plimsoll` command: argument parsing and dispatch to one function per subcommand.

Exit codes: 0 an answer (a plan that does not fit is an answer), 2 bad input (the message says which flag,
file or field, and what to do).
"""

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from exporter import __version__
from exporter.capacity import quantization
from exporter.capacity.architecture import ModelConfigError
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.kv import KvDtypeError
from exporter.capacity.plan import Deployment, PlanError, plan, plan_fleet
from exporter.capacity.weights import DtypeError
from exporter.catalog import CatalogError, find_gpu, gpu_presets, load_model, model_presets
from exporter.config import (
    DEFAULT_LISTEN,
    Config,
    ConfigError,
    ConfigReport,
    Target,
    check_config_file,
    load_config,
    readable_file,
    validate_boolean,
    validate_duration,
    validate_listen,
    validate_url,
)
from exporter.plan_output import fleet_table, plan_table
from exporter.target_model import model_problems
from exporter.units import parse_duration, parse_size

T = TypeVar("T")
EXIT_OK = 0
EXIT_USAGE = 2
_LOG_LEVELS = ("debug", "info", "warning", "error")

_INPUT_ERRORS = (
    CatalogError,
    ConfigError,
    ModelConfigError,
    PlanError,
    DtypeError,
    KvDtypeError,
    quantization.QuantizationError,
    ValueError,
)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows a flag's default where it has a real one and its help does not already say what it is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """The config's own parser as an argparse type: its message becomes argparse's error, which names the flag."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


_size = _flag_type(parse_size)
_duration = _flag_type(validate_duration)
_duration_or_zero = _flag_type(parse_duration)


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        hint = f" (did you mean {value / 100:g}?)" if 1 < value <= 100 else ""
        raise argparse.ArgumentTypeError(f"{text} is not a ratio in (0, 1]{hint}")
    return value


def _version(text: str) -> tuple[int, int]:
    parts = text.lstrip("v").split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a version like 0.10 or 0.10.1")
    return int(parts[0]), int(parts[1])


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _env_twin(parser: argparse.ArgumentParser, flag: str, env: str, **kwargs: Any) -> None:
    """An option whose default comes from an environment variable, named in --help (query-exporter's way)."""
    if env in os.environ:
        # An appending flag starts from a list, which the flags given then extend.
        kwargs["default"] = [os.environ[env]] if kwargs.get("action") == "append" else os.environ[env]
    kwargs["help"] = f"{kwargs.get('help', '')} [env {env}]"
    parser.add_argument(flag, **kwargs)


def _add_run(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "run",
        help="the daemon: poll NVML and engines, serve headroom on /metrics",
        formatter_class=_Formatter,
        description="Without --config or --target, scans this host's usual engine ports (8000, 30000, 8002, 8080, "
        "23333). SIGHUP rebuilds the config from the file, the flags and their environment twins (a bad one is "
        "rejected and the running one kept; listen, nvml, web_config and request_header_timeout take a restart); "
        "SIGTERM drains and exits.",
    )
    _env_twin(p, "--config", "PLIMSOLL_CONFIG", help="YAML config file")
    _env_twin(
        p, "--listen", "PLIMSOLL_LISTEN", help=f"host:port to serve on (config: listen; default {DEFAULT_LISTEN})"
    )
    _env_twin(p, "--poll-interval", "PLIMSOLL_POLL_INTERVAL", help="a duration such as 5s (config: poll_interval)")
    _env_twin(
        p,
        "--target",
        "PLIMSOLL_TARGETS",
        action="append",
        help="engine /metrics URL, repeatable (env: comma-separated); added to the config's targets",
    )
    _env_twin(p, "--nvml", "PLIMSOLL_NVML", metavar="on|off", help="read GPUs through NVML (config: nvml)")
    _env_twin(
        p,
        "--web-config",
        "PLIMSOLL_WEB_CONFIG",
        metavar="FILE",
        help="TLS and basic auth for the daemon's port, in Prometheus' exporter-toolkit format (config: web_config)",
    )
    _env_twin(p, "--log-level", "PLIMSOLL_LOG_LEVEL", default="info", choices=_LOG_LEVELS)
    p.add_argument("--check-only", action="store_true", help="validate the config and exit")
    p.set_defaults(handler=_run)


def _add_check_config(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("check-config", help="validate a config file without starting", formatter_class=_Formatter)
    p.add_argument("config", help="YAML config file")
    p.set_defaults(handler=_check_config)


def _add_probe(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "probe",
        help="what Plimsoll sees at one engine endpoint or saved page",
        formatter_class=_Formatter,
        description="Fetches URL (or reads FILE, or - for stdin), detects the engine and prints the normalised "
        "reading. Exit 1 when nothing could be read (down, not a metrics page, unknown engine).",
    )
    p.add_argument("source", metavar="URL|FILE")
    p.add_argument("--engine", default="auto", help="force an engine vocabulary instead of detecting it")
    p.add_argument("--timeout", type=_duration, default="5s", help="how long to wait for the page, e.g. 5s")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=_probe)


def _add_generate(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "generate",
        help="Prometheus rules and Grafana dashboards from a config",
        formatter_class=_Formatter,
        description="Writes rules/plimsoll.rules.yaml, deploy/kubernetes/prometheusrule.yaml and dashboards/*.json "
        "under --out, from the config's SLOs, saturation threshold and lead time. --check writes nothing and "
        "exits 1 when a file under --out differs from what the config generates.",
    )
    _env_twin(p, "--config", "PLIMSOLL_CONFIG", required=False, help="YAML config file (default: built-in defaults)")
    p.add_argument("--out", default=".", help="directory to write under")
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    p.set_defaults(handler=_generate)


def _add_plan(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "plan",
        help="the capacity model as a calculator: what fits, how many GPUs, and why",
        formatter_class=_Formatter,
        description="Per-GPU memory breakdown of one deployment (weights, activation peak, overhead, KV cache), "
        "or, with --concurrency, the GPUs and replicas a load needs.",
    )
    p.add_argument("--model", help="preset name (see --list-models), or a Hugging Face config.json or its directory")
    p.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    p.add_argument("--list-gpus", action="store_true", help="list the GPU presets and exit")
    p.add_argument("--gpu", default="H100-80GB", help="GPU preset, or 'any' with --concurrency to rank them")
    _add_deployment_flags(p)
    p.add_argument("--concurrency", type=_positive, help="inverse planning: requests in flight to hold")
    p.add_argument("--prompt-tokens", type=_positive, help="with --concurrency: prompt tokens per request")
    p.add_argument("--output-tokens", type=_positive, help="with --concurrency: output tokens per request")
    p.add_argument("--context", type=_positive, help="with --concurrency: total tokens per request")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=_plan)


def _add_deployment_flags(p: argparse._ActionsContainer) -> None:
    """The deployment the capacity model plans: `plan`'s flags, which `loadtest` shares for its comparison."""
    p.add_argument("--gpu-memory", type=_size, help="GPU memory instead of a preset (80GiB, 81920MiB, bytes)")
    p.add_argument("--tp", type=_positive, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=_positive, default=1, help="pipeline-parallel size")
    p.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    p.add_argument(
        "--gpu-memory-utilization",
        type=_ratio,
        help="vLLM's gpu_memory_utilization or SGLang's mem_fraction_static (default: the engine's)",
    )
    p.add_argument("--max-model-len", type=_positive, help="context length (default: the model's)")
    p.add_argument("--max-num-batched-tokens", type=_positive, help="default: vLLM's for this GPU")
    p.add_argument("--max-num-seqs", type=_positive, help="default: vLLM's for this GPU")
    p.add_argument("--dtype", default="auto", help="weights dtype: auto, bfloat16, float16, float32")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the weights' dtype) or fp8")
    p.add_argument("--block-size", type=_positive, help="KV block size in tokens (default: vLLM's)")
    p.add_argument("--kv-cache-memory", type=_size, help="KV pool size per GPU, as vLLM's flag: skips profiling")
    p.add_argument("--quantization", help="online quantization of a 16-bit checkpoint: fp8 or bitsandbytes")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument(
        "--vllm-version",
        type=_version,
        help="model an older vLLM (e.g. 0.10): defaults, CUDA-graph budgeting and token counting changed",
    )


def _add_loadtest(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "loadtest",
        help="find the knee: the highest concurrency at which the SLOs hold, and thresholds from it",
        formatter_class=_Formatter,
        description="Drives an OpenAI-compatible server (streaming) with closed-loop concurrency 1, 2, 4, ... then "
        "bisection, judges each step by SLO attainment with a 95%% interval, reads the engine's /metrics while it "
        "runs, and writes result.json, report.html and thresholds.yaml under --out. Exit 0 with a knee, 1 when "
        "the run found none or could not run (the message says why), 2 for bad input, 130 after Ctrl-C (what was "
        "measured is written). API key: PLIMSOLL_API_KEY or --api-key-file.",
    )
    _env_twin(p, "--url", "PLIMSOLL_LOADTEST_URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    _env_twin(p, "--slo", "PLIMSOLL_LOADTEST_SLO", help="thresholds, each with a unit: ttft=500ms,itl=50ms")
    _env_twin(
        p,
        "--objective",
        "PLIMSOLL_LOADTEST_OBJECTIVE",
        type=float,
        default=0.99,
        help="share of requests within the SLOs",
    )
    workload = p.add_argument_group("workload (token counts are the server's own usage)")
    for name, default in (("prompt", 512), ("output", 128)):
        workload.add_argument(f"--{name}-tokens", type=_positive, default=default, help=f"mean {name} tokens")
        workload.add_argument(
            f"--{name}-tokens-spread", type=float, default=0.0, help="standard deviation (0: fixed length)"
        )
        workload.add_argument(f"--{name}-tokens-min", type=_positive, default=1, help="shortest drawn")
        workload.add_argument(f"--{name}-tokens-max", type=_positive, help="longest drawn")
    workload.add_argument(
        "--dataset", metavar="FILE.jsonl", help="requests to replay: {prompt|messages, max_tokens} a line"
    )
    workload.add_argument("--ignore-eos", action="store_true", help="ask the server to generate every max token")
    workload.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts and lengths")
    server = p.add_argument_group("server")
    server.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    _env_twin(p, "--served-model", "PLIMSOLL_LOADTEST_SERVED_MODEL", help="default: the first of /v1/models")
    _env_twin(p, "--metrics-url", "PLIMSOLL_LOADTEST_METRICS_URL", help="default: the server's /metrics")
    server.add_argument("--api-key-file", metavar="FILE", help="a file holding the API key (bearer token)")
    search = p.add_argument_group("search")
    search.add_argument("--max-concurrency", type=_positive, default=512, help="the highest concurrency tried")
    search.add_argument("--tolerance", type=float, default=0.1, help="bisection stops within this share of the knee")
    search.add_argument("--step-duration", type=_duration, default="30s", help="measured part of each step")
    search.add_argument(
        "--warmup", type=_duration_or_zero, default="5s", help="discarded start of each step (0s: none)"
    )
    search.add_argument("--max-duration", type=_duration, default="15m", help="the whole run's time limit")
    search.add_argument("--request-timeout", type=_duration, default="60s", help="one request's time limit")
    search.add_argument("--stall-timeout", type=_duration, default="15s", help="longest silence mid-stream")
    model = p.add_argument_group("capacity model (compared with the knee)")
    model.add_argument("--model", help="preset name or Hugging Face config.json, as for plimsoll plan")
    model.add_argument("--gpu", default="H100-80GB", help="GPU preset, with --model")
    _add_deployment_flags(model)
    config = p.add_argument_group("config")
    _env_twin(p, "--config", "PLIMSOLL_CONFIG", help="YAML config: its target's model, and where --write goes")
    config.add_argument("--target", help="the config's target under test (default: its only one)")
    config.add_argument("--write", action="store_true", help="update --config's saturation: in place (FILE.bak kept)")
    config.add_argument("--margin", type=float, default=0.05, help="KV threshold this share below the knee's usage")
    _env_twin(p, "--out", "PLIMSOLL_LOADTEST_OUT", default="plimsoll-loadtest", help="directory for the outputs")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=_loadtest)


def _loadtest(args: argparse.Namespace) -> int:
    from exporter.loadtest.command import run_loadtest, settings_from_args  # aiohttp and rich load only here

    flag_plan = plan(load_model(args.model), _gpu_for(args), _deployment(args)) if args.model else None
    return run_loadtest(settings_from_args(args, flag_plan))


def _gpu_for(args: argparse.Namespace) -> GpuSpec:
    if args.gpu_memory is not None:
        return GpuSpec(name=f"{args.gpu_memory / 1024**3:.2f}GiB GPU", memory_bytes=args.gpu_memory)
    return find_gpu(args.gpu)


def _context_tokens(args: argparse.Namespace) -> int:
    if args.context is not None:
        return args.context
    if args.prompt_tokens is None or args.output_tokens is None:
        raise PlanError("--concurrency needs --context, or both --prompt-tokens and --output-tokens")
    return args.prompt_tokens + args.output_tokens


def _plan(args: argparse.Namespace) -> int:
    if args.list_models:
        for preset in model_presets():
            print(f"{preset.id:<32} {preset.hf_id}")
        return EXIT_OK
    if args.list_gpus:
        for gpu in gpu_presets():
            print(f"{gpu.name:<12} {gpu.memory_bytes / 1024**3:8.2f} GiB  {', '.join(gpu.aliases)}")
        return EXIT_OK
    if not args.model:
        raise PlanError("--model is required (a preset name, or a path to a config.json)")
    arch = load_model(args.model)
    deployment = _deployment(args)
    if args.concurrency is None:
        result = plan(arch, _gpu_for(args), deployment)
        print(json.dumps(result.to_dict(), indent=2) if args.format == "json" else plan_table(result))
        return EXIT_OK
    context = _context_tokens(args)
    gpus = list(gpu_presets()) if args.gpu == "any" and args.gpu_memory is None else [_gpu_for(args)]
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
    return EXIT_OK


def _deployment(args: argparse.Namespace) -> Deployment:
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


def _flag_targets(values: Sequence[str] | None) -> list[str]:
    """--target URLs: the flag repeated, each (like the environment twin) possibly comma-separated."""
    return [u.strip() for entry in values or [] for u in entry.split(",") if u.strip()]


def run_config(args: argparse.Namespace) -> Config:
    """The running config: the file (without one, a scan of this host's usual ports) with the flags and their
    environment twins on top, each flag checked by the config's own validator. Built the same way at start and on
    every reload, so a reload keeps what the flags said. Every problem, in the file and in the flags, is raised at
    once."""
    report = check_config_file(args.config) if args.config else ConfigReport(Config(scan_local_ports=True), ())
    config, problems = report.config, list(report.problems)
    changes: dict[str, Any] = {}

    def flag(name: str, env: str, value: Any, validate: Callable[[Any], Any], field_name: str) -> None:
        if value is None:
            return
        try:
            changes[field_name] = validate(value)
        except ValueError as error:
            problems.append(f"{name} ({env}): {error}")

    flag("--listen", "PLIMSOLL_LISTEN", args.listen, validate_listen, "listen")
    flag("--poll-interval", "PLIMSOLL_POLL_INTERVAL", args.poll_interval, validate_duration, "poll_interval_seconds")
    flag("--nvml", "PLIMSOLL_NVML", args.nvml, validate_boolean, "nvml")
    flag(
        "--web-config", "PLIMSOLL_WEB_CONFIG", args.web_config, readable_file(Path("."), "the web config"), "web_config"
    )
    names = {t.name for t in config.targets}
    extra = []
    for value in _flag_targets(args.target):
        try:
            url = validate_url(value)
        except ValueError as error:
            problems.append(f"--target (PLIMSOLL_TARGETS): {error}")
            continue
        name = urlsplit(url).netloc
        if name in names:
            problems.append(f"--target (PLIMSOLL_TARGETS): {name!r} is already a target (names label every series)")
        names.add(name)
        extra.append(Target(name=name, url=url, source="flag"))
    if extra:
        changes["targets"] = config.targets + tuple(extra)
        changes["scan_local_ports"] = False
    if problems:
        raise ConfigError(problems)
    return replace(config, **changes)


def _model_problems(config: Config) -> list[str]:
    """What the capacity model says about each target of the file: what `plimsoll plan` would refuse."""
    return [
        f"{config.source}: targets[{i}].{field_name}: {message}"
        for i, target in enumerate(config.targets)
        for field_name, message in model_problems(target)
    ]


def _run(args: argparse.Namespace) -> int:
    if args.log_level not in _LOG_LEVELS:
        raise ConfigError(
            [f"--log-level (PLIMSOLL_LOG_LEVEL): {args.log_level!r} is not one of {', '.join(_LOG_LEVELS)}"]
        )
    config = run_config(args)
    if args.check_only:
        problems = [*_model_problems(config), *_web_config_problems(config)]
        if problems:
            raise ConfigError(problems)
        print(f"{config.source}: ok, {len(config.targets)} static targets")
        return EXIT_OK
    from exporter.server import serve  # aiohttp's app only loads for the daemon

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(config, reload=(lambda: run_config(args)) if args.config else None)
    return EXIT_OK


def _web_config_problems(config: Config) -> list[str]:
    from exporter.web_config import load_web_config  # bcrypt and ssl load only where a web config is named

    if config.web_config is None:
        return []
    try:
        load_web_config(config.web_config)
    except ConfigError as error:
        return error.problems
    return []


def _check_config(args: argparse.Namespace) -> int:
    """Every problem in one run: the file's, then what the capacity model says about each target."""
    report = check_config_file(args.config)
    problems = [*report.problems, *_model_problems(report.config), *_web_config_problems(report.config)]
    if problems:
        raise ConfigError(problems)
    config = report.config
    pods = f", pods on node {config.kubernetes.node}" if config.kubernetes else ""
    print(f"{config.source}: ok, {len(config.targets)} static targets{pods}, {len(config.slos)} SLOs")
    return EXIT_OK


def _probe(args: argparse.Namespace) -> int:
    from exporter.probe import probe, probe_table  # aiohttp and the engine adapters load only when needed

    result = asyncio.run(probe(args.source, args.engine, args.timeout))
    print(json.dumps(result, indent=2) if args.format == "json" else probe_table(result))
    return EXIT_OK if result["readings"] else 1


def _generate(args: argparse.Namespace) -> int:
    from exporter import generate  # grafanalib loads only for this command

    config = load_config(args.config) if args.config else Config()
    items = generate.artifacts(config)
    out = Path(args.out)
    if args.check:
        differing = generate.stale(items, out)
        source = f"--config {args.config} " if args.config else ""
        for path in differing:
            print(f"stale: {out / path} (regenerate: plimsoll generate {source}--out {out})")
        return 1 if differing else EXIT_OK
    for written in generate.write(items, out):
        print(f"wrote {written}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plimsoll",
        description="Capacity observability for LLM serving: the load line for your inference fleet.",
    )
    parser.add_argument("--version", action="version", version=f"plimsoll {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(commands)
    return parser


_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_run,
    _add_probe,
    _add_check_config,
    _add_plan,
    _add_generate,
    _add_loadtest,
)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except _INPUT_ERRORS as error:
        print(f"plimsoll {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `plimsoll plan ... | head` closed the pipe: not an error worth a traceback
        sys.stderr.close()
        return EXIT_OK
