"""Vision-language models: the language model read from the nested config, the vision tower and projector in the
weights, and the encoder's pass over vLLM's dummy images in the profiling run, with the flags that change it.

The configs are the presets' real config.json files (each preset's `_preset.source` names where it came from).
"""

import json

import pytest

from exporter.capacity.activation import encoder_profile
from exporter.capacity.architecture import from_hf_config
from exporter.capacity.deployment import Deployment
from exporter.capacity.kv import kv_layout
from exporter.capacity.plan import plan
from exporter.capacity.uncertainty import kv_cache_tokens_range
from exporter.capacity.weights import count_parameters, weight_breakdown
from exporter.catalog import find_gpu, find_model_preset, load_model
from exporter.cli import main

GIB = 1024**3

# (KV bytes per token of the language model, 16-bit; total parameters the Hub's safetensors metadata publishes)
FAMILIES = {
    "qwen2.5-vl-7b": (2 * 4 * 128 * 2 * 28, 8.29e9),
    "qwen3-vl-4b": (2 * 8 * 128 * 2 * 36, 4.44e9),
    "gemma-3-4b": (None, 4.30e9),  # sliding-window hybrid: per-token bytes depend on the context
    "gemma-3-27b": (None, 27.4e9),
    "mistral-small-3.1-24b": (2 * 8 * 128 * 2 * 40, 24.0e9),
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
    # Qwen2.5-VL's largest image is 16,384 tokens: issue 18's L4 log at max-model-len 2048 defaulted the encoder
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


def test_a_text_model_has_no_encoder_pass():
    assert encoder_profile(load_model("qwen2.5-7b"), Deployment(), 2048, 2048, 256) is None


L4_LOG_TOKENS = 33_824  # issue 18: Qwen2.5-VL-7B on an L4, max-model-len 2048, weights 15.63 GiB
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
    # Issue 18 measured 72,656 tokens (2.1x the log) before the tower and the encoder pass were counted.
    assert result.pool.tokens == pytest.approx(L4_LOG_TOKENS, rel=0.25)
    low, high = kv_cache_tokens_range(result)
    assert low <= L4_LOG_TOKENS <= high


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
