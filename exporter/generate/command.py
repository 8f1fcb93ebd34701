"""`plimsoll generate`: its arguments, and what it does with the artifacts: writes them without ever leaving a
half-written file (temporary file, then rename) or, for `--check`, says which committed files differ from what the
config generates and lints the scaler files as they are on disk.
"""

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from exporter.cli_args import EXIT_OK, Formatter, Subcommands, env_twin
from exporter.config import Config, ConfigError, load_config, read_config_text
from exporter.display import shown
from exporter.files import read_regular_file, write_all_or_none
from exporter.generate import autoscaling, monitors, rules
from exporter.generate.artifact import Artifact

# Of all the scaler folder's YAML together: generated files are a few kilobytes a workload, and the lint parses
# about a mebibyte in six seconds, so a folder of thousands of large files would keep --check busy for hours.
MAX_SCALER_FOLDER_CHARS = 4 * 1024 * 1024


def artifacts(config: Config) -> list[Artifact]:
    from exporter.generate import dashboards  # grafanalib loads only when asked

    return [
        *rules.artifacts(config),
        *monitors.artifacts(config),
        *autoscaling.artifacts(config),
        *dashboards.artifacts(config),
    ]


def write(items: Iterable[Artifact], out: Path) -> list[Path]:
    """Each artifact under `out`, readable by all (Prometheus and Grafana must read them), all of them or none: a
    target that cannot be written (a folder in its way, a full disk) leaves the files as they were, not some from
    the new config and the rest from the old, and no folder it made (a run that failed writes nothing)."""
    texts: dict[Path, str | None] = {out / item.path: item.text for item in items}
    write_all_or_none(texts)
    return list(texts)


def stale(items: Iterable[Artifact], out: Path) -> list[str]:
    """Paths whose committed text differs from what the config generates (missing files included)."""
    return [item.path for item in items if _committed(out / item.path, len(item.text) + 1) != item.text]


def _committed(target: Path, limit: int) -> str | None:
    """The text of a regular file, enough of it to tell it differs (a file grown huge is not read whole); None
    where there is none to compare, a FIFO in its place included. Read with replacement, so bytes that are not
    UTF-8 make it differ rather than end the check."""
    try:
        data = read_regular_file(target, 4 * limit)  # a character is at most four bytes of UTF-8
    except OSError:
        return None
    return data.decode("utf-8", errors="replace")


def lint_scalers(config: Config, out: Path) -> autoscaling.FileLint:
    """The scaler lint over every YAML file in the autoscaling folder under `out`, as it is on disk: a file edited
    by hand since it was generated, or one the config no longer generates, is checked too."""
    models = {workload.model for workload in config.autoscaling.workloads} if config.autoscaling else set()
    folder = out / autoscaling.DIRECTORY
    files = sorted(path for path in folder.glob("*.y*ml") if path.is_file()) if folder.is_dir() else []
    problems: list[str] = []
    skipped: list[str] = []
    total = 0
    for path in files:
        try:
            text = read_config_text(path, "scaler file")
        except ConfigError as error:
            problems += error.problems
            continue
        total += len(text)
        if total > MAX_SCALER_FOLDER_CHARS:
            problems.append(
                f"{folder}: over {MAX_SCALER_FOLDER_CHARS >> 20} MiB of YAML in all, so the lint stopped at "
                f"{path.name}; scaler files are a few kilobytes each (is this the folder plimsoll generate writes?)"
            )
            break
        found = autoscaling.lint_file(str(path), text, models)
        problems += found.problems
        skipped += found.skipped
    return autoscaling.FileLint(problems=tuple(problems), skipped=tuple(skipped))


def add_generate(commands: Subcommands) -> None:
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


def _generate(args: argparse.Namespace) -> int:
    config = load_config(args.config) if args.config else Config()
    try:
        items = artifacts(config)
    except ConfigError as error:  # what only the generators see, such as two workloads' scalers colliding
        raise ConfigError([f"{args.config}: {problem}" for problem in error.problems]) from None
    out = Path(args.out)
    if args.check:
        differing = stale(items, out)
        source = f"--config {args.config} " if args.config else ""
        for path in differing:
            print(f"stale: {out / path} (regenerate: plimsoll generate {source}--out {out})")
        scalers = lint_scalers(config, out)  # its lines quote file names and what the files say
        for line in scalers.skipped:
            print(f"skipped: {shown(line)}")
        for problem in scalers.problems:
            print(f"lint: {shown(problem)}")
        return 1 if differing or scalers.problems else EXIT_OK
    try:
        written = write(items, out)
    except OSError as error:  # --out is a file, read-only, full: say which file, not a traceback
        where = error.filename or out
        print(f"plimsoll generate: --out {out}: cannot write {where} ({error.strerror})", file=sys.stderr)
        return 1
    for target in written:
        print(f"wrote {target}")
    return EXIT_OK
