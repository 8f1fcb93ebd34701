"""`plimsoll generate`: Prometheus rules, Prometheus Operator monitors, scalers and Grafana dashboards from the config.

Each generator returns `Artifact`s (a path relative to the output directory, and its text); this module writes
them without ever leaving a half-written file (temporary file, then rename) and, for `--check`, says which
committed files differ from what the config generates and lints the scaler files as they are on disk.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.config import Config, ConfigError, read_config_text
from exporter.files import read_regular_file, write_atomically
from exporter.generate.artifact import Artifact

if TYPE_CHECKING:
    from exporter.generate.autoscaling import FileLint


# Of all the scaler folder's YAML together: generated files are a few kilobytes a workload, and the lint parses
# about a mebibyte in six seconds, so a folder of thousands of large files would keep --check busy for hours.
MAX_SCALER_FOLDER_CHARS = 4 * 1024 * 1024


def artifacts(config: Config) -> list[Artifact]:
    from exporter.generate import autoscaling, dashboards, monitors, rules  # grafanalib loads only when asked

    return [
        *rules.artifacts(config),
        *monitors.artifacts(config),
        *autoscaling.artifacts(config),
        *dashboards.artifacts(config),
    ]


def write(items: Iterable[Artifact], out: Path) -> list[Path]:
    """Each artifact under `out`, atomically and readable by all (Prometheus and Grafana must read them)."""
    written = []
    for item in items:
        target = out / item.path
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, item.text)
        written.append(target)
    return written


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


def lint_scalers(config: Config, out: Path) -> "FileLint":
    """The scaler lint over every YAML file in the autoscaling folder under `out`, as it is on disk: a file edited
    by hand since it was generated, or one the config no longer generates, is checked too."""
    from exporter.generate import autoscaling

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
