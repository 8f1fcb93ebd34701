"""Alert thresholds from the operating point (the lower of the SLO knee and the saturation point): the KV usage and
queue depth at which the server still met its SLOs and held its load, as a fragment of Plimsoll's config
(`saturation:`), written to thresholds.yaml or merged into the user's config, with the operating point itself as one
replica's capacity (`autoscaling.workloads[].knee_concurrency` of the workload serving the tested model).

KV usage at the operating point is lowered by a margin so the alert fires just before it rather than at it, and
kept within [0.5, 0.99]: under half full is no saturation signal, and a full pool is too late. The queue threshold
is the mean number of requests waiting there, rounded up: more than that waiting is past it.
"""

import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark, YAMLError
from ruamel.yaml.tokens import CommentToken
from ruamel.yaml.util import load_yaml_guess_indent

from exporter.config import ConfigError, check_config, label_value, load_yaml, read_config_text
from exporter.core.units import duration
from exporter.display import shown
from exporter.files import write_atomically
from exporter.loadtest.judge import StepSummary

DEFAULT_MARGIN = 0.05
KV_USAGE_FLOOR = 0.5
KV_USAGE_CEILING = 0.99

Fragment = Mapping[str, Mapping[str, float | int]]


class ThresholdsError(Exception):
    """The config file cannot take the thresholds; the message names the file and what to do."""


@dataclass(frozen=True)
class Thresholds:
    kv_usage: float | None  # None: the engine reported no KV usage at the operating point
    queue: int | None  # None: the engine reported no queue at the operating point
    margin: float
    knee_concurrency: int | None  # None: no operating point, so nothing to calibrate from

    def fragment(self) -> Fragment | None:
        """The measured part of the config's `saturation:` block; None when nothing was measured."""
        measured: dict[str, float | int] = {}
        if self.kv_usage is not None:
            measured["kv_usage"] = self.kv_usage
        if self.queue is not None:
            measured["queue"] = self.queue
        return {"saturation": measured} if measured else None


def derive_thresholds(point: StepSummary | None, margin: float = DEFAULT_MARGIN) -> Thresholds:
    """The thresholds at `point`, the operating point; none where there is no point to calibrate from."""
    if point is None:
        return Thresholds(kv_usage=None, queue=None, margin=margin, knee_concurrency=None)
    kv_usage = None
    if point.kv_cache_usage_ratio is not None:
        lowered = min(max(point.kv_cache_usage_ratio * (1 - margin), KV_USAGE_FLOOR), KV_USAGE_CEILING)
        # Rounded down: a threshold a hair lower alerts a hair earlier, never later.
        kv_usage = math.floor(round(lowered * 1000, 6)) / 1000
    # Rounded before ceil so 2.0000000001 waiting (float noise in a mean) stays 2.
    queue = None if point.requests_waiting is None else math.ceil(round(point.requests_waiting, 6))
    # An open loop's capacity is a rate, not requests in flight: it sets no replica's knee_concurrency.
    knee_concurrency = point.concurrency if point.offered_rate is None else None
    return Thresholds(kv_usage=kv_usage, queue=queue, margin=margin, knee_concurrency=knee_concurrency)


def render_thresholds_yaml(fragment: Fragment, lead_time_seconds: float, header: Sequence[str]) -> str:
    """thresholds.yaml: comments saying where the values came from, then a `saturation:` block to paste.

    The lead time is not measured; it is the config's (or the default), so the block is complete on its own,
    while `--write` only ever sets the measured keys."""
    lines = [*header, "lead_time is not measured: it is your config's, or the default."]
    block = {"saturation": {**fragment["saturation"], "lead_time": duration(lead_time_seconds)}}
    return "".join(f"{_comment(line)}\n" for line in lines) + yaml.safe_dump(block, sort_keys=False)


def _comment(line: str) -> str:
    """A comment line whatever the text holds. The header quotes the served model id, which the engine chooses: a
    line break in it would end the comment and start settings, so it is written as its escape."""
    return "# " + shown(line)


@dataclass(frozen=True)
class ReplicaKnee:
    """The operating point as the capacity of one replica (the config's knee_concurrency), for the autoscaling
    workload that serves the tested model."""

    concurrency: int
    # The model labels the tested server may go by, in the order they are tried: the config target's `model`, then
    # the model name the requests were sent with (what the engine's series carry as `model`).
    models: tuple[str, ...]


@dataclass(frozen=True)
class ConfigUpdate:
    backup: Path | None  # FILE.bak; None: nothing to set, so the file was not touched
    knee_workload: str | None  # e.g. "autoscaling.workloads[1] (vllm-tiny-llama)"; None: no workload took the knee


def write_thresholds(config_path: Path, fragment: Fragment | None, knee: ReplicaKnee | None = None) -> ConfigUpdate:
    """Set the fragment's keys, and the knee in the workload of the tested model, in the config file in place.

    The file is parsed round-trip (ruamel.yaml), updated, checked with the same validation as `check-config`, then
    written atomically with its own indentation and line lengths; the previous version is kept as FILE.bak.
    Comments inside a flow mapping such as `saturation: {kv_usage: 0.9}` are the one thing ruamel cannot keep;
    block mappings keep every comment. A config without a workload for the model gets no `autoscaling:` entry:
    which Kubernetes workload serves the model is the user's to say."""
    if knee is not None:
        _refuse_unlabelable(knee.models, config_path)
    path = config_path.resolve()  # a symlinked config is updated where it lives, not replaced by a plain file
    try:
        original = read_config_text(path)
    except ConfigError as error:
        raise ThresholdsError(str(error)) from None
    try:  # the safe loader first: ruamel bounds neither aliases nor depth, so it sees only what this one accepts
        load_yaml(original, str(config_path))
    except ConfigError as error:
        reason = error.problems[0].removeprefix(f"{config_path}: ")
        raise ThresholdsError(f"{config_path}: not YAML that can be edited in place ({reason})") from None
    yaml = YAML()
    yaml.preserve_quotes = True
    try:
        document = yaml.load(original)
        _, sequence_indent, sequence_offset = load_yaml_guess_indent(original)
    except YAMLError as error:
        raise ThresholdsError(f"{config_path}: not YAML that can be edited in place ({_first_line(error)})") from None
    except RecursionError:  # ruamel's round trip nests deeper per level than the safe loader
        raise ThresholdsError(f"{config_path}: not YAML that can be edited in place (nested too deeply)") from None
    if document is None:
        document = CommentedMap()
    if not isinstance(document, CommentedMap):
        raise ThresholdsError(
            f"{config_path}: the top level is not a mapping of settings; fix the file (plimsoll check-config "
            f"{config_path}) or copy thresholds.yaml's saturation block into it by hand"
        )
    workload = None if knee is None else _knee_workload(document, knee.models)
    if fragment is None and workload is None:
        return ConfigUpdate(backup=None, knee_workload=None)
    if fragment is not None:
        _merge(document, fragment, config_path)
    if knee is not None and workload is not None:
        _put(workload[1], "knee_concurrency", knee.concurrency)
    mapping_indent = _mapping_indent(document)
    yaml.indent(
        mapping=mapping_indent,
        sequence=sequence_indent or mapping_indent,
        offset=sequence_offset or 0,
    )
    yaml.width = 1 << 16  # never fold a long line (a URL, a commented value) the user wrote on one line
    stream = StringIO()
    try:
        yaml.dump(document, stream)
    except RecursionError:
        raise ThresholdsError(f"{config_path}: not YAML that can be edited in place (nested too deeply)") from None
    updated = _head_ruamel_drops(original) + stream.getvalue()
    if "\r\n" in original:  # ruamel writes "\n": a file edited on Windows keeps its line ends, so only set lines change
        updated = updated.replace("\r\n", "\n").replace("\n", "\r\n")
    _refuse_new_problems(original, updated, str(path), config_path)
    refuse_read_only(config_path)
    try:
        changed = read_config_text(path) != original
    except ConfigError as error:
        raise ThresholdsError(f"{error}; it is unchanged") from None
    if changed:
        raise ThresholdsError(f"{config_path}: changed while it was being updated, so not written: run again")
    backup = path.with_name(f"{path.name}.bak")
    try:
        mode = path.stat().st_mode & 0o7777
        # The backup too is whole or not at all: a disk that fills while it is written keeps the previous one. Its
        # rename replaces a symlink there rather than writing through it.
        write_atomically(backup, original, mode)
        write_atomically(path, updated, mode)
    except OSError as error:
        raise ThresholdsError(
            f"{config_path}: cannot write the updated config ({error.strerror}); it is unchanged"
        ) from None
    return ConfigUpdate(backup=backup, knee_workload=None if workload is None else workload[0])


def _refuse_unlabelable(models: Sequence[str], config_path: Path) -> None:
    """A model the config could not hold as a workload's `model` (the served model id is the engine's to choose)
    is refused before the file is read: it could match no workload, and must not reach the file or its messages."""
    for model in models:
        try:
            label_value("a model name")(model)
        except ValueError as error:
            raise ThresholdsError(f"{config_path}: not written: model {error}") from None


def refuse_read_only(config_path: Path) -> None:
    """A file its owner made read-only, or one this user may not write, is not replaced: the rename that writes it
    atomically would succeed in a writable directory regardless, and make this user its owner. Checked before the
    run as well, so a run that could not be written back is refused before it is measured."""
    path = config_path.resolve()
    try:
        writable = os.access(path, os.W_OK) and path.stat().st_mode & stat.S_IWUSR
    except OSError as error:
        raise ThresholdsError(f"{config_path}: cannot read its permissions ({error.strerror})") from None
    if not writable:
        raise ThresholdsError(
            f"{config_path}: read-only, so not written; make it writable (chmod u+w) or copy thresholds.yaml's "
            "values into it by hand"
        )


def _knee_workload(document: CommentedMap, models: Sequence[str]) -> tuple[str, CommentedMap] | None:
    """The workload entry whose `model` is the first of `models` that any workload has, and where it is."""
    autoscaling = document.get("autoscaling")
    workloads = autoscaling.get("workloads") if isinstance(autoscaling, CommentedMap) else None
    if not isinstance(workloads, CommentedSeq):
        return None
    for model in models:
        for index, entry in enumerate(workloads):
            if isinstance(entry, CommentedMap) and entry.get("model") == model:
                return f"autoscaling.workloads[{index}] ({entry.get('name')})", entry
    return None


def _head_ruamel_drops(original: str) -> str:
    """The start of the file that a round trip would lose: the comments above a `---` line and the line itself, or
    the whole of a file of comments alone (it loads as nothing)."""
    lines = original.splitlines(keepends=True)
    for index, line in enumerate(lines):
        content = line.strip()
        if content and not content.startswith("#"):
            return "".join(lines[: index + 1]) if content == "---" else ""
    return original.rstrip("\n") + "\n" if original.strip() else ""


def _mapping_indent(document: CommentedMap) -> int:
    """The file's indentation of a nested block mapping (2 where it has none), so the edit rewrites no other line."""
    for value in document.values():
        if isinstance(value, CommentedMap) and not value.fa.flow_style():
            # Its keys' column, not the mapping's: an anchored one (`base: &b`) starts after the anchor.
            columns = [position[1] for position in (value.lc.data or {}).values()]
            if columns and columns[0]:
                return int(columns[0])
    return 2


def _merge(document: CommentedMap, fragment: Fragment, config_path: Path) -> None:
    for section, values in fragment.items():
        existing = document.get(section)
        if existing is None:
            document[section] = CommentedMap(values)
        elif isinstance(existing, CommentedMap):
            for key, value in values.items():
                _put(existing, key, value)
        else:
            raise ThresholdsError(
                f"{config_path}: {section} is not a mapping (expected e.g. {section}: {{kv_usage: 0.9}}); "
                "fix it, then run again"
            )


def _put(mapping: CommentedMap, key: str, value: float | int) -> None:
    """Set a key; a new one goes last, above the comment lines that followed the mapping's old last key.

    ruamel keeps the full-line comments after a mapping's last value as part of that value's comment, so a key
    appended plainly would land under them: under a comment that introduces the next entry or section."""
    if key in mapping or not mapping:
        mapping[key] = value
        return
    last = list(mapping)[-1]
    mapping[key] = value
    slot = mapping.ca.items.get(last)
    if not slot or slot[2] is None:
        return
    end_of_line, newline, following = slot[2].value.partition("\n")
    if not following:
        return
    if end_of_line:
        slot[2].value = end_of_line + newline
    else:
        slot[2] = None
    mapping.ca.items[key] = [None, None, CommentToken("\n" + following, CommentMark(0), None), None]


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
