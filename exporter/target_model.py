"""The capacity model of one running target: the configured deployment, completed by what the engine reports.

An operator rarely writes every engine flag into Plimsoll's config. vLLM publishes its cache settings in
`vllm:cache_config_info`, so a value the config leaves out is taken from there (block size, utilization,
KV dtype, an explicit KV pool size); what neither says falls back to the engine's defaults.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from exporter.capacity.architecture import MAX_POSITIONS, ModelArchitecture, ModelConfigError
from exporter.capacity.deployment import Deployment
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.kv import KV_DTYPE_BYTES, KvDtypeError
from exporter.capacity.plan import MAX_GPU_MEMORY_BYTES, CapacityPlan, PlanError, plan
from exporter.capacity.quantization import QuantizationError
from exporter.capacity.weights import DtypeError
from exporter.catalog import CatalogError, find_gpu, load_model
from exporter.config import Target
from exporter.sources.engines.series import label_int, label_number


@dataclass(frozen=True)
class TargetCatalog:
    """What a target's `model` and `gpu_type` name, loaded once; `problems` are (field, message) pairs."""

    arch: ModelArchitecture | None = None
    gpu: GpuSpec | None = None
    problems: tuple[tuple[str, str], ...] = ()


def resolve(target: Target) -> TargetCatalog:
    """Load the target's model and GPU preset; a bad name is a problem to report, never an exception."""
    arch = gpu = None
    problems = []
    if target.model:
        try:
            arch = load_model(target.model, from_hub=False)
        except (CatalogError, ModelConfigError) as error:
            problems.append(("model", str(error)))
    if target.gpu_type:
        try:
            gpu = find_gpu(target.gpu_type)
        except CatalogError as error:
            # The daemon reads a GPU the list lacks, and its memory, from NVML: gpu_type is only for hosts without it.
            problems.append(("gpu_type", f"{error} Leave gpu_type out where NVML sees the GPU."))
    return TargetCatalog(arch, gpu, tuple(problems))


# What the plan refuses outright (as opposed to a deployment that plans but does not fit).
_UNPLANNABLE = (PlanError, DtypeError, KvDtypeError, QuantizationError)
# Stands in for the GPU when none is known: check-config (which has no NVML) judges only the plan's refusals with
# it, not whether the model fits, and the daemon plans a KV pool of a size given, which no GPU's memory changes.
_UNKNOWN_GPU = GpuSpec("unknown", 0)


def model_problems(target: Target) -> tuple[tuple[str, str], ...]:
    """Everything known about a target's model before it runs, as (field, message) pairs: a bad model or GPU
    name, what the plan refuses (a tensor-parallel size that does not divide the attention heads...), and, where
    gpu_type names the GPU, a model whose one longest request does not fit on it."""
    catalog = resolve(target)
    if catalog.arch is None:
        return catalog.problems
    try:
        result = plan(catalog.arch, catalog.gpu or _UNKNOWN_GPU, deployment_for(target.deployment, target.engine, {}))
    except _UNPLANNABLE as error:
        return (*catalog.problems, ("deployment", str(error)))
    if catalog.gpu is None or result.fits:
        return catalog.problems
    shortfall, *fixes = result.suggestions
    options = f" ({'; '.join(fixes)})" if fixes else ""
    return (*catalog.problems, ("gpu_type", f"{target.model} does not fit on {catalog.gpu.name}: {shortfall}{options}"))


_Number = TypeVar("_Number", int, float)


def _within(value: _Number | None, low: _Number, high: _Number) -> _Number | None:
    """A reported setting where it can be one. The labels are the engine's text: one out of range (a block size of
    0, which the plan divides by, or NaN) is taken as unreported, and the engine's default stands in."""
    return value if value is not None and low <= value <= high else None


def deployment_for(configured: Deployment, engine: str, engine_config: Mapping[str, str]) -> Deployment:
    """The configured deployment; what it leaves unset comes from the engine's own report where it has one."""
    reported_dtype = engine_config.get("cache_dtype", "auto")
    utilization = _within(label_number(engine_config, "gpu_memory_utilization"), 0.0, 1.0) or None  # 0: none
    block_size = _within(label_int(engine_config, "block_size"), 1, MAX_POSITIONS)
    pool_bytes = _within(label_int(engine_config, "kv_cache_memory_bytes"), 1, MAX_GPU_MEMORY_BYTES)
    return replace(
        configured,
        engine="sglang" if engine == "sglang" else "vllm",
        gpu_memory_utilization=configured.gpu_memory_utilization or utilization,
        kv_cache_dtype=configured.kv_cache_dtype
        if configured.kv_cache_dtype != "auto"
        else (reported_dtype if reported_dtype in KV_DTYPE_BYTES else "auto"),
        block_size=configured.block_size or block_size,
        kv_cache_memory_bytes=configured.kv_cache_memory_bytes or pool_bytes,
    )


def model_plan(
    arch: ModelArchitecture,
    configured: Deployment,
    engine: str,
    engine_config: Mapping[str, str],
    gpu: GpuSpec | None,
) -> CapacityPlan | None:
    """The model's prediction for this target, or None when it cannot be made (no GPU size and no KV size)."""
    deployment = deployment_for(configured, engine, engine_config)
    if gpu is None:
        if deployment.kv_cache_memory_bytes is None:
            return None
        gpu = _UNKNOWN_GPU
    try:
        return plan(arch, gpu, deployment)
    except _UNPLANNABLE:
        return None
