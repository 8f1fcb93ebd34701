"""Built-in model and GPU presets, and config.json files named by path: the I/O in front of `capacity`.

Presets are data files shipped in `exporter/data/`: one real config.json per model (with a `_preset` block
naming it and where it came from) and one YAML list of GPUs.
"""

import difflib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from exporter.capacity.architecture import ModelArchitecture, ModelConfigError, from_hf_config
from exporter.capacity.gpus import GpuSpec
from exporter.units import parse_size


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
        )
        for e in entries
    )


def _closest(wanted: str, names: list[str]) -> str:
    lowered = {n.lower(): n for n in names}
    close = difflib.get_close_matches(wanted.lower(), list(lowered), n=5, cutoff=0.4)
    return ", ".join(lowered[c] for c in close) if close else "none close"


def find_model_preset(name: str) -> ModelPreset:
    wanted = name.lower()
    for preset in model_presets():
        if any(wanted == n.lower() for n in preset.names()):
            return preset
    names = [n for p in model_presets() for n in (p.id, p.hf_id)]
    raise CatalogError(
        f"unknown model {name!r}: not a preset and not a file. Closest presets: {_closest(name, names)}. "
        "Pass a path to a Hugging Face config.json (or its directory) for any other model; "
        "`plimsoll plan --list-models` lists the presets."
    )


def load_model(spec: str) -> ModelArchitecture:
    """A preset name, a config.json path, or a directory holding config.json."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise CatalogError(f"{spec}: directory has no config.json")
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CatalogError(f"{path}: not a readable JSON file ({error})") from None
        if not isinstance(config, dict):
            raise CatalogError(f"{path}: expected a JSON object (a Hugging Face config.json)")
        return from_hf_config(config, source=str(path), name=str(config.get("_name_or_path") or path.parent.name))
    preset = find_model_preset(spec)
    return from_hf_config(preset.config, source=f"preset {preset.id}", name=preset.hf_id)


def find_gpu(name: str) -> GpuSpec:
    for gpu in gpu_presets():
        if gpu.matches(name):
            return gpu
    names = [n for g in gpu_presets() for n in (g.name, *g.aliases)]
    raise CatalogError(
        f"unknown GPU {name!r}. Closest presets: {_closest(name, names)}. "
        "Give the memory instead with --gpu-memory (e.g. 79.1GiB, as torch.cuda.mem_get_info reports it)."
    )


__all__ = ["CatalogError", "ModelConfigError", "find_gpu", "find_model_preset", "gpu_presets", "load_model"]
