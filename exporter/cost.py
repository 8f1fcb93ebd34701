"""What a GPU costs: the config's price per GPU-hour (`pricing.gpu_hour`), found by a GPU's preset or NVML name.

Prices are keyed as the user writes them: a preset name or alias ("H100-80GB", "H100") or the product name NVML
reports ("NVIDIA H100 80GB HBM3"). A key and a GPU that name the same preset are the same GPU, so a price given
as "H100" also prices the card NVML calls "NVIDIA H100 80GB HBM3".
"""

from collections.abc import Sequence

from exporter.catalog import gpu_presets

GpuHourPrices = tuple[tuple[str, float], ...]  # Config.gpu_hour_prices: sorted (GPU type, price) pairs


def _preset(name: str) -> str | None:
    # Not find_gpu: its error suggests the closest names, which costs more than the daemon can spend each poll.
    return next((gpu.name for gpu in gpu_presets() if gpu.matches(name)), None)


def gpu_hour_price(prices: GpuHourPrices, gpu_name: str) -> float | None:
    """The price of one hour of `gpu_name`, or None when no key names it (nor the preset it is)."""
    for key, price in prices:
        if key == gpu_name:
            return price
    preset = _preset(gpu_name)
    if preset is None:
        return None
    for key, price in prices:
        if _preset(key) == preset:
            return price
    return None


def gpus_hourly_cost(prices: GpuHourPrices, gpu_names: Sequence[str]) -> float | None:
    """What the GPUs named (one name a GPU) cost together per hour; None when there are none or any one has no
    price, as a sum that leaves a GPU out would pass for the whole cost."""
    if not gpu_names or not prices:
        return None
    total = 0.0
    for name in gpu_names:
        price = gpu_hour_price(prices, name)
        if price is None:
            return None
        total += price
    return total


def unpriced_gpus(prices: GpuHourPrices, gpu_names: Sequence[str]) -> tuple[str, ...]:
    """The names among `gpu_names` that no key prices, each once, in order."""
    return tuple(dict.fromkeys(name for name in gpu_names if gpu_hour_price(prices, name) is None))
