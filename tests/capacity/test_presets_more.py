"""The unquantized presets added for widely served models: parameter counts, the shape values that set
memory, and that the names vLLM logs and users type resolve to them."""

import pytest

from exporter.capacity.architecture import SLIDING
from exporter.capacity.weights import count_parameters
from exporter.catalog import find_model_preset, load_model

# Totals the model authors publish (model cards, GGUF general.parameter_count, HF safetensors metadata).
PUBLISHED = {
    "llama-3-8b": 8.03e9,
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.02e9,
    "mistral-nemo-12b": 12_247_782_400,  # GGUF general.parameter_count quoted in ollama/ollama#8277
    "mistral-nemo-base-12b": 12_247_782_400,
    "qwen2.5-3b": 3.09e9,
    "gemma-2b": 2.51e9,
    "phi-4-mini": 3.84e9,
    "phi-3-mini-4k": 3.82e9,
    "smollm2-1.7b": 1.71e9,
}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_parameter_count_matches_published_total_within_half_a_percent(preset):
    assert count_parameters(load_model(preset)) == pytest.approx(PUBLISHED[preset], rel=0.005)


def test_preset_published_totals_agree_with_the_table():
    for preset, total in PUBLISHED.items():
        published = find_model_preset(preset).params_published
        assert published is not None and published == pytest.approx(total, rel=0.005)


def test_mistral_nemo_instruct_and_base_differ_only_in_declared_context():
    instruct, base = load_model("mistralai/Mistral-Nemo-Instruct-2407"), load_model("mistralai/Mistral-Nemo-Base-2407")
    assert instruct.max_position_embeddings == 1_024_000
    assert base.max_position_embeddings == 128_000
    # head_dim is explicit (128), not hidden/heads (160)
    assert instruct.head_dim == base.head_dim == 128
    assert count_parameters(instruct) == count_parameters(base)


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "head_dim", "context"),
    [
        ("meta-llama/Meta-Llama-3-8B-Instruct", 32, 8, 128, 8192),
        ("meta-llama/Meta-Llama-3-70B-Instruct", 80, 8, 128, 8192),
        ("meta-llama/Llama-2-7b-chat-hf", 32, 32, 128, 4096),
        ("meta-llama/Llama-2-13b-chat-hf", 40, 40, 128, 4096),
        ("Qwen/Qwen2.5-3B-Instruct", 36, 2, 128, 32768),
        ("Qwen/Qwen2-7B-Instruct", 28, 4, 128, 32768),
        ("Qwen/Qwen3-1.7B", 28, 8, 128, 40960),
        ("google/gemma-2b-it", 18, 1, 256, 8192),
        ("microsoft/Phi-4-mini-instruct", 32, 8, 128, 131072),
        ("microsoft/Phi-3-mini-4k-instruct", 32, 32, 96, 4096),
        ("internlm/internlm2_5-7b-chat", 32, 8, 128, 32768),
        ("HuggingFaceTB/SmolLM2-1.7B-Instruct", 24, 32, 64, 8192),
    ],
)
def test_kv_cache_shape_of_new_presets(name, layers, kv_heads, head_dim, context):
    arch = load_model(name)
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim, arch.max_position_embeddings) == (
        layers,
        kv_heads,
        head_dim,
        context,
    )


def test_tied_embeddings_where_the_configs_tie_them():
    tied = ["qwen2.5-3b", "qwen3-1.7b", "gemma-2b", "phi-4-mini", "smollm2-1.7b"]
    untied = ["llama-3-8b", "llama-2-7b", "qwen2-7b", "phi-3-mini-4k", "mistral-nemo-12b", "internlm2.5-7b"]
    assert all(load_model(p).tie_word_embeddings for p in tied)
    assert not any(load_model(p).tie_word_embeddings for p in untied)


def test_phi_3_mini_4k_slides_on_every_layer_but_phi_4_mini_does_not():
    phi3 = load_model("phi-3-mini-4k")
    assert phi3.sliding_window == 2047 and set(phi3.layer_types) == {SLIDING}
    assert load_model("phi-4-mini").sliding_window is None  # 262144 > 131072 positions: no sliding


@pytest.mark.parametrize(
    ("alias", "preset"),
    [
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("meta-llama/Meta-Llama-3-70B", "llama-3-70b"),
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("google/gemma-1.1-2b-it", "gemma-2b"),
        ("HuggingFaceTB/SmolLM2-1.7B", "smollm2-1.7b"),
        ("MISTRALAI/MISTRAL-NEMO-INSTRUCT-2407", "mistral-nemo-12b"),
    ],
)
def test_aliases_resolve(alias, preset):
    assert find_model_preset(alias).id == preset


def test_no_name_is_claimed_by_two_presets():
    from exporter.catalog import model_presets

    seen: dict[str, str] = {}
    for preset in model_presets():
        for name in {n.lower() for n in preset.names()}:
            assert name not in seen, f"{name!r} is claimed by {seen[name]} and {preset.id}"
            seen[name] = preset.id
