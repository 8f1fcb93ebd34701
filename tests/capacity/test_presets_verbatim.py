"""Presets copied from verbatim config.json files (the Hugging Face configs NVIDIA ships in PyPI's aiconfigurator-core
0.12.0 wheel, and Mistral-Small-3.2's file proven by its published digests): the bytes their sources cite, and the
shapes the planner reads from them, against the files' values and the rules vLLM applies to them."""

import hashlib
import json
from dataclasses import replace

import pytest

from exporter.capacity.activation import language_only
from exporter.capacity.architecture import FULL, MLA, SLIDING, ModelArchitecture
from exporter.capacity.deployment import Deployment
from exporter.capacity.kv import kv_layout
from exporter.capacity.plan import plan
from exporter.capacity.weights import count_parameters
from exporter.catalog import find_gpu, find_model_preset, load_model
from exporter.core.units import GIB

# The SHA-256 of each source file, as each preset's source cites it.
CITED_SHA256 = {
    "gemma-4-26b-a4b": "0364256c5de7863a22b5dd666043d542d42b681c02fd83eb67dc7b483d859e96",
    "kimi-k2-instruct": "17caf15bd0614a4580e066eec2f459f5b0b1372648e355e6d770305b092662ce",
    "mistral-small-3.2-24b": "01ab910a5dda7995709cc355d094eabb8094b78d49240cd167188606c3ff5edb",
    "qwen3-vl-32b": "d2dd0c60d01b9e195d9447c52da61c7302d28828524914c044d9c6e1b81d0427",
}


def _file_bytes(preset: str) -> bytes:
    """The config.json as its author's tool wrote it (indent 2, a final newline), from the preset's keys in order."""
    return (json.dumps(find_model_preset(preset).config, indent=2, ensure_ascii=False) + "\n").encode()


def _named(arch: ModelArchitecture) -> ModelArchitecture:
    return replace(arch, name="", source="")


@pytest.mark.parametrize("preset", sorted(CITED_SHA256))
def test_a_verbatim_preset_holds_the_bytes_its_source_hashes(preset):
    digest = CITED_SHA256[preset]
    assert digest in find_model_preset(preset).source
    assert hashlib.sha256(_file_bytes(preset)).hexdigest() == digest


def test_mistral_small_3_2_matches_the_git_blob_id_of_the_hub_file():
    data = _file_bytes("mistral-small-3.2-24b")
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's object id
    assert blob == "786d10ba172eb033ce576f199e13cd65c3a8d905"
    assert blob in find_model_preset("mistral-small-3.2-24b").source


def test_mistral_small_3_2_has_the_3_1_shapes_and_their_logged_kv_bytes():
    small_32 = load_model("mistralai/Mistral-Small-3.2-24B-Instruct-2506")
    assert _named(small_32) == _named(load_model("mistral-small-3.1-24b"))
    # llm-d-benchmark's 3.2 run: 28.20 GiB / 184,832 tokens = 163,840 B a token
    assert kv_layout(small_32).bytes_per_token == 163_840


GEMMA4 = find_model_preset("gemma-4-26b-a4b").config


def test_gemma4_layers_as_vllm_caches_them():
    """vLLM's Gemma4 attention: sliding layers keep num_key_value_heads x head_dim, full layers with
    attention_k_eq_v num_global_key_value_heads x global_head_dim, V cached beside K."""
    arch, text = load_model("gemma-4-26b-a4b"), GEMMA4["text_config"]
    assert arch.layer_types == tuple(SLIDING if t == SLIDING else FULL for t in text["layer_types"])
    assert (arch.layer_types.count(SLIDING), arch.layer_types.count(FULL)) == (25, 5)
    assert (arch.num_kv_heads, arch.head_dim, arch.sliding_window) == (8, 256, 1024)
    assert (arch.full_kv_heads, arch.full_head_dim) == (2, 512)
    assert kv_layout(arch).bytes_per_token == 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2
    assert arch.context_limit("vllm").tokens == text["max_position_embeddings"] == 262_144


def test_gemma4_runs_its_dense_mlp_beside_128_experts_in_every_layer():
    moe = load_model("gemma-4-26b-a4b").moe
    assert moe is not None
    assert (moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size) == (128, 8, 704)
    assert moe.shared_intermediate_size == GEMMA4["text_config"]["intermediate_size"] == 2112
    assert moe.dense_layers == frozenset()


def test_gemma4_vision_tower_is_gated_with_one_projection():
    """transformers' and vLLM's Gemma4VisionMLP gate, up and down (hidden_activation, no hidden_act key), and
    Gemma4MultimodalEmbedder is one bias-free projection into the text width."""
    arch = load_model("gemma-4-26b-a4b")
    vision = arch.vision
    assert vision is not None
    assert (vision.hidden_size, vision.intermediate_size, vision.num_layers, vision.patch_size) == (1152, 4304, 27, 16)
    assert vision.gated_mlp
    assert vision.projector == ((1152, 2816),)
    # '~550M parameter vision encoder' (the card's summary at https://vast.ai/model/gemma-4-26b-a4b-it)
    assert count_parameters(arch) - count_parameters(replace(arch, vision=None)) == pytest.approx(550e6, rel=0.02)


def test_gemma4_vision_tower_is_skipped_only_with_images_and_video_off():
    """vLLM builds the tower under _mark_tower_model(vllm_config, {"image", "video"}): video frames use it too."""
    arch = load_model("gemma-4-26b-a4b")
    assert arch.vision is not None and arch.vision.has_video
    assert not language_only(arch, Deployment(mm_limits=(("image", 0),)))
    assert language_only(arch, Deployment(mm_limits=(("image", 0), ("video", 0))))


@pytest.mark.parametrize("name", ["google/gemma-4-26B-A4B-it", "gemma-4-26b-a4b-it"])
def test_gemma4_instruct_names_resolve_to_the_base_shapes(name):
    assert find_model_preset(name).id == "gemma-4-26b-a4b"


def test_kimi_k2_is_read_as_multi_head_latent_attention():
    arch, config = load_model("moonshotai/Kimi-K2-Instruct"), find_model_preset("kimi-k2-instruct").config
    assert config["model_type"] == "kimi_k2"
    assert arch.mla == MLA(
        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536
    )
    assert kv_layout(arch, tp=8).bytes_per_token == 61 * (512 + 64) * 2  # one latent a layer, not split by TP
    # YaRN: vLLM starts from original_max_position_embeddings 4096 and multiplies by the factor 32
    assert arch.context_limit("vllm").tokens == 131_072


def test_kimi_k2_moe_and_block_fp8_weights():
    arch = load_model("kimi-k2-instruct")
    assert arch.moe is not None and arch.quantization is not None
    assert (arch.moe.num_experts, arch.moe.experts_per_token, arch.moe.expert_intermediate_size) == (384, 8, 2048)
    assert arch.moe.shared_intermediate_size == 2048
    assert arch.moe.dense_layers == frozenset({0})
    assert arch.quantization.method == "fp8"
    assert arch.quantization.bytes_per_weight == 1 + 4 / (128 * 128)  # a float32 scale per 128 x 128 block


def test_kimi_k2_thinking_log_kv_tokens_from_its_kv_memory():
    """vllm-project/recipes, Kimi-K2-Think.md @ 0d218d1: TP 8 on H200, 46.80 GiB of KV -> 715,072 tokens."""
    given = Deployment(tensor_parallel=8, kv_cache_memory_bytes=round(46.80 * GIB), vllm_version=(0, 11))
    assert plan(load_model("kimi-k2-instruct"), find_gpu("H200"), given).pool.tokens == 715_072


@pytest.mark.parametrize(
    ("fp8", "base"), [("qwen3-30b-a3b-fp8", "qwen3-30b-a3b"), ("qwen3-235b-a22b-fp8", "qwen3-235b-a22b")]
)
def test_qwen3_fp8_checkpoints_are_their_base_with_block_fp8_weights(fp8, base):
    arch = load_model(fp8)
    assert arch.quantization is not None and arch.quantization.bytes_per_weight == 1 + 4 / (128 * 128)
    assert _named(replace(arch, quantization=None)) == _named(load_model(base))


@pytest.mark.parametrize(
    ("preset", "text"),
    [("qwen3-vl-8b", "qwen3-8b"), ("qwen3-vl-30b-a3b", "qwen3-30b-a3b"), ("qwen3-vl-235b-a22b", "qwen3-235b-a22b")],
)
def test_qwen3_vl_text_models_have_their_qwen3_shapes(preset, text):
    arch, plain = load_model(preset), load_model(text)
    shape = ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size", "moe")
    assert {k: getattr(arch, k) for k in shape} == {k: getattr(plain, k) for k in shape}
    assert arch.max_position_embeddings == 262_144
    vision = arch.vision
    assert vision is not None and vision.has_video
    assert (vision.hidden_size, vision.num_layers, vision.patch_size, vision.temporal_patch_size) == (1152, 27, 16, 2)
    assert len(vision.projector) == 2 * 4  # the patch merger, and again at DeepStack levels 8, 16 and 24
