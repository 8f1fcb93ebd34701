"""A model's shape, read from a Hugging Face config.json dictionary.

Only what memory depends on is kept. The reader trusts what real configs carry over what can be derived:
`head_dim` when present (Gemma, Qwen3 and gpt-oss do not use hidden/heads), `num_key_value_heads`, the layer
pattern of sliding-window models, MLA ranks and the quantization block.

The file may be corrupt or hostile, so every field read is checked here, and only here, against the range a real
model could have (the bounds below); the plan downstream trusts the architecture it gets.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.capacity.quantization import Quantization, QuantizationError, from_config
from exporter.display import shown

FULL = "full_attention"
SLIDING = "sliding_attention"


class ModelConfigError(ValueError):
    """A config.json that lacks or garbles what the model needs; the message names the key and the file."""


@dataclass(frozen=True)
class MoE:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int  # all shared experts together; 0 when there are none
    dense_layers: frozenset[int]  # layers that keep a plain MLP (DeepSeek's first_k_dense_replace)
    expert_bias: bool = False  # gpt-oss experts carry biases


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): the KV cache holds one compressed latent."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True)
class VisionTower:
    """The vision encoder and its projector, and the largest image vLLM's profiling run feeds it."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    patch_size: int
    num_channels: int
    temporal_patch_size: int = 1  # Qwen-VL embeds two frames per patch (an image is repeated)
    gated_mlp: bool = False  # SwiGLU blocks (Qwen2.5-VL, Pixtral) rather than fc1/fc2 (CLIP, SigLIP, InternViT)
    projector: tuple[tuple[int, int], ...] = ()  # (inputs, outputs) of each linear layer after the tower
    image_tokens: int = 0  # the largest image's tokens in the language model; 0: not known for this family
    image_patches: int = 0  # the encoder's sequence for that image
    has_video: bool = False  # a second modality vLLM profiles unless --limit-mm-per-prompt turns it off too


@dataclass(frozen=True)
class RopeScaling:
    """A config.json's rope_scaling, as far as the longest context the engines accept depends on it."""

    rope_type: str
    factor: float
    original_max_position_embeddings: int | None  # YaRN's trained length, from rope_scaling itself


@dataclass(frozen=True)
class ContextLimit:
    """The longest --max-model-len an engine accepts without its override variable, and how it follows from
    the config (for the error that refuses a longer one)."""

    tokens: int
    derivation: str


# RoPE types whose factor does not lengthen the context vLLM accepts: their max_position_embeddings already is the
# extended length (Llama 3.1's "llama3": 8192 x 8 = 131072 is declared as 131072; Phi-3's LongRoPE).
_VLLM_UNSCALED_ROPE_TYPES = frozenset({"su", "longrope", "llama3"})


@dataclass(frozen=True)
class ModelArchitecture:
    name: str
    source: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str
    max_position_embeddings: int
    layer_types: tuple[str, ...]
    sliding_window: int | None = None
    attention_bias: bool = False
    gated_mlp: bool = True  # gate, up and down projections; False: up and down only (phi-2, GPT-2 style)
    moe: MoE | None = None
    mla: MLA | None = None
    quantization: Quantization | None = None
    vision: VisionTower | None = None
    rope_scaling: RopeScaling | None = None
    # Gemma 4's full-attention layers have their own head_dim (global_head_dim) and, with attention_k_eq_v, their
    # own KV heads (num_global_key_value_heads); None: the same as every other layer's.
    full_head_dim: int | None = None
    full_kv_heads: int | None = None
    # Gemma 4's num_kv_shared_layers: the last layers read the KV of an earlier layer of their kind and keep none.
    kv_shared_layers: int = 0

    @property
    def is_hybrid(self) -> bool:
        return SLIDING in self.layer_types and FULL in self.layer_types

    def context_limit(self, engine: str) -> ContextLimit:
        """The longest context `engine` accepts for this model, which is also its default --max-model-len.

        vLLM (`_get_and_verify_max_len` in vllm/config/model.py, vllm-project/vllm) multiplies the length by
        rope_scaling's factor unless the RoPE type is "su", "longrope" or "llama3", and for YaRN starts from
        rope_scaling's original_max_position_embeddings instead of max_position_embeddings. SGLang
        (`get_context_length` in python/sglang/srt/hf_transformers_utils.py, sgl-project/sglang) applies the
        factor only when rope_scaling names no original_max_position_embeddings and is not "llama3", so a YaRN
        model keeps max_position_embeddings there.
        """
        plain = ContextLimit(self.max_position_embeddings, f"max_position_embeddings {self.max_position_embeddings}")
        rope = self.rope_scaling
        if rope is None:
            return plain
        base, declared = plain.tokens, plain.derivation
        if engine == "sglang":
            scales = rope.original_max_position_embeddings is None and rope.rope_type != "llama3"
        else:
            scales = rope.rope_type not in _VLLM_UNSCALED_ROPE_TYPES
            if scales and rope.rope_type == "yarn" and rope.original_max_position_embeddings is not None:
                base = rope.original_max_position_embeddings
                declared = f"original_max_position_embeddings {base}"
        if not scales or (rope.factor == 1 and base == plain.tokens):
            return plain
        return ContextLimit(int(base * rope.factor), f"{declared} x {rope.rope_type} factor {rope.factor:g}")


# Keys that transformers' config classes default and published config.json files therefore omit
# (Gemma 3's multimodal checkpoints list only non-default text_config keys).
_CONFIG_DEFAULTS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "gemma3_text": MappingProxyType(
            {
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "vocab_size": 262208,
                "max_position_embeddings": 131072,
                "sliding_window": 4096,
                "sliding_window_pattern": 6,
                "tie_word_embeddings": True,
            }
        ),
    }
)
# The same for a language model nested in a multimodal config, whose file may list only the keys that differ from
# the text config class's defaults: LLaVA-NeXT's Mistral text_config omits hidden_size, num_hidden_layers and
# num_attention_heads (transformers' MistralConfig defaults below, including the 4096-token window the engine then
# applies where the file leaves sliding_window out). A top-level config.json of these families names its shape, so a
# missing key there stays an error.
_NESTED_TEXT_DEFAULTS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "mistral": MappingProxyType(
            {
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
                "max_position_embeddings": 4096 * 32,
                "sliding_window": 4096,
            }
        ),
    }
)


# Families whose layers keep a recurrent state (Mamba, RWKV, linear attention) beside or instead of a KV cache:
# their memory is not what the capacity model computes, so they are refused by name rather than sized wrongly.
_RECURRENT_STATE_TYPES = frozenset(
    {
        "mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "rwkv7", "jamba", "zamba", "zamba2", "bamba",
        "nemotron_h", "falcon_h1", "granitemoehybrid", "qwen3_next", "lfm2", "minimax", "minimax_m1", "plamo2",
        "recurrent_gemma", "xlstm",
    }
)  # fmt: skip
_RECURRENT_ARCHITECTURE_WORDS = ("Mamba", "Rwkv", "RWKV", "Jamba", "Zamba", "Bamba", "Hybrid", "RecurrentGemma")


def _refuse_recurrent_state(config: dict[str, Any], source: str) -> None:
    model_type = str(config.get("model_type", ""))
    architectures = [str(a) for a in config.get("architectures") or []]
    kinds = {str(k) for k in config.get("layer_types") or []} - {FULL, SLIDING, "attention"}
    named = _text(", ".join(architectures) or model_type)
    if model_type in _RECURRENT_STATE_TYPES or any(
        w in a for a in architectures for w in _RECURRENT_ARCHITECTURE_WORDS
    ):
        reason = f"{named} keeps a recurrent state (Mamba, RWKV or linear-attention layers)"
    elif kinds:
        reason = f"{named} has {_text(', '.join(sorted(kinds)))} layers"
    else:
        return
    raise ModelConfigError(
        f"{source}: {reason}, which the capacity model cannot size: it plans attention KV caches only"
    )


def _refuse_cross_attention(config: dict[str, Any], body: dict[str, Any], source: str) -> None:
    """Encoder-decoder models (Llama 3.2 Vision's mllama, Whisper, T5, BART): their cross-attention layers cache the
    encoder's keys and values per request, sized by the encoder input, which no term here prices. Read as a decoder
    their cross-attention layers would be counted as self-attention KV, a figure that looks right and is not."""
    if not (config.get("is_encoder_decoder") or body.get("is_encoder_decoder") or body.get("cross_attention_layers")):
        return
    named = _text(", ".join(map(str, config.get("architectures") or [])) or str(body.get("model_type")))
    raise ModelConfigError(
        f"{source}: {named} is an encoder-decoder model (cross-attention layers that cache the encoder's KV), which "
        "the capacity model does not size, and vLLM from 0.11 serves no encoder-decoder model but Whisper "
        "(vllm-project/vllm#24907): plan a decoder-only model"
    )


def _require(config: dict[str, Any], key: str, source: str, *alternatives: str) -> Any:
    for name in (key, *alternatives):
        if config.get(name) is not None:
            return config[name]
    names = " or ".join(repr(n) for n in (key, *alternatives))
    raise ModelConfigError(f"{source}: missing key {names}, which the capacity model needs")


def _text(text: str, limit: int = 80) -> str:
    """Text from the file as an error quotes it: cut short (the file chose its size), its controls escaped."""
    return shown(text if len(text) <= limit else f"{text[:limit]}...")


def _shown(value: object) -> str:
    """A bad value as an error quotes it."""
    return _text(repr(value) if not isinstance(value, Exception) else str(value))


# Past 2**53 a number is no dimension of a model, and products of a few such overflow the float arithmetic of the
# plan; infinities and NaN (Python's json reads them) are no dimension either.
_LARGEST_NUMBER = 2**53


def _refuse_huge_numbers(config: dict[str, Any], source: str) -> None:
    pending: list[tuple[str, Any]] = [("", config)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, dict):
            pending.extend((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, int | float) and not isinstance(value, bool) and not abs(value) <= _LARGEST_NUMBER:
            raise ModelConfigError(f"{source}: {shown(path)} is {_shown(value)}, not a finite number of a model's size")


# Upper bounds of the dimensions, each far past the largest released model's (in brackets), so that only a garbled
# file reaches one, and a tuple per layer or a product of several stays small.
MAX_LAYERS = 1024  # (126, Llama 3.1 405B); the plan sizes layer by layer, so this bounds its time too
MAX_WIDTH = 1_048_576  # hidden, MLP, expert, LoRA and vision sizes (53,248, Llama 3.1 405B's MLP)
MAX_HEADS = 65_536  # attention and KV heads, head_dim, experts (128 heads; head_dim 256; 384 experts, Kimi K2)
MAX_VOCAB = 16_777_216  # (262,208, Gemma 3)
MAX_POSITIONS = 1_073_741_824  # context lengths and sliding windows (10,485,760, Llama 4 Scout)
MAX_ROPE_FACTOR = 1024  # (40, DeepSeek-V3's YaRN)
# What the file's torch_dtype may name: the dtypes checkpoints are published in.
CHECKPOINT_DTYPES = ("bfloat16", "float16", "half", "float32", "float")
_FIX = "correct the file, or download it again"


def _whole(value: object) -> int | None:
    """`value` as a whole number, if it is written as one (4096, 4096.0); None otherwise. A string is none: no real
    config quotes a number, and str.isdecimal would read "٤٠" as 40."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _in_range(value: object, named: str, source: str, least: int, most: int) -> int:
    number = _whole(value)
    if number is None or not least <= number <= most:
        quoted = " (a string: write the number without quotes)" if isinstance(value, str) else ""
        raise ModelConfigError(
            f"{source}: {named} is {_shown(value)}, not a whole number from {least:,} to {most:,}{quoted}; {_FIX}"
        )
    return number


def _count(config: dict[str, Any], key: str, source: str, *alternatives: str, most: int) -> int:
    """A required dimension, a whole number from 1 to `most`; the message names the key the file used."""
    value = _require(config, key, source, *alternatives)
    named = next(n for n in (key, *alternatives) if config.get(n) is not None)
    return _in_range(value, named, source, 1, most)


def _optional(config: dict[str, Any], key: str, source: str, *, most: int, least: int = 1) -> int | None:
    """An optional dimension: None when absent or null, else a whole number from `least` to `most`."""
    value = config.get(key)
    return None if value is None else _in_range(value, key, source, least, most)


def _ratio_of(config: dict[str, Any], key: str, source: str) -> float:
    """A RoPE factor: above 0 (a factor of 0 or less is no context at all) and at most MAX_ROPE_FACTOR."""
    value = config.get(key)
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_ROPE_FACTOR:
        raise ModelConfigError(
            f"{source}: rope_scaling.{key} is {_shown(value)}, not a number above 0 and at most "
            f"{MAX_ROPE_FACTOR}; {_FIX}"
        )
    return float(value)


def _layer_types(config: dict[str, Any], num_layers: int, window: int | None, source: str) -> tuple[str, ...]:
    declared = config.get("layer_types")
    if declared:
        if len(declared) != num_layers:
            raise ModelConfigError(
                f"{source}: layer_types has {len(declared)} entries but num_hidden_layers is {num_layers}"
            )
        return tuple(SLIDING if kind == SLIDING else FULL for kind in declared)
    if window is None:
        return (FULL,) * num_layers
    model_type = str(config.get("model_type", ""))
    pattern = _optional(config, "sliding_window_pattern", source, most=MAX_LAYERS)
    if model_type.startswith("gemma3") or pattern:
        # Gemma 3: every `pattern`-th layer is global, the rest slide.
        every = pattern or 6
        return tuple(FULL if (i + 1) % every == 0 else SLIDING for i in range(num_layers))
    if model_type.startswith("gemma2"):
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))
    if config.get("use_sliding_window") is False:
        return (FULL,) * num_layers
    return (SLIDING,) * num_layers  # Mistral v0.1-style: every layer slides


def _window(config: dict[str, Any], max_positions: int, source: str) -> int | None:
    # 0 is how some configs write "no window"; a negative one is no window a model could have.
    window = _optional(config, "sliding_window", source, least=0, most=MAX_POSITIONS)
    if config.get("use_sliding_window") is False and not config.get("layer_types"):
        return None
    if not window or window >= max_positions:
        return None  # Phi-3.5's 262144-token "window" is wider than the context: no sliding at all
    return window


def _first(config: dict[str, Any], *keys: str) -> str | None:
    """The first of `keys` the config gives a value (not null, not 0), as the engines read such synonyms."""
    return next((k for k in keys if config.get(k)), None)


def _moe(config: dict[str, Any], num_layers: int, source: str) -> MoE | None:
    experts_key = _first(config, "n_routed_experts", "num_local_experts", "num_experts")
    if experts_key is None:
        return None
    experts = _in_range(config[experts_key], experts_key, source, 1, MAX_HEADS)
    expert_size = _count(config, "moe_intermediate_size", source, "intermediate_size", most=MAX_WIDTH)
    shared = _optional(config, "shared_expert_intermediate_size", source, least=0, most=MAX_WIDTH) or 0
    shared_experts = _optional(config, "n_shared_experts", source, least=0, most=MAX_HEADS)
    if shared_experts:
        shared = shared_experts * expert_size
    if str(config.get("model_type")) == "llama4_text":
        shared = expert_size  # every Llama 4 MoE layer adds one shared expert of the routed experts' size
    if config.get("enable_moe_block"):
        # Gemma 4 runs its dense MLP beside the experts in every layer, as a shared expert would be run.
        shared = _count(config, "intermediate_size", source, most=MAX_WIDTH)
    first_dense = _optional(config, "first_k_dense_replace", source, least=0, most=MAX_LAYERS) or 0
    dense = set(range(min(first_dense, num_layers)))
    dense |= {_in_range(i, "mlp_only_layers[]", source, 0, num_layers - 1) for i in config.get("mlp_only_layers") or []}
    # Qwen's decoder_sparse_step and Llama 4's interleave_moe_layer_step: every step-th layer is MoE, the rest dense.
    step_keys = [k for k in ("decoder_sparse_step", "interleave_moe_layer_step") if config.get(k) is not None]
    step = _in_range(config[step_keys[0]], step_keys[0], source, 1, MAX_LAYERS) if step_keys else 1
    dense |= {i for i in range(num_layers) if (i + 1) % step != 0}
    per_token_key = _first(config, "num_experts_per_tok", "experts_per_token", "top_k", "top_k_experts")
    per_token = 1 if per_token_key is None else _in_range(config[per_token_key], per_token_key, source, 1, experts)
    return MoE(
        num_experts=experts,
        experts_per_token=per_token,
        expert_intermediate_size=expert_size,
        shared_intermediate_size=shared,
        dense_layers=frozenset(dense),
        expert_bias=str(config.get("model_type")) == "gpt_oss",
    )


# Families whose processors size vLLM's dummy image from the preprocessor's pixel limit, not from config.json:
# Qwen2-VL and Qwen2.5-VL's default max_pixels 12,845,056 over (14 x 2)^2 pixels a token, and Qwen3-VL's
# 16,777,216 over (16 x 2)^2, are both 16,384 tokens (the encoder cache budget vLLM logs for them).
_QWEN_VL = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
_QWEN_VL_IMAGE_TOKENS = 16384
_INTERNVL = frozenset({"internvl", "internvl_chat"})
# Llama 4's processor tiles the largest image into 16 tiles plus a global view (max_patches in its preprocessor).
_LLAMA4_TILES = 16 + 1
_INTERNVL_DEFAULT_TILES = 12  # max_dynamic_patch, before the thumbnail


def _side(value: object, named: str, source: str) -> int:
    """An image or patch size, written as one number or as [height, width] (the transformers InternVL configs)."""
    if isinstance(value, list) and value:
        value = max(value)
    return _in_range(value, named, source, 1, MAX_WIDTH)


def _merge(config: dict[str, Any], vision: dict[str, Any], source: str) -> int:
    """Patches merged into one token along each side: Qwen-VL and Pixtral's spatial_merge_size, or the pixel
    shuffle of InternVL (downsample_ratio) and Llama 4 (pixel_shuffle_ratio), 0.5 -> 2."""
    merge = vision.get("spatial_merge_size") or config.get("spatial_merge_size")
    if merge is not None:
        return _in_range(merge, "spatial_merge_size", source, 1, MAX_HEADS)
    for where, key in ((config, "downsample_ratio"), (vision, "pixel_shuffle_ratio")):
        ratio = where.get(key)
        if isinstance(ratio, str):  # else skipped below as if absent, planning one token per patch
            raise ModelConfigError(f"{source}: {key} is {_shown(ratio)}, not a number above 0 and at most 1; {_FIX}")
        if isinstance(ratio, int | float) and not isinstance(ratio, bool) and 0 < ratio <= 1:
            return round(1 / ratio)
    return 1


def _projector(
    family: str,
    config: dict[str, Any],
    width: int,
    merged: int,
    out: int,
    text_hidden: int,
    size: Callable[[str, int], int],
) -> tuple[tuple[int, int], ...]:
    """The linear layers between the tower and the language model, as each family's vLLM model builds them."""
    if family in _QWEN_VL:  # the patch merger, again for each DeepStack level (Qwen3-VL)
        levels = 1 + len(config["vision_config"].get("deepstack_visual_indexes") or [])
        return ((merged, merged), (merged, out)) * levels
    if family == "mistral3":  # Pixtral's patch merger, then a two-layer MLP
        return ((merged, width), (width, text_hidden), (text_hidden, text_hidden))
    if family in {"gemma3", "gemma4"}:  # one projection (Gemma 4's Gemma4MultimodalEmbedder, after 3x3 pooling)
        return ((width, text_hidden),)
    if family == "llama4":  # the pixel-shuffle MLP, then the projector into the text model
        inner = size("projector_input_dim", text_hidden)
        outer = size("projector_output_dim", inner)
        return ((merged, inner), (inner, outer), (size("vision_output_dim", outer), text_hidden))
    return ((merged, text_hidden), (text_hidden, text_hidden))  # LLaVA, InternVL: a two-layer MLP


def _largest_image(
    family: str, config: dict[str, Any], side: int, image: int, merge: int, source: str
) -> tuple[int, int]:
    """(tokens, encoder patches) of the largest image the family's vLLM processor makes, the profiling run's dummy.

    `side` is the patches along one side of one tile (image_size / patch_size; 0 where the config gives no
    image_size), `image` the tile's pixels."""
    if family in _QWEN_VL:
        return _QWEN_VL_IMAGE_TOKENS, _QWEN_VL_IMAGE_TOKENS * merge * merge
    if not side:
        return 0, 0
    tokens_per_tile = side * side // (merge * merge)
    if family == "gemma3":
        tokens = _optional(config, "mm_tokens_per_image", source, most=MAX_POSITIONS) or tokens_per_tile
        return tokens, side * side
    if family == "mistral3":  # one image at full size, with an [IMG_BREAK] token closing each row
        rows = side // merge
        return rows * rows + rows, side * side
    if family in {"llava_next", "llava_onevision"}:  # the base tile, then the best grid of tiles, a newline a row
        grids = [
            (_side(h, "image_grid_pinpoints[]", source) // image, _side(w, "image_grid_pinpoints[]", source) // image)
            for h, w in config.get("image_grid_pinpoints") or [[image, image]]
        ]
        tokens = max(side * side + (h * side) * (w * side) + h * side for h, w in grids)
        return tokens, (1 + max(h * w for h, w in grids)) * (side * side + 1)
    if family in _INTERNVL:  # dynamic tiles, plus a thumbnail
        tiles = _optional(config, "max_dynamic_patch", source, most=MAX_HEADS) or _INTERNVL_DEFAULT_TILES
        tiles += 1 if config.get("use_thumbnail", True) else 0
        return tiles * tokens_per_tile, tiles * (side * side + 1)
    if family == "llama4":
        return _LLAMA4_TILES * tokens_per_tile, _LLAMA4_TILES * (side * side + 1)
    return tokens_per_tile, side * side


def _vision(config: dict[str, Any], text_hidden: int, source: str) -> VisionTower | None:
    vision = config.get("vision_config")
    if not isinstance(vision, dict) or not (vision.get("hidden_size") or vision.get("embed_dim")):
        return None

    def size(key: str, default: int, least: int = 1) -> int:
        value = vision.get(key)
        return default if value is None else _in_range(value, f"vision_config.{key}", source, least, MAX_WIDTH)

    # Qwen2-VL names the tower's width embed_dim and its output hidden_size.
    width = size("embed_dim", 0, least=0) or size("hidden_size", 1)
    out = size("out_hidden_size", 0, least=0) or (size("hidden_size", 1) if vision.get("embed_dim") else text_hidden)
    family = str(config.get("model_type", ""))
    patch = _side(vision.get("patch_size", 14), "vision_config.patch_size", source)
    image = _side(vision["image_size"], "vision_config.image_size", source) if vision.get("image_size") else 0
    merge = _merge(config, vision, source)
    tokens, patches = _largest_image(family, config, image // patch, image, merge, source)
    channels = next((vision[k] for k in ("num_channels", "in_chans", "in_channels") if vision.get(k)), 3)
    return VisionTower(
        hidden_size=width,
        intermediate_size=size("intermediate_size", 0, least=0) or size("mlp_ratio", 4) * width,
        num_layers=size("num_hidden_layers", 0, least=0) or size("depth", 0, least=0),
        patch_size=patch,
        num_channels=_in_range(channels, "vision_config.num_channels", source, 1, MAX_HEADS),
        temporal_patch_size=size("temporal_patch_size", 1),
        # Gemma 4's tower names its activation hidden_activation and gates it (gate, up and down projections)
        gated_mlp=vision.get("hidden_act") == "silu" or family == "gemma4",
        projector=_projector(family, config, width, width * merge * merge, out, text_hidden, size),
        image_tokens=tokens,
        image_patches=patches,
        # Gemma 4 sends a video's frames through the image tower, which vLLM builds if either modality is on
        has_video=family in _QWEN_VL or family in _INTERNVL or family in {"llava_onevision", "gemma4"},
    )


# Families whose MLP is two matrices (fc1, fc2) with biases everywhere, instead of a gated (SwiGLU) MLP.
_PLAIN_MLP_FAMILIES = frozenset({"phi", "gpt2", "gpt_neox", "gptj", "starcoder2", "opt", "bloom", "falcon"})


def _ties_by_default(config: dict[str, Any]) -> bool:
    # transformers' Gemma configs default to tied embeddings and their config.json files often omit the key.
    return str(config.get("model_type", "")).startswith("gemma")


def _rope_scaling(config: dict[str, Any], source: str) -> RopeScaling | None:
    rope = config.get("rope_scaling") or config.get("rope_parameters")  # transformers >= 5 renames it
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
        rope = next(iter(rope.values()))  # per layer type (transformers >= 5); engines assume one factor for all
    if not isinstance(rope, dict):
        return None
    if str(config.get("model_type", "")).startswith("gemma3"):
        # Gemma 3 declares its max_position_embeddings with the factor applied; vLLM skips it for that reason.
        return None
    return RopeScaling(
        rope_type=_text(str(rope.get("rope_type") or rope.get("type") or "default")),
        factor=_ratio_of(rope, "factor", source),
        original_max_position_embeddings=_optional(
            rope, "original_max_position_embeddings", source, most=MAX_POSITIONS
        ),
    )


def from_hf_config(config: dict[str, Any], source: str, name: str | None = None) -> ModelArchitecture:
    """Read a config.json dictionary; `source` names the file in every error."""
    _refuse_huge_numbers(config, source)
    _refuse_wrong_shapes(config, source)
    try:
        return _from_hf_config(config, source, name)
    except ModelConfigError:
        raise
    except (TypeError, ValueError, AttributeError, ArithmeticError) as error:
        # An optional key of the wrong shape (a list for a number, a number for a list): the file, not a traceback.
        wrong = _shown(error)
        raise ModelConfigError(
            f"{source}: a value has the wrong type or range for a config.json ({wrong}); {_FIX}"
        ) from None


def _heads(body: dict[str, Any], hidden: int, source: str) -> tuple[int, int, int]:
    """Attention heads, KV heads and head_dim. KV heads share the query heads in equal groups (GQA), so a count
    that does not divide them is a garbled file, not a model."""
    heads = _count(body, "num_attention_heads", source, "n_head", most=MAX_HEADS)
    kv_heads = _optional(body, "num_key_value_heads", source, most=heads) or heads
    if heads % kv_heads:
        raise ModelConfigError(
            f"{source}: num_key_value_heads {kv_heads} does not divide num_attention_heads {heads} into equal "
            f"groups; {_FIX}"
        )
    head_dim = _optional(body, "head_dim", source, most=MAX_HEADS) or hidden // heads
    if head_dim < 1:
        raise ModelConfigError(
            f"{source}: hidden_size {hidden} / num_attention_heads {heads} leaves no head_dim; {_FIX}"
        )
    return heads, kv_heads, head_dim


def _mla(body: dict[str, Any], source: str) -> MLA | None:
    rank = _optional(body, "kv_lora_rank", source, least=0, most=MAX_WIDTH)
    if not rank:
        return None
    return MLA(
        kv_lora_rank=rank,
        qk_rope_head_dim=_count(body, "qk_rope_head_dim", source, most=MAX_HEADS),
        qk_nope_head_dim=_count(body, "qk_nope_head_dim", source, most=MAX_HEADS),
        v_head_dim=_count(body, "v_head_dim", source, most=MAX_HEADS),
        q_lora_rank=_optional(body, "q_lora_rank", source, least=0, most=MAX_WIDTH) or None,
    )


def _full_attention(body: dict[str, Any], heads: int, kv_heads: int, source: str) -> tuple[int | None, int | None]:
    """(head_dim, KV heads) of Gemma 4's full-attention layers where they differ from the sliding ones, as
    vLLM's Gemma4DecoderLayer builds them (vllm/model_executor/models/gemma4.py, vllm-project/vllm): global_head_dim,
    and num_global_key_value_heads only where attention_k_eq_v is set (V is then a copy of K, still cached)."""
    head_dim = _optional(body, "global_head_dim", source, most=MAX_HEADS)
    global_kv = _optional(body, "num_global_key_value_heads", source, most=MAX_HEADS)
    if global_kv is not None and heads % global_kv:
        raise ModelConfigError(
            f"{source}: num_global_key_value_heads {global_kv} does not divide num_attention_heads {heads} into "
            f"equal groups; {_FIX}"
        )
    full_kv = global_kv if body.get("attention_k_eq_v") and global_kv != kv_heads else None
    return head_dim, full_kv


def _dtype(body: dict[str, Any], config: dict[str, Any], source: str) -> str:
    key = _first(body, "torch_dtype", "dtype")
    value = body[key] if key else config.get("torch_dtype") or "bfloat16"
    if value not in CHECKPOINT_DTYPES:
        raise ModelConfigError(
            f"{source}: {key or 'torch_dtype'} is {_shown(value)}, not one of {', '.join(CHECKPOINT_DTYPES)}; {_FIX}"
        )
    return str(value)


def _quantization(body: dict[str, Any], config: dict[str, Any], source: str) -> Quantization | None:
    quant_config = body.get("quantization_config") or config.get("quantization_config")
    try:
        return from_config(quant_config) if quant_config else None
    except QuantizationError as error:
        raise ModelConfigError(f"{source}: {_text(str(error), 300)}") from None


_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")

# Blocks a config.json nests and lists it holds: one of another type would be skipped or iterated letter by letter
# (a vision tower dropped, a layer_types string read as layers named "f", "u"...), so it is refused by its key.
_OBJECT_KEYS = (*_TEXT_CONFIG_KEYS, "vision_config", "quantization_config", "rope_scaling", "rope_parameters")
_LIST_KEYS = ("architectures", "layer_types", "mlp_only_layers", "cross_attention_layers", "image_grid_pinpoints")


def _refuse_wrong_shapes(config: dict[str, Any], source: str) -> None:
    nested = next((k for k in _TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)), None)
    for block, prefix in ((config, ""), (config[nested] if nested else {}, f"{nested}.")):
        for keys, kind, want in ((_OBJECT_KEYS, dict, "an object"), (_LIST_KEYS, list, "a list")):
            for key in keys:
                value = block.get(key)
                if value is not None and not isinstance(value, kind):
                    raise ModelConfigError(f"{source}: {prefix}{key} is {_shown(value)}, not {want}; {_FIX}")


def _from_hf_config(config: dict[str, Any], source: str, name: str | None) -> ModelArchitecture:
    # A multimodal config nests its language model; InternVL's chat checkpoints call it llm_config.
    text = next((config[k] for k in _TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)), None)
    body = {**config, **text} if text else config
    if "model_type" in config and text is not None:
        body["model_type"] = text.get("model_type", config["model_type"])
    model_type = str(body.get("model_type"))
    nested = _NESTED_TEXT_DEFAULTS.get(model_type, {}) if text is not None else {}
    body = {**nested, **_CONFIG_DEFAULTS.get(model_type, {}), **body}
    _refuse_recurrent_state(body, source)
    _refuse_cross_attention(config, body, source)
    hidden = _count(body, "hidden_size", source, "n_embd", "d_model", most=MAX_WIDTH)
    layers = _count(body, "num_hidden_layers", source, "n_layer", "num_layers", most=MAX_LAYERS)
    heads, kv_heads, head_dim = _heads(body, hidden, source)
    max_positions = _count(body, "max_position_embeddings", source, "n_positions", "max_seq_len", most=MAX_POSITIONS)
    window = _window(body, max_positions, source)
    full_head_dim, full_kv_heads = _full_attention(body, heads, kv_heads, source)
    return ModelArchitecture(
        name=name or str(config.get("_name_or_path") or source),
        source=source,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        # Llama 4 sizes its dense layers by intermediate_size_mlp; its intermediate_size is the experts'.
        intermediate_size=_count(
            body, "intermediate_size_mlp", source, "intermediate_size", "n_inner", "ffn_dim", most=MAX_WIDTH
        ),
        vocab_size=_count(body, "vocab_size", source, most=MAX_VOCAB),
        tie_word_embeddings=bool(
            body.get("tie_word_embeddings", config.get("tie_word_embeddings", _ties_by_default(body)))
        ),
        dtype=_dtype(body, config, source),
        max_position_embeddings=max_positions,
        layer_types=_layer_types(body, layers, window, source),
        sliding_window=window,
        attention_bias=bool(
            body.get("attention_bias") or body.get("model_type") in {"qwen2", "qwen2_moe"} | _PLAIN_MLP_FAMILIES
        ),
        gated_mlp=str(body.get("model_type")) not in _PLAIN_MLP_FAMILIES,
        moe=_moe(body, layers, source),
        mla=_mla(body, source),
        quantization=_quantization(body, config, source),
        vision=_vision(config, hidden, source),
        rope_scaling=_rope_scaling(body, source),
        full_head_dim=full_head_dim if full_head_dim != head_dim else None,
        full_kv_heads=full_kv_heads,
        kv_shared_layers=_optional(body, "num_kv_shared_layers", source, least=0, most=layers - 1) or 0,
    )
