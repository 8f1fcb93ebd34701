"""Alert thresholds from the knee: the KV usage and queue depth at which the server still met its SLOs, as a
fragment of Plimsoll's config (`saturation:`), written to thresholds.yaml or merged into the user's config.

KV usage at the knee is lowered by a margin so the alert fires just before the knee rather than at it, and kept
within [0.5, 0.99]: under half full is no saturation signal, and a full pool is too late. The queue threshold is
the mean number of requests waiting at the knee, rounded up: more than that waiting is past the knee.
"""

import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from exporter.config import ConfigError, check_config, read_config_text
from exporter.files import write_atomically
from exporter.generate.rules import duration
from exporter.loadtest.judge import StepSummary

DEFAULT_MARGIN = 0.05
KV_USAGE_FLOOR = 0.5
KV_USAGE_CEILING = 0.99

Fragment = Mapping[str, Mapping[str, float | int]]


class ThresholdsError(Exception):
    """The config file cannot take the thresholds; the message names the file and what to do."""


@dataclass(frozen=True)
class Thresholds:
    kv_usage: float | None  # None: the engine reported no KV usage at the knee
    queue: int | None  # None: the engine reported no queue at the knee
    margin: float
    knee_concurrency: int | None  # None: no knee, so nothing to calibrate from

    def fragment(self) -> Fragment | None:
        """The measured part of the config's `saturation:` block; None when nothing was measured."""
        measured: dict[str, float | int] = {}
        if self.kv_usage is not None:
            measured["kv_usage"] = self.kv_usage
        if self.queue is not None:
            measured["queue"] = self.queue
        return {"saturation": measured} if measured else None


def derive_thresholds(knee: StepSummary | None, margin: float = DEFAULT_MARGIN) -> Thresholds:
    if knee is None:
        return Thresholds(kv_usage=None, queue=None, margin=margin, knee_concurrency=None)
    kv_usage = None
    if knee.kv_cache_usage_ratio is not None:
        lowered = min(max(knee.kv_cache_usage_ratio * (1 - margin), KV_USAGE_FLOOR), KV_USAGE_CEILING)
        # Rounded down: a threshold a hair lower alerts a hair earlier, never later.
        kv_usage = math.floor(round(lowered * 1000, 6)) / 1000
    # Rounded before ceil so 2.0000000001 waiting (float noise in a mean) stays 2.
    queue = None if knee.requests_waiting is None else math.ceil(round(knee.requests_waiting, 6))
    return Thresholds(kv_usage=kv_usage, queue=queue, margin=margin, knee_concurrency=knee.concurrency)


def render_thresholds_yaml(fragment: Fragment, lead_time_seconds: float, header: Sequence[str]) -> str:
    """thresholds.yaml: comments saying where the values came from, then a `saturation:` block to paste.

    The lead time is not measured; it is the config's (or the default), so the block is complete on its own,
    while `--write` only ever sets the measured keys."""
    lines = [f"# {line}" for line in header]
    lines.append("saturation:")
    for key, value in fragment["saturation"].items():
        lines.append(f"  {key}: {value}")
    lines.append(f"  lead_time: {duration(lead_time_seconds)}  # not measured: your config's, or the default")
    return "\n".join(lines) + "\n"


def write_thresholds(config_path: Path, fragment: Fragment) -> Path:
    """Set the fragment's keys in the config file in place, keeping its comments and key order; returns the backup.

    The file is parsed round-trip (ruamel.yaml), updated, checked with the same validation as `check-config`, then
    written atomically; the previous version is kept as FILE.bak. Comments inside a flow mapping such as
    `saturation: {kv_usage: 0.9}` are the one thing ruamel cannot keep; block mappings keep every comment."""
    path = config_path.resolve()  # a symlinked config is updated where it lives, not replaced by a plain file
    try:
        original = read_config_text(path)
    except ConfigError as error:
        raise ThresholdsError(str(error)) from None
    yaml = YAML()
    yaml.preserve_quotes = True
    try:
        document = yaml.load(original)
    except YAMLError as error:
        raise ThresholdsError(f"{config_path}: not YAML that can be edited in place ({_first_line(error)})") from None
    if document is None:
        document = CommentedMap()
    if not isinstance(document, CommentedMap):
        raise ThresholdsError(
            f"{config_path}: the top level is not a mapping of settings; fix the file (plimsoll check-config "
            f"{config_path}) or copy thresholds.yaml's saturation block into it by hand"
        )
    _merge(document, fragment, config_path)
    stream = StringIO()
    yaml.dump(document, stream)
    updated = stream.getvalue()
    _refuse_new_problems(original, updated, str(path), config_path)
    backup = path.with_name(f"{path.name}.bak")
    try:
        shutil.copy2(path, backup)
        write_atomically(path, updated, path.stat().st_mode & 0o7777)
    except OSError as error:
        raise ThresholdsError(
            f"{config_path}: cannot write the updated config ({error.strerror}); it is unchanged"
        ) from None
    return backup


def _merge(document: CommentedMap, fragment: Fragment, config_path: Path) -> None:
    for section, values in fragment.items():
        existing = document.get(section)
        if existing is None:
            document[section] = CommentedMap(values)
        elif isinstance(existing, CommentedMap):
            for key, value in values.items():
                existing[key] = value
        else:
            raise ThresholdsError(
                f"{config_path}: {section} is not a mapping (expected e.g. {section}: {{kv_usage: 0.9}}); "
                "fix it, then run again"
            )


def _refuse_new_problems(original: str, updated: str, source: str, config_path: Path) -> None:
    """Problems the file had before are the user's to fix; a problem the edit would add stops the write."""
    before = set(check_config(original, source).problems)
    added = [problem for problem in check_config(updated, source).problems if problem not in before]
    if added:
        raise ThresholdsError(
            f"{config_path}: not written: the updated config would not pass check-config:\n" + "\n".join(added)
        )


def _first_line(error: Any) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
