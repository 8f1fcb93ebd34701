"""`plimsoll plan` fed by someone hostile, or by a corrupt download: every config.json field and every numeric flag
out of its range is refused in one line that names the file, the field or the flag and the range it accepts, with
exit status 2; never a traceback, never a nonsense figure with exit status 0."""

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.capacity.architecture import ModelConfigError, from_hf_config
from exporter.capacity.deployment import Deployment
from exporter.capacity.plan import plan
from exporter.catalog import find_gpu, load_model, model_presets
from exporter.cli import main
from tests.test_plan_inputs import TINY_LLAMA

MOE = {"num_local_experts": 8, "num_experts_per_tok": 2}
MLA = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}


def refused(capsys, tmp_path, config: dict, *flags: str) -> str:
    """Plans `config` written to a file; asserts the one-line refusal and returns it."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--model", str(tmp_path), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(tmp_path / "config.json") in err
    return err


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"head_dim": -128}, "head_dim is -128, not a whole number from 1 to 65,536"),
        ({"head_dim": 0.5}, "head_dim is 0.5, not a whole number from 1 to 65,536"),
        ({"num_key_value_heads": 0}, "num_key_value_heads is 0, not a whole number from 1 to 4"),
        ({"num_key_value_heads": -2}, "num_key_value_heads is -2, not a whole number from 1 to 4"),
        ({"num_key_value_heads": 8}, "num_key_value_heads is 8, not a whole number from 1 to 4"),
        ({"sliding_window": -4096}, "sliding_window is -4096, not a whole number from 0 to 1,073,741,824"),
        ({"sliding_window": 10.5}, "sliding_window is 10.5, not a whole number from 0"),
        ({"torch_dtype": "float1024"}, "torch_dtype is 'float1024', not one of bfloat16, float16, half, float32"),
        ({"dtype": 5}, "dtype is 5, not one of bfloat16"),
        ({"num_attention_heads": 2**40}, "num_attention_heads is 1099511627776, not a whole number from 1 to 65,536"),
        ({"hidden_size": 2**50}, "hidden_size is 1125899906842624, not a whole number from 1 to 1,048,576"),
        ({"intermediate_size": -1}, "intermediate_size is -1, not a whole number from 1 to 1,048,576"),
        ({"vocab_size": 2**40}, "vocab_size is 1099511627776, not a whole number from 1 to 16,777,216"),
        ({"max_position_embeddings": 2**50}, "max_position_embeddings is 1125899906842624, not a whole number"),
        ({"num_hidden_layers": 2_000}, "num_hidden_layers is 2000, not a whole number from 1 to 1,024"),
        ({"sliding_window": 128, "sliding_window_pattern": "0"}, "sliding_window_pattern is '0', not a whole number"),
        # A number written as a string is refused, not read: str.isdecimal took the Arabic-Indic "٤٠" for 40.
        ({"num_hidden_layers": "٤٠"}, "num_hidden_layers is '٤٠', not a whole number from 1 to 1,024 (a string"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers is '2', not a whole number from 1 to 1,024 (a string: write"),
        (
            {"vision_config": {"hidden_size": 64, "pixel_shuffle_ratio": "0.5"}},
            "pixel_shuffle_ratio is '0.5', not a number above 0 and at most 1",
        ),
        ({"rope_scaling": {"rope_type": "linear", "factor": -4}}, "rope_scaling.factor is -4, not a number above 0"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 1e15}}, "at most 1024"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": -1}},
            "original_max_position_embeddings is -1, not a whole number from 1",
        ),
        ({**MOE, "num_local_experts": -8}, "num_local_experts is -8, not a whole number from 1 to 65,536"),
        ({**MOE, "num_experts_per_tok": 100}, "num_experts_per_tok is 100, not a whole number from 1 to 8"),
        ({**MOE, "moe_intermediate_size": -100}, "moe_intermediate_size is -100, not a whole number"),
        ({**MOE, "n_shared_experts": -3}, "n_shared_experts is -3, not a whole number from 0"),
        ({**MOE, "first_k_dense_replace": -3}, "first_k_dense_replace is -3, not a whole number from 0"),
        ({**MOE, "decoder_sparse_step": 0}, "decoder_sparse_step is 0, not a whole number from 1"),
        ({**MOE, "mlp_only_layers": [-1]}, "mlp_only_layers[] is -1, not a whole number from 0 to 1"),
        ({**MLA, "kv_lora_rank": -5}, "kv_lora_rank is -5, not a whole number from 0"),
        ({**MLA, "q_lora_rank": -1}, "q_lora_rank is -1, not a whole number from 0"),
        ({"vision_config": {"hidden_size": -5}}, "vision_config.hidden_size is -5, not a whole number from 1"),
        ({"vision_config": {"hidden_size": 64, "patch_size": 0}}, "vision_config.patch_size is 0, not a whole number"),
        (
            {"quantization_config": {"quant_method": "gptq", "bits": -4, "group_size": 128}},
            "quantization_config.bits is -4, not from 1 to 16",
        ),
        # vLLM divides by the group size (all but -1), so a group of 0 is no per-channel checkpoint it can load.
        (
            {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 0}},
            "quantization_config.group_size is 0, which vLLM cannot load",
        ),
        (
            {"quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": 0}},
            "quantization_config.q_group_size is 0, which vLLM cannot load",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]}},
            "quantization_config.weight_block_size[] is 0, not from 1",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
            "quantization_config.weight_block_size is [128], not [rows, columns]",
        ),
        (
            {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": ["group_0"]}},
            "quantization_config.config_groups is ['group_0'], not the object of schemes compressed-tensors writes",
        ),
        (
            {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": [4]}}}},
            "quantization_config.config_groups[].weights is [4], not an object",
        ),
        ({"text_config": [1, 2]}, "text_config is [1, 2], not an object"),
        ({"text_config": {"layer_types": "full_attention"}}, "text_config.layer_types is 'full_attention', not a list"),
        ({"vision_config": "siglip"}, "vision_config is 'siglip', not an object"),
        ({"quantization_config": "fp8"}, "quantization_config is 'fp8', not an object"),
        ({"layer_types": "full_attention"}, "layer_types is 'full_attention', not a list"),
        (
            {"quantization_config": {"quant_method": "fp8", "ignore": "lm_head"}},
            "quantization_config.ignore is 'lm_head', not a list of module names",
        ),
        (
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "config_groups": {
                        "group_0": {
                            "targets": ["Linear"],
                            "weights": {"num_bits": 4, "type": "float", "group_size": -1},
                        }
                    },
                }
            },
            "quantization_config.group_size is -1, not from 1",
        ),
    ],
)
def test_a_config_json_field_out_of_its_range_is_refused_with_the_range(capsys, tmp_path, change, named):
    err = refused(capsys, tmp_path, {**TINY_LLAMA, **change})
    assert named in err


def test_kv_heads_that_do_not_split_the_query_heads_evenly_are_refused(capsys, tmp_path):
    err = refused(capsys, tmp_path, {**TINY_LLAMA, "num_key_value_heads": 3})
    assert "num_key_value_heads 3 does not divide num_attention_heads 4" in err


def test_a_hidden_size_below_the_head_count_without_head_dim_is_refused(capsys, tmp_path):
    err = refused(capsys, tmp_path, {**TINY_LLAMA, "hidden_size": 2})
    assert "hidden_size 2 / num_attention_heads 4 leaves no head_dim" in err


def test_text_from_the_config_json_reaches_the_terminal_escaped(capsys, tmp_path):
    err = refused(capsys, tmp_path, {**TINY_LLAMA, "layer_types": ["full_attention", "x\x1b[2J\u202e"]})
    assert "\x1b" not in err and "\u202e" not in err and "x\\x1b[2J\\u202e layers" in err
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "_name_or_path": "evil\x1b]0;pwned\x07"}))
    assert main(["plan", "--model", str(tmp_path / "config.json")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b]0;pwned\\x07" in out


def test_a_zero_sliding_window_and_a_per_channel_group_size_are_real_configs_and_plan(capsys, tmp_path):
    quantized = {"quant_method": "gptq", "bits": 4, "group_size": -1}
    (tmp_path / "config.json").write_text(
        json.dumps({**TINY_LLAMA, "sliding_window": 0, "quantization_config": quantized})
    )
    assert main(["plan", "--model", str(tmp_path)]) == 0


def test_every_preset_is_within_the_bounds_a_config_json_is_held_to():
    for preset in model_presets():
        load_model(preset.id)


@pytest.mark.parametrize(
    ("flags", "accepted"),
    [
        (["--gpu-memory", "1e30GiB"], "--gpu-memory: 1e30GiB is out of range: Plimsoll accepts 1 GiB to 4 TiB"),
        (["--tp", "100000000000000000000"], "accepts 1 to 1,024"),
        (["--pp", "4096"], "accepts 1 to 1,024"),
        (["--dp", "100000000000"], "accepts 1 to 1,024"),
        (["--ep-size", "100000"], "accepts 1 to 1,024"),
        (["--max-num-seqs", "100000000000000000000"], "accepts 1 to 1,048,576"),
        (["--max-num-batched-tokens", "1000000000000000000"], "accepts 1 to 1,073,741,824"),
        (["--block-size", "100000000000000"], "accepts 1 to 1,073,741,824"),
        (["--max-model-len", "999999T"], "accepts 1 to 1,073,741,824"),
        # vLLM's auto-fit shrinks the context to the KV pool at startup: no length to plan, so not the model's maximum.
        (["--max-model-len", "-1"], "-1 and auto are vLLM's auto-fit"),
        (["--max-model-len", "auto"], "which Plimsoll does not plan: leave the flag out to plan the model's maximum"),
        (
            ["--from", "vllm serve llama-3.1-8b --max-model-len -1"],
            "--from: --max-model-len -1: argument --max-model-len",
        ),
        (["--kv-cache-memory", "1e30GiB"], "accepts up to 4 TiB"),
        (["--kv-cache-memory-bytes", "99999T"], "accepts up to 4T"),
        (["--concurrency", "100000000000000000000", "--context", "1000"], "accepts 1 to 10,000,000"),
        (["--concurrency", "10", "--context", "100000000000000000000"], "accepts 1 to 1,073,741,824"),
        (["--concurrency", "10", "--prompt-tokens", "100000000000000000000", "--output-tokens", "1"], "accepts 1 to"),
        (["--from", "vllm serve llama-3.1-8b --tensor-parallel-size 99999"], "accepts 1 to 1,024"),
        (["--gpu-memory", "1e308GiB"], "too large"),
        (["--kv-cache-memory", "1e308TiB"], "too large"),
        (["--max-num-batched-tokens", "9" * 400 + ".5K"], "accepts 1 to 1,073,741,824"),
    ],
)
def test_a_numeric_flag_out_of_its_range_is_refused_with_the_range(capsys, flags, accepted):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--model", "llama-3.1-8b", *flags])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and accepted in err and "Traceback" not in err


# Every key the reader takes a number, a list or a name from, across the dense, MoE, MLA and multimodal shapes.
_FIELDS = [
    *TINY_LLAMA,
    *MOE,
    *MLA,
    "head_dim", "sliding_window", "sliding_window_pattern", "torch_dtype", "layer_types", "moe_intermediate_size",
    "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace", "mlp_only_layers",
    "decoder_sparse_step", "q_lora_rank", "rope_scaling", "vision_config", "quantization_config", "text_config",
    "interleave_moe_layer_step", "intermediate_size_mlp", "top_k_experts", "enable_moe_block", "global_head_dim",
    "num_global_key_value_heads", "attention_k_eq_v", "num_kv_shared_layers",
]  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(_FIELDS), value=_JSON, shape=st.sampled_from([{}, MOE, MLA]))
def test_any_value_in_any_field_is_refused_by_name_or_planned_with_sane_dimensions(field, value, shape):
    try:
        arch = from_hf_config({**TINY_LLAMA, **shape, field: value}, source="config.json")
    except ModelConfigError as error:
        assert str(error).startswith("config.json: ") and "\x1b" not in str(error)
        return
    assert min(arch.head_dim, arch.num_kv_heads, arch.hidden_size, arch.vocab_size) >= 1
    assert arch.num_attention_heads % arch.num_kv_heads == 0
    assert plan(arch, find_gpu("H100"), Deployment()).pool.tokens >= 0


def test_control_characters_in_a_pasted_command_line_or_a_path_reach_the_terminal_escaped(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["plan", "--from", "vllm serve llama-3.1-8b --evil\x1b[2J"])
    err = capsys.readouterr().err
    assert "\x1b" not in err and "--evil\\x1b[2J is not a vllm flag" in err
    folder = tmp_path / "m\x1b]0;pwned\x07"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, "head_dim": -1}))
    assert main(["plan", "--model", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "m\\x1b]0;pwned\\x07" in err and "head_dim is -1" in err


def test_a_config_json_at_every_upper_bound_plans_in_bounded_time(capsys, tmp_path):
    # The plan sizes layer by layer and re-plans for its suggestions: the bounds also bound what a file can cost.
    at_the_bounds = {
        **TINY_LLAMA,
        "hidden_size": 1_048_576, "intermediate_size": 1_048_576, "num_hidden_layers": 1024,
        "num_attention_heads": 65_536, "num_key_value_heads": 65_536, "head_dim": 65_536, "vocab_size": 16_777_216,
        "max_position_embeddings": 1_073_741_824, "sliding_window": 4096, "num_local_experts": 65_536,
        "num_experts_per_tok": 65_536, "vision_config": {"hidden_size": 1_048_576, "num_hidden_layers": 1_048_576},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(at_the_bounds))
    started = time.monotonic()
    assert main(["plan", "--model", str(tmp_path)]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert time.monotonic() - started < 30, "a config.json at the bounds took too long to plan"


def test_a_name_in_the_config_json_longer_than_any_repository_id_is_not_shown(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "_name_or_path": "org/" + "x" * 100_000}))
    assert main(["plan", "--model", str(tmp_path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == tmp_path.name


@pytest.mark.parametrize("flag", ["--model", "--gpu"])
def test_an_unknown_model_or_gpu_name_is_quoted_cut_short(capsys, flag):
    argv = ["--model", "llama-3.1-8b", "--gpu", "ab" * 50_000] if flag == "--gpu" else ["--model", "ab" * 50_000]
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert "unknown" in err and "abab'..." in err and len(err) < 1000
