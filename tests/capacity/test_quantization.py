"""Quantized formats priced as their `quantization_config` says, with the modules each leaves 16-bit.

Each block below has the shape of the named checkpoint's `quantization_config` (its config.json, or
hf_quant_config.json), written after it rather than copied byte for byte: the fields the parser reads are the
checkpoint's, other fields may be left out. The per-layer ignore entries and the GPTQModel `dynamic` rules are
constructed to exercise the parser. The bytes per weight are what vLLM holds after loading (see
exporter/capacity/quantization.py for its files).
"""

import pytest

from exporter.capacity.quantization import (
    ALL_LAYERS,
    PART_ATTENTION,
    PART_EXPERTS,
    PART_MLP,
    QuantizationError,
    from_config,
)
from exporter.capacity.weights import weight_breakdown
from exporter.catalog import load_model

QWEN_7B = load_model("qwen2.5-7b")
GPT_OSS = load_model("gpt-oss-20b")

# RedHatAI/Qwen2.5-7B-Instruct-FP8-dynamic, config.json (llm-compressor FP8_DYNAMIC scheme)
FP8_DYNAMIC = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False, "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}
# llm-compressor FP8 (static, per tensor), e.g. RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8
FP8_STATIC = {
    **FP8_DYNAMIC,
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
        }
    },
}
# llm-compressor FP8_BLOCK (examples/model_free_ptq/glm_4.6_fp8_block.py ignores routers, head and embeddings)
FP8_BLOCK = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
        }
    },
    "ignore": ["re:.*gate$", "lm_head", "model.embed_tokens"],
}
# RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8, config.json (INT8 W8A8, per-channel weights)
INT8_W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}
# RedHatAI/Qwen2.5-7B-Instruct-quantized.w4a16, config.json (W4A16, group 128, symmetric)
W4A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True},
        }
    },
    "ignore": ["lm_head"],
}
# llm-compressor NVFP4 scheme for a Qwen VL model (vision tower, projector and head left out)
NVFP4_CT = {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
            "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
        }
    },
    "ignore": ["re:.*lm_head", "re:.*visual.*", "re:.*vision.*"],
}
# Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4, config.json
GPTQ_INT4 = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq", "damp_percent": 0.01}
# Qwen/Qwen2.5-VL-7B-Instruct-AWQ, config.json: the vision tower stays bf16
AWQ_VL = {
    "bits": 4,
    "group_size": 128,
    "modules_to_not_convert": ["visual"],
    "quant_method": "awq",
    "version": "gemm",
    "zero_point": True,
}
# nvidia MiniMax-M2 NVFP4 (ModelOpt) config.json: attention and routers left out in every layer
MODELOPT_NVFP4 = {
    "quant_algo": "NVFP4",
    "quant_method": "modelopt",
    "weights": {"num_bits": 4, "type": "float", "group_size": 16},
    "input_activations": {"num_bits": 4, "type": "float", "group_size": 16},
    "ignore": ["lm_head", "model.layers.*.block_sparse_moe.gate", "model.layers.*.self_attn*"],
}
# An older ModelOpt export's hf_quant_config.json, whose block config.json carries under `quantization`
MODELOPT_FP8_NESTED = {
    "quant_method": "modelopt",
    "producer": {"name": "modelopt", "version": "0.19.0"},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
}
# openai/gpt-oss-20b, config.json
GPT_OSS_MXFP4 = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}


@pytest.mark.parametrize(
    ("config", "method", "bytes_per_weight"),
    [
        pytest.param(FP8_DYNAMIC, "fp8", 1.0, id="ct-fp8-dynamic"),
        pytest.param(FP8_STATIC, "fp8", 1.0, id="ct-fp8-static"),
        pytest.param(FP8_BLOCK, "fp8", 1 + 4 / 128**2, id="ct-fp8-block"),
        pytest.param(INT8_W8A8, "int", 1.0, id="ct-int8-w8a8"),
        pytest.param(W4A16, "int", 0.5 + 2 / 128, id="ct-w4a16-g128"),
        pytest.param(NVFP4_CT, "nvfp4", 0.5 + 1 / 16, id="ct-nvfp4"),
        pytest.param(GPTQ_INT4, "gptq", 0.5 + 2 / 128, id="gptq-int4-marlin"),
        pytest.param(AWQ_VL, "awq", 0.5 + 2.5 / 128, id="awq"),
        pytest.param(MODELOPT_NVFP4, "nvfp4", 0.5 + 1 / 16, id="modelopt-nvfp4"),
        pytest.param(MODELOPT_FP8_NESTED, "fp8", 1.0, id="modelopt-fp8-nested"),
        pytest.param(GPT_OSS_MXFP4, "mxfp4", 0.5 + 1 / 32, id="mxfp4"),
    ],
)
def test_each_format_costs_what_vllm_holds_after_loading(config, method, bytes_per_weight):
    quant = from_config(config)
    assert (quant.method, quant.bytes_per_weight) == (method, pytest.approx(bytes_per_weight))


@pytest.mark.parametrize(
    "config",
    [FP8_DYNAMIC, FP8_BLOCK, INT8_W8A8, W4A16, NVFP4_CT, AWQ_VL, MODELOPT_FP8_NESTED],
    ids=["fp8-dynamic", "fp8-block", "w8a8", "w4a16", "nvfp4-vl", "awq-vl", "modelopt-fp8"],
)
def test_ignoring_only_the_head_routers_or_vision_tower_quantizes_the_whole_decoder(config):
    quant = from_config(config)
    assert quant.kept_16bit == frozenset()
    assert all(quant.quantizes(part, 0) for part in (PART_ATTENTION, PART_MLP, PART_EXPERTS))


def test_modelopt_nvfp4_that_leaves_attention_out_keeps_it_16_bit_in_every_layer():
    quant = from_config(MODELOPT_NVFP4)
    assert quant.kept_16bit == {(PART_ATTENTION, ALL_LAYERS)}
    nvfp4 = weight_breakdown(QWEN_7B, quantization=quant)
    plain = weight_breakdown(QWEN_7B)
    everything = weight_breakdown(QWEN_7B, quantization=from_config({**MODELOPT_NVFP4, "ignore": ["lm_head"]}))
    assert nvfp4.attention_bytes == plain.attention_bytes
    assert nvfp4.mlp_bytes == everything.mlp_bytes == pytest.approx(plain.mlp_bytes / 2 * (0.5 + 1 / 16))
    assert everything.attention_bytes < plain.attention_bytes / 3


def test_an_ignore_entry_naming_one_layer_keeps_only_that_layer_16_bit():
    # llm-compressor writes the modules it skipped by name when a recipe excludes a layer's MLP
    quant = from_config({**W4A16, "ignore": ["lm_head", "model.layers.0.mlp.down_proj", "model.layers.27"]})
    assert not quant.quantizes(PART_MLP, 0) and quant.quantizes(PART_ATTENTION, 0)
    assert not quant.quantizes(PART_ATTENTION, 27) and quant.quantizes(PART_MLP, 1)
    partial = weight_breakdown(QWEN_7B, quantization=quant)
    full = weight_breakdown(QWEN_7B, quantization=from_config(W4A16))
    plain = weight_breakdown(QWEN_7B)
    layers = QWEN_7B.num_layers
    assert partial.mlp_bytes == pytest.approx(full.mlp_bytes * (layers - 2) / layers + plain.mlp_bytes * 2 / layers)


def test_gptqmodel_negative_dynamic_rule_leaves_its_modules_16_bit():
    quant = from_config({**GPTQ_INT4, "dynamic": {r"-:.*\.mlp\..*": {}, r"+:.*self_attn.*": {"bits": 8}}})
    assert quant.kept_16bit == {(PART_MLP, ALL_LAYERS), (PART_EXPERTS, ALL_LAYERS)}


def test_mxfp4_quantizes_the_experts_and_leaves_attention_16_bit():
    quant = from_config(GPT_OSS_MXFP4)
    assert quant.quantizes(PART_EXPERTS, 3) and not quant.quantizes(PART_ATTENTION, 3)
    weights = weight_breakdown(GPT_OSS, quantization=quant)
    assert weights.attention_bytes == weight_breakdown(GPT_OSS).attention_bytes


def test_gptq_off_marlin_keeps_its_zero_points():
    # 3-bit GPTQ (and asymmetric, or an odd group size) runs on the plain GPTQ kernel, which keeps qzeros
    three_bit = from_config({**GPTQ_INT4, "bits": 3})
    odd_group = from_config({**GPTQ_INT4, "group_size": 256})
    assert three_bit.bytes_per_weight == pytest.approx(3 / 8 + (2 + 3 / 8) / 128)
    assert odd_group.bytes_per_weight == pytest.approx(0.5 + 2.5 / 256)


def test_gptq_act_order_prices_like_the_same_checkpoint_without_it():
    assert from_config({**GPTQ_INT4, "desc_act": True}) == from_config(GPTQ_INT4)


def test_asymmetric_w4a16_carries_a_zero_point_per_group():
    asym = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64, "symmetric": False}
    quant = from_config({**W4A16, "config_groups": {"group_0": {"targets": ["Linear"], "weights": asym}}})
    assert quant.bytes_per_weight == pytest.approx(0.5 + 2.5 / 64)


def test_an_unknown_modelopt_algorithm_is_refused_by_name():
    with pytest.raises(QuantizationError, match="quant_algo 'W4A8_AWQ'"):
        from_config({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"})
