"""How many bytes a quantized weight really costs, scales and zero points included.

Every method below quantizes the decoder's linear layers only; embeddings, the LM head, norms and routers keep
the model dtype (that is what vLLM loads for each of them). MXFP4 checkpoints (gpt-oss) quantize the MoE experts
only. The scale overhead matters: 4-bit AWQ at group size 128 costs 0.52 bytes a weight, not 0.5.

What vLLM keeps after loading is what counts, not what the checkpoint stores:
- GPTQ with symmetric quantization (`sym: true`, the GPTQ default) runs on Marlin, which drops the checkpoint's
  zero points (`marlin_make_empty` in place of `qzeros`); AWQ keeps its zero points (repacked, same size).
- bitsandbytes 4-bit: since vLLM PR #19742 (June 2025, first released in v0.9.2) the loader dequantizes
  double-quantized absmax values to float32 at load (`dequantize_dq`), so every nf4/fp4 weight costs
  0.5 + 4/64 bytes whatever the checkpoint says. Earlier releases kept the nested 8-bit absmax, and in-flight
  quantization (`--quantization bitsandbytes` on a 16-bit checkpoint) always used it (`compress_statistics=True`).
"""

from dataclasses import dataclass
from typing import Any

from exporter.capacity import assumptions as A

# Which linear layers a method converts.
SCOPE_LINEAR = "linear"
SCOPE_EXPERTS = "experts"


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
    """The group size under the first of `keys` the config has; null, -1 and 0 are the ways GPTQ and AWQ write one
    scale per output channel."""
    key = next((k for k in keys if k in config), None)
    if key is None:
        return default
    return None if config[key] is None else _whole_in(config[key], key, -1, _MOST_GROUP)


def _int_bits(bits: int, group_size: int | None, scale_bytes: float = 2.0, zero_points: bool = True) -> float:
    """Packed b-bit integers plus one scale (fp16) and, unless symmetric, one packed zero point per group."""
    weight = bits / 8
    if not group_size or group_size <= 0:
        return weight  # per-channel scales: one per output row, negligible against the matrix
    return weight + (scale_bytes + (bits / 8 if zero_points else 0)) / group_size


def _fp8(block: list[int] | None) -> float:
    if block:
        rows, columns = (_whole_in(side, "weight_block_size[]", 1, _MOST_GROUP) for side in block[:2])
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
    """A `quantization_config` block of a Hugging Face config.json."""
    method = str(config.get("quant_method", "")).lower()
    if method in {"fp8", "fbgemm_fp8"}:
        return Quantization("fp8", 8, _fp8(config.get("weight_block_size")))
    if method in {"awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round"}:
        bits = _bits(config, "bits" if "bits" in config else "w_bit", 4)
        group = _group(config, "group_size", "q_group_size", default=128)
        if method.startswith("awq"):
            zero_points = bool(config.get("zero_point", True))
        else:  # GPTQ: Marlin drops the zero points of symmetric checkpoints
            zero_points = not bool(config.get("sym", True))
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
        algo = str(config.get("quant_algo", config.get("quantization", {}).get("quant_algo", ""))).upper()
        if algo == "FP8":
            return Quantization("fp8", 8, 1.0)
        if algo == "NVFP4":
            return Quantization("nvfp4", 4, 0.5 + 1 / 16)  # fp8 scale per 16
    raise QuantizationError(
        f"quantization_config.quant_method {method or '(missing)'!r} is not one Plimsoll can price "
        "(known: fp8, awq, gptq, bitsandbytes, mxfp4, compressed-tensors, modelopt)"
    )


def _compressed_tensors(config: dict[str, Any]) -> Quantization:
    groups = config.get("config_groups") or {}
    if not groups:
        raise QuantizationError("quantization_config.config_groups is missing for compressed-tensors")
    weights = next(iter(groups.values())).get("weights") or {}
    bits = _bits(weights, "num_bits", 8)
    if weights.get("type") == "float":
        if bits == 8:
            block = weights.get("block_structure") if weights.get("strategy") == "block" else None
            return Quantization("fp8", 8, _fp8(block))
        return Quantization("nvfp4", bits, 0.5 + 1 / 16)
    zero_points = not bool(weights.get("symmetric", True))
    return Quantization("int", bits, _int_bits(bits, _group(weights, "group_size"), zero_points=zero_points))
