"""Scores the capacity model against real vLLM startup logs (bench/data/vllm_startup_logs.yaml).

Three comparisons per log, each printed only where the log carries the number:
- weights: the model's weights per GPU vs "Model loading took X GiB";
- KV math: tokens the model fits in the KV memory vLLM reported as available vs the tokens vLLM allocated
  (block arithmetic and bytes per token alone, no profiling estimates);
- end to end: tokens predicted from GPU size and flags alone vs the tokens vLLM allocated (adds the weights,
  activation, non-torch and CUDA-graph estimates), and the activation estimate vs the logged peak.
A baseline is printed beside it: the back-of-envelope most calculators use (KV = utilization x memory - weights,
with weights = parameters x bytes, nothing else subtracted).

    .venv/bin/python bench/model_accuracy.py            # table and summary
    .venv/bin/python bench/model_accuracy.py --markdown # the summary as a README table
"""

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import CapacityPlan, Deployment, plan
from exporter.capacity.quantization import Quantization, from_config, from_flag
from exporter.catalog import CatalogError, find_gpu, load_model
from exporter.units import GIB

DATA = Path(__file__).parent / "data" / "vllm_startup_logs.yaml"

# Logs of checkpoints without a preset of their own, priced as a preset with the same architecture.
SAME_ARCHITECTURE: dict[str, tuple[str, str | dict[str, Any] | None]] = {
    "Qwen/Qwen2-7B-Instruct": ("qwen2.5-7b", None),
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic": ("llama-3.3-70b", "fp8"),
    "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic": ("llama-3.3-70b", "fp8"),
    "RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic": ("qwen2.5-7b", "fp8"),
    "RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8": ("qwen2.5-7b", "int8"),
    # The Kaitchup's Llama 3.1 8B quantizations; the settings are those of the quantization code printed
    # beside the logs (optimum GPTQQuantizer(bits=4): group 128, sym, no act-order; AutoRound bits=4,
    # group_size=128, sym True/False; AutoAWQ zero_point True, q_group_size 128).
    "kaitchup/Meta-Llama-3.1-8B-Instruct-gptq-4bit": (
        "llama-3.1-8b",
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False},
    ),
    "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-sym": (
        "llama-3.1-8b",
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True},
    ),
    "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym": (
        "llama-3.1-8b",
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False},
    ),
    "kaitchup/Meta-Llama-3.1-8B-Instruct-awq-4bit": (
        "llama-3.1-8b",
        {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
    ),
    # unsloth's pre-quantized nf4 checkpoints use double quantization (config not read here: see the log's notes)
    "unsloth/Llama-3.2-1B-Instruct-bnb-4bit": (
        "llama-3.2-1b",
        {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True},
    ),
}
INT8 = Quantization("int", 8, 1.0)


@dataclass(frozen=True)
class Score:
    id: str
    model: str
    weights: tuple[float, float] | None  # (predicted, observed) GiB
    kv_math: tuple[float, float] | None  # tokens
    end_to_end: tuple[float, float] | None
    baseline: tuple[float, float] | None
    activation: tuple[float, float] | None
    skipped: str | None = None


def _model(name: str, online: str | None) -> tuple[ModelArchitecture, Quantization | None]:
    preset, quant = SAME_ARCHITECTURE.get(name, (name, online if online in ("fp8", "bitsandbytes") else None))
    if isinstance(quant, dict):
        quantization: Quantization | None = from_config(quant)
    else:
        quantization = INT8 if quant == "int8" else from_flag(quant) if quant else None
    arch = load_model(preset)
    if quantization is not None and quantization.method == "bitsandbytes" and arch.quantization is not None:
        quantization = None  # a pre-quantized checkpoint: its own config decides
    return arch, quantization


def _version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return (0, 6)  # the logs here that state no version are V0-era issue threads (late 2024 to early 2025)
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def _observed_tokens(entry: dict[str, Any], block_size: int) -> float | None:
    observed = entry["observed"]
    if observed.get("kv_cache_tokens"):
        return float(observed["kv_cache_tokens"])
    if observed.get("num_gpu_blocks"):
        return float(observed["num_gpu_blocks"] * block_size)
    return None


def _gpu(entry: dict[str, Any]) -> GpuSpec | None:
    total = entry["observed"].get("total_gpu_memory_gib")
    if total:
        return GpuSpec(entry["gpu"], round(total * GIB))
    try:
        return find_gpu(entry["gpu"])
    except CatalogError:
        return None


def score(entry: dict[str, Any]) -> Score:
    name = entry["model"]
    try:
        arch, quantization = _model(name, entry.get("quantization"))
    except CatalogError:
        return Score(entry["id"], name, None, None, None, None, None, skipped="no preset for this architecture")
    observed = entry["observed"]
    deployment = Deployment(
        tensor_parallel=entry["tensor_parallel"],
        pipeline_parallel=entry.get("pipeline_parallel") or 1,
        gpu_memory_utilization=entry.get("gpu_memory_utilization"),
        max_model_len=entry.get("max_model_len"),
        max_num_batched_tokens=entry.get("max_num_batched_tokens"),
        max_num_seqs=entry.get("max_num_seqs"),
        dtype="float32" if str(entry.get("dtype")) == "float32" else "auto",
        kv_cache_dtype="fp8" if str(entry.get("kv_cache_dtype", "auto")).startswith("fp8") else "auto",
        block_size=entry.get("block_size"),
        enforce_eager=bool(entry.get("enforce_eager")),
        quantization=quantization,
        vllm_version=_version(entry.get("vllm_version")),
    )
    gpu = _gpu(entry)
    reference = plan(arch, gpu or GpuSpec("unknown", 80 * GIB), deployment)
    block = reference.deployment.block_size or 16
    tokens = _observed_tokens(entry, block)
    weights = (reference.weights.per_gpu_bytes / GIB, observed["weights_gib"]) if observed.get("weights_gib") else None
    kv_math = None
    # vLLM prints the KV memory to 0.01 GiB: below 1 GiB that rounding alone exceeds 0.5% of the pool.
    if tokens and observed.get("available_kv_gib") and observed["available_kv_gib"] >= 1:
        given = Deployment(
            **{**deployment.__dict__, "kv_cache_memory_bytes": round(observed["available_kv_gib"] * GIB)}
        )
        kv_math = (plan(arch, gpu or GpuSpec("unknown", 80 * GIB), given).pool.tokens, tokens)
    end_to_end = baseline = None
    if tokens and gpu is not None:
        end_to_end = (reference.pool.tokens, tokens)
        baseline = (_baseline_tokens(reference), tokens)
    activation = None
    if observed.get("activation_peak_gib"):
        activation = (reference.activation_bytes / GIB, observed["activation_peak_gib"])
    return Score(entry["id"], name, weights, kv_math, end_to_end, baseline, activation)


def _baseline_tokens(reference: CapacityPlan) -> float:
    d = reference.deployment
    assert d.gpu_memory_utilization is not None
    budget = reference.gpu_memory_bytes * d.gpu_memory_utilization - reference.weights.total_parameters * 2 / (
        d.tensor_parallel * d.pipeline_parallel
    )
    return max(0.0, budget / reference.layout.bytes_per_token)


def _error(pair: tuple[float, float] | None) -> float | None:
    if pair is None or not pair[1]:
        return None
    return (pair[0] - pair[1]) / pair[1]


def _cell(pair: tuple[float, float] | None) -> str:
    error = _error(pair)
    return "" if error is None else f"{error:+7.1%}"


def summary(scores: list[Score]) -> list[tuple[str, int, float, float, float]]:
    rows = []
    for label, attribute in (
        ("weights per GPU", "weights"),
        ("KV tokens from logged KV memory", "kv_math"),
        ("KV tokens end to end (model)", "end_to_end"),
        ("KV tokens end to end (baseline)", "baseline"),
        ("activation peak", "activation"),
    ):
        errors = [abs(e) for s in scores if (e := _error(getattr(s, attribute))) is not None]
        if errors:
            within = sum(e <= 0.05 for e in errors) / len(errors)
            rows.append((label, len(errors), statistics.median(errors), max(errors), within))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    entries = yaml.safe_load(DATA.read_text())
    scores = [score(e) for e in entries]
    used = [s for s in scores if s.skipped is None]
    if not args.markdown:
        print(f"{'log':<58} {'weights':>8} {'KV math':>8} {'model':>8} {'baseline':>8} {'activ.':>8}")
        for s in used:
            cells = (_cell(s.weights), _cell(s.kv_math), _cell(s.end_to_end), _cell(s.baseline), _cell(s.activation))
            print(f"{s.id[:58]:<58} " + " ".join(f"{c:>8}" for c in cells))
        skipped = [s for s in scores if s.skipped]
        print(f"\n{len(used)} logs scored, {len(skipped)} skipped (no preset for the architecture):")
        print("  " + ", ".join(sorted({s.model for s in skipped})))
        print()
    print("| comparison | logs | median abs error | max abs error | within 5% |")
    print("|---|---:|---:|---:|---:|")
    for label, count, median, worst, within in summary(used):
        print(f"| {label} | {count} | {median:.1%} | {worst:.1%} | {within:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
