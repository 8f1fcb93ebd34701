"""`plimsoll loadtest`: from the parsed flags to a knee, the files that record it, and an exit status.

Everything that can be refused without sending a request (SLOs, workload, model, config) is checked first and
raised as a ValueError naming the flag (exit 2). The run then checks the server with one request (exit 1 with the
reason when it cannot be load-tested), searches for the knee while showing each step, and writes result.json,
report.html and thresholds.yaml, also after Ctrl-C or SIGTERM (exit 130) so a partial run is never lost.
"""

import argparse
import asyncio
import json
import math
import os
import resource
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from rich.console import Console

from exporter.capacity.plan import CapacityPlan
from exporter.cli_args import EXIT_INTERRUPTED  # a SIGTERM'd run is as interrupted as a Ctrl-C'd one
from exporter.config import Config, ConfigError, Target, load_config, validate_duration
from exporter.core.units import duration
from exporter.display import plain, shown
from exporter.loadtest import runner, workload
from exporter.loadtest.measure import SloSpec
from exporter.loadtest.model import model_prediction
from exporter.loadtest.outputs import (
    RunResult,
    RunSettings,
    WrittenOutputs,
    requests_text,
    result_document,
    write_outputs,
)
from exporter.loadtest.progress import Progress, result_table, summary_lines
from exporter.loadtest.steps import Outcome, SearchSettings, run_steps
from exporter.loadtest.thresholds import ReplicaKnee, ThresholdsError, refuse_read_only, write_thresholds
from exporter.target_model import model_plan, resolve

EXIT_KNEE = 0
EXIT_NO_ANSWER = 1
_SLO_NAMES = ("ttft", "itl")
# One process sends about 1,300 requests/s of 32 tokens on one core (bench/loadgen_bench.py); ten times that is
# surely past it, and every arrival over the in-flight cap is a record kept in memory.
MAX_RATE = 10_000.0
# The final table's width where stdout is not a terminal (a file, a CI log): wide enough for every column.
_TABLE_WIDTH = 160
# Files the run holds open besides one connection per request in flight: the metrics reads, the outputs, Python's own.
_SPARE_FILES = 64


class LoadtestInputError(ValueError):
    """A flag or file that cannot be used; the message names it and says what to write instead."""


@dataclass(frozen=True)
class LoadtestSettings:
    """Everything one run needs, decided from the flags before any request is sent."""

    run: runner.RunSettings
    search: SearchSettings  # the SLOs and what loads to run
    save_requests: Path | None  # --save-requests: every request's record, CSV or JSON lines
    margin: float
    out_dir: Path
    output_format: str  # "table" | "json"
    capacity_plan: CapacityPlan | None  # the capacity model's deployment, from the plan flags or the config
    config_path: Path | None  # --config: the lead time comes from it, and --write updates it
    target: str | None  # the config's target the run is about
    target_model: str | None  # its `model`: --write gives the knee to the autoscaling workload of that model
    write: bool
    lead_time_seconds: float


def parse_slos(text: str | None, objective: float) -> SloSpec:
    """--slo "ttft=500ms,itl=50ms": each threshold named, each with its unit. None: no latency objective (a request
    is good when it completes whole, and the saturation point is the answer)."""
    thresholds: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")) if text is not None else ():
        name, equals, value = item.partition("=")
        name = name.strip().lower()
        if not equals or not value.strip():
            raise LoadtestInputError(f"--slo: {item!r} is not NAME=DURATION (e.g. --slo ttft=500ms,itl=50ms)")
        if name not in _SLO_NAMES:
            raise LoadtestInputError(f"--slo: {name!r} is not an SLO this command judges (use ttft and/or itl)")
        if name in thresholds:
            raise LoadtestInputError(f"--slo: {name} is given twice")
        if value.strip().replace(".", "", 1).isdigit():
            # A latency SLO is as often milliseconds as seconds: name both rather than guess.
            bare = value.strip()
            raise LoadtestInputError(f"--slo: {name}: {bare} has no unit: write {bare}ms or {bare}s")
        try:
            thresholds[name] = validate_duration(value.strip())
        except ValueError as error:
            raise LoadtestInputError(f"--slo: {name}: {error}") from None
    if not 0 < objective < 1:
        hint = f" (did you mean {objective / 100:g}?)" if 1 < objective < 100 else ""
        if objective == 1:
            hint = " (no number of requests can show that every one will meet the SLOs: e.g. 0.999)"
        raise LoadtestInputError(f"--objective: {objective:g} is not a ratio above 0 and below 1{hint}")
    return SloSpec(ttft_seconds=thresholds.get("ttft"), itl_seconds=thresholds.get("itl"), objective=objective)


def _lengths(args: argparse.Namespace, name: str) -> workload.Lengths:
    flag = f"--{name.replace('_', '-')}"
    lengths = workload.Lengths(
        mean=getattr(args, name),
        spread=getattr(args, f"{name}_spread"),
        minimum=getattr(args, f"{name}_min"),
        maximum=getattr(args, f"{name}_max"),
    )
    return workload.check_lengths(flag, lengths)


def _workload(args: argparse.Namespace) -> workload.Workload:
    output = _lengths(args, "output_tokens")
    if args.dataset:
        return workload.load_trace(Path(args.dataset), output.mean)
    return workload.SyntheticWorkload(_lengths(args, "prompt_tokens"), output, seed=args.seed)


def _config_target(config: Config, name: str | None, source: str) -> Target | None:
    if name is None:
        return config.targets[0] if len(config.targets) == 1 else None
    for target in config.targets:
        if target.name == name:
            return target
    names = ", ".join(t.name for t in config.targets) or "none"
    raise LoadtestInputError(f"--target {name!r}: {source} has no such target (it has: {names})")


def _config_plan(target: Target | None) -> CapacityPlan | None:
    """The capacity model of the config's target, where its model and GPU (or KV size) allow one."""
    if target is None or not target.model:
        return None
    catalog = resolve(target)
    if catalog.problems:
        field_name, message = catalog.problems[0]
        raise LoadtestInputError(f"--config: targets[{target.name}].{field_name}: {message}")
    assert catalog.arch is not None  # resolve() loads the model or reports a problem
    return model_plan(catalog.arch, target.deployment, target.engine, {}, catalog.gpu)


def settings_from_args(args: argparse.Namespace, flag_plan: CapacityPlan | None) -> LoadtestSettings:
    """The run the flags describe; `flag_plan` is the capacity model the plan flags (--model, --gpu...) built."""
    slos = parse_slos(args.slo, args.objective)
    config: Config | None = None
    target: Target | None = None
    if args.config:
        try:
            config = load_config(args.config)
        except ConfigError as error:
            raise LoadtestInputError(f"--config: {error}") from None
        target = _config_target(config, args.target, args.config)
        if args.write:
            try:
                refuse_read_only(Path(args.config))
            except ThresholdsError as error:
                raise LoadtestInputError(f"--write: {error}") from None
    elif args.target or args.write:
        raise LoadtestInputError(f"{'--target' if args.target else '--write'} needs --config FILE")
    if flag_plan is not None and target is not None and target.model:
        raise LoadtestInputError("--model and --config's target both name a model: give one of them")
    run_settings = runner.RunSettings(
        url=_checked_url(args.url),
        workload=_workload(args),
        endpoint=args.endpoint,
        served_model=args.served_model,
        metrics_url=_checked_url(args.metrics_url, "--metrics-url") if args.metrics_url else None,
        request_timeout_seconds=args.request_timeout,
        stall_timeout_seconds=min(args.stall_timeout, args.request_timeout),
        step_seconds=args.step_duration,
        warmup_seconds=args.warmup,
        max_duration_seconds=args.max_duration,
        ready_timeout_seconds=args.ready_timeout,
        ignore_eos=args.ignore_eos,
        allow_short_answers=args.allow_short_answers,
        unique_prompts=args.unique_prompts,
        arrivals=args.arrivals,
        api_key=_api_key(args.api_key_file),
    )
    if args.max_concurrency < 1:
        raise LoadtestInputError(f"--max-concurrency: {args.max_concurrency} must be at least 1")
    levels = _levels(args.concurrency)
    _open_files_for(max(levels) if levels else args.max_concurrency, "--concurrency" if levels else "--max-concurrency")
    if not 0 <= args.tolerance < 1:
        raise LoadtestInputError(f"--tolerance: {args.tolerance:g} is not a share in [0, 1) (e.g. 0.1 for 10%)")
    if not 0 <= args.margin < 0.5:
        raise LoadtestInputError(f"--margin: {args.margin:g} is not a share in [0, 0.5) (e.g. 0.05 for 5%)")
    if args.max_duration < args.warmup + args.step_duration:
        one_step = duration(args.warmup + args.step_duration)
        raise LoadtestInputError(
            f"--max-duration: {duration(args.max_duration)} is shorter than one step (--warmup + --step-duration, "
            f"{one_step}), so no step could finish: give at least {one_step}, or shorter steps"
        )
    return LoadtestSettings(
        run=run_settings,
        search=SearchSettings(
            slos=slos,
            max_concurrency=args.max_concurrency,
            tolerance=args.tolerance,
            levels=levels,
            rates=_rates(args.rate, args.concurrency),
        ),
        save_requests=_save_requests(args.save_requests),
        margin=args.margin,
        out_dir=_writable_dir(Path(args.out)),
        output_format=args.format,
        capacity_plan=flag_plan or _config_plan(target),
        config_path=Path(args.config) if args.config else None,
        target=target.name if target is not None else None,
        target_model=target.model if target is not None else None,
        write=args.write,
        lead_time_seconds=config.lead_time_seconds if config is not None else Config().lead_time_seconds,
    )


def _open_files_for(concurrency: int, flag: str) -> None:
    """Raise this process's limit on open files to what `concurrency` requests in flight need, as far as the hard
    limit allows, or refuse: past it, connections fail in the load generator itself and would read as a server
    that stopped answering."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = concurrency + _SPARE_FILES
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise LoadtestInputError(
            f"{flag}: {concurrency} requests in flight need about {needed} open files, and this process may open "
            f"{hard} (ulimit -Hn): give at most {max(1, hard - _SPARE_FILES)}, or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _levels(text: str | None) -> tuple[int, ...]:
    """--concurrency 1,4,16: whole numbers of at least 1, each once."""
    if text is None:
        return ()
    levels = []
    for item in (part.strip() for part in text.split(",")):
        if not item.isdigit() or int(item) < 1:
            raise LoadtestInputError(f"--concurrency: {item!r} is not a concurrency (a whole number of at least 1)")
        if int(item) in levels:
            raise LoadtestInputError(f"--concurrency: {item} is given twice")
        levels.append(int(item))
    return tuple(levels)


def _rates(text: str | None, concurrency: str | None) -> tuple[float, ...]:
    """--rate 2,4.5,8: requests per second above 0, each once; not with --concurrency (open or closed, not both)."""
    if text is None:
        return ()
    if concurrency is not None:
        raise LoadtestInputError("--rate and --concurrency: give one (an open loop at rates, or a closed loop)")
    rates: list[float] = []
    for item in (part.strip() for part in text.split(",")):
        try:
            rate = float(item)
        except ValueError:
            rate = math.nan
        if not math.isfinite(rate) or rate <= 0:
            raise LoadtestInputError(f"--rate: {item!r} is not a rate (requests per second above 0, e.g. 2.5)")
        if rate > MAX_RATE:
            raise LoadtestInputError(
                f"--rate: {item} requests/s is more than one load generator sends ({MAX_RATE:g} at most; "
                "bench/loadgen_bench.py measures what this machine holds)"
            )
        if rate in rates:
            raise LoadtestInputError(f"--rate: {item} is given twice")
        rates.append(rate)
    return tuple(rates)


def _save_requests(path: str | None) -> Path | None:
    if path is None:
        return None
    if not path.endswith((".csv", ".jsonl")):
        raise LoadtestInputError(f"--save-requests: {path!r} must end in .csv or .jsonl (the format it is written in)")
    if Path(path).is_dir():
        raise LoadtestInputError(f"--save-requests: {path} is a directory; name a file in it")
    _writable_dir(Path(path).parent, "--save-requests")
    return Path(path)


def _writable_dir(path: Path, flag: str = "--out") -> Path:
    """A directory the run will be able to write into (made when it writes): checked before any load is sent, so
    a run is never measured only to be lost, and nothing is made for a run that could not answer."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise LoadtestInputError(f"{flag}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise LoadtestInputError(f"{flag}: {existing} is not writable")
    return path


def _checked_url(url: str | None, flag: str = "--url") -> str:
    if not url:
        raise LoadtestInputError(f"{flag} is required: the server's base URL, e.g. http://127.0.0.1:8000")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- read for its ValueError: a port that is no number, or out of range
    except ValueError:  # that, or a bracket left open
        parts = None
    if "@" in (parts.netloc if parts is not None else url):
        # Refused as the daemon refuses it, and without repeating the URL: it holds the password.
        raise LoadtestInputError(
            f"{flag}: credentials in the URL would be written into result.json, report.html and logs: give the URL "
            "without them, and the API key with --api-key-file FILE or PLIMSOLL_API_KEY"
        )
    if flag == "--url" and parts is not None and (parts.query or parts.fragment or url.endswith(("?", "#"))):
        # A base URL never needs one, and a query is where a key would ride (?api_key=...) into the same outputs.
        raise LoadtestInputError(
            f"{flag}: a query string or fragment would be written into result.json, report.html and logs, and a "
            "base URL needs none: give the URL without it, and the API key with --api-key-file FILE or "
            "PLIMSOLL_API_KEY"
        )
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise LoadtestInputError(f"{flag}: {shown(url)!r} is not an http(s) URL (e.g. http://127.0.0.1:8000)")
    return url.rstrip("/")


def _api_key(key_file: str | None) -> str | None:
    try:
        return runner.api_key_from(os.environ, key_file)
    except runner.LoadtestError as error:
        raise LoadtestInputError(str(error)) from None


def run_loadtest(settings: LoadtestSettings) -> int:
    """Run the search, write the outputs, print the table or the document; the exit status."""
    # Logs and pipes get whole lines: rich would wrap them at 80 columns where it cannot ask a terminal.
    progress_console = Console(stderr=True, soft_wrap=True)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    with Progress(progress_console) as progress:
        try:
            outcome = asyncio.run(run_steps(settings.run, settings.search, progress))
        except runner.LoadtestError as error:
            print(f"plimsoll loadtest: {shown(str(error))}", file=sys.stderr)
            return EXIT_NO_ANSWER
        except KeyboardInterrupt:
            # Ctrl-C before the first step (while the server was being checked): nothing was measured.
            print("plimsoll loadtest: interrupted before any load was sent; nothing written", file=sys.stderr)
            return EXIT_INTERRUPTED
    result = _result(settings, outcome, started_at)
    try:
        saved = settings.save_requests
        requests = None if saved is None else (saved, requests_text(saved, outcome.step_runs, settings.search.slos))
        written = write_outputs(settings.out_dir, result, requests)
    except OSError as error:  # the disk filled or a permission changed during the run: say where, no traceback
        where = error.filename or settings.out_dir
        print(f"plimsoll loadtest: cannot write {shown(str(where))}: {error.strerror}", file=sys.stderr)
        return EXIT_NO_ANSWER
    document = result_document(result)
    messages = _write_back(settings, result, time_limited=outcome.time_limited)
    if settings.output_format == "json":
        print(json.dumps(document, indent=2))
    else:
        output = Console(highlight=False, soft_wrap=True)
        if not output.is_terminal:
            output.width = _TABLE_WIDTH
        output.print(result_table(document))
        for line in summary_lines(document, _paths(written)):
            output.print(plain(line))  # the notes hold the server's words
    for message in messages:
        print(f"plimsoll loadtest: {shown(message)}", file=sys.stderr)
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_KNEE if outcome.search.operating_point is not None else EXIT_NO_ANSWER


def _paths(written: WrittenOutputs) -> list[str]:
    return [str(p) for p in (written.result, written.report, written.thresholds) if p is not None]


def _write_back(settings: LoadtestSettings, result: RunResult, *, time_limited: bool) -> list[str]:
    """--write: the measured thresholds, and the knee as one replica's capacity, into the config file; what
    happened, as lines for stderr."""
    if not settings.write or settings.config_path is None:
        return []
    config = settings.config_path
    if result.interrupted:
        return [f"--write: {config} left unchanged: the run was interrupted"]
    if time_limited:
        # A search cut short answers lower bounds: the config takes only a finished search's answers.
        return [
            f"--write: {config} left unchanged: --max-duration ended the search before it finished; run again with "
            "a longer one (result.json holds what it measured)"
        ]
    fragment = result.thresholds.fragment()
    knee = result.search.operating_point
    models = tuple(dict.fromkeys(m for m in (settings.target_model, result.settings.model) if m))
    closed = knee is not None and knee.offered_rate is None
    replica_knee = ReplicaKnee(knee.concurrency, models) if knee is not None and closed else None
    if fragment is None and replica_knee is None:
        return [f"--write: {config} left unchanged: no knee to calibrate from"]
    try:
        update = write_thresholds(config, fragment, replica_knee)
    except ThresholdsError as error:
        return [f"--write: {error}"]
    messages = []
    if replica_knee is not None and update.knee_workload is None:
        wanted = " or ".join(f"model: {model}" for model in models)
        messages.append(
            f"--write: knee_concurrency {replica_knee.concurrency} not written: no autoscaling workload in {config} "
            f"has {wanted}; the workload serving this model takes it (add it under autoscaling.workloads, "
            "docs/autoscaling.md)"
        )
    changes = []
    if fragment is not None:
        changes.append(f"saturation: {dict(fragment['saturation'])}")
    if update.knee_workload is not None and replica_knee is not None:
        changes.append(f"{update.knee_workload} knee_concurrency: {replica_knee.concurrency}")
    if update.backup is None:
        messages.append(f"--write: {config} left unchanged: nothing measured that it can take")
    else:
        messages.append(f"updated {config} ({'; '.join(changes)}); previous kept as {update.backup}")
    return messages


def _result(settings: LoadtestSettings, outcome: Outcome, started_at: str) -> RunResult:
    search = outcome.search
    point = search.operating_point
    prediction = model_prediction(
        settings.capacity_plan,
        outcome.engine_capacity_tokens,
        outcome.footprint_tokens,
        point.concurrency if point is not None and point.offered_rate is None else None,
        outcome.engine_block_size,
    )
    run = settings.run
    return RunResult(
        settings=RunSettings(
            target=settings.target,
            endpoint=run.endpoint_at().url,
            model=outcome.model,
            started_at=started_at,
            slos=settings.search.slos,
            workload=workload.describe(run.workload),
            max_concurrency=settings.search.max_concurrency,
            tolerance=settings.search.tolerance,
            margin=settings.margin,
            lead_time_seconds=settings.lead_time_seconds,
        ),
        search=search,
        model_prediction=prediction,
        interrupted=outcome.interrupted,
        notes=outcome.notes,
    )
