"""Vision-language models: the language model read from the nested config, the vision tower and projector in the
weights, and the encoder's pass over vLLM's dummy images in the profiling run, with the flags that change it.

The configs are the presets' real config.json files (each preset's `_preset.source` names where it came from).
"""

import dataclasses
import json

import pytest

from exporter.capacity.activation import encoder_pass_bytes, encoder_profile
from exporter.capacity.architecture import ModelConfigError, from_hf_config
from exporter.capacity.deployment import Deployment
from exporter.capacity.kv import kv_layout
from exporter.capacity.plan import plan
from exporter.capacity.uncertainty import kv_cache_tokens_range
from exporter.capacity.weights import count_parameters, weight_breakdown
from exporter.catalog import find_gpu, find_model_preset, load_model
from exporter.cli import main

GIB = 1024**3

# (KV bytes per token of the language model, 16-bit; total parameters published: the Hub's safetensors metadata,
# or the model card where the preset's _preset.notes say so)
FAMILIES = {
    "qwen2.5-vl-7b": (2 * 4 * 128 * 2 * 28, 8.29e9),
    "qwen3-vl-4b": (2 * 8 * 128 * 2 * 36, 4.44e9),
    "gemma-3-4b": (None, 4.30e9),  # sliding-window hybrid: per-token bytes depend on the context
    "gemma-3-27b": (None, 27.4e9),
    "mistral-small-3.1-24b": (2 * 8 * 128 * 2 * 40, 24.0e9),
    # Model card: "109B total" and "400B total"; every layer keeps a full KV cache (vLLM's default for Llama 4).
    "llama-4-scout-17b-16e": (2 * 8 * 128 * 2 * 48, 109e9),
    "llama-4-maverick-17b-128e": (2 * 8 * 128 * 2 * 48, 400e9),
}


@pytest.mark.parametrize("preset", sorted(FAMILIES))
def test_the_whole_checkpoint_vision_tower_included_matches_its_published_total(preset):
    assert count_parameters(load_model(preset)) == pytest.approx(FAMILIES[preset][1], rel=0.005)


@pytest.mark.parametrize("preset", sorted(p for p, (kv, _) in FAMILIES.items() if kv))
def test_kv_bytes_per_token_are_the_language_models(preset):
    arch = load_model(preset)
    assert kv_layout(arch, 1, None, 2).bytes_per_token == FAMILIES[preset][0]


def test_qwen2_5_vl_vision_tower_counts_a_swiglu_vit_and_its_patch_merger():
    vision = load_model("qwen2.5-vl-7b").vision
    assert vision is not None
    assert (vision.hidden_size, vision.num_layers, vision.gated_mlp) == (1280, 32, True)
    # Qwen2.5-VL's ViT and merger are 0.67B of the 8.29B; the text model alone (qwen2.5-7b) is 7.62B.
    text_only = count_parameters(load_model("qwen2.5-7b"))
    assert count_parameters(load_model("qwen2.5-vl-7b")) - text_only == pytest.approx(0.675e9, rel=0.01)


def test_llama4_scout_puts_a_shared_expert_beside_the_routed_ones_in_every_layer():
    moe = load_model("llama-4-scout-17b-16e").moe
    assert moe is not None
    assert (moe.num_experts, moe.experts_per_token, moe.dense_layers) == (16, 1, frozenset())
    # Without the shared expert (8192 wide, every layer) the count falls 6.04B short of the card's 109B.
    assert (moe.expert_intermediate_size, moe.shared_intermediate_size) == (8192, 8192)


def test_llama4_maverick_alternates_dense_and_moe_layers():
    arch = load_model("llama-4-maverick-17b-128e")
    assert arch.moe is not None
    # interleave_moe_layer_step 2: layers 1, 3, ..., 47 are MoE, the even ones dense MLPs of intermediate_size_mlp.
    assert arch.moe.dense_layers == frozenset(range(0, 48, 2))
    assert (arch.intermediate_size, arch.moe.expert_intermediate_size) == (16384, 8192)


def test_llama4_on_h100s_plans_through_the_cli(capsys):
    argv = ["plan", "--model", "meta-llama/Llama-4-Scout-17B-16E-Instruct", "--gpu", "H100", "--tp", "4"]
    assert main([*argv, "--max-model-len", "65536", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["kv_cache_bytes"] > 0


# LLAVA_NEXT_7B_CONFIG in NVIDIA TensorRT-LLM's tests/unittest/_torch/modeling/test_modeling_llava_next.py (commit
# 380e542681475b6c003a88ed737206f8596d9f0e): llava-hf/llava-v1.6-mistral-7b-hf's config.json with the vision tower cut
# to 2 layers for that test ("24 layers for full model"), so it checks the reader, not a parameter total. Its
# text_config lists only what differs from transformers' MistralConfig: no hidden_size, layers or attention heads.
LLAVA_NEXT_MISTRAL_7B = {
    "architectures": ["LlavaNextForConditionalGeneration"],
    "ignore_index": -100,
    "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
    "image_token_index": 32000,
    "model_type": "llava_next",
    "projector_hidden_act": "gelu",
    "text_config": {
        "_name_or_path": "mistralai/Mistral-7B-Instruct-v0.2",
        "architectures": ["MistralForCausalLM"],
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "torch_dtype": "bfloat16",
        "vocab_size": 32064,
    },
    "torch_dtype": "float16",
    "transformers_version": "4.39.0.dev0",
    "use_image_newline_parameter": True,
    "vision_config": {
        "hidden_size": 1024,
        "image_size": 336,
        "intermediate_size": 4096,
        "model_type": "clip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 2,
        "patch_size": 14,
        "projection_dim": 768,
        "vocab_size": 32000,
    },
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "vocab_size": 32064,
}


def test_a_nested_mistral_text_config_takes_transformers_defaults_for_the_keys_it_leaves_out():
    arch = from_hf_config(LLAVA_NEXT_MISTRAL_7B, "config.json")
    assert (arch.hidden_size, arch.num_layers, arch.num_attention_heads, arch.num_kv_heads) == (4096, 32, 32, 8)
    assert (arch.head_dim, arch.vocab_size, arch.sliding_window) == (128, 32064, None)
    assert kv_layout(arch, 1, None, 2).bytes_per_token == 2 * 8 * 128 * 2 * 32
    # The language model is Mistral 7B's (the mistral-7b preset, v0.3) but for its 32064-token vocabulary.
    text_only = count_parameters(dataclasses.replace(arch, vision=None))
    mistral = load_model("mistral-7b")
    assert text_only - count_parameters(mistral) == (32064 - mistral.vocab_size) * 4096 * 2


def test_the_largest_llava_next_image_is_the_base_tile_and_a_2_x_2_grid():
    vision = from_hf_config(LLAVA_NEXT_MISTRAL_7B, "config.json").vision
    assert vision is not None
    # 24 x 24 patches a 336 px tile: 576 for the base view, 48 x 48 for 672 x 672 and a newline token a row.
    assert vision.image_tokens == 576 + 48 * 48 + 48


def test_a_nested_mistral_text_config_that_leaves_out_its_window_and_positions_gets_transformers_defaults():
    # transformers' MistralConfig: sliding_window 4096, max_position_embeddings 4096 * 32 (what vLLM then reads).
    text = dict(LLAVA_NEXT_MISTRAL_7B["text_config"])
    del text["sliding_window"], text["max_position_embeddings"]
    arch = from_hf_config({**LLAVA_NEXT_MISTRAL_7B, "text_config": text}, "config.json")
    assert (arch.sliding_window, arch.max_position_embeddings) == (4096, 131072)


def test_the_llava_next_preset_is_that_copy_with_the_24_vision_layers_its_note_gives():
    tower = {**LLAVA_NEXT_MISTRAL_7B["vision_config"], "num_hidden_layers": 24}
    assert find_model_preset("llava-hf/llava-v1.6-mistral-7b-hf").config == {
        **LLAVA_NEXT_MISTRAL_7B,
        "vision_config": tower,
    }


def test_the_llava_next_preset_prices_the_logged_start_to_its_weights_and_kv_tokens():
    # bench/data's VLM_vLLM log: vLLM 0.10.2 on an 80 GB H100, float16, max-model-len 4096, 16,384 batched tokens
    # (5 images of 2,928 tokens profiled): 14.0786 GiB of weights and 451,744 KV tokens.
    deployment = Deployment(
        max_model_len=4096,
        max_num_batched_tokens=16384,
        dtype="float16",
        gpu_memory_utilization=0.9,
        vllm_version=(0, 10),
    )
    result = plan(load_model("llava-v1.6-mistral-7b"), find_gpu("H100"), deployment)
    assert result.weights.per_gpu_bytes == pytest.approx(14.0786 * GIB, rel=0.005)
    assert result.pool.tokens == pytest.approx(451_744, rel=0.01)


def test_a_top_level_mistral_config_still_names_its_own_shape():
    config = dict(LLAVA_NEXT_MISTRAL_7B["text_config"])
    with pytest.raises(ModelConfigError, match="hidden_size"):
        from_hf_config(config, "config.json")


def test_the_language_model_may_be_nested_as_llm_config():
    # InternVL's chat checkpoints nest the language model as llm_config and shuffle 2 x 2 patches into a token.
    config = {
        "model_type": "internvl_chat",
        "downsample_ratio": 0.5,
        "max_dynamic_patch": 12,
        "use_thumbnail": True,
        "llm_config": {
            "model_type": "qwen2",
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_position_embeddings": 32768,
            "vocab_size": 151674,
        },
        "vision_config": {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "image_size": 448,
            "patch_size": 14,
        },
    }
    arch = from_hf_config(config, "config.json")
    assert (arch.hidden_size, arch.num_layers, arch.num_kv_heads) == (3584, 28, 4)
    assert arch.vision is not None
    # 13 tiles (12 and a thumbnail) of 32 x 32 patches, 256 tokens each after the pixel shuffle.
    assert (arch.vision.image_tokens, arch.vision.image_patches) == (13 * 256, 13 * (1024 + 1))
    assert arch.vision.projector == ((4096, 3584), (3584, 3584))


def test_the_encoder_budget_is_the_largest_image_when_it_exceeds_the_batched_tokens():
    # Qwen2.5-VL's largest image is 16,384 tokens: the L4 log in bench/data at max-model-len 2048 defaulted the encoder
    # cache budget to 16,384 and profiled one image.
    profile = encoder_profile(load_model("qwen2.5-vl-7b"), Deployment(), 2048, 2048, 256)
    assert profile is not None
    assert (profile.items, profile.tokens_per_item, profile.budget) == (1, 16384, 16384)


def test_the_encoder_budget_fits_as_many_largest_images_as_the_batched_tokens_hold():
    # The v0.19 H100 log of Mistral Small 3.1 (bench/data: mistral-small-31-24b-w8a8-h100-tp1-v0190-llmdplanner):
    # "Encoder cache will be initialized with a budget of 8192 tokens, and profiled with 2 image items".
    profile = encoder_profile(load_model("mistral-small-3.1-24b"), Deployment(), 8192, 8192, 1024)
    assert profile is not None
    assert (profile.items, profile.budget) == (2, 8192)
    assert profile.tokens_per_item == 55 * 55 + 55  # 1540 px / 14 px / merge 2, and a break token a row


def test_the_images_a_prompt_may_hold_bound_the_profiling_batch():
    arch = load_model("gemma-3-4b")  # 256 tokens an image
    assert encoder_profile(arch, Deployment(), 8192, 8192, 1024).items == 32
    one_each = Deployment(mm_limits=(("image", 1),))
    assert encoder_profile(arch, one_each, 8192, 8192, 4).items == 4  # 4 sequences of one image


def test_the_encoder_pass_holds_the_pixels_as_float32_and_as_a_model_dtype_copy():
    # vLLM v0.9.0.1's profile_run moves the processor's float32 pixels to the GPU unconverted and holds them
    # through the pass; Qwen2.5-VL's _process_image_input casts them to bfloat16 for the tower (citations in
    # activation.encoder_pass_bytes). One 16,384-token image is 65,536 patches of 3 x 2 x 14 x 14 pixel values.
    arch = load_model("qwen2.5-vl-7b")
    profile = encoder_profile(arch, Deployment(), 2048, 2048, 256)
    assert profile is not None
    pixels = 3 * 2 * 14 * 14
    activations = 3 * 1280 + 3 * 3420  # residual, normed input, block output; gate, up and their product
    per_patch = (activations + pixels) * 2 + pixels * 4
    assert encoder_pass_bytes(arch, profile, 1, "weights", 2) == 65_536 * per_patch


def test_a_text_model_has_no_encoder_pass():
    assert encoder_profile(load_model("qwen2.5-7b"), Deployment(), 2048, 2048, 256) is None


L4_LOG_TOKENS = 33_824  # bench/data's tsailiming log: Qwen2.5-VL-7B on an L4, max-model-len 2048, weights 15.63 GiB
L4_LOG_WEIGHTS = 15.63 * GIB
# The log's vLLM budgets 0.9 of the GPU and keeps CUDA graphs outside it, as vLLM before 0.21 did.
L4_LOG_DEPLOYMENT = Deployment(max_model_len=2048, vllm_version=(0, 10))


def test_qwen2_5_vl_on_an_l4_reserves_the_encoder_pass_and_its_range_holds_the_logged_tokens():
    arch, gpu = load_model("qwen2.5-vl-7b"), find_gpu("L4")
    result = plan(arch, gpu, L4_LOG_DEPLOYMENT)
    text_only = plan(arch, gpu, Deployment(max_model_len=2048, vllm_version=(0, 10), mm_limits=(("image", 0),)))
    # The dummy image (65,536 patches through 32 blocks of width 1280) outweighs the 2048-token text pass.
    assert result.activation_bytes > 3 * text_only.activation_bytes
    assert result.weights.per_gpu_bytes == pytest.approx(L4_LOG_WEIGHTS, rel=0.02)
    # The plan gave 72,656 tokens (2.1x the log) before the tower and the encoder pass were counted, 41,872
    # (+24%) before the pixels' float32 batch was.
    assert result.pool.tokens == pytest.approx(L4_LOG_TOKENS, rel=0.10)
    low, high = kv_cache_tokens_range(result)
    assert low <= L4_LOG_TOKENS <= high
    # The tower's own spread, not the text passes' (which reaches -62% and +257% over all versions), sizes the
    # range: it no longer runs from nothing to half as much again. It is 5,440-41,216 tokens: the LLaVA-NeXT log
    # widened the tower's spread to +55% (its text passes' 0.08 GiB miss counted against a 0.35 GiB tower pass);
    # it was 10,448-40,896 before that log.
    assert low > 0.1 * result.pool.tokens and high < 1.2 * result.pool.tokens


def test_every_modality_off_serves_the_language_model_alone():
    arch, gpu = load_model("qwen2.5-vl-7b"), find_gpu("L4")
    served = plan(arch, gpu, L4_LOG_DEPLOYMENT)
    language_only = plan(
        arch, gpu, Deployment(max_model_len=2048, vllm_version=(0, 10), mm_limits=(("image", 0), ("video", 0)))
    )
    text = plan(load_model("qwen2.5-7b"), gpu, Deployment(max_model_len=2048, vllm_version=(0, 10)))
    assert language_only.activation_bytes == text.activation_bytes
    vision_bytes = served.weights.per_gpu_bytes - language_only.weights.per_gpu_bytes
    assert vision_bytes == pytest.approx(0.675e9 * 2, rel=0.01)


def test_images_off_but_video_on_keeps_the_tower_loaded():
    arch, gpu = load_model("qwen2.5-vl-7b"), find_gpu("L4")
    images_off = plan(arch, gpu, Deployment(max_model_len=2048, mm_limits=(("image", 0),)))
    assert images_off.weights.per_gpu_bytes == plan(arch, gpu, Deployment(max_model_len=2048)).weights.per_gpu_bytes


def test_encoder_tp_mode_data_keeps_a_whole_tower_per_gpu_and_a_whole_image_per_rank():
    arch, gpu = load_model("qwen2.5-vl-7b"), find_gpu("L4")
    sharded = plan(arch, gpu, Deployment(tensor_parallel=2, max_model_len=2048))
    data = plan(arch, gpu, Deployment(tensor_parallel=2, max_model_len=2048, mm_encoder_tp_mode="data"))
    whole = weight_breakdown(arch, 1).other_bytes - weight_breakdown(arch, 1, vision="skipped").other_bytes
    assert data.weights.per_gpu_bytes - sharded.weights.per_gpu_bytes == pytest.approx(whole / 2, rel=0.001)
    # One image cannot be split between two ranks: the rank that holds it runs the whole MLP width.
    assert data.activation_bytes > sharded.activation_bytes


def test_quantized_checkpoints_keep_the_vision_tower_in_16_bits():
    preset = find_model_preset("qwen2.5-vl-7b")
    config = {**preset.config, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    quantized = from_hf_config(config, "config.json")
    plain = load_model("qwen2.5-vl-7b")
    skipped = weight_breakdown(quantized, vision="skipped").other_bytes
    assert weight_breakdown(quantized).other_bytes - skipped == pytest.approx(0.675e9 * 2, rel=0.01)
    assert weight_breakdown(quantized).per_gpu_bytes < weight_breakdown(plain).per_gpu_bytes / 2


def _plan_json(capsys, *argv: str) -> dict[str, object]:
    assert main(["plan", "--model", "qwen2.5-vl-7b", "--gpu", "L4", "--format", "json", *argv]) == 0
    answer: dict[str, object] = json.loads(capsys.readouterr().out)
    return answer


@pytest.mark.parametrize(
    "limits", ['{"image": 0, "video": 0}', "image=0,video=0", '{"image": {"count": 0}, "video": 0}']
)
def test_limit_mm_per_prompt_is_read_as_vllm_writes_it(capsys, limits):
    served = _plan_json(capsys, "--max-model-len", "2048")
    language_only = _plan_json(capsys, "--max-model-len", "2048", "--limit-mm-per-prompt", limits)
    assert language_only["activation_bytes"] < served["activation_bytes"]  # type: ignore[operator]


def test_the_multimodal_flags_are_read_from_a_launch_command(capsys):
    flags = _plan_json(capsys, "--tp", "2", "--mm-encoder-tp-mode", "data", "--limit-mm-per-prompt", "image=0,video=0")
    command = "vllm serve Qwen/Qwen2.5-VL-7B-Instruct -tp 2 --mm-encoder-tp-mode data --limit-mm-per-prompt "
    assert main(["plan", "--gpu", "L4", "--format", "json", "--from", command + '\'{"image":0,"video":0}\'']) == 0
    assert json.loads(capsys.readouterr().out)["kv_cache_bytes"] == flags["kv_cache_bytes"]


@pytest.mark.parametrize("limits", ["image=many", '{"image": -1}', '{"image": 1.5}', "{not json", "x" * 2000])
def test_a_bad_limit_is_refused_naming_the_flag(capsys, limits):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", "qwen2.5-vl-7b", "--limit-mm-per-prompt", limits])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--limit-mm-per-prompt" in err and "Traceback" not in err
