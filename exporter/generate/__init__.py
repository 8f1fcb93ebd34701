"""`plimsoll generate`: Prometheus rules, Prometheus Operator monitors, scalers and Grafana dashboards from the config.

Each generator returns `Artifact`s (a path relative to the output directory, and its text); this module writes
them without ever leaving a half-written file (temporary file, then rename) and, for `--check`, says which
committed files differ from what the config generates.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from exporter.config import Config
from exporter.files import write_atomically


@dataclass(frozen=True)
class Artifact:
    path: str  # relative to the output directory, e.g. "rules/plimsoll.rules.yaml"
    text: str


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
    differing = []
    for item in items:
        target = out / item.path
        try:
            current = target.read_text()
        except OSError:
            current = None
        if current != item.text:
            differing.append(item.path)
    return differing
