"""What users paste into `plimsoll plan`: engine flag spellings, whole launch commands, sizes and GPUs as they
write them, and the mistakes among them caught with the fix."""

import argparse
import json

import pytest

from exporter.catalog import find_gpu
from exporter.cli import main
from exporter.plan_flags import gpu_for

GIB = 1024**3


def plan_json(capsys, *argv: str) -> dict:
    assert main(["plan", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "spelling",
    [["--tp", "2"], ["--tensor-parallel-size", "2"], ["-tp", "2"], ["--tp-size", "2"]],
)
def test_tensor_parallel_answers_to_every_engine_spelling(capsys, spelling):
    assert plan_json(capsys, "--model", "llama-3.1-8b", *spelling)["tensor_parallel"] == 2


def test_sglang_spellings_set_the_same_settings(capsys):
    answer = plan_json(
        capsys, "--model", "llama-3.1-8b", "--engine", "sglang", "--mem-fraction-static", "0.8",
        "--context-length", "8192", "--max-running-requests", "64",
    )  # fmt: skip
    assert (answer["gpu_memory_utilization"], answer["max_model_len"], answer["max_num_seqs"]) == (0.8, 8192, 64)


def test_vllm_kv_cache_memory_bytes_reads_vllm_units(capsys):
    # vLLM's human_readable_int: upper-case G is binary.
    answer = plan_json(capsys, "--model", "llama-3.1-8b", "--kv-cache-memory-bytes", "4G")
    assert answer["kv_cache_tokens"] == 4 * GIB // 131072


def test_from_a_vllm_command_line_plans_the_same_as_the_flags(capsys):
    pasted = plan_json(
        capsys, "--from", "vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2 --max-model-len 32K"
    )
    typed = plan_json(capsys, "--model", "llama-3.1-8b", "--tp", "2", "--max-model-len", "32768")
    assert pasted == typed


def test_from_an_sglang_command_line_sets_the_engine(capsys):
    answer = plan_json(capsys, "--from", "python -m sglang.launch_server --model-path qwen3-8b --tp 2")
    assert (answer["engine"], answer["tensor_parallel"]) == ("sglang", 2)


def test_from_lists_the_ignored_flags_on_one_line(capsys):
    assert main(["plan", "--from", "vllm serve llama-3.1-8b --port 8000 --host 0.0.0.0", "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "ignored: --port --host" in err and err.count("\n") == 1


def test_a_flag_before_from_that_contradicts_it_names_both(capsys):
    err = usage_error(capsys, "--tp", "4", "--from", "vllm serve llama-3.1-8b -tp 2")
    assert "--from says -tp 2 but --tp says 4" in err


def test_a_flag_after_from_that_contradicts_it_names_both(capsys):
    assert main(["plan", "--from", "vllm serve llama-3.1-8b -tp 2", "--tp", "4"]) == 2
    assert "--from says -tp 2 but --tp says 4" in capsys.readouterr().err


def test_a_model_beside_from_that_differs_names_both(capsys):
    err = usage_error(capsys, "--model", "qwen3-8b", "--from", "vllm serve llama-3.1-8b")
    assert "--from says model llama-3.1-8b but --model says qwen3-8b" in err


def test_flags_beside_from_that_agree_or_add_are_taken(capsys):
    answer = plan_json(capsys, "--from", "vllm serve llama-3.1-8b -tp 2", "--tp", "2", "--max-num-seqs", "64")
    assert (answer["tensor_parallel"], answer["max_num_seqs"]) == (2, 64)


def test_from_with_an_unknown_flag_names_it(capsys):
    assert "--speculative-config is not a vllm flag" in usage_error(
        capsys, "--from", "vllm serve llama-3.1-8b --speculative-config {}"
    )


def test_from_with_a_bad_value_names_the_flag_as_written(capsys):
    err = usage_error(capsys, "--from", "vllm serve llama-3.1-8b --gpu-memory-utilization 90")
    assert "--gpu-memory-utilization 90" in err and "did you mean 0.9" in err


def test_gpu_memory_keeps_the_presets_identity_and_defaults(capsys):
    answer = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--gpu-memory", "79.3GiB")
    assert answer["max_num_seqs"] == 256  # vLLM's A100 default, not the 1024 of other large GPUs
    assert answer["gpu_memory_bytes"] == round(79.3 * GIB)


def test_gpu_memory_alone_is_a_gpu_known_by_its_memory():
    gpu = gpu_for(argparse.Namespace(gpu=None, gpu_memory=40 * GIB))
    assert gpu.memory_bytes == 40 * GIB and gpu.name == "40.00GiB GPU"
    named = gpu_for(argparse.Namespace(gpu="A100-80GB", gpu_memory=79 * GIB))
    assert named.name == find_gpu("A100-80GB").name and named.is_a100


def test_gpu_memory_without_a_unit_suggests_gib(capsys):
    assert "80 is 80 bytes (did you mean 80GiB?)" in usage_error(
        capsys, "--model", "llama-3.1-8b", "--gpu-memory", "80"
    )


def test_gpu_memory_below_a_gib_is_refused(capsys):
    assert "less than 1 GiB" in usage_error(capsys, "--model", "llama-3.1-8b", "--gpu-memory", "80MB")


@pytest.mark.parametrize(("size", "expected"), [("80Gi", 80 * GIB), ("80G", 80 * 1000**3), ("81920Mi", 80 * GIB)])
def test_gpu_memory_in_kubernetes_quantities(capsys, size, expected):
    assert plan_json(capsys, "--model", "llama-3.1-8b", "--gpu-memory", size)["gpu_memory_bytes"] == expected


def test_utilization_above_one_suggests_the_percent_reading(capsys):
    assert "did you mean 0.015?" in usage_error(capsys, "--model", "llama-3.1-8b", "--gpu-memory-utilization", "1.5")
