"""fp8 is offered only where vLLM runs it: fp8 arithmetic from compute capability 8.9 (and MI300X), weight-only
fp8 (Marlin) on Ampere and Turing, and an fp8 KV cache only with fp8 arithmetic."""

import json

import pytest

from exporter.capacity.candidates import precisions
from exporter.capacity.deployment import Deployment
from exporter.capacity.fleet import plan_fleet
from exporter.capacity.gpus import Fp8Weights, GpuSpec
from exporter.capacity.plan import plan
from exporter.catalog import find_gpu, gpu_presets, load_model
from exporter.cli import main

GIB = 1024**3


def test_every_gpu_preset_names_its_compute_capability():
    missing = [gpu.name for gpu in gpu_presets() if gpu.compute_capability is None]
    assert missing == []


@pytest.mark.parametrize(
    ("gpu", "capability", "weights", "kv"),
    [
        ("H100", (9, 0), Fp8Weights.HARDWARE, True),
        ("H800", (9, 0), Fp8Weights.HARDWARE, True),
        ("B200", (10, 0), Fp8Weights.HARDWARE, True),
        ("L40S", (8, 9), Fp8Weights.HARDWARE, True),
        ("MI300X", (9, 4), Fp8Weights.HARDWARE, True),
        ("A100-80GB", (8, 0), Fp8Weights.MARLIN, False),
        ("A10G", (8, 6), Fp8Weights.MARLIN, False),
        ("T4", (7, 5), Fp8Weights.MARLIN, False),
    ],
)
def test_the_fp8_paths_follow_the_compute_capability(gpu, capability, weights, kv):
    spec = find_gpu(gpu)
    assert (spec.compute_capability, spec.fp8_weights, spec.fp8_kv_cache) == (capability, weights, kv)


# The H800 (the H100's export variant) as nvidia-smi and NVML print it: its own CUDA total, not the H100's.
@pytest.mark.parametrize("printed", ["NVIDIA H800", "nvidia h800 80gb hbm3"])
def test_plan_on_an_h800_uses_its_own_cuda_total(capsys, printed):
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", printed, "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["gpu"], result["gpu_memory_bytes"]) == ("H800", round(79.11 * GIB))


def test_volta_has_no_fp8_path_and_is_offered_none():
    v100 = GpuSpec("V100", 32 * GIB, compute_capability=(7, 0))
    assert [p.changes for p in precisions(load_model("llama-3.1-8b"), Deployment(), v100)] == [()]


def test_ampere_is_offered_weight_only_fp8_and_no_fp8_kv_cache():
    offered = precisions(load_model("llama-3.1-8b"), Deployment(), find_gpu("A100-80GB"))
    assert [p.changes for p in offered] == [(), ("weight-only fp8 (Marlin)",)]


def test_hopper_is_offered_fp8_weights_and_fp8_kv_cache():
    offered = precisions(load_model("llama-3.1-8b"), Deployment(), find_gpu("H100"))
    assert [p.changes for p in offered] == [(), ("fp8 KV cache",), ("fp8 weights",), ("fp8 weights", "fp8 KV cache")]


def test_a_gpu_known_only_by_its_memory_keeps_every_fp8_option():
    offered = precisions(load_model("llama-3.1-8b"), Deployment(), GpuSpec("80.00GiB GPU", 80 * GIB))
    assert len(offered) == 4


def test_fixes_for_a_deployment_that_does_not_fit_offer_no_fp8_kv_cache_on_ampere():
    # Llama 3.1 70B in 16-bit does not fit one A100: the fix names weight-only fp8, never --kv-cache-dtype fp8.
    result = plan(load_model("llama-3.1-70b"), find_gpu("A100-80GB"), Deployment(max_model_len=8192))
    assert not result.fits
    assert not any("--kv-cache-dtype fp8" in s for s in result.suggestions)
    assert any("weight-only fp8 (Marlin)" in s for s in result.suggestions)


def test_fleet_planning_labels_ampere_fp8_as_weight_only(capsys):
    argv = ["plan", "--model", "llama-3.1-70b", "--gpu", "A100-80GB", "--concurrency", "8", "--context", "8192"]
    assert main([*argv, "--format", "json"]) == 0
    changes = {tuple(option["changes_precision"]) for option in json.loads(capsys.readouterr().out)["options"]}
    assert ("weight-only fp8 (Marlin)",) in changes
    assert not any("fp8 KV cache" in change for option in changes for change in option)


def test_fleet_planning_on_t4_offers_weight_only_fp8_but_never_an_fp8_kv_cache():
    options = plan_fleet(load_model("llama-3.1-8b"), [find_gpu("T4")], Deployment(), 4, 4096)
    assert options
    assert all(not o.precision.fp8_kv_cache for o in options)
    assert all(o.precision.weights_path == Fp8Weights.MARLIN for o in options if o.precision.fp8_weights)
