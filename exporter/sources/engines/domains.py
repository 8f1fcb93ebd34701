"""Which values each normalised field may take, and what becomes of one that is outside: the field is left None
and the reason kept in the reading's `invalid`, so a KV usage of 5 or -Inf is never exported as a 0..1 ratio
(and read as "saturated now"), and the other fields of the same reading are still read.

Every engine Plimsoll reads reports KV usage as a fraction 0..1 (reference/engines.md, A.8), so nothing is scaled
from percent: a value above 1 is wrong, not a percentage.
"""

import math
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from exporter.sources.engines.base import EngineReading, Histogram

# Above any real KV pool or block (2**40 tokens is a petabyte of KV at one byte a token), below where a float
# stops holding whole numbers exactly.
MAX_COUNT = 2**40
# Above what any engine counts in its life (a million tokens a second for 285 years), where a float stops holding
# whole numbers: a hostile page's 1e308 would otherwise be summed across resets into an SLO counter of +Inf.
MAX_AMOUNT = 2**53


def shown(value: float) -> str:
    """A value as a person reads it in a reason, in the spelling of the text format."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def ratio_problem(value: float) -> str | None:
    if math.isnan(value):
        return "NaN is not a number"
    return None if 0.0 <= value <= 1.0 else f"{shown(value)} is outside 0..1"


def amount_problem(value: float) -> str | None:
    """Requests, tokens, counters: finite, not negative, at most MAX_AMOUNT."""
    if math.isnan(value):
        return "NaN is not a number"
    if math.isinf(value):
        return f"{shown(value)} is not finite"
    if value > MAX_AMOUNT:
        return f"{shown(value)} is over 2**53, more than any engine counts"
    return f"{shown(value)} is negative" if value < 0 else None


def count_problem(value: float) -> str | None:
    """A size in tokens or blocks: a whole number from 1 to MAX_COUNT."""
    if math.isfinite(value) and value.is_integer() and 1 <= value <= MAX_COUNT:
        return None
    return f"{shown(value)} is not a whole number from 1 to 2**40"


def size_product(blocks: float | None, block_size: float | None) -> float | None:
    """Blocks times tokens per block, for `with_counts`; a factor that is not a count itself is returned instead
    of the product, so two wrong signs cannot multiply into a plausible size and the reason shows the bad value."""
    if blocks is None or block_size is None:
        return None
    for factor in (blocks, block_size):
        if count_problem(factor) is not None:
            return factor
    return blocks * block_size


def histogram_problem(histogram: Histogram) -> str | None:
    """Finite, non-negative counts that never fall from one bucket to the next; a sum, where given, likewise."""
    below_bound, below_count = -math.inf, 0.0  # the bucket before; the first must hold at least 0
    for bound, count in histogram.buckets:
        if not below_count <= count <= MAX_AMOUNT:  # one test for NaN, Inf, too big, negative and falling
            why = amount_problem(count) or (
                f"holds {shown(count)}, fewer than le={shown(below_bound)} below it ({shown(below_count)}): "
                "cumulative counts cannot fall"
            )
            return f"bucket le={shown(bound)}: {why}"
        below_bound, below_count = bound, count
    problem = amount_problem(histogram.count)
    if problem is not None:
        return f"count: {problem}"
    if math.isnan(histogram.sum):  # the page gave no _sum
        return None
    problem = amount_problem(histogram.sum)
    return None if problem is None else f"sum: {problem}"


_FLOAT_FIELDS: dict[str, Callable[[float], str | None]] = {
    "kv_cache_usage_ratio": ratio_problem,
    "requests_running": amount_problem,
    "requests_waiting": amount_problem,
    "preemptions_total": amount_problem,
    "prompt_tokens_total": amount_problem,
    "generation_tokens_total": amount_problem,
    "requests_finished_total": amount_problem,
}
_HISTOGRAM_FIELDS = ("ttft_seconds", "itl_seconds", "e2e_seconds", "request_prompt_tokens", "request_generation_tokens")


def checked(reading: EngineReading) -> EngineReading:
    """The reading with each float and histogram field outside its domain left None, and the reason recorded."""
    problems: dict[str, str] = {}
    for name, problem_of in _FLOAT_FIELDS.items():
        value = getattr(reading, name)
        problem = None if value is None else problem_of(value)
        if problem is not None:
            problems[name] = problem
    for name in _HISTOGRAM_FIELDS:
        histogram = getattr(reading, name)
        problem = None if histogram is None else histogram_problem(histogram)
        if problem is not None:
            problems[name] = problem
    return _rejecting(reading, problems)


def with_counts(reading: EngineReading, **values: float | None) -> EngineReading:
    """The reading with each named size field (kv_cache_capacity_tokens, kv_block_size) set to its value as a
    whole number, or left None with the reason when it is not one from 1 to MAX_COUNT."""
    whole: dict[str, Any] = {}  # field name -> int; typed for `replace`, which cannot check fields named at run time
    problems: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        problem = count_problem(value)
        if problem is None:
            whole[name] = int(value)
        else:
            problems[name] = problem
    return _rejecting(replace(reading, **whole), problems)


def _rejecting(reading: EngineReading, problems: dict[str, str]) -> EngineReading:
    if not problems:
        return reading
    rejected: dict[str, Any] = dict.fromkeys(problems)
    return replace(reading, **rejected, invalid=MappingProxyType({**reading.invalid, **problems}))
