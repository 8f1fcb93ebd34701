"""Parameter counts against the totals the model authors publish, and quantized weight sizes."""

import pytest

from exporter.capacity.deployment import pipeline_stages
from exporter.capacity.quantization import from_config, from_flag
from exporter.capacity.weights import count_parameters, weight_breakdown
from exporter.catalog import load_model

GIB = 1024**3

# Totals from the model cards / safetensors metadata on the Hugging Face hub.
PUBLISHED = {
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
    "llama-3.2-1b": 1.24e9,
    "mistral-7b": 7.25e9,
    "mixtral-8x7b": 46.7e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "qwen3-30b-a3b": 30.5e9,
    "qwen3-235b-a22b": 235e9,
    "deepseek-v3": 671e9,
    "gemma-2-9b": 9.24e9,
    "gemma-3-27b": 27.4e9,
    "phi-4": 14.7e9,
    "gpt-oss-20b": 20.9e9,
    "gpt-oss-120b": 116.8e9,
}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_parameter_count_matches_published_total_within_half_a_percent(preset):
    counted = count_parameters(load_model(preset))
    assert counted == pytest.approx(PUBLISHED[preset], rel=0.005)


def test_llama_3_1_8b_parameter_count_is_exact():
    assert count_parameters(load_model("llama-3.1-8b")) == 8_030_261_248


def test_tensor_parallel_splits_weights_but_not_replicated_parts():
    arch = load_model("llama-3.1-70b")
    one, four = weight_breakdown(arch, tp=1), weight_breakdown(arch, tp=4)
    assert four.per_gpu_bytes == pytest.approx(one.per_gpu_bytes / 4, rel=0.001)
    assert four.other_bytes == one.other_bytes  # norms are whole on every rank


def test_tied_embeddings_hold_no_separate_lm_head():
    arch = load_model("llama-3.2-1b")
    assert arch.tie_word_embeddings
    assert weight_breakdown(arch).lm_head_bytes == 0


def test_pipeline_stage_holds_its_layers_and_one_vocabulary_matrix():
    arch = load_model("llama-3.1-70b")
    first, last = (weight_breakdown(arch, stage=stage) for stage in pipeline_stages(arch.num_layers, 2))
    whole = weight_breakdown(arch)
    assert first.layers_on_gpu == last.layers_on_gpu == 40
    assert first.attention_bytes == whole.attention_bytes // 2
    assert (first.embedding_bytes, first.lm_head_bytes) == (whole.embedding_bytes, 0)
    assert (last.embedding_bytes, last.lm_head_bytes) == (0, whole.lm_head_bytes)


def test_a_middle_pipeline_stage_holds_no_vocabulary_matrix_and_tied_ends_hold_one_each():
    arch = load_model("llama-3.2-1b")  # tied embeddings: one matrix when one GPU holds the whole model
    first, middle, last = (weight_breakdown(arch, stage=stage) for stage in pipeline_stages(arch.num_layers, 3))
    assert middle.embedding_bytes == middle.lm_head_bytes == 0
    assert first.embedding_bytes == last.lm_head_bytes == weight_breakdown(arch).embedding_bytes


def test_awq_4bit_costs_scales_and_zeros_on_top_of_half_a_byte():
    quant = from_config({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"})
    assert quant.bytes_per_weight == pytest.approx(0.5 + (2 + 0.5) / 128)


def test_quantization_keeps_embeddings_and_lm_head_in_16_bits():
    arch = load_model("llama-3.1-8b")
    fp8 = weight_breakdown(arch, quantization=from_config({"quant_method": "fp8"}))
    plain = weight_breakdown(arch)
    assert fp8.embedding_bytes == plain.embedding_bytes
    assert fp8.attention_bytes == plain.attention_bytes // 2


def test_mxfp4_quantizes_only_the_experts():
    arch = load_model("gpt-oss-20b")  # 24 layers of 32 experts, hidden = expert width = 2880
    assert arch.quantization is not None and arch.quantization.method == "mxfp4"
    weights = weight_breakdown(arch)
    # gate/up/down with the hidden side padded to 3072 for vLLM's MXFP4 kernels, plus their biases
    expert_params = 24 * 32 * (3 * 3072 * 2880 + 2 * 2880 + 2880)
    assert weights.expert_bytes == round(expert_params * (0.5 + 1 / 32))
    attention_params = 24 * (2 * 2880 * 64 * 64 + 2 * 2880 * 8 * 64 + 64 * 64 + 2 * 8 * 64)  # q, o, k, v, biases
    assert weights.attention_bytes == attention_params * 2  # attention stays 16-bit


def test_symmetric_gptq_drops_zero_points_on_marlin():
    sym = from_config({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False})
    asym = from_config({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False})
    assert sym.bytes_per_weight == pytest.approx(0.5 + 2 / 128)  # packed weights and fp16 scales only
    assert asym.bytes_per_weight == pytest.approx(0.5 + (2 + 0.5) / 128)


def test_gptq_4bit_llama_31_8b_by_hand():
    # 6,979,321,856 linear weights x (0.5 + 2/128) + 2 x 128,256 x 4,096 x 2 (embedding, lm_head)
    # + 131,072 x 128 x 2 (rotary cache) + 65 x 4,096 x 2 (norms) = 5,734,146,048 bytes (5.3404 GiB). The Kaitchup's
    # v0.5.4 log of this checkpoint printed 5.3494 GiB.
    quant = from_config({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True})
    assert weight_breakdown(load_model("llama-3.1-8b"), quantization=quant).per_gpu_bytes == 5_734_146_048


def test_bitsandbytes_absmax_is_float32_in_current_vllm_and_nested_before():
    online = from_flag("bitsandbytes")  # in-flight nf4: compress_statistics=True
    assert online.bytes_per_weight_in(None) == pytest.approx(0.5 + 4 / 64)
    assert online.bytes_per_weight_in((0, 5)) == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256))
    plain = from_config({"quant_method": "bitsandbytes", "load_in_4bit": True})
    assert plain.bytes_per_weight_in((0, 5)) == plain.bytes_per_weight_in(None) == pytest.approx(0.5 + 4 / 64)


def test_inflight_bitsandbytes_llama_31_8b_by_hand():
    # v0.5.4: 6,979,321,856 x (0.5 + 1/64 + 4/16,384) + 2,101,346,304 (embedding, lm_head)
    # + 33,554,432 (rotary) + 532,480 (norms) = 5,735,849,984 bytes = 5.3419 GiB; the Kaitchup log printed 5.3421.
    arch = load_model("llama-3.1-8b")
    weights = weight_breakdown(arch, quantization=from_flag("bitsandbytes"), vllm_version=(0, 5))
    assert weights.per_gpu_bytes == 5_735_849_984
