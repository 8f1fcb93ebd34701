"""Headroom of one engine instance: KV tokens and requests that still fit, and how far the model is off.

Pure: takes a normalised reading and the model's prediction, returns values. A request's footprint is the KV it
holds at its end: prompt plus generated tokens, from the engine's per-request token histograms (mean from their
sums and counts; p95 as the sum of each histogram's p95, which over-states a little because long prompts and
long outputs rarely coincide: the safe side for capacity).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class CumulativeHistogram(Protocol):
    @property
    def buckets(self) -> Sequence[tuple[float, float]]: ...

    @property
    def count(self) -> float: ...

    @property
    def sum(self) -> float: ...


@dataclass(frozen=True)
class Headroom:
    kv_cache_used_tokens: float | None
    kv_cache_headroom_tokens: float | None
    footprint_mean_tokens: float | None
    footprint_p95_tokens: float | None
    headroom_requests_mean: float | None
    headroom_requests_p95: float | None


def quantile(histogram: CumulativeHistogram, q: float) -> float | None:
    """histogram_quantile's estimate: linear inside the bucket holding the q-th observation."""
    if histogram.count <= 0:
        return None
    rank = q * histogram.count
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in histogram.buckets:
        # The +Inf bucket: the largest finite bound is all we know. Whatever its count, as a torn scrape can read
        # _count above it (requests that finished between the two lines), which is no observation past +Inf.
        if math.isinf(bound):
            return lower_bound
        if cumulative >= rank:
            if cumulative == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (cumulative - lower_count)
        lower_bound, lower_count = bound, cumulative
    return lower_bound


def _mean(histogram: CumulativeHistogram | None) -> float | None:
    if histogram is None or histogram.count <= 0 or math.isnan(histogram.sum):  # NaN: the page gave no _sum
        return None
    return histogram.sum / histogram.count


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _fit(headroom_tokens: float | None, footprint: float | None) -> float | None:
    if headroom_tokens is None or not footprint:
        return None
    fit = headroom_tokens / footprint  # +Inf where the footprint is a denormal fraction of a token
    return float(math.floor(fit)) if math.isfinite(fit) else None


def headroom(
    usage_ratio: float | None,
    capacity_tokens: float | None,
    prompt_tokens: CumulativeHistogram | None,
    generation_tokens: CumulativeHistogram | None,
) -> Headroom:
    used = free = None
    if usage_ratio is not None and capacity_tokens is not None and math.isfinite(usage_ratio):
        ratio = min(max(usage_ratio, 0.0), 1.0)
        used = ratio * capacity_tokens
        free = capacity_tokens - used
    mean = _add(_mean(prompt_tokens), _mean(generation_tokens))
    p95 = None
    if prompt_tokens is not None and generation_tokens is not None:
        p95 = _add(quantile(prompt_tokens, 0.95), quantile(generation_tokens, 0.95))
    return Headroom(
        kv_cache_used_tokens=used,
        kv_cache_headroom_tokens=free,
        footprint_mean_tokens=mean,
        footprint_p95_tokens=p95,
        headroom_requests_mean=_fit(free, mean),
        headroom_requests_p95=_fit(free, p95),
    )


def capacity_error_ratio(engine_tokens: float | None, model_tokens: float | None) -> float | None:
    """(engine - model) / model: positive when the engine allocated more than the model predicts."""
    if engine_tokens is None or not model_tokens:
        return None
    return (engine_tokens - model_tokens) / model_tokens
