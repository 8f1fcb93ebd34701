"""What users paste into `plimsoll plan`: engine flag spellings, whole launch commands, sizes and GPUs as they
write them, and the mistakes among them caught with the fix."""

import argparse
import json
import os

import pytest

from exporter.catalog import find_gpu
from exporter.cli import main
from exporter.deployment_flags import gpu_for

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


# Each switch the planner mirrors, with a launch whose plan shows it. vLLM declares its switches with argparse's
# BooleanOptionalAction (vllm/engine/arg_utils.py), so of `--x` and `--no-x` the last one given wins.
SWITCHES = [
    ("--language-model-only", "qwen2.5-vl-7b"),
    ("--enforce-eager", "llama-3.1-8b"),
    ("--enable-expert-parallel", "qwen3-30b-a3b --tensor-parallel-size 2"),
    ("--async-scheduling", "gemma-4-26b-a4b --max-model-len 4096 --max-num-batched-tokens 2048 --language-model-only"),
]


@pytest.mark.parametrize(("switch", "launch"), SWITCHES)
def test_of_a_switch_and_its_negation_the_last_one_given_wins_as_in_vllm(capsys, switch, launch):
    negation = "--no-" + switch.removeprefix("--")
    model, *flags = launch.split()
    on = plan_json(capsys, "--model", model, *flags, switch)
    off = plan_json(capsys, "--model", model, *flags, negation)
    assert on != off
    assert plan_json(capsys, "--model", model, *flags, negation, switch) == on
    assert plan_json(capsys, "--model", model, *flags, switch, negation) == off
    assert plan_json(capsys, "--from", f"vllm serve {launch} {negation} {switch}") == on
    assert plan_json(capsys, "--from", f"vllm serve {launch} {switch} {negation}") == off


@pytest.mark.parametrize(("switch", "launch"), SWITCHES)
def test_a_switch_beside_from_that_contradicts_it_names_both_spellings(capsys, switch, launch):
    negation = "--no-" + switch.removeprefix("--")
    err = usage_error(capsys, negation, "--from", f"vllm serve {launch} {switch}")
    assert f"--from says {switch} but {negation} is given too: give it once" in err
    assert main(["plan", "--from", f"vllm serve {launch} {negation}", switch]) == 2
    assert f"--from says {negation} but {switch} is given too: give it once" in capsys.readouterr().err


def test_from_reads_a_flag_given_twice_as_vllm_does_the_last_one_in_any_spelling(capsys):
    launch = "vllm serve llama-3.1-8b -tp 2 --tensor_parallel_size=4 --max_model_len 8K --max-model-len 4096"
    answer = plan_json(capsys, "--from", launch)
    assert (answer["tensor_parallel"], answer["max_model_len"]) == (4, 4096)


def test_sglangs_cuda_graph_switch_has_no_negation_as_in_sglang(capsys):
    launch = "python -m sglang.launch_server --model-path llama-3.1-8b --disable-cuda-graph"
    eager = plan_json(capsys, "--model", "llama-3.1-8b", "--engine", "sglang", "--enforce-eager")
    assert plan_json(capsys, "--from", launch) == eager
    err = usage_error(capsys, "--from", f"{launch} --no-disable-cuda-graph")
    assert "--no-disable-cuda-graph is not a sglang flag" in err


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


TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "_name_or_path": "/home/someone/checkpoints/run-7",
}


def cache_model(cache, repo_id: str, config: dict, snapshot: str = "0123abcd", main: bool = True) -> None:
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    (folder / "snapshots" / snapshot).mkdir(parents=True)
    (folder / "snapshots" / snapshot / "config.json").write_text(json.dumps(config))
    if main:
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(snapshot)


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_model_without_a_preset_resolves_from_the_local_hugging_face_cache(capsys, tmp_path, monkeypatch, variable):
    cache = tmp_path / "hub" if variable == "HF_HOME" else tmp_path
    cache_model(cache, "someorg/tiny-llama", TINY_LLAMA)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv(variable, str(tmp_path))
    answer = plan_json(capsys, "--model", "someorg/tiny-llama")
    assert answer["kv_bytes_per_token"] == 2 * 2 * 64 * 2 * 2
    assert answer["model"] == "someorg/tiny-llama"  # not the snapshot hash nor _name_or_path's local folder


def test_the_snapshot_refs_main_names_is_read_first(tmp_path):
    from exporter.catalog import cached_config

    cache_model(tmp_path, "someorg/m", TINY_LLAMA, snapshot="aaaa", main=False)
    cache_model_second = tmp_path / "models--someorg--m" / "snapshots" / "ffff"
    cache_model_second.mkdir()
    (cache_model_second / "config.json").write_text(json.dumps({**TINY_LLAMA, "num_hidden_layers": 4}))
    (tmp_path / "models--someorg--m" / "refs").mkdir()
    (tmp_path / "models--someorg--m" / "refs" / "main").write_text("ffff\n")
    assert cached_config("someorg/m", tmp_path) == cache_model_second / "config.json"


def test_a_config_path_inside_the_cache_is_shown_by_its_repository_id(capsys, tmp_path):
    cache_model(tmp_path, "someorg/tiny-llama", TINY_LLAMA)
    snapshot = tmp_path / "models--someorg--tiny-llama" / "snapshots" / "0123abcd"
    assert plan_json(capsys, "--model", str(snapshot))["model"] == "someorg/tiny-llama"


def test_a_model_in_neither_presets_nor_cache_says_where_it_looked(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # else the Hub is asked (tests/test_hub_configs.py)
    assert main(["plan", "--model", "someorg/absent"]) == 2
    assert "Hugging Face cache" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}, "MambaForCausalLM keeps a recurrent state"),
        ({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"]}, "recurrent state"),
        ({"layer_types": ["linear_attention", "full_attention"]}, "linear_attention layers"),
    ],
)
def test_an_architecture_the_model_cannot_size_says_so_by_name(capsys, tmp_path, extra, named):
    config = {k: v for k, v in TINY_LLAMA.items() if k != "num_attention_heads"}
    (tmp_path / "config.json").write_text(json.dumps({**config, **extra}))
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert named in err and "num_attention_heads" not in err


# Llama 3.2 11B Vision's language model: Llama 3.1 8B's shapes with eight cross-attention layers added among its 40.
MLLAMA_11B = {
    "architectures": ["MllamaForConditionalGeneration"],
    "model_type": "mllama",
    "text_config": {
        "model_type": "mllama_text_model",
        "num_hidden_layers": 40,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
    },
    "vision_config": {"hidden_size": 1280, "image_size": 560, "patch_size": 14, "num_hidden_layers": 32},
}


@pytest.mark.parametrize(
    "config",
    [MLLAMA_11B, {**TINY_LLAMA, "model_type": "t5", "is_encoder_decoder": True, "architectures": ["T5Model"]}],
)
def test_an_encoder_decoder_model_is_refused_with_why_not_priced_as_self_attention_kv(capsys, tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--model", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "is an encoder-decoder model (cross-attention layers that cache the encoder's KV)" in err
    assert "vLLM from 0.11 serves no encoder-decoder model but Whisper" in err


def test_a100_alone_is_ambiguous_and_lists_both(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "A100"]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and "A100-80GB (79.25 GiB)" in err and "A100-40GB (39.50 GiB)" in err


@pytest.mark.parametrize(
    ("name", "preset", "gib"),
    [
        ("A10", "A10", 22.18),
        ("Tesla T4", "T4", 14.56),
        ("L40", "L40", 44.39),
        ("RTX A6000", "RTX-A6000", 47.50),
        ("H100 NVL", "H100-NVL", 93.00),
        ("NVIDIA H100 PCIe", "H100-PCIe", 79.19),
        ("H20", "H20", 95.00),
        ("GH200", "GH200", 94.88),
    ],
)
def test_new_gpu_presets_resolve_with_their_cuda_total(name, preset, gib):
    gpu = find_gpu(name)
    assert gpu.name == preset and gpu.memory_bytes == round(gib * GIB) and gpu.evidence


# Names as `nvidia-smi --query-gpu=name` (or ROCm's torch.cuda.get_device_name) prints them, in other case and spacing.
@pytest.mark.parametrize(
    ("printed", "preset", "gib", "capability"),
    [
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Server", 95.01, (12, 0)),
        ("nvidia rtx pro 6000 blackwell workstation edition", "RTX-PRO-6000-Workstation", 94.97, (12, 0)),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000-Workstation", 94.97, (12, 0)),
        ("NVIDIA B300 SXM6 AC", "B300", 267.69, (10, 3)),
        ("NVIDIA  GB200", "GB200", 184.31, (10, 0)),
        ("NVIDIA GB300", "GB300", 276.50, (10, 3)),
        ("NVIDIA H20-3e", "H20-141GB", 139.80, (9, 0)),
        ("NVIDIA A800-SXM4-80GB", "A800-80GB", 79.33, (8, 0)),
        ("NVIDIA L20", "L20", 44.53, (8, 9)),
        ("NVIDIA GeForce RTX 5090", "RTX-5090", 31.37, (12, 0)),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada", 47.53, (8, 9)),
        ("AMD Instinct MI325X", "MI325X", 255.98, (9, 4)),
        ("AMD Instinct MI355X", "MI355X", 287.98, (9, 5)),
    ],
)
def test_gpus_are_found_by_the_name_the_driver_prints(printed, preset, gib, capability):
    gpu = find_gpu(printed)
    assert (gpu.name, gpu.memory_bytes, gpu.compute_capability) == (preset, round(gib * GIB), capability)
    assert not gpu.is_a100  # the A800 too: vLLM's smaller A100 defaults look for "a100" in the name


def test_every_gpu_preset_says_where_its_figure_comes_from():
    from exporter.catalog import gpu_presets

    assert all(gpu.evidence for gpu in gpu_presets())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"hidden_size": [256]}, "hidden_size is [256], not a whole number"),
        ({"num_attention_heads": 0}, "num_attention_heads is 0, not a whole number"),
        ({"vocab_size": "many"}, "vocab_size is 'many', not a whole number"),
        ({"num_hidden_layers": 2_000_000_000}, "not a whole number from 1 to 1,024"),
        ({"vocab_size": 10**40}, "vocab_size is 1000"),
        ({"head_dim": 1e300}, "head_dim is 1e+300"),
        ({"rope_scaling": {"factor": float("nan")}}, "rope_scaling.factor is nan"),
        ({"layer_types": 5}, "layer_types is 5, not a list"),
        ({"quantization_config": [1]}, "quantization_config is [1], not an object"),
        ({"model_type": {"llama": 1}}, "for a config.json (unhashable type: 'dict'); correct the file"),
    ],
)
def test_a_garbled_config_json_names_the_file_and_key_without_a_traceback(capsys, tmp_path, change, named):
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, **change}))
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "config.json") in err and named in err


def test_a_config_json_too_large_or_too_deep_is_refused_by_name(capsys, tmp_path):
    from exporter.catalog import MAX_MODEL_CONFIG_BYTES

    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({**TINY_LLAMA, "padding": "x" * MAX_MODEL_CONFIG_BYTES}))
    assert main(["plan", "--model", str(huge)]) == 2
    assert "huge.json: over" in capsys.readouterr().err
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["plan", "--model", str(deep)]) == 2
    assert "deep.json: not a usable JSON file (nested too deeply)" in capsys.readouterr().err


@pytest.mark.parametrize("ref", ["../../../outside", "/etc", "x" * 1000])
def test_a_refs_main_that_names_no_snapshot_is_refused_not_followed(capsys, tmp_path, monkeypatch, ref):
    cache_model(tmp_path / "hub", "someorg/m", TINY_LLAMA)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text(json.dumps(TINY_LLAMA))
    main_ref = tmp_path / "hub" / "models--someorg--m" / "refs" / "main"
    main_ref.write_text(ref)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["plan", "--model", "someorg/m"]) == 2
    assert str(main_ref) in capsys.readouterr().err


@pytest.mark.parametrize("name", ["~no-such-user-here/config.json", "a" * 5000, "someorg/" + "a" * 5000])
def test_a_model_name_that_is_no_usable_path_is_looked_up_as_a_preset(capsys, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert main(["plan", "--model", name]) == 2
    assert "unknown model" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["fifo", "loop", "folder/config.json"])
def test_a_model_path_that_is_there_but_no_file_to_read_is_refused_by_name_without_waiting(capsys, tmp_path, where):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "folder" / "config.json").mkdir(parents=True)
    named = tmp_path / where
    assert main(["plan", "--model", str(named.parent if where.startswith("folder") else named)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"plimsoll plan: {named}: not a regular file (a directory, a FIFO, a device, or a symlink that leads "
        "nowhere): pass the config.json itself"
    )


def test_a_fifo_named_from_the_home_directory_is_refused_by_its_expanded_path(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    os.mkfifo(tmp_path / "fifo")
    assert main(["plan", "--model", "~/fifo"]) == 2
    assert capsys.readouterr().err.strip().startswith(f"plimsoll plan: {tmp_path / 'fifo'}: not a regular file")


@pytest.mark.parametrize("revision", ["", "../../outside", "a b", "\x1b[31mred", "@x", "v1..2", "/abs", "x" * 300])
def test_a_revision_that_names_no_branch_tag_or_commit_is_refused_before_the_cache_is_touched(
    capsys, tmp_path, monkeypatch, revision
):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["plan", "--model", f"someorg/m@{revision}"]) == 2
    [error] = capsys.readouterr().err.strip().splitlines()
    assert "is not a branch, tag or commit name" in error and "\x1b" not in error
    assert not (tmp_path / "hub").exists()  # huggingface_hub would join "../.." to the cache folder as a path


def test_a_config_json_garbled_in_the_cache_names_the_folder_to_delete(capsys, tmp_path, monkeypatch):
    cache_model(tmp_path, "someorg/m", TINY_LLAMA)
    folder = tmp_path / "models--someorg--m"
    (folder / "snapshots" / "0123abcd" / "config.json").write_text("<html>Bad Gateway</html>")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["plan", "--model", "someorg/m"]) == 2
    [error] = capsys.readouterr().err.strip().splitlines()
    assert "config.json: not a readable JSON file" in error and error.endswith(f"; delete {folder} to fetch it again")


def test_a_config_file_not_named_config_json_is_named_by_itself_and_a_preset_file_by_its_repository(capsys, tmp_path):
    mine = tmp_path / "models" / "my-llama.json"
    mine.parent.mkdir()
    mine.write_text(json.dumps(TINY_LLAMA))
    assert main(["plan", "--model", str(mine), "--gpu", "L4", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "my-llama"  # not "models", its folder
    preset = os.path.join(os.path.dirname(__file__), "..", "exporter", "data", "models", "llama-3.1-8b.json")
    assert main(["plan", "--model", preset, "--gpu", "L4", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "meta-llama/Llama-3.1-8B-Instruct"
