"""Scores the capacity model against real vLLM startup logs (bench/data/vllm_startup_logs.yaml).

Three comparisons per log, each printed only where the log carries the number:
- weights: the model's weights per GPU vs "Model loading took X GiB";
- KV math: tokens the model fits in the KV memory vLLM reported as available vs the tokens vLLM allocated
  (block arithmetic and bytes per token alone, no profiling estimates);
- end to end: tokens predicted from GPU size and flags alone vs the tokens vLLM allocated (adds the weights,
  activation, non-torch and CUDA-graph estimates), and the activation estimate vs the logged peak.
A baseline is printed beside it: the back-of-envelope most calculators use (KV = utilization x memory - weights,
with weights = parameters x bytes, nothing else subtracted).

The end-to-end figure is in-sample: the overhead terms were fitted to these logs. The bench therefore also refits
them (exporter/capacity/fit.py) on every source but one, scores the left-out source with the refit terms and the
range exporter/capacity/uncertainty.py derives from the refit spreads, and reports that honest figure, the range's
coverage and its median width beside the in-sample ones.

    .venv/bin/python -m bench.model_accuracy            # table and summary
    .venv/bin/python -m bench.model_accuracy --markdown # the summary as a README table
"""

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from exporter.capacity import assumptions as A
from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.deployment import Deployment
from exporter.capacity.fit import FittedTerms, TermObservation, fit_terms, term_spreads
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import CapacityPlan, plan
from exporter.capacity.quantization import Quantization, from_config, from_flag
from exporter.capacity.uncertainty import (
    SHIPPED_SPREADS,
    UNQUANTIZED,
    TermSpreads,
    kv_cache_tokens_range,
    weights_format,
)
from exporter.catalog import CatalogError, find_gpu, load_model
from exporter.core.units import GIB

DATA = Path(__file__).parent / "data" / "vllm_startup_logs.yaml"

# Logs of checkpoints without a preset of their own, priced as a preset with the same architecture.
SAME_ARCHITECTURE: dict[str, tuple[str, str | dict[str, Any] | None]] = {
    "Qwen/Qwen2-7B-Instruct": ("qwen2.5-7b", None),
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic": ("llama-3.3-70b", "fp8"),
    "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic": ("llama-3.3-70b", "fp8"),
    "RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic": ("qwen2.5-7b", "fp8"),
    "RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8": ("qwen2.5-7b", "int8"),
    # Red Hat's INT8 W8A8 of the 3.1 checkpoint the preset copies; its card quantizes "only weights and activations
    # of the linear operators within transformers blocks" (per-channel weights, per-token activations). Its own
    # config.json (with quantization_config) was not found.
    "RedHatAI/Mistral-Small-3.1-24B-Instruct-2503-quantized.w8a8": ("mistral-small-3.1-24b", "int8"),
    # Red Hat's FP8-dynamic (compressed-tensors: per-channel FP8 weights, per-token FP8 activations) of the -it
    # checkpoint, whose shapes the preset's base config shares; its own config.json was not found. vLLM leaves
    # Gemma 4's vision tower unquantized (4304 is not a multiple of 64), and these logs skip it anyway.
    "RedHatAI/gemma-4-26B-A4B-it-FP8-dynamic": ("gemma-4-26b-a4b", "fp8"),
    # Kimi-K2-Thinking's attention (61 layers of one 576-wide MLA latent) is Instruct's, its weights are not (INT4
    # compressed-tensors experts), so its log is scored on the KV math only (KV_MATH_ONLY).
    "moonshotai/Kimi-K2-Thinking": ("kimi-k2-instruct", None),
    # Qwen's block-scaled FP8 checkpoint (the logs select DeepGemmFp8BlockScaledMMKernel); its config was not read,
    # and per-block scales differ from the flag's per-tensor ones by well under 0.1% of the weights
    "Qwen/Qwen3-8B-FP8": ("qwen3-8b", "fp8"),
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
# Logs priced through a preset whose KV cache per token is the checkpoint's but whose weights are not: only the KV
# math from the logged KV memory is scored, never a weights or end-to-end figure (their GPU size is not used).
KV_MATH_ONLY = frozenset({"moonshotai/Kimi-K2-Thinking"})
# Logs whose model the planner refuses whatever config.json it is given, so a preset would not score them either.
REFUSED_ARCHITECTURE = {
    "meta-llama/Llama-3.2-11B-Vision": "refused: an encoder-decoder model (mllama), whose cross-attention KV is not "
    "modelled; vLLM from 0.11 serves no encoder-decoder model but Whisper",
}
INT8 = Quantization("int", 8, 1.0)
# The terms as the shipped model applies them: the constants in `assumptions`, the activation estimate unscaled.
SHIPPED_TERMS = FittedTerms(A.NON_TORCH_BYTES_SINGLE_GPU, A.NON_TORCH_BYTES_MULTI_GPU, A.CUDA_GRAPH_BYTES, 1.0, ())


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
    arch = load_model(preset, from_hub=False)  # presets (and the local cache) only: a score never waits on the Hub
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


@dataclass(frozen=True)
class Setup:
    """One log's model, GPU and flags, and the shipped model's plan for it."""

    arch: ModelArchitecture
    gpu: GpuSpec | None
    deployment: Deployment
    reference: CapacityPlan


def _setup(entry: dict[str, Any]) -> Setup | None:
    """None where no preset has the log's architecture."""
    try:
        arch, quantization = _model(entry["model"], entry.get("quantization"))
    except CatalogError:
        return None
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
        async_scheduling=entry.get("async_scheduling") is not False,
        quantization=quantization,
        vllm_version=_version(entry.get("vllm_version")),
        # --language-model-only sets every modality's limit to 0; the data writes that out per modality
        mm_limits=tuple(sorted((entry.get("limit_mm_per_prompt") or {}).items())),
    )
    gpu = None if entry["model"] in KV_MATH_ONLY else _gpu(entry)
    return Setup(arch, gpu, deployment, plan(arch, gpu or GpuSpec("unknown", 80 * GIB), deployment))


def score(entry: dict[str, Any]) -> Score:
    name = entry["model"]
    setup = _setup(entry)
    if setup is None:
        skipped = REFUSED_ARCHITECTURE.get(name, "no preset (no verbatim config.json was found to make one)")
        return Score(entry["id"], name, None, None, None, None, None, skipped=skipped)
    arch, gpu, deployment, reference = setup.arch, setup.gpu, setup.deployment, setup.reference
    observed = entry["observed"]
    block = reference.deployment.block_size or 16
    tokens = _observed_tokens(entry, block)
    priced = observed.get("weights_gib") and name not in KV_MATH_ONLY
    weights = (reference.weights.per_gpu_bytes / GIB, observed["weights_gib"]) if priced else None
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


def source(entry: dict[str, Any]) -> str:
    """Where a log comes from (a repository, or a site): the unit left out together, since one harness's logs
    share its quirks."""
    url = urlparse(entry["source"].split()[0])
    if url.netloc == "github.com":
        return "/".join(url.path.strip("/").split("/")[:2])
    return url.netloc


def observation(entry: dict[str, Any]) -> TermObservation:
    """What the log printed about the fitted terms (those need no preset), with the model's predictions where
    a preset gives them."""
    observed, setup = entry["observed"], _setup(entry)
    gib = {key: round(observed[key] * GIB) if observed.get(key) is not None else None for key in observed}
    predicted = setup.reference if setup is not None and entry["model"] not in KV_MATH_ONLY else None
    weights = activation = None
    if predicted is not None and gib.get("weights_gib"):
        weights = (predicted.weights.per_gpu_bytes, gib["weights_gib"])
    if predicted is not None and gib.get("activation_peak_gib"):
        activation = (predicted.activation_passes.text, gib["activation_peak_gib"])
    stated = entry.get("vllm_version")
    return TermObservation(
        # a log that states no version counts only towards the all-versions fit, not towards V0's
        version=_version(stated) if stated else None,
        gpus=entry["tensor_parallel"] * (entry.get("pipeline_parallel") or 1),
        non_torch_bytes=gib.get("non_torch_gib"),
        activation_bytes=activation,
        weights_bytes=weights,
        cuda_graph_bytes=gib.get("cudagraph_estimate_gib"),
        weights_format=weights_format(predicted.deployment.quantization) if predicted is not None else UNQUANTIZED,
        encoder_pass_bytes=predicted.activation_passes.encoder if predicted is not None else 0,
    )


def refit_plan(setup: Setup, fitted: FittedTerms) -> CapacityPlan:
    """The shipped model's plan for a log, with the fitted terms replaced by `fitted`."""
    reference, gpu = setup.reference, setup.gpu
    d = reference.deployment
    assert gpu is not None and d.gpu_memory_utilization is not None
    assert d.vllm_version is not None
    passes = fitted.scaled(reference.activation_passes, d.vllm_version)
    activation = passes.peak
    non_torch = fitted.non_torch(reference.num_gpus)
    graphs = fitted.cuda_graph_bytes if reference.cuda_graph_bytes else 0
    budget = round(gpu.memory_bytes * d.gpu_memory_utilization) - reference.weights.per_gpu_bytes
    budget -= activation + non_torch + graphs
    given = plan(setup.arch, gpu, replace(setup.deployment, kv_cache_memory_bytes=max(0, budget)))
    return replace(
        given,
        deployment=d,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs,
        kv_cache_bytes=budget,
        activation_passes=passes,
    )


@dataclass(frozen=True)
class Scored:
    """One log scored end to end: in-sample with the shipped model, out of sample with terms refit without it."""

    id: str
    source: str
    observed: float
    in_sample: float
    in_sample_range: tuple[int, int]
    out_of_sample: float
    out_of_sample_range: tuple[int, int]

    def covered(self, out_of_sample: bool = True) -> bool:
        low, high = self.out_of_sample_range if out_of_sample else self.in_sample_range
        return low <= self.observed <= high

    def width(self, out_of_sample: bool = True) -> float:
        low, high = self.out_of_sample_range if out_of_sample else self.in_sample_range
        return (high - low) / self.observed


def fit_all(entries: Sequence[dict[str, Any]]) -> tuple[FittedTerms, TermSpreads]:
    """The terms fitted on these logs, and how far they miss them."""
    observations = [observation(e) for e in entries]
    fitted = fit_terms(observations)
    return fitted, term_spreads(observations, fitted)


def shipped_spreads(entries: Sequence[dict[str, Any]]) -> TermSpreads:
    """How far the shipped model's terms miss these logs: what `uncertainty.SHIPPED_SPREADS` should hold."""
    return term_spreads([observation(e) for e in entries], SHIPPED_TERMS)


def leave_one_source_out(entries: Sequence[dict[str, Any]]) -> list[Scored]:
    """Every log scored end to end, each with the terms fitted on the other sources only."""
    setups = {e["id"]: _setup(e) for e in entries}
    results = []
    for held_out in sorted({source(e) for e in entries}):
        tested = []
        for entry in entries:
            setup = setups[entry["id"]]
            if source(entry) != held_out or setup is None or setup.gpu is None:
                continue
            tokens = _observed_tokens(entry, setup.reference.deployment.block_size or A.VLLM_BLOCK_SIZE)
            if tokens:
                tested.append((entry, setup, tokens))
        if not tested:
            continue
        fitted, spreads = fit_all([e for e in entries if source(e) != held_out])
        for entry, setup, tokens in tested:
            refit = refit_plan(setup, fitted)
            results.append(
                Scored(
                    entry["id"],
                    held_out,
                    tokens,
                    setup.reference.pool.tokens,
                    kv_cache_tokens_range(setup.reference, SHIPPED_SPREADS),
                    refit.pool.tokens,
                    kv_cache_tokens_range(refit, spreads),
                )
            )
    return results


FAMILIES = ("dense", "MoE", "MLA", "VLM", "quantized")


def families(entry: dict[str, Any], setup: Setup | None) -> tuple[str, ...]:
    """The rows of the family table a log counts in: its architecture (from the preset, or the entry's `family`
    where no preset prices it), and "quantized" too where its weights are."""
    if setup is None:
        kind = str(entry.get("family") or "dense")
    else:
        arch = setup.arch
        kind = "VLM" if arch.vision else "MLA" if arch.mla else "MoE" if arch.moe else "dense"
    quantized = entry.get("quantization") or (setup is not None and setup.reference.deployment.quantization)
    return (kind, "quantized") if quantized else (kind,)


@dataclass(frozen=True)
class FamilyRow:
    family: str
    logs: int
    refused: int
    scored: int  # logs with a GPU size and KV tokens to score end to end
    in_sample: tuple[float, float] | None  # median and worst abs error of the end-to-end KV tokens
    out_of_sample: tuple[float, float] | None
    coverage: float | None  # share of logs inside the leave-one-source-out range


def family_summary(entries: Sequence[dict[str, Any]], loso: Sequence[Scored]) -> list[FamilyRow]:
    """The end-to-end KV-token figures per family, and how many of the family's logs have no preset at all."""
    member = {e["id"]: families(e, _setup(e)) for e in entries}
    rows = []
    for family in FAMILIES:
        ids = [e["id"] for e in entries if family in member[e["id"]]]
        scored = [s for s in loso if family in member[s.id]]
        refused = sum(_setup(e) is None for e in entries if family in member[e["id"]])

        def errors(values: list[float]) -> tuple[float, float] | None:
            return (statistics.median(values), max(values)) if values else None

        rows.append(
            FamilyRow(
                family,
                len(ids),
                refused,
                len(scored),
                errors([abs(s.in_sample / s.observed - 1) for s in scored]),
                errors([abs(s.out_of_sample / s.observed - 1) for s in scored]),
                sum(s.covered() for s in scored) / len(scored) if scored else None,
            )
        )
    return rows


def _pair(pair: tuple[float, float] | None) -> str:
    return f"{pair[0]:.1%} / {pair[1]:.1%}" if pair else "-"


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


def out_of_sample_summary(loso: Sequence[Scored]) -> list[tuple[str, int, float, float, float]]:
    errors = [abs(s.out_of_sample / s.observed - 1) for s in loso]
    within = sum(e <= 0.05 for e in errors) / len(errors)
    return [("KV tokens end to end, leave one source out", len(errors), statistics.median(errors), max(errors), within)]


def range_summary(loso: Sequence[Scored]) -> list[tuple[str, int, float, float]]:
    """Share of logs whose real KV tokens lie in the range, and the range's median width (of the real value)."""
    rows = []
    for label, out in (("in-sample (shipped spreads)", False), ("leave one source out", True)):
        coverage = sum(s.covered(out) for s in loso) / len(loso)
        rows.append((label, len(loso), coverage, statistics.median(s.width(out) for s in loso)))
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
        print(f"\n{len(used)} logs scored, {len(skipped)} skipped:")
        for reason in sorted({s.skipped for s in skipped if s.skipped}):
            print(f"  {reason}: " + ", ".join(sorted({s.model for s in skipped if s.skipped == reason})))
        print("\nKnown misses (their `known_miss` in the data):")
        for entry in entries:
            if entry.get("known_miss"):
                print(f"  {entry['id']}: {entry['known_miss']}")
        print()
    loso = leave_one_source_out(entries)
    print("| comparison | logs | median abs error | max abs error | within 5% |")
    print("|---|---:|---:|---:|---:|")
    for label, count, median, worst, within in summary(used) + out_of_sample_summary(loso):
        print(f"| {label} | {count} | {median:.1%} | {worst:.1%} | {within:.0%} |")
    print()
    print("| KV tokens range | logs | holds the logged value | median width |")
    print("|---|---:|---:|---:|")
    for label, count, coverage, width in range_summary(loso):
        print(f"| {label} | {count} | {coverage:.0%} | {width:.1%} |")
    print()
    print(
        "| family | logs | refused (no preset) | scored end to end | KV tokens in-sample, median / worst "
        "| leave one source out, median / worst | range holds it (out of sample) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in family_summary(entries, loso):
        coverage = "-" if row.coverage is None else f"{row.coverage:.0%}"
        refused = f"{row.refused} ({row.refused / max(row.logs, 1):.0%})"
        print(
            f"| {row.family} | {row.logs} | {refused} | {row.scored} | {_pair(row.in_sample)} "
            f"| {_pair(row.out_of_sample)} | {coverage} |"
        )
    if not args.markdown:
        print("\nLeft out one source at a time (in-sample error -> out-of-sample error, range):")
        for s in loso:
            low, high = s.out_of_sample_range
            mark = "" if s.covered() else "  (outside the range)"
            print(
                f"  {s.source[:32]:<32} {s.id[:46]:<46} {s.in_sample / s.observed - 1:+7.1%} -> "
                f"{s.out_of_sample / s.observed - 1:+7.1%}  [{low / s.observed - 1:+.1%}, {high / s.observed - 1:+.1%}]"
                + mark
            )
        fitted, _ = fit_all(entries)
        print("\nFitted on all logs (exporter/capacity/fit.py) vs shipped (exporter/capacity/assumptions.py):")
        for label, fit, shipped in (
            ("non-torch at one GPU", fitted.non_torch_single_gpu_bytes, A.NON_TORCH_BYTES_SINGLE_GPU),
            ("non-torch per GPU above", fitted.non_torch_multi_gpu_bytes, A.NON_TORCH_BYTES_MULTI_GPU),
            ("CUDA-graph estimate", fitted.cuda_graph_bytes, A.CUDA_GRAPH_BYTES),
        ):
            print(f"  {label + ':':<27} {fit / GIB:.2f} vs {shipped / GIB:.2f} GiB")
        by_version = ", ".join(f"v{v[0]}.{v[1]} {scale}" for v, scale in fitted.activation_scale_by_version)
        print(f"  activation scale:           {by_version}; all versions {fitted.activation_scale} vs 1.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
