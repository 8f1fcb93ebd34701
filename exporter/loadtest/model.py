"""The knee against the capacity model: at what concurrency does the model say the KV pool fills?

The pool's tokens divided by the measured mean request footprint (prompt + output tokens, what one request holds
at its end, rounded up to whole KV blocks, since the engine hands out blocks, not tokens) is the number of such
requests that fit at once. The KV cache is not the only limit (compute, a batch
slot limit or the SLO itself may bind first), so a knee well below the prediction says something else limits the
server, and a knee above it says requests rarely hold their whole footprint at once.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exporter.capacity.plan import CapacityPlan
from exporter.loadtest.measure import RequestRecord


@dataclass(frozen=True)
class ModelPrediction:
    kv_cache_tokens: int  # the pool the prediction divides
    source: str  # "model" (Plimsoll's capacity model) or "engine" (what the engine reports it allocated)
    request_footprint_tokens: float  # measured: the mean prompt + output tokens of a request
    block_size: int | None  # the pool's block size the footprint was rounded up to (None: not rounded)
    predicted_concurrency: float  # requests of the measured footprint that fit in the pool
    knee_concurrency: int | None
    engine_kv_cache_tokens: int | None  # shown beside the model's, where the engine reports it

    @property
    def ratio(self) -> float | None:
        """Knee / predicted concurrency: 1 when the knee is where the pool fills, below 1 when something else binds
        first."""
        if self.knee_concurrency is None or self.predicted_concurrency <= 0:
            return None
        return self.knee_concurrency / self.predicted_concurrency

    def to_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "kv_cache_tokens": self.kv_cache_tokens,
            "source": self.source,
            "request_footprint_tokens": round(self.request_footprint_tokens, 1),
            "block_size": self.block_size,
            "predicted_concurrency": round(self.predicted_concurrency, 2),
            "knee_concurrency": self.knee_concurrency,
            "ratio": None if ratio is None else round(ratio, 3),
            "engine_kv_cache_tokens": self.engine_kv_cache_tokens,
        }


def model_prediction(
    plan: CapacityPlan | None,
    engine_capacity_tokens: int | None,
    footprint_tokens: float,
    knee_concurrency: int | None,
    engine_block_size: int | None = None,
) -> ModelPrediction | None:
    """The model's prediction where a plan was given, else the engine's own pool (in blocks of
    `engine_block_size` where the engine says); None with neither, or without a measured footprint (no request
    completed with usage)."""
    if footprint_tokens <= 0:
        return None
    block_size: int | None
    if plan is not None:
        tokens, source, block_size = plan.pool.tokens, "model", plan.pool.block_size
    elif engine_capacity_tokens is not None:
        tokens, source, block_size = engine_capacity_tokens, "engine", engine_block_size
    else:
        return None
    held = held_tokens(footprint_tokens, block_size)
    return ModelPrediction(
        kv_cache_tokens=tokens,
        source=source,
        request_footprint_tokens=footprint_tokens,
        block_size=block_size,
        predicted_concurrency=tokens / held,
        knee_concurrency=knee_concurrency,
        engine_kv_cache_tokens=engine_capacity_tokens,
    )


def held_tokens(footprint_tokens: float, block_size: int | None) -> float:
    """The pool a request of `footprint_tokens` holds: whole blocks where the engine allocates blocks."""
    return math.ceil(footprint_tokens / block_size) * block_size if block_size else footprint_tokens


def mean_footprint_tokens(requests: Sequence[RequestRecord]) -> float:
    """The mean prompt + output tokens of the completed requests whose usage the server reported; 0 without any."""
    sizes = [
        r.prompt_tokens + r.output_tokens
        for r in requests
        if r.error is None and r.prompt_tokens is not None and r.output_tokens is not None
    ]
    return sum(sizes) / len(sizes) if sizes else 0.0
