"""How many bytes a quantized weight really costs, scales and zero points included.

Every method below quantizes the decoder's linear layers only; embeddings, the LM head, norms and routers keep
the model dtype (that is what vLLM loads for each of them). MXFP4 checkpoints (gpt-oss) quantize the MoE experts
only. The scale overhead matters: 4-bit AWQ at group size 128 costs 0.52 bytes a weight, not 0.5.

What vLLM keeps after loading is what counts, not what the checkpoint stores:
- GPTQ runs on Marlin (vllm/model_executor/layers/quantization/gptq_marlin.py) where the checkpoint is symmetric
  (`sym: true`, the GPTQ default), 4- or 8-bit, with a group of 32, 64, 128 or one per channel; Marlin drops the
  zero points (`marlin_make_empty` in place of `qzeros`). Any other GPTQ checkpoint falls back to the plain GPTQ
  kernel (gptq.py), which keeps `qzeros`. AWQ keeps its zero points (repacked by awq_marlin, same size).
  Act-order (`desc_act`) adds one int32 group index and one sort index per input row: a few bytes per row of
  thousands of weights, not counted.
- compressed-tensors (compressed_tensors/schemes/): FP8 weights (dynamic or static activations) cost a byte, plus
  one fp32 scale per tensor or output channel, or per block where the strategy is "block"; INT8 W8A8 a byte with
  per-channel scales; W4A16/W8A16 (`pack-quantized`) packed integers plus a 16-bit scale per group, and a packed
  zero point per group where asymmetric; NVFP4 (`nvfp4-pack-quantized`) half a byte plus an fp8 scale per 16.
- ModelOpt (modelopt.py): `quant_algo` FP8 and its per-channel and block variants cost a byte; NVFP4 half a byte
  plus an fp8 scale per 16 (`group_size`); MXFP8 a byte plus an e8m0 scale per 32. config.json carries it as
  `quantization_config` (`quant_method: modelopt`, with `quant_algo` flat or nested under `quantization`).
- Every method leaves modules 16-bit where its config names them (`ignore`, `modules_to_not_convert`,
  `exclude_modules`, `llm_int8_skip_modules`, GPTQModel's negative `dynamic` rules): `Quantization.kept_16bit`
  holds the decoder parts (attention, MLP, experts) those patterns cover, by layer or in every layer. Embeddings,
  the LM head, routers, norms and a vision tower are 16-bit anyway in `weights.weight_breakdown`.
- bitsandbytes 4-bit: since vLLM PR #19742 (June 2025, first released in v0.9.2) the loader dequantizes
  double-quantized absmax values to float32 at load (`dequantize_dq`), so every nf4/fp4 weight costs
  0.5 + 4/64 bytes whatever the checkpoint says. Earlier releases kept the nested 8-bit absmax, and in-flight
  quantization (`--quantization bitsandbytes` on a 16-bit checkpoint) always used it (`compress_statistics=True`).
"""

import re
from dataclasses import dataclass, replace
from typing import Any

from exporter.capacity import assumptions as A

# Which linear layers a method converts.
SCOPE_LINEAR = "linear"
SCOPE_EXPERTS = "experts"

# The parts of a decoder layer an ignore list can leave unquantized, and the layer index meaning "every layer".
PART_ATTENTION = "attention"
PART_MLP = "mlp"  # a dense layer's MLP, and the shared experts of an MoE layer
PART_EXPERTS = "experts"
ALL_LAYERS = -1


class QuantizationError(ValueError):
    """A quantization_config Plimsoll cannot price; the message names the key."""


@dataclass(frozen=True)
class Quantization:
    method: str
    bits: int
    bytes_per_weight: float
    scope: str = SCOPE_LINEAR
    # bytes per weight in vLLM releases before A.VLLM_BNB_FP32_ABSMAX_SINCE, where they differ
    legacy_bytes_per_weight: float | None = None
    # (part, layer or ALL_LAYERS) the checkpoint's ignore list keeps in 16 bits
    kept_16bit: frozenset[tuple[str, int]] = frozenset()

    def quantizes(self, part: str, layer: int) -> bool:
        """Whether this part of that decoder layer holds quantized weights."""
        if self.scope == SCOPE_EXPERTS and part != PART_EXPERTS:
            return False
        return (part, ALL_LAYERS) not in self.kept_16bit and (part, layer) not in self.kept_16bit

    def bytes_per_weight_in(self, vllm_version: tuple[int, int] | None) -> float:
        """Bytes per weight in a given vLLM release (None: current)."""
        old = vllm_version is not None and vllm_version < A.VLLM_BNB_FP32_ABSMAX_SINCE
        return self.legacy_bytes_per_weight if old and self.legacy_bytes_per_weight else self.bytes_per_weight

    @property
    def label(self) -> str:
        return f"{self.method} ({self.bits}-bit, {self.bytes_per_weight:.4g} bytes/weight)"


# Bits a packed integer or float weight may have: 2, 3, 4 and 8 are published; past 16 nothing is quantized.
_MOST_BITS = 16
# A group or block of weights sharing one scale: 32 to 128 are published; past this it is a garbled file.
_MOST_GROUP = 1_048_576


def _whole_in(value: object, key: str, least: int, most: int) -> int:
    """A quantization_config number, checked as the file gives it: the message names the key and the range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise QuantizationError(f"quantization_config.{key} is {value!r}, not a whole number")
    if not least <= value <= most:
        raise QuantizationError(f"quantization_config.{key} is {value!r}, not from {least} to {most:,}")
    return int(value)


def _bits(config: dict[str, Any], key: str, default: int) -> int:
    return _whole_in(config.get(key, default), key, 1, _MOST_BITS)


def _group(config: dict[str, Any], *keys: str, default: int | None = None) -> int | None:
    """The group size under the first of `keys` the config has; null and -1 are the ways GPTQ and AWQ write one
    scale per output channel. 0 is none: vLLM divides the input size by any group size but -1 (`input_size //
    group_size` in gptq.py and awq.py), so it cannot load such a checkpoint."""
    key = next((k for k in keys if k in config), None)
    if key is None:
        return default
    group = None if config[key] is None else _whole_in(config[key], key, -1, _MOST_GROUP)
    if group == 0:
        raise QuantizationError(
            f"quantization_config.{key} is 0, which vLLM cannot load (it divides by the group size): "
            "-1 for one scale per output channel, or the size the checkpoint was quantized with"
        )
    return group


def _int_bits(bits: int, group_size: int | None, scale_bytes: float = 2.0, zero_points: bool = True) -> float:
    """Packed b-bit integers plus one scale (fp16) and, unless symmetric, one packed zero point per group."""
    weight = bits / 8
    if not group_size or group_size <= 0:
        return weight  # per-channel scales: one per output row, negligible against the matrix
    return weight + (scale_bytes + (bits / 8 if zero_points else 0)) / group_size


def _fp8(block: object) -> float:
    if block:
        if not isinstance(block, list) or len(block) != 2:
            raise QuantizationError(f"quantization_config.weight_block_size is {block!r}, not [rows, columns]")
        rows, columns = (_whole_in(side, "weight_block_size[]", 1, _MOST_GROUP) for side in block)
        return 1 + 4 / (rows * columns)  # one fp32 scale per block
    return 1.0


def from_flag(method: str) -> Quantization:
    """vLLM's `--quantization` for online quantization of a 16-bit checkpoint."""
    if method == "fp8":
        return Quantization("fp8", 8, 1.0)
    if method == "bitsandbytes":
        # in-flight nf4 quantizes with compress_statistics=True (double quantization)
        return _bnb_4bit(double_quant=True)
    raise QuantizationError(
        f"--quantization {method!r} cannot be applied to an unquantized checkpoint "
        "(online quantization exists for fp8 and bitsandbytes; use a quantized checkpoint's config.json)"
    )


def _nf4(double_quant: bool) -> float:
    # One absmax per 64 weights: fp32, or 8-bit with a second-level fp32 scale per 256 absmaxes.
    return 0.5 + (1 / 64 + 4 / (64 * 256) if double_quant else 4 / 64)


def _bnb_4bit(double_quant: bool) -> Quantization:
    """nf4/fp4: current vLLM keeps float32 absmax (it dequantizes nested ones at load); older releases kept
    the checkpoint's double quantization."""
    legacy = _nf4(double_quant) if double_quant else None
    return Quantization("bitsandbytes", 4, _nf4(double_quant=False), legacy_bytes_per_weight=legacy)


def from_config(config: dict[str, Any]) -> Quantization:
    """A `quantization_config` block of a Hugging Face config.json, with the modules it leaves unquantized."""
    return replace(_scheme(config), kept_16bit=_kept_16bit(_ignored(config)))


def _scheme(config: dict[str, Any]) -> Quantization:
    method = str(config.get("quant_method", "")).lower()
    if method in {"fp8", "fbgemm_fp8"}:
        return Quantization("fp8", 8, _fp8(config.get("weight_block_size")))
    if method in {"awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round"}:
        bits = _bits(config, "bits" if "bits" in config else "w_bit", 4)
        group = _group(config, "group_size", "q_group_size", default=128)
        if method.startswith("awq"):
            zero_points = bool(config.get("zero_point", True))
        else:
            zero_points = not _gptq_on_marlin(bits, group, bool(config.get("sym", True)))
        return Quantization(method.removesuffix("_marlin"), bits, _int_bits(bits, group, zero_points=zero_points))
    if method == "bitsandbytes":
        if config.get("load_in_8bit"):
            return Quantization("bitsandbytes", 8, 1.0)
        return _bnb_4bit(bool(config.get("bnb_4bit_use_double_quant")))
    if method == "mxfp4":
        return Quantization("mxfp4", 4, 0.5 + 1 / 32, scope=SCOPE_EXPERTS)  # e8m0 scale per 32
    if method == "compressed-tensors":
        return _compressed_tensors(config)
    if method == "modelopt":
        return _modelopt(config)
    raise QuantizationError(
        f"quantization_config.quant_method {method or '(missing)'!r} is not one Plimsoll can price "
        "(known: fp8, awq, gptq, bitsandbytes, mxfp4, compressed-tensors, modelopt)"
    )


def _gptq_on_marlin(bits: int, group: int | None, symmetric: bool) -> bool:
    """Marlin takes symmetric 4- and 8-bit GPTQ at these group sizes (gptq_marlin.py); it drops the zero points."""
    return symmetric and bits in (4, 8) and (group or -1) in (-1, 32, 64, 128)


def _modelopt(config: dict[str, Any]) -> Quantization:
    nested = config.get("quantization")
    block = nested if isinstance(nested, dict) else config
    algo = str(block.get("quant_algo", "")).upper()
    if algo.startswith("FP8"):  # FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO: a byte, scales negligible
        return Quantization("fp8", 8, 1.0)
    if algo == "MXFP8":
        return Quantization("mxfp8", 8, 1 + 1 / 32)  # e8m0 scale per 32
    if "NVFP4" in algo:  # NVFP4, W4A16_NVFP4: fp8 scale per group of 16
        group = _whole_in(block.get("group_size") or 16, "group_size", 1, _MOST_GROUP)
        return Quantization("nvfp4", 4, 0.5 + 1 / group)
    raise QuantizationError(
        f"quantization_config.quant_algo {algo or '(missing)'!r} is not one Plimsoll can price for modelopt "
        "(known: FP8 and its variants, MXFP8, NVFP4)"
    )


def _ignored(config: dict[str, Any]) -> list[str]:
    """The module patterns a config leaves unquantized, under whichever key its method uses."""
    nested = config.get("quantization")
    blocks = [config, nested] if isinstance(nested, dict) else [config]
    keys = ("ignore", "modules_to_not_convert", "exclude_modules", "llm_int8_skip_modules")
    for block in blocks:
        wrong = next((k for k in keys if block.get(k) is not None and not isinstance(block[k], list)), None)
        if wrong is not None:  # skipping it would price as quantized the modules it keeps in 16 bits
            raise QuantizationError(f"quantization_config.{wrong} is {block[wrong]!r}, not a list of module names")
    patterns = [p for b in blocks for k in keys if isinstance(b.get(k), list) for p in b[k] if isinstance(p, str)]
    dynamic = config.get("dynamic")
    if isinstance(dynamic, dict):  # GPTQModel: a "-:" rule skips the modules it matches
        patterns += [k[2:] for k in dynamic if isinstance(k, str) and k.startswith("-:")]
    return patterns


# Module names already 16-bit in weights.weight_breakdown whatever the method (or not counted at all): an ignore
# entry naming one of them changes nothing.
_ALWAYS_16BIT = ("lm_head", "embed", "visual", "vision", "projector", "image", "audio", "mtp", "norm", "router")
_ATTENTION = ("attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "qkv", "kv_a_", "kv_b_", "q_a_", "q_b_")
_MLP = ("mlp", "feed_forward", "ffn", "gate_proj", "up_proj", "down_proj", "moe")
_LAYER = re.compile(r"layers\.(\d+)(\.|$)")


def _kept_16bit(patterns: list[str]) -> frozenset[tuple[str, int]]:
    """The decoder parts, by layer (or in every layer), that these ignore patterns name. A pattern naming none of
    them (a norm, the vision tower, an unknown module) leaves the decoder as the method quantizes it."""
    kept: set[tuple[str, int]] = set()
    for pattern in patterns:
        name = pattern.lower().removeprefix("re:").replace("\\", "").rstrip("$*.")
        if any(word in name for word in _ALWAYS_16BIT) or name.endswith("gate"):  # routers end in .gate
            continue
        layer = int(match.group(1)) if (match := _LAYER.search(name)) else ALL_LAYERS
        if any(word in name for word in _ATTENTION):
            kept.add((PART_ATTENTION, layer))
        elif "shared_expert" in name:
            kept.add((PART_MLP, layer))
        elif "expert" in name:
            kept.add((PART_EXPERTS, layer))
        elif any(word in name for word in _MLP):
            kept |= {(PART_MLP, layer), (PART_EXPERTS, layer)}
        elif match is not None and match.group(2) == "":  # a whole layer
            kept |= {(PART_ATTENTION, layer), (PART_MLP, layer), (PART_EXPERTS, layer)}
    return frozenset(kept)


def _compressed_tensors(config: dict[str, Any]) -> Quantization:
    groups = config.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups or not all(isinstance(g, dict) for g in groups.values()):
        raise QuantizationError(
            f"quantization_config.config_groups is {groups!r}, not the object of schemes compressed-tensors writes"
        )
    # the group over every Linear layer where there are several; a scheme per part is not priced separately
    linear = [g for g in groups.values() if "Linear" in (g.get("targets") or [])]
    weights = (linear or list(groups.values()))[0].get("weights") or {}
    if not isinstance(weights, dict):
        raise QuantizationError(f"quantization_config.config_groups[].weights is {weights!r}, not an object")
    bits = _bits(weights, "num_bits", 8)
    if weights.get("type") == "float":
        if bits == 8:
            block = weights.get("block_structure") if weights.get("strategy") == "block" else None
            return Quantization("fp8", 8, _fp8(block))
        # one fp8 scale per group, so no per-channel reading: -1 would price the scales at minus a byte a weight
        group = _whole_in(weights.get("group_size") or 16, "group_size", 1, _MOST_GROUP)
        return Quantization("nvfp4", bits, bits / 8 + 1 / group)
    zero_points = not bool(weights.get("symmetric", True))
    return Quantization("int", bits, _int_bits(bits, _group(weights, "group_size"), zero_points=zero_points))
