"""The `targets` section: each target's URL, engine, model, GPUs, deployment and credentials."""

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from exporter.capacity.architecture import MAX_POSITIONS
from exporter.capacity.deployment import Deployment
from exporter.capacity.kv import KV_DTYPE_BYTES
from exporter.capacity.plan import MAX_GPU_MEMORY_BYTES, MAX_GPU_TIB, MAX_PARALLEL, MAX_SEQUENCES
from exporter.config.model import ENGINE_NAMES, BasicAuth, Target
from exporter.config.reader import Reader
from exporter.config.validators import (
    label_value,
    one_of,
    positive_int_at_most,
    readable_file,
    shown,
    text_value,
    validate_boolean,
    validate_duration,
    validate_ratio,
    validate_url,
)
from exporter.core.units import parse_size, value_kind

_DEPLOYMENT_FIELDS = (
    "tensor_parallel",
    "pipeline_parallel",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "kv_cache_dtype",
    "dtype",
    "block_size",
    "kv_cache_memory",
    "enforce_eager",
)


def _deployment(r: Reader, raw: Any, path: str) -> Deployment:
    data = r.mapping(raw, path)
    r.unknown(data, path, _DEPLOYMENT_FIELDS)
    p = f"{path}."
    parallel, tokens = positive_int_at_most(MAX_PARALLEL), positive_int_at_most(MAX_POSITIONS)
    return Deployment(
        tensor_parallel=r.convert(data, "tensor_parallel", p, parallel, 1),
        pipeline_parallel=r.convert(data, "pipeline_parallel", p, parallel, 1),
        gpu_memory_utilization=r.convert(data, "gpu_memory_utilization", p, validate_ratio, None),
        max_model_len=r.convert(data, "max_model_len", p, tokens, None),
        max_num_batched_tokens=r.convert(data, "max_num_batched_tokens", p, tokens, None),
        max_num_seqs=r.convert(data, "max_num_seqs", p, positive_int_at_most(MAX_SEQUENCES), None),
        kv_cache_dtype=r.convert(data, "kv_cache_dtype", p, one_of(("auto", *KV_DTYPE_BYTES)), "auto"),
        dtype=r.convert(data, "dtype", p, text_value("a dtype such as bfloat16"), "auto"),
        block_size=r.convert(data, "block_size", p, tokens, None),
        kv_cache_memory_bytes=r.convert(data, "kv_cache_memory", p, _kv_cache_memory, None),
        enforce_eager=r.convert(data, "enforce_eager", p, validate_boolean, False),
    )


def _kv_cache_memory(value: Any) -> int:
    size = parse_size(value)
    if size == 0:  # unset is the key left out: a 0 is a typo, which the planner would read as unset
        raise ValueError(f"{shown(value)} is no KV cache; give its size (such as 20GiB) or leave the key out")
    if size > MAX_GPU_MEMORY_BYTES:
        raise ValueError(f"{shown(value)} is out of range: Plimsoll accepts up to {MAX_GPU_TIB} TiB, one GPU's memory")
    return size


def _gpus(value: Any) -> tuple[str, ...] | None:
    if value == "auto":
        return None
    if isinstance(value, int | str) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, list) and all(isinstance(v, int | str) and not isinstance(v, bool) for v in value):
        return tuple(str(v) for v in value)
    raise ValueError(f"{shown(value)} is not 'auto', a GPU index or UUID, or a list of them")


def _gpu_type(value: Any) -> str:
    text = text_value("a GPU preset such as H100")(value)
    if not text.strip():  # unset is the key left out: an empty name is a typo, which the daemon would read as unset
        raise ValueError(f"{shown(text)} names no GPU; give a preset such as H100 or leave the key out")
    return text


def _username(value: Any) -> str:
    """A basic-auth user name: the server splits user and password at the first ":", so a name cannot hold one."""
    text = text_value("a user name")(value)
    if ":" in text or not text.isprintable():
        raise ValueError(f"{shown(text)} is not a user name (one line of text, without ':')")
    return text


def _basic_auth(r: Reader, raw: Any, path: str, base: Path) -> BasicAuth | None:
    if raw is None:
        return None
    data = r.mapping(raw, path)
    if "password" in data:
        r.fail(
            f"{path}.password",
            "a password in the config shows wherever the config does: put it in a file and "
            "name the file in password_file",
        )
    r.unknown({k: v for k, v in data.items() if k != "password"}, path, ("username", "password_file"))
    p = f"{path}."
    username = r.convert(data, "username", p, _username, None)
    password_file = r.convert(data, "password_file", p, readable_file(base, "the password file"), None)
    for key in ("username", "password_file"):
        if data.get(key) is None:
            r.fail(f"{p}{key}", "missing (basic_auth needs username and password_file)")
    if username is None or password_file is None:
        return None
    return BasicAuth(username, password_file)


_TARGET_FIELDS = (
    "name",
    "url",
    "engine",
    "model",
    "gpus",
    "gpu_type",
    "deployment",
    "timeout",
    "poll_interval",
    "basic_auth",
    "bearer_token_file",
)


def _target(r: Reader, raw: Any, path: str, base: Path) -> Target:
    """Every field of one target entry is checked, whatever else is wrong with it."""
    data = r.mapping(raw, path)
    r.unknown(data, path, _TARGET_FIELDS)
    p = f"{path}."
    if data.get("url") is None:
        r.fail(f"{p}url", "missing (every target needs the URL of its /metrics page)")
    target_url = r.convert(data, "url", p, validate_url, "")
    deployment = _deployment(r, data.get("deployment"), f"{p}deployment")
    gpus = r.convert(data, "gpus", p, _gpus, None)
    needed = deployment.tensor_parallel * deployment.pipeline_parallel
    if gpus is not None and len(gpus) != needed:
        listed = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
        r.fail(
            f"{p}gpus",
            f"lists {listed} but tensor_parallel {deployment.tensor_parallel} x pipeline_parallel "
            f"{deployment.pipeline_parallel} needs {needed}",
        )
    basic_auth = _basic_auth(r, data.get("basic_auth"), f"{p}basic_auth", base)
    bearer_token_file = r.convert(data, "bearer_token_file", p, readable_file(base, "the token file"), None)
    if data.get("basic_auth") is not None and data.get("bearer_token_file") is not None:
        r.fail(f"{p}bearer_token_file", "give basic_auth or bearer_token_file, not both (one Authorization header)")
    return Target(
        name=r.convert(data, "name", p, label_value("a target name"), None) or urlsplit(target_url).netloc or path,
        url=target_url,
        engine=r.convert(data, "engine", p, one_of(ENGINE_NAMES), "auto"),
        model=r.convert(data, "model", p, label_value("a model preset or the path of a config.json"), None),
        gpus=gpus,
        gpu_type=r.convert(data, "gpu_type", p, _gpu_type, None),
        deployment=deployment,
        timeout_seconds=r.convert(data, "timeout", p, validate_duration, None),
        poll_interval_seconds=r.convert(data, "poll_interval", p, validate_duration, None),
        basic_auth=basic_auth,
        bearer_token_file=bearer_token_file,
    )


def parse_targets(r: Reader, raw: Any, base: Path) -> tuple[Target, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.fail("targets", f"expected a list of targets, got {value_kind(raw)}")
        return ()
    targets = tuple(_target(r, entry, f"targets[{i}]", base) for i, entry in enumerate(raw))
    seen: set[str] = set()
    for i, target in enumerate(targets):
        if target.name in seen:
            r.fail(
                f"targets[{i}].name",
                f"{shown(target.name)} is used by another target (names label every series: keep them unique)",
            )
        seen.add(target.name)
    return targets
