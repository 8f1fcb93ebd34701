"""`plimsoll autoscale replay`: its arguments, and the run: the demand trace read, the generated scaler of each
workload replayed over it beside the static-peak and oracle baselines, the answer printed and, with `--out`,
written to result.json and report.html. Nothing is written unless every workload asked for was replayed.
"""

import argparse
import asyncio
import itertools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from exporter.autoscale import hpa
from exporter.autoscale.baselines import oracle, static_peak
from exporter.autoscale.demand import MAX_DEMAND_BYTES, DemandError, DemandPoint, parse_demand
from exporter.autoscale.outputs import (
    RESULT_FILE,
    WorkloadReplay,
    result_document,
    result_table,
    result_text,
    tune_document,
)
from exporter.autoscale.prometheus import (
    DEFAULT_BUDGET_SECONDS,
    demands_from_prometheus,
    prometheus_access,
    prometheus_url,
)
from exporter.autoscale.replay import replay
from exporter.autoscale.report import REPORT_FILE, render_report
from exporter.autoscale.tune import DEFAULT_OVERFLOW_BUDGET, parse_overflow_budget, tune
from exporter.cli_args import EXIT_OK, Formatter, Subcommands, duration_arg, env_twin, flag_type
from exporter.config import AutoscalingConfig, Config, ScaledWorkload, load_config
from exporter.core.units import duration
from exporter.cost import gpu_hour_price
from exporter.display import shown
from exporter.files import read_capped, write_all_or_none
from exporter.scaling import scaler_spec

# Logs and pipes get whole lines: rich would wrap the table at 80 columns where it cannot ask a terminal.
_TABLE_WIDTH = 120
DEFAULT_SINCE_SECONDS = 7 * 86400.0
# One demand point per HPA sync: what the scaler reads is never coarser than how often it reads.
PROMETHEUS_STEP_SECONDS = hpa.SYNC_PERIOD_SECONDS


def add_autoscale(commands: Subcommands) -> None:
    p = commands.add_parser(
        "autoscale",
        help="what the generated scaler would have done on a recorded demand trace",
        formatter_class=Formatter,
        description="Judge the scalers `plimsoll generate` writes before applying them (docs/autoscaling.md).",
    )
    actions = p.add_subparsers(dest="autoscale_command", required=True, metavar="ACTION")
    replay_parser = actions.add_parser(
        "replay",
        help="replay a demand trace through each workload's generated scaler",
        formatter_class=Formatter,
        description="Replays a demand trace (requests in flight per model over time: from Prometheus' range "
        "query of the recording rules Plimsoll ships, or a CSV with columns time, demand[, queue_max, queue_sum]) "
        "through the HPA the config's generated scaler would be, replicas serving one start-up time after they are "
        "asked for, and reports replica-hours, cost (pricing.gpu_hour x the workload's gpu and gpus_per_replica), "
        "the seconds and request-seconds of demand above the ready replicas' knee, the peak replicas and every "
        "scaling decision, beside a static fleet sized at the peak and an oracle. Exit 0 with an answer, 2 on bad "
        "input (nothing written).",
    )
    env_twin(
        replay_parser, "--config", "PLIMSOLL_CONFIG", required=True, help="YAML config with an autoscaling section"
    )
    trace = replay_parser.add_mutually_exclusive_group(required=True)
    trace.add_argument(
        "--prometheus",
        metavar="URL",
        type=flag_type(prometheus_url),
        help="a Prometheus holding the recording rules Plimsoll generates (its base URL, e.g. http://prometheus:9090)",
    )
    trace.add_argument(
        "--demand", metavar="FILE.csv", help="one workload's demand trace: columns time, demand[, queue_max, queue_sum]"
    )
    _add_prometheus_access(replay_parser)
    replay_parser.add_argument(
        "--since",
        type=duration_arg,
        metavar="DURATION",
        help="with --prometheus: how far back to replay, at one point per 15 s (default: 7d)",
    )
    env_twin(
        replay_parser,
        "--prometheus-timeout",
        "PLIMSOLL_PROMETHEUS_TIMEOUT",
        type=duration_arg,
        metavar="DURATION",
        help="with --prometheus: the most the whole read of the traces may take, every range query together "
        f"(default: {duration(DEFAULT_BUDGET_SECONDS)})",
    )
    replay_parser.add_argument(
        "--workload",
        metavar="NAME",
        help="the workload (its name in autoscaling.workloads) to replay; with --demand needed when there are "
        "several, with --prometheus default every one",
    )
    replay_parser.add_argument("--format", choices=("table", "json"), default="table", help="what to print")
    replay_parser.add_argument(
        "--out", metavar="DIR", type=flag_type(_folder), help="also write DIR/result.json and DIR/report.html"
    )
    replay_parser.add_argument(
        "--tune",
        action="store_true",
        help="also search autoscaling.margin (0.5 to 1.0) and autoscaling.demand_window (the config's, down to the "
        "longest start-up) for the fewest replica-hours within --overflow-budget, and print the config change",
    )
    replay_parser.add_argument(
        "--overflow-budget",
        type=flag_type(parse_overflow_budget),
        metavar="PERCENT",
        help="with --tune: the most overflow request-seconds each workload may have, as a share of its demand "
        f"request-seconds, such as 0.1%% (default: {DEFAULT_OVERFLOW_BUDGET * 100:g}%%)",
    )
    replay_parser.set_defaults(handler=_replay)


def _folder(text: str) -> str:
    # An empty --out (an unset shell variable) would write into the working folder.
    if not text.strip():
        raise ValueError("an empty path; name the folder to write result.json and report.html in")
    return text


def _add_prometheus_access(parser: argparse.ArgumentParser) -> None:
    """How to reach a Prometheus behind authentication or a private CA, named as Prometheus' own http client config
    names them; each secret is read from a file, never given on the command line. Not read with --demand, so an
    environment set up for --prometheus does not stop a CSV replay."""
    env_twin(
        parser,
        "--prometheus-bearer-token-file",
        "PLIMSOLL_PROMETHEUS_BEARER_TOKEN_FILE",
        metavar="FILE",
        help="with --prometheus: send the token in FILE as Authorization: Bearer",
    )
    env_twin(
        parser,
        "--prometheus-basic-auth-user",
        "PLIMSOLL_PROMETHEUS_BASIC_AUTH_USER",
        metavar="USER",
        help="with --prometheus: basic auth as USER, the password from --prometheus-password-file",
    )
    env_twin(
        parser,
        "--prometheus-password-file",
        "PLIMSOLL_PROMETHEUS_PASSWORD_FILE",
        metavar="FILE",
        help="with --prometheus-basic-auth-user: the file holding the password",
    )
    env_twin(
        parser,
        "--prometheus-ca-file",
        "PLIMSOLL_PROMETHEUS_CA_FILE",
        metavar="FILE",
        help="with --prometheus: trust the CA certificates (PEM) in FILE instead of the system's",
    )


def _autoscaling(config: Config, path: str) -> AutoscalingConfig:
    if config.autoscaling is None:
        raise ValueError(
            f"--config {path}: no autoscaling section, so no generated scaler to replay (docs/autoscaling.md)"
        )
    return config.autoscaling


def _workloads(autoscaling: AutoscalingConfig, args: argparse.Namespace) -> tuple[ScaledWorkload, ...]:
    """The workloads to replay: the one `--workload` names, else every one (a CSV holds one: the config's only)."""
    workloads = autoscaling.workloads
    names = ", ".join(workload.name for workload in workloads)
    if args.workload is None:
        if args.demand is not None and len(workloads) > 1:
            raise ValueError(f"--demand holds one workload's demand: name it with --workload (one of {names})")
        return workloads
    for workload in workloads:
        if workload.name == args.workload:
            return (workload,)
    raise ValueError(
        f"--workload {args.workload}: not in autoscaling.workloads of {args.config} (its workloads: {names})"
    )


def _knee(workload: ScaledWorkload) -> int:
    if workload.knee_concurrency is None:
        raise ValueError(
            f"workload {workload.name}: no knee_concurrency, so what one replica holds is unknown offline (the "
            "capacity model stands in only in a running fleet); measure it with `plimsoll loadtest --write` or set "
            "knee_concurrency"
        )
    return workload.knee_concurrency


def _read_demand(path: str) -> tuple[DemandPoint, ...]:
    data = read_capped(path, MAX_DEMAND_BYTES, "--demand", "replay a shorter span or a coarser step")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DemandError(f"{path}: not UTF-8 text (byte {error.start}); save the CSV as UTF-8") from None
    return parse_demand(text, path)


def _price(config: Config, workload: ScaledWorkload) -> tuple[float | None, str | None]:
    """What one replica-hour costs, or why the config cannot say."""
    if workload.gpu is None:
        return None, f"workload {workload.name} names no gpu (autoscaling.workloads[].gpu, gpus_per_replica)"
    price = gpu_hour_price(config.gpu_hour_prices, workload.gpu)
    if price is None:
        return None, f"pricing.gpu_hour has no price for {workload.gpu}"
    return price * workload.gpus_per_replica, None


def _replayed(
    config: Config, autoscaling: AutoscalingConfig, workload: ScaledWorkload, trace: Sequence[DemandPoint]
) -> WorkloadReplay:
    """The workload's generated scaler over `trace`, beside the baselines."""
    knee = _knee(workload)
    # The queue target as `plimsoll generate` writes it: one above the config's saturation.queue.
    spec = scaler_spec(autoscaling, workload, config.saturation_queue)
    bounds = (workload.min_replicas, workload.max_replicas)
    price, unpriced = _price(config, workload)
    return WorkloadReplay(
        workload=workload,
        trace=trace,
        replay=replay(trace, spec, workload.startup_seconds, knee),
        static_peak=static_peak(trace, knee, bounds),
        oracle=oracle(trace, knee, workload.startup_seconds, bounds),
        replica_hour_price=price,
        unpriced=unpriced,
        gaps=tuple(
            (point.time, after.time)
            for point, after in itertools.pairwise(trace)
            if after.time - point.time > autoscaling.demand_window_seconds
        ),
    )


def _traces(args: argparse.Namespace, workloads: Sequence[ScaledWorkload]) -> list[tuple[DemandPoint, ...]]:
    """Each workload's demand trace, from the CSV or Prometheus."""
    if args.demand is not None:
        if args.since is not None:
            raise ValueError("--since: applies to --prometheus only (a --demand CSV replays whole)")
        return [_read_demand(args.demand)]
    since = DEFAULT_SINCE_SECONDS if args.since is None else args.since
    access = prometheus_access(
        args.prometheus_bearer_token_file,
        args.prometheus_basic_auth_user,
        args.prometheus_password_file,
        args.prometheus_ca_file,
    )
    budget = DEFAULT_BUDGET_SECONDS if args.prometheus_timeout is None else args.prometheus_timeout
    models = [workload.model for workload in workloads]
    return asyncio.run(
        demands_from_prometheus(
            args.prometheus, models, since, PROMETHEUS_STEP_SECONDS, budget_seconds=budget, access=access
        )
    )


def _source(args: argparse.Namespace) -> dict[str, Any]:
    if args.demand is not None:
        # A file name not in UTF-8 (its bytes come as surrogates) is written with U+FFFD for them: the files are UTF-8.
        return {"demand": os.fsencode(args.demand).decode("utf-8", "replace")}
    since = DEFAULT_SINCE_SECONDS if args.since is None else args.since
    return {"prometheus": args.prometheus, "since_seconds": since, "step_seconds": PROMETHEUS_STEP_SECONDS}


def _print(document: dict[str, Any], output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(document, indent=2))
        return
    output = Console(highlight=False, soft_wrap=True)
    if not output.is_terminal:
        output.width = _TABLE_WIDTH
    output.print(result_table(document))


def _tuned(
    config: Config, autoscaling: AutoscalingConfig, args: argparse.Namespace, results: Sequence[WorkloadReplay]
) -> dict[str, Any]:
    budget = DEFAULT_OVERFLOW_BUDGET if args.overflow_budget is None else args.overflow_budget
    traces = [(result.workload, result.trace, _knee(result.workload)) for result in results]
    replayed = {result.workload.name for result in results}
    unreplayed = [workload.name for workload in autoscaling.workloads if workload.name not in replayed]
    return tune_document(tune(autoscaling, traces, config.saturation_queue, budget), results, unreplayed)


def _write(out: Path, document: Mapping[str, Any]) -> list[Path]:
    """result.json and report.html, both or neither: a new result beside an earlier run's report would disagree
    with it."""
    files = {out / RESULT_FILE: result_text(document), out / REPORT_FILE: render_report(document)}
    write_all_or_none(files)
    return list(files)


def _replay(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    autoscaling = _autoscaling(config, args.config)
    workloads = _workloads(autoscaling, args)
    for workload in workloads:  # refused before any trace is read
        _knee(workload)
    if args.overflow_budget is not None and not args.tune:
        raise ValueError("--overflow-budget: applies with --tune only (the budget the tuned knobs must keep)")
    traces = _traces(args, workloads)
    results = [_replayed(config, autoscaling, w, trace) for w, trace in zip(workloads, traces, strict=True)]
    document = result_document(_source(args), results)
    if args.tune:
        document["tune"] = _tuned(config, autoscaling, args, results)
    written: list[Path] = []
    if args.out is not None:
        try:
            written = _write(Path(args.out), document)
        except OSError as error:  # --out is a file, read-only, full: say which, not a traceback
            raise ValueError(
                f"--out {args.out}: cannot write {error.filename or args.out} ({error.strerror})"
            ) from None
    _print(document, args.format)
    for path in written:
        print(f"wrote {shown(str(path))}", file=sys.stderr)  # stderr: stdout stays one JSON document
    return EXIT_OK
