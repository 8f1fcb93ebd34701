"""Built-in model and GPU presets, and config.json files named by path: the I/O in front of `capacity`.

Presets are data files shipped in `exporter/data/`: one real config.json per model (with a `_preset` block
naming it and where it came from) and one YAML list of GPUs.
"""

import difflib
import json
import logging
import os
import queue
import re
import shlex
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from exporter.capacity.architecture import ModelArchitecture, ModelConfigError, from_hf_config
from exporter.capacity.gpus import GpuSpec
from exporter.core.units import format_gib, parse_size
from exporter.display import shown
from exporter.files import read_regular_file


class CatalogError(LookupError):
    """An unknown preset or an unreadable file; the message says what to do."""


@dataclass(frozen=True)
class ModelPreset:
    id: str
    hf_id: str
    aliases: tuple[str, ...]
    source: str
    params_published: int | None
    config: dict[str, Any]

    def names(self) -> tuple[str, ...]:
        return (self.id, self.hf_id, *self.aliases)


def _data() -> Any:
    return resources.files("exporter") / "data"


@cache
def model_presets() -> tuple[ModelPreset, ...]:
    presets = []
    for entry in sorted(_data().joinpath("models").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        config = json.loads(entry.read_text())
        meta = config.pop("_preset")
        presets.append(
            ModelPreset(
                id=meta["id"],
                hf_id=meta.get("hf_id", meta["id"]),
                aliases=tuple(meta.get("aliases", ())),
                source=meta.get("source", ""),
                params_published=meta.get("params_published"),
                config=config,
            )
        )
    return tuple(presets)


@cache
def gpu_presets() -> tuple[GpuSpec, ...]:
    entries = yaml.safe_load(_data().joinpath("gpus.yaml").read_text())
    return tuple(
        GpuSpec(
            name=e["name"],
            memory_bytes=parse_size(e["memory"]),
            aliases=tuple(str(alias) for alias in e.get("aliases", ())),
            evidence=e.get("evidence", ""),
            compute_capability=_compute_capability(e.get("compute_capability")),
        )
        for e in entries
    )


def _compute_capability(value: object) -> tuple[int, int] | None:
    if value is None:
        return None
    major, minor = str(value).split(".")
    return int(major), int(minor)


def _closest(wanted: str, names: list[str]) -> str:
    lowered = {n.lower(): n for n in names}
    close = difflib.get_close_matches(wanted.lower(), list(lowered), n=5, cutoff=0.4)
    return ", ".join(lowered[c] for c in close) if close else "none close"


def _quoted(name: str) -> str:
    """A name as typed, quoted in a message: escaped, and cut short (whoever typed it chose its length)."""
    return shown(repr(name) if len(name) <= 80 else f"{name[:80]!r}...")


def find_model_preset(name: str) -> ModelPreset:
    wanted = name.lower()
    for preset in model_presets():
        if any(wanted == n.lower() for n in preset.names()):
            return preset
    names = [n for p in model_presets() for n in (p.id, p.hf_id)]
    raise CatalogError(
        f"unknown model {_quoted(name)}: not a preset and not a file. Closest presets: {_closest(name, names)}. "
        "Pass a path to a Hugging Face config.json (or its directory), or a Hugging Face repository id "
        "(org/name, or org/name@revision) to read its config.json from the Hub, for any other model; "
        "`plimsoll plan --list-models` lists the presets."
    )


def hub_cache(environ: Mapping[str, str]) -> Path:
    """Where the Hugging Face hub keeps downloads, as huggingface_hub finds it."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


# A config.json is kilobytes (the largest presets under 10 KiB); past this the file is not one, and is not read.
MAX_MODEL_CONFIG_BYTES = 4 * 1024 * 1024
# refs/main holds a commit hash (40 hex digits); a few more bytes leave room for a newline and tell garbage.
_MAX_REF_BYTES = 256
_SNAPSHOT_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")  # one folder name: no "..", no separator


def _named(path: Path) -> str:
    """A path as messages name it: typed by whoever ran the command, so escaped like any text from outside."""
    return shown(str(path))


def _read_bounded(path: Path, limit: int, what: str) -> str:
    try:
        data = read_regular_file(path, limit)
    except OSError as error:
        raise CatalogError(f"{_named(path)}: cannot read the {what} ({error.strerror})") from None
    if len(data) > limit:
        raise CatalogError(f"{_named(path)}: over {limit:,} bytes, too large for a {what} (is this the right file?)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CatalogError(f"{_named(path)}: not UTF-8 text (byte {error.start}), so not a {what}") from None


def _snapshot_named_by(main: Path) -> str:
    """The snapshot folder `refs/main` names: one name inside snapshots/, never a path out of the cache."""
    ref = _read_bounded(main, _MAX_REF_BYTES, "Hugging Face ref").strip()
    if not _SNAPSHOT_NAME.fullmatch(ref):
        raise CatalogError(
            f"{_named(main)}: {ref[:80]!r} is not a snapshot name (a commit hash): delete the file, or download the "
            "model again, to repair the cache"
        )
    return ref


def cached_config(repo_id: str, cache: Path) -> Path | None:
    """`models--org--name/snapshots/*/config.json`, the snapshot `refs/main` names first; None when not cached."""
    if repo_id.count("/") != 1:
        return None
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    main = folder / "refs" / "main"
    try:
        candidates = [folder / "snapshots" / _snapshot_named_by(main) / "config.json"] if main.is_file() else []
        candidates += sorted((folder / "snapshots").glob("*/config.json"))
        return next((c for c in candidates if c.is_file()), None)
    except OSError:  # a repository id too long to be a folder name: not cached
        return None


# huggingface_hub's validate_repo_id allows a name of 96 characters; with an owner as long, a longer declared name
# is no repository id, and would fill every line that shows it.
_LONGEST_REPOSITORY_ID = 96 + 1 + 96


def _shown_name(config: dict[str, Any], path: Path) -> str:
    """The model as people name it: a repository id, never a cache folder or a snapshot hash."""
    for parent in path.parents:
        if parent.name.startswith("models--") and parent.name.count("--") >= 2:
            return parent.name.removeprefix("models--").replace("--", "/", 1)
    preset = config.get("_preset")
    declared = str(config.get("_name_or_path") or (preset.get("hf_id") if isinstance(preset, dict) else "") or "")
    if declared and len(declared) <= _LONGEST_REPOSITORY_ID and not declared.startswith(("/", ".", "~")):
        return declared
    # A config.json is named by its folder (a checkpoint's); a file named otherwise, by itself.
    return path.parent.name if path.name == "config.json" else path.stem


def _read_config(path: Path) -> dict[str, Any]:
    text = _read_bounded(path, MAX_MODEL_CONFIG_BYTES, "config.json")
    try:
        config = json.loads(text)
    except ValueError as error:  # not JSON, or an integer of more digits than Python converts
        raise CatalogError(f"{_named(path)}: not a readable JSON file ({error})") from None
    except RecursionError:
        raise CatalogError(f"{_named(path)}: not a usable JSON file (nested too deeply)") from None
    if not isinstance(config, dict):
        raise CatalogError(f"{_named(path)}: expected a JSON object (a Hugging Face config.json)")
    return config


def _refuse_unreadable(path: Path) -> None:
    """A path that is there but is no file to read: reading a FIFO would wait, a device never end, a loop fail."""
    if os.path.lexists(path) and not path.is_file():
        raise CatalogError(
            f"{_named(path)}: not a regular file (a directory, a FIFO, a device, or a symlink that leads nowhere): "
            "pass the config.json itself"
        )


def _expanded(spec: str) -> Path:
    """`spec` as a path, `~` expanded as a shell would; `~user` of no such user stays as written."""
    try:
        return Path(spec).expanduser()
    except RuntimeError:
        return Path(spec)


def _config_file(spec: str) -> Path | None:
    """The config.json `spec` names, as the file or its directory; None when it names no file."""
    try:
        path = _expanded(spec)
        if path.is_dir():
            path = path / "config.json"
            if not os.path.lexists(path):
                raise CatalogError(f"{shown(spec)}: directory has no config.json")
            _refuse_unreadable(path)
        return path if path.is_file() else None
    except OSError:  # a name too long for a path: not a file
        return None


# `org/name` or `org/name@revision` (a branch, tag or commit; `refs/pr/1` has slashes), each name as the Hub allows
# it (huggingface_hub's validate_repo_id: word characters, `.` and `-`, 96 at most, no `--` or `..`). Anything else,
# a preset's name mistyped or a config.json path that is not there, never reaches the network.
_HUB_NAME = r"\w(?:[\w.-]{0,94}\w)?"
_HUB_SPEC = re.compile(rf"(?P<repo>{_HUB_NAME}/{_HUB_NAME})(?:@(?P<revision>.*))?", re.DOTALL)
# A branch, tag or commit as git allows one, more strictly: slash-separated names, none starting with "." (so no
# ".." and no "/" at either end). huggingface_hub joins the revision to the cache folder as a path (refs/<revision>),
# so "../.." would write, or read, outside it.
_REVISION = re.compile(r"[\w+-][\w.+-]*(?:/[\w+-][\w.+-]*)*")
_LONGEST_REVISION = 256
# As huggingface_hub reads HF_HUB_OFFLINE, but when the command runs: the library reads it once, at import.
_TRUE_WORDS = frozenset({"1", "ON", "YES", "TRUE"})


def _offline(environ: Mapping[str, str]) -> bool:
    return any(environ.get(name, "").upper() in _TRUE_WORDS for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_spec(spec: str) -> tuple[str, str | None] | None:
    """The repository id and revision `spec` names, or None when it names no repository (a path, a preset typo);
    a CatalogError where it names one at a revision no branch, tag or commit could have."""
    match = _HUB_SPEC.fullmatch(spec)
    if match is None or match["repo"].endswith(".json") or "--" in match["repo"] or ".." in match["repo"]:
        return None
    revision = match["revision"]
    if revision is not None and not (
        len(revision) <= _LONGEST_REVISION and _REVISION.fullmatch(revision) and ".." not in revision
    ):
        raise CatalogError(
            f"model {_quoted(spec)}: {_quoted(revision)} is not a branch, tag or commit name (letters, digits, "
            "'.', '_', '-', '+' and '/' between names): check what follows the @"
        )
    return match["repo"], revision


@dataclass(frozen=True)
class _HubRequest:
    """One config.json asked of the Hub, with the settings read when the command runs."""

    repo_id: str
    revision: str | None
    cache: Path
    endpoint: str
    offline: str | None  # why the cache alone is read; None when the Hub may be asked
    deadline_s: float  # how long the command waits for the library's answer

    def named(self) -> str:
        return _quoted(self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}")

    def folder(self) -> Path:
        """Where huggingface_hub keeps this repository's files in the cache."""
        return self.cache / ("models--" + self.repo_id.replace("/", "--"))

    def download_command(self) -> str:
        revision = "" if self.revision is None else f" --revision {shlex.quote(self.revision)}"  # pasted into a shell
        return shown(f"hf download {self.repo_id} config.json{revision}")


# Why a config file's model is never fetched: the daemon resolves it inside its poll loop, which must not wait on
# the Hub (up to half a minute when it is unreachable).
_CACHE_ONLY = "a config file's model is read from the cache only"


def _hub_request(repo_id: str, revision: str | None, environ: Mapping[str, str], from_hub: bool) -> _HubRequest:
    endpoint = environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"
    offline = "HF_HUB_OFFLINE is set" if _offline(environ) else None if from_hub else _CACHE_ONLY
    deadline = _DEADLINE_TIMES * (
        _seconds(environ, "HF_HUB_ETAG_TIMEOUT") + _seconds(environ, "HF_HUB_DOWNLOAD_TIMEOUT")
    )
    return _HubRequest(repo_id, revision, hub_cache(environ), endpoint, offline, deadline)


# huggingface_hub waits HF_HUB_ETAG_TIMEOUT for the Hub's answer and HF_HUB_DOWNLOAD_TIMEOUT for the file (10 s
# each by default), and retries with backoff (about 24 s when nothing answers); three times its two waits is past
# all that, so the command stops there (a minute by default).
_DEADLINE_TIMES = 3
_HUB_DEFAULT_TIMEOUT_S = 10


def _seconds(environ: Mapping[str, str], name: str) -> int:
    """One of the library's timeouts, read as it reads it: a whole number of seconds, else its default."""
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else _HUB_DEFAULT_TIMEOUT_S


def _hub_config(request: _HubRequest) -> Path:
    """The repository's config.json, from the Hugging Face cache or else downloaded into it: that one file, never
    weights. huggingface_hub honours HF_TOKEN, HF_ENDPOINT and the cache, as every tool that reads the Hub does.

    The library waits on a server that accepts and never answers, or asks it to wait (Retry-After), for many
    minutes, retries included; so it runs in a thread the command stops waiting for at `request.deadline_s`."""
    outcome: queue.Queue[Path | Exception] = queue.Queue(maxsize=1)

    def fetch() -> None:
        # Broad on purpose: besides its own errors the library lets its HTTP client's raise when a transfer breaks,
        # and each is answered by _hub_refusal, never by a traceback from this thread.
        try:
            outcome.put(_download(request))
        except Exception as error:
            outcome.put(error)

    threading.Thread(target=fetch, name="hub config.json", daemon=True).start()  # daemon: a hung one ends with us
    try:
        result = outcome.get(timeout=request.deadline_s)
    except queue.Empty:
        raise CatalogError(
            f"model {request.named()}: the Hub ({shown(request.endpoint)}) gave no config.json within "
            f"{request.deadline_s:g} s: try again later, or pass the model's config.json by path"
        ) from None
    if isinstance(result, CatalogError):
        raise result
    if isinstance(result, Exception):
        raise _hub_refusal(request, result) from None
    return result


def _download(request: _HubRequest) -> Path:
    """hf_hub_download, the file's size asked first where it would go to the Hub: a file too large to be a
    config.json is refused before a byte of it is written to the cache."""
    # Imported here: it is heavy, and only a model from the Hub needs it (presets and paths never do).
    from huggingface_hub import hf_hub_download

    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its retry warnings would print above the refusal
    offline = request.offline is not None
    size = None if offline else _announced_size(request)
    if size is not None and size > MAX_MODEL_CONFIG_BYTES:
        raise CatalogError(
            f"model {request.named()}: its config.json on the Hub ({shown(request.endpoint)}) is {size:,} bytes, "
            "too large for a config.json (is this the right repository?)"
        )
    path = hf_hub_download(
        request.repo_id,
        "config.json",
        revision=request.revision,
        cache_dir=request.cache,
        endpoint=request.endpoint,
        local_files_only=offline,
    )
    return Path(path)


def _announced_size(request: _HubRequest) -> int | None:
    """The size the Hub gives for the file (Content-Length, or X-Linked-Size for a file in LFS); None where it
    gives none, or the asking failed."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(request.repo_id, "config.json", revision=request.revision, endpoint=request.endpoint)
    try:
        size: int | None = get_hf_file_metadata(url).size
    # Broad on purpose: whatever failed here fails the download asked next the same way, and that error is the one
    # _hub_refusal knows how to explain (a Hub out of reach, a gated or missing repository).
    except Exception:
        return None
    return size


def _hub_refusal(request: _HubRequest, error: Exception) -> CatalogError:
    """What to do about a config.json the Hub did not give: the library's own text may quote the server."""
    from huggingface_hub import errors

    named, endpoint = request.named(), shown(request.endpoint)
    if isinstance(error, errors.LocalEntryNotFoundError) and isinstance(error.__cause__, errors.HfHubHTTPError):
        error = error.__cause__  # the Hub answered (403, 5xx) and the cache was no help: its answer is the news
    if isinstance(error, errors.LocalEntryNotFoundError):
        reason = request.offline or f"the Hub ({endpoint}) cannot be reached"
        return CatalogError(
            f"model {named} is not a preset and not in the Hugging Face cache, and {reason}: fill "
            f"{_named(request.folder())} by running `{request.download_command()}` on a machine with network "
            "(HF_HUB_CACHE naming the same cache), or pass the model's config.json by path"
        )
    if isinstance(error, errors.GatedRepoError):
        return CatalogError(
            f"model {named} is gated on the Hub: accept its licence on its page ({endpoint}/{shown(request.repo_id)}) "
            "and set HF_TOKEN to a token of that account"
        )
    if isinstance(error, errors.RepositoryNotFoundError):
        return CatalogError(
            f"model {named} is not a preset and not a repository on the Hub ({endpoint}), or it is private: check "
            "the name (`plimsoll plan --list-models` lists the presets), or set HF_TOKEN to a token that can read it"
        )
    if isinstance(error, errors.RevisionNotFoundError):
        return CatalogError(f"model {named}: the repository has no such revision on the Hub ({endpoint})")
    if isinstance(error, errors.EntryNotFoundError):
        return CatalogError(
            f"model {named} has no config.json on the Hub (a GGUF-only repository?): name the repository the "
            "weights came from, or pass a config.json by path"
        )
    if isinstance(error, errors.HfHubHTTPError):
        status = error.response.status_code
        fix = "set HF_TOKEN, or accept the model's licence on the Hub" if status in (401, 403) else "try again later"
        return CatalogError(f"model {named}: the Hub ({endpoint}) answered HTTP {status}: {fix}")
    if isinstance(error, OSError) and error.filename is not None:
        return CatalogError(f"model {named}: cannot write the Hugging Face cache {_named(request.cache)} ({error})")
    return CatalogError(
        f"model {named}: fetching its config.json from the Hub ({endpoint}) failed ({type(error).__name__}): "
        "try again, or pass a config.json by path"
    )


def _from_cache(path: Path, name: str) -> ModelArchitecture:
    """A config.json in the Hugging Face cache (`models--org--name/snapshots/<commit>/config.json`). One that cannot
    be read came in broken (a download cut short, a server that answered garbage) and every later run would read it
    again, so the message names the folder to delete."""
    try:
        config = _read_config(path)
    except CatalogError as error:
        raise CatalogError(f"{error}; delete {_named(path.parents[2])} to fetch it again") from None
    return from_hf_config(config, source=_named(path), name=name)


def load_model(spec: str, *, from_hub: bool = True) -> ModelArchitecture:
    """A config.json path or its directory, a preset name, or a repository id (`org/name[@revision]`): read from
    the local Hugging Face cache (HF_HUB_CACHE, HF_HOME), else (`from_hub`) its config.json alone downloaded from
    the Hub."""
    path = _config_file(spec)
    if path is not None:
        config = _read_config(path)
        return from_hf_config(config, source=_named(path), name=_shown_name(config, path))
    try:
        preset = find_model_preset(spec)
    except CatalogError:
        cached = cached_config(spec, hub_cache(os.environ))
        if cached is not None:
            return _from_cache(cached, spec)
        repository = _hub_spec(spec)
        if repository is None:
            _refuse_unreadable(_expanded(spec))
            raise
        return _from_cache(_hub_config(_hub_request(*repository, os.environ, from_hub)), spec)
    return from_hf_config(preset.config, source=f"preset {preset.id}", name=preset.hf_id)


def find_gpu(name: str) -> GpuSpec:
    for gpu in gpu_presets():
        if gpu.matches(name):
            return gpu
    variants = [gpu for gpu in gpu_presets() if gpu.is_variant_of(name)]
    if len(variants) > 1:
        listed = " or ".join(f"{gpu.name} ({format_gib(gpu.memory_bytes)})" for gpu in variants)
        raise CatalogError(f"GPU {_quoted(name)} is ambiguous: {listed}. Name one with --gpu.")
    names = [n for g in gpu_presets() for n in (g.name, *g.aliases)]
    raise CatalogError(
        f"unknown GPU {_quoted(name)}. Closest presets: {_closest(name, names)} "
        "(`plimsoll plan --list-gpus` lists them all)."
    )


__all__ = ["CatalogError", "ModelConfigError", "find_gpu", "find_model_preset", "gpu_presets", "load_model"]
