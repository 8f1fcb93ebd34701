"""`plimsoll run` (the daemon) and `plimsoll check-config`: their arguments, and the running config built from the
file, the flags and their environment twins."""

import argparse
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from exporter.cli_args import EXIT_OK, Formatter, Subcommands, env_twin
from exporter.config import (
    DEFAULT_LISTEN,
    Config,
    ConfigError,
    ConfigReport,
    Target,
    check_config_file,
    field_problems,
    readable_file,
    validate_boolean,
    validate_duration,
    validate_listen,
    validate_url,
)
from exporter.core.units import counted
from exporter.sources.kubernetes import listed_where
from exporter.target_model import model_problems

_LOG_LEVELS = ("debug", "info", "warning", "error")


def add_run(commands: Subcommands) -> None:
    p = commands.add_parser(
        "run",
        help="the daemon: poll NVML and engines, serve headroom on /metrics",
        formatter_class=Formatter,
        description="Without --config or --target, scans this host's usual engine ports (8000, 30000, 8002, 8080, "
        "23333). SIGHUP rebuilds the config from the file, the flags and their environment twins, and re-reads the "
        "web config, certificates and client CA included (a bad file is rejected and the running one kept; listen, "
        "nvml, the web_config path, switching between HTTP and HTTPS, the TLS versions and request_header_timeout "
        "take a restart); SIGTERM drains and exits.",
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


def add_check_config(commands: Subcommands) -> None:
    p = commands.add_parser("check-config", help="validate a config file without starting", formatter_class=Formatter)
    p.add_argument("config", help="YAML config file")
    p.set_defaults(handler=_check_config)


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
    return field_problems(
        config,
        (
            (f"targets[{i}].{field_name}", message)
            for i, target in enumerate(config.targets)
            for field_name, message in model_problems(target)
        ),
    )


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
        print(f"{config.source}: ok, {counted(len(config.targets), 'static target')}")
        return EXIT_OK
    from exporter.daemon.server import serve  # aiohttp's app only loads for the daemon

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(config, reload=(lambda: run_config(args)) if args.config else None)
    return EXIT_OK


def _web_config_problems(config: Config) -> list[str]:
    from exporter.daemon.web_config import load_web_config  # bcrypt and ssl load only where a web config is named

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
    pods = f", pods {listed_where(config.kubernetes)}" if config.kubernetes else ""
    targets, slos = counted(len(config.targets), "static target"), counted(len(config.slos), "SLO")
    print(f"{config.source}: ok, {targets}{pods}, {slos}")
    return EXIT_OK
