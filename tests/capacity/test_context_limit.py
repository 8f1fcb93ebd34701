"""The longest context an engine accepts, from max_position_embeddings and rope_scaling as vLLM and SGLang derive it:
a YaRN model may be served past its declared length, Llama 3.1's "llama3" scaling may not."""

import json

import pytest

from exporter.capacity.architecture import from_hf_config
from exporter.capacity.deployment import Deployment
from exporter.capacity.plan import PlanError, check_inputs, plan
from exporter.catalog import find_gpu, find_model_preset, load_model
from exporter.cli import main

# What the Qwen2.5 and Qwen3 model cards tell users to add to config.json for 128K contexts.
QWEN25_YARN = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def preset_config(preset: str, **changes: object) -> dict:
    return {**find_model_preset(preset).config, **changes}


def test_yarn_lengthens_qwen25_to_the_factor_times_its_original_length_in_vllm():
    arch = from_hf_config(preset_config("qwen2.5-7b", rope_scaling=QWEN25_YARN), "config.json")
    limit = arch.context_limit("vllm")
    assert limit.tokens == 131072
    assert limit.derivation == "original_max_position_embeddings 32768 x yarn factor 4"
    check_inputs(arch, find_gpu("H100"), Deployment(max_model_len=131072))
    with pytest.raises(PlanError, match="maximum of 131072 tokens"):
        check_inputs(arch, find_gpu("H100"), Deployment(max_model_len=131073))


def test_yarn_starts_from_rope_scalings_original_length_not_max_position_embeddings():
    # Qwen3-8B declares 40960 positions; vLLM's YaRN length is 32768 x 4, not 40960 x 4.
    arch = from_hf_config(preset_config("qwen3-8b", rope_scaling=QWEN3_YARN), "config.json")
    assert arch.max_position_embeddings == 40960
    assert arch.context_limit("vllm").tokens == 131072


def test_sglang_keeps_max_position_embeddings_for_yarn_with_an_original_length():
    arch = from_hf_config(preset_config("qwen2.5-7b", rope_scaling=QWEN25_YARN), "config.json")
    assert arch.context_limit("sglang").tokens == 32768
    with pytest.raises(PlanError, match="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        check_inputs(arch, find_gpu("H100"), Deployment(engine="sglang", max_model_len=65536))


def test_the_default_max_model_len_is_the_derived_maximum_as_in_vllm():
    arch = from_hf_config(preset_config("qwen2.5-7b", rope_scaling=QWEN25_YARN), "config.json")
    assert plan(arch, find_gpu("H200"), Deployment()).deployment.max_model_len == 131072


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_llama31_llama3_rope_type_does_not_lengthen_the_declared_131072(engine):
    arch = load_model("llama-3.1-8b")
    assert arch.rope_scaling is not None and arch.rope_scaling.factor == 8
    assert arch.context_limit(engine).tokens == 131072


@pytest.mark.parametrize(
    ("preset", "tokens"),
    [
        ("deepseek-v3", 163840),  # yarn under the old "type" key: 4096 x 40
        ("gpt-oss-20b", 131072),  # yarn: 4096 x 32
        ("gemma-3-27b", 131072),  # linear x 8 is already counted in Gemma 3's max_position_embeddings
        ("phi-3.5-mini", 131072),  # longrope
        ("internlm2.5-7b", 65536),  # dynamic x 2 over 32768
        ("qwen3-8b", 40960),  # no rope_scaling
    ],
)
def test_presets_get_the_maximum_vllm_derives(preset, tokens):
    assert load_model(preset).context_limit("vllm").tokens == tokens


def test_plan_accepts_a_yarn_models_long_context_and_refuses_beyond_it(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(preset_config("qwen2.5-7b", rope_scaling=QWEN25_YARN)))
    argv = ["plan", "--model", str(config), "--gpu", "H200"]
    assert main([*argv, "--max-model-len", "131072"]) == 0
    assert main([*argv, "--max-model-len", "262144"]) == 2
    assert "(original_max_position_embeddings 32768 x yarn factor 4)" in capsys.readouterr().err
