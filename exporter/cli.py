"""The `plimsoll` command: argument parsing and dispatch to one function per subcommand.

Exit codes: 0 an answer (a plan that does not fit is an answer), 2 bad input (the message says which flag,
file or field, and what to do).
"""

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from exporter import __version__
from exporter.capacity import quantization
from exporter.capacity.architecture import ModelConfigError
from exporter.capacity.kv import KvDtypeError
from exporter.capacity.plan import PlanError, plan
from exporter.capacity.weights import DtypeError
from exporter.catalog import CatalogError, load_model
from exporter.cli_args import Formatter, duration_arg, duration_or_zero_arg, env_twin, positive_int
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
from exporter.display import shown
from exporter.plan_command import add_plan
from exporter.plan_flags import add_deployment_flags, deployment_from_args, gpu_for
from exporter.status_command import add_status
from exporter.target_model import model_problems

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


def _add_run(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "run",
        help="the daemon: poll NVML and engines, serve headroom on /metrics",
        formatter_class=Formatter,
        description="Without --config or --target, scans this host's usual engine ports (8000, 30000, 8002, 8080, "
        "23333). SIGHUP rebuilds the config from the file, the flags and their environment twins, and re-reads the "
        "web config (a bad file is rejected and the running one kept; listen, nvml, the web_config path, the web "
        "config's tls_server_config and request_header_timeout take a restart); SIGTERM drains and exits.",
    )
    env_twin(p, "--config", "PLIMSOLL_CONFIG", help="YAML config file")
    env_twin(p, "--listen", "PLIMSOLL_LISTEN", help=f"host:port to serve on (config: listen; default {DEFAULT_LISTEN})")
    env_twin(p, "--poll-interval", "PLIMSOLL_POLL_INTERVAL", help="a duration such as 5s (config: poll_interval)")
    env_twin(
        p,
        "--target",
        "PLIMSOLL_TARGETS",
        action="append",
        help="engine /metrics URL, repeatable (env: comma-separated); added to the config's targets",
    )
    env_twin(p, "--nvml", "PLIMSOLL_NVML", metavar="on|off", help="read GPUs through NVML (config: nvml)")
    env_twin(
        p,
        "--web-config",
        "PLIMSOLL_WEB_CONFIG",
        metavar="FILE",
        help="TLS and basic auth for the daemon's port, in Prometheus' exporter-toolkit format (config: web_config)",
    )
    env_twin(p, "--log-level", "PLIMSOLL_LOG_LEVEL", default="info", choices=_LOG_LEVELS)
    p.add_argument("--check-only", action="store_true", help="validate the config and exit")
    p.set_defaults(handler=_run)


def _add_check_config(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("check-config", help="validate a config file without starting", formatter_class=Formatter)
    p.add_argument("config", help="YAML config file")
    p.set_defaults(handler=_check_config)


def _add_probe(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "probe",
        help="what Plimsoll sees at one engine endpoint or saved page",
        formatter_class=Formatter,
        description="Fetches URL (or reads FILE, or - for stdin), detects the engine and prints the normalised "
        "reading. Exit 1 when nothing could be read (down, not a metrics page, unknown engine).",
    )
    p.add_argument("source", metavar="URL|FILE")
    p.add_argument("--engine", default="auto", help="force an engine vocabulary instead of detecting it")
    p.add_argument("--timeout", type=duration_arg, default="5s", help="how long to wait for the page, e.g. 5s")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=_probe)


def _add_generate(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "generate",
        help="Prometheus rules, Grafana dashboards and autoscalers from a config",
        formatter_class=Formatter,
        description="Writes rules/plimsoll.rules.yaml, deploy/kubernetes/prometheusrule.yaml, dashboards/*.json and, "
        "with an autoscaling section, deploy/kubernetes/autoscaling/ under --out, from the config. --check writes "
        "nothing and exits 1 when a file under --out differs from what the config generates, or when a scaler "
        "file in deploy/kubernetes/autoscaling/ as it is on disk (hand edits included) has a shape known to fail.",
    )
    env_twin(p, "--config", "PLIMSOLL_CONFIG", required=False, help="YAML config file (default: built-in defaults)")
    p.add_argument("--out", default=".", help="directory to write under")
    p.add_argument("--check", action="store_true", help="compare and lint instead of writing")
    p.set_defaults(handler=_generate)


def _add_loadtest(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "loadtest",
        help="find the saturation point and the SLO knee, and thresholds from the lower",
        formatter_class=Formatter,
        description="Drives an OpenAI-compatible server (streaming) with closed-loop concurrency 1, 2, 4, ... then "
        "bisection, and finds two answers: the saturation point (where the engine's own metrics show it cannot "
        "hold the load) and the SLO knee (the highest concurrency meeting the SLOs, judged by a sequential test). "
        "Writes result.json, report.html and thresholds.yaml under --out. Exit 0 with an answer, 1 when the run "
        "found none or could not run (the message says why; nothing is written), 2 for bad input, 130 after Ctrl-C "
        "(what was measured is written). API key: PLIMSOLL_API_KEY or --api-key-file.",
    )
    env_twin(p, "--url", "PLIMSOLL_LOADTEST_URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    env_twin(
        p,
        "--slo",
        "PLIMSOLL_LOADTEST_SLO",
        required=False,
        help="thresholds, each with a unit: ttft=500ms,itl=50ms (none: the saturation point alone)",
    )
    env_twin(
        p,
        "--objective",
        "PLIMSOLL_LOADTEST_OBJECTIVE",
        type=float,
        default=0.99,
        help="share of requests within the SLOs",
    )
    workload = p.add_argument_group("workload (token counts are the server's own usage)")
    for name, default in (("prompt", 512), ("output", 128)):
        workload.add_argument(f"--{name}-tokens", type=positive_int, default=default, help=f"mean {name} tokens")
        workload.add_argument(
            f"--{name}-tokens-spread", type=float, default=0.0, help="standard deviation (0: fixed length)"
        )
        workload.add_argument(f"--{name}-tokens-min", type=positive_int, default=1, help="shortest drawn")
        workload.add_argument(f"--{name}-tokens-max", type=positive_int, help="longest drawn")
    workload.add_argument(
        "--dataset", metavar="FILE.jsonl", help="requests to replay: {prompt|messages, max_tokens} a line"
    )
    workload.add_argument("--ignore-eos", action="store_true", help="ask the server to generate every max token")
    workload.add_argument(
        "--allow-short-answers",
        action="store_true",
        help="an answer shorter than its max tokens is good (default: an error, so a server that stops early "
        "cannot pass)",
    )
    workload.add_argument(
        "--unique-prompts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="open each prompt with a marker of the run and request, so no prefix is ever cached "
        "(--no-unique-prompts sends --dataset prompts as written)",
    )
    workload.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts and lengths")
    workload.add_argument(
        "--save-requests", metavar="FILE.csv|FILE.jsonl", help="write every measured request's record there"
    )
    server = p.add_argument_group("server")
    server.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    env_twin(p, "--served-model", "PLIMSOLL_LOADTEST_SERVED_MODEL", help="default: the first of /v1/models")
    env_twin(p, "--metrics-url", "PLIMSOLL_LOADTEST_METRICS_URL", help="default: the server's /metrics")
    server.add_argument("--api-key-file", metavar="FILE", help="a file holding the API key (bearer token)")
    search = p.add_argument_group("search")
    search.add_argument("--max-concurrency", type=positive_int, default=512, help="the highest concurrency tried")
    search.add_argument(
        "--concurrency", metavar="N,N,...", help="run exactly these concurrencies, in order, instead of searching"
    )
    search.add_argument(
        "--rate",
        metavar="R,R,...",
        help="open loop: requests/s arriving whatever the server's pace, each rate a step (at most "
        "--max-concurrency in flight)",
    )
    search.add_argument(
        "--arrivals", default="poisson", choices=["poisson", "constant"], help="open loop: gaps between arrivals"
    )
    search.add_argument("--tolerance", type=float, default=0.1, help="bisection stops within this share of the knee")
    search.add_argument("--step-duration", type=duration_arg, default="30s", help="measured part of each step")
    search.add_argument(
        "--warmup", type=duration_or_zero_arg, default="5s", help="discarded start of each step (0s: none)"
    )
    search.add_argument("--max-duration", type=duration_arg, default="15m", help="the whole run's time limit")
    search.add_argument("--request-timeout", type=duration_arg, default="60s", help="one request's time limit")
    search.add_argument("--stall-timeout", type=duration_arg, default="15s", help="longest silence mid-stream")
    search.add_argument(
        "--ready-timeout",
        type=duration_or_zero_arg,
        default="30s",
        help="how long to wait for /health and /v1/models to answer before the first step",
    )
    model = p.add_argument_group("capacity model (compared with the knee)")
    model.add_argument("--model", help="preset name or Hugging Face config.json, as for plimsoll plan")
    model.add_argument("--gpu", help="GPU preset (default H100-80GB), with --model")
    add_deployment_flags(model)
    config = p.add_argument_group("config")
    env_twin(p, "--config", "PLIMSOLL_CONFIG", help="YAML config: its target's model, and where --write goes")
    config.add_argument("--target", help="the config's target under test (default: its only one)")
    config.add_argument("--write", action="store_true", help="update --config's saturation: in place (FILE.bak kept)")
    config.add_argument("--margin", type=float, default=0.05, help="KV threshold this share below the knee's usage")
    env_twin(p, "--out", "PLIMSOLL_LOADTEST_OUT", default="plimsoll-loadtest", help="directory for the outputs")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=_loadtest)


def _loadtest(args: argparse.Namespace) -> int:
    from exporter.loadtest.command import run_loadtest, settings_from_args  # aiohttp and rich load only here

    flag_plan = plan(load_model(args.model), gpu_for(args), deployment_from_args(args)) if args.model else None
    return run_loadtest(settings_from_args(args, flag_plan))


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
        scalers = generate.lint_scalers(config, out)
        for line in scalers.skipped:
            print(f"skipped: {line}")
        for problem in scalers.problems:
            print(f"lint: {problem}")
        return 1 if differing or scalers.problems else EXIT_OK
    try:
        written = generate.write(items, out)
    except OSError as error:  # --out is a file, read-only, full: say which file, not a traceback
        where = error.filename or out
        print(f"plimsoll generate: --out {out}: cannot write {where} ({error.strerror})", file=sys.stderr)
        return 1
    for target in written:
        print(f"wrote {target}")
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
    add_plan,
    _add_generate,
    _add_loadtest,
    add_status,
)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except _INPUT_ERRORS as error:
        # An error may quote a file's or a server's text: each of its lines is shown, never acted on by the terminal.
        lines = "\n".join(shown(line) for line in str(error).splitlines())
        print(f"plimsoll {args.command}: {lines}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `plimsoll plan ... | head` closed the pipe: not an error worth a traceback
        sys.stderr.close()
        return EXIT_OK
