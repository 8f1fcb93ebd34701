"""The `pricing` section: the price of one GPU-hour by GPU type, for the cost series."""

from typing import Any

from exporter.catalog import gpu_presets
from exporter.config.reader import Reader
from exporter.config.validators import label_value, shown, shown_key, validate_number
from exporter.core.units import value_kind

_NVML_NAME_PREFIXES = ("NVIDIA ", "Tesla ", "Quadro ")
# Tens of times what any GPU-hour rents for in any currency quoted per hour: a bigger number is a typo (a price per
# month, a node's price, an exponent), and 1e308 times GPUs and hours overflows to Infinity in result.json.
MAX_GPU_HOUR_PRICE = 10_000
_GPU_LABEL = label_value("a GPU type (a preset or NVML product name)")


def validate_gpu_type(value: Any) -> str:
    """A GPU type as prices are keyed: a preset or an NVML product name."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{shown(value)} is not a GPU type (a preset or NVML product name)")
    _GPU_LABEL(value)  # matched against NVML names and quoted in messages: one printable line, like them
    if not value.startswith(_NVML_NAME_PREFIXES) and not any(preset.matches(value) for preset in gpu_presets()):
        # A typo here would silently leave every GPU of that type unpriced (no cost series at all).
        raise ValueError(
            f"{shown_key(value)}: neither a GPU preset (`plimsoll plan --list-gpus`) nor an NVML product name "
            "(as `nvidia-smi -L` shows it, e.g. NVIDIA A40)"
        )
    return value


def validate_gpu_hour_prices(value: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a map of GPU type to price per GPU-hour (H100-80GB: 2.49), got {value_kind(value)}")
    problems, prices = [], []
    for gpu, price in value.items():
        try:
            validate_gpu_type(gpu)
        except ValueError as error:
            problems.append(str(error))
            continue
        try:
            number = validate_number(price, "a price per GPU-hour")
        except ValueError as error:
            problems.append(f"{shown_key(gpu)}: {error}")
            continue
        if number <= 0:
            problems.append(f"{shown_key(gpu)}: {shown(price)} is not a price (more than 0 per GPU-hour)")
        elif number > MAX_GPU_HOUR_PRICE:
            problems.append(
                f"{shown_key(gpu)}: {shown(price)} is out of range: a price above {MAX_GPU_HOUR_PRICE:,} per "
                "GPU-hour is a typo (prices are per GPU and per hour)"
            )
        prices.append((gpu, number))
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(sorted(prices))


def parse_pricing(r: Reader, raw: Any) -> tuple[tuple[str, float], ...]:
    data = r.mapping(raw, "pricing")
    r.unknown(data, "pricing", ("gpu_hour",))
    prices: tuple[tuple[str, float], ...] = r.convert(data, "gpu_hour", "pricing.", validate_gpu_hour_prices, ())
    return prices
