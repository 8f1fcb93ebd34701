"""llama.cpp's llama-server (`--metrics`; engines.md A.6). No labels at all.

Current builds export no KV metric: `kv_cache_usage_ratio` and `kv_cache_tokens` were removed in May 2025
(ggml-org/llama.cpp #13660). Older builds' usage ratio is still read; their `kv_cache_tokens` counted tokens held,
not capacity, and a reading has no field for it. Capacity comes from GET /slots instead, fetched by the daemon
and summed by `capacity_from_slots`.
"""

from typing import Any

from exporter.sources.engines.vocabulary import Vocabulary

ADAPTER = Vocabulary(
    name="llamacpp",
    prefix="llamacpp:",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    kv_usage=("llamacpp:kv_cache_usage_ratio",),  # builds before May 2025 only
    prompt_tokens=("llamacpp:prompt_tokens_total",),
    generation_tokens=("llamacpp:tokens_predicted_total",),
)


def capacity_from_slots(slots_json: list[dict[str, Any]]) -> int | None:
    """KV capacity in tokens from the body of GET /slots: the slots' `n_ctx` added up (each slot owns its share
    of the context). None when no slot states a whole n_ctx."""
    sizes = [slot.get("n_ctx") for slot in slots_json if isinstance(slot, dict)]
    counted = [size for size in sizes if isinstance(size, int) and not isinstance(size, bool) and size >= 0]
    return sum(counted) if counted else None
