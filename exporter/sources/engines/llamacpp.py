"""llama.cpp's llama-server (`--metrics`; engines.md A.6). No labels at all.

Current builds export no KV metric: `kv_cache_usage_ratio` and `kv_cache_tokens` were removed in May 2025
(ggml-org/llama.cpp #13660). Older builds' usage ratio is still read; their `kv_cache_tokens` counted tokens held,
not capacity, and a reading has no field for it. Capacity comes from GET /slots instead, fetched by the daemon
and summed by `capacity_from_slots`.
"""

import json

from exporter.sources.engines.domains import MAX_COUNT
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


def capacity_from_slots(body: str) -> int | None:
    """KV capacity in tokens from the body of GET /slots: the slots' `n_ctx` added up (each slot owns its share
    of the context). None when the body is not a JSON list, when no slot states a whole n_ctx, or when the total is
    not a count from 1 to MAX_COUNT: JSON integers have no bound, and a total too large for a float would fail
    every /metrics scrape."""
    try:
        slots = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: lists nested deeper than the decoder recurses
        return None
    if not isinstance(slots, list):
        return None
    sizes = [slot.get("n_ctx") for slot in slots if isinstance(slot, dict)]
    counted = [size for size in sizes if isinstance(size, int) and not isinstance(size, bool) and size >= 0]
    total = sum(counted)
    return total if counted and 1 <= total <= MAX_COUNT else None
