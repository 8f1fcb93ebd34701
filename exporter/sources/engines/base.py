"""What every engine adapter returns: one normalised reading per engine instance on a page.

`None` means the engine gives no usable value: either the page does not carry the field (`absent_fields()`), or
it carries a value outside the field's domain, whose reason is kept in `invalid`; it never means zero. Counters
are the engine's cumulative values as scraped (resets are handled downstream, where history lives).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from exporter.sources.promtext import ParsedPage


@dataclass(frozen=True)
class PageLimits:
    """What one page may make a read keep; beyond either, the read fails (the target is marked down)."""

    max_series: int = 20_000  # samples kept after filtering to the adapters' names
    max_instances: int = 64  # engine instances read from one page


class TooManyInstances(Exception):
    def __init__(self, found: int, limit: int) -> None:
        super().__init__(f"{found} engine instances, at most {limit} read")
        self.found = found
        self.limit = limit


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram: (upper bound, cumulative count) pairs sorted by bound, +Inf last."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float


@dataclass(frozen=True)
class EngineReading:
    engine: str  # adapter name: vllm, sglang, trtllm, tgi, llamacpp, lmdeploy, nim
    instance: str  # the engine's own instance label (vLLM's `engine`, SGLang's dp_rank); "" when single
    model: str | None
    kv_cache_usage_ratio: float | None = None
    kv_cache_capacity_tokens: int | None = None
    kv_block_size: int | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    requests_finished_total: float | None = None
    ttft_seconds: Histogram | None = None
    itl_seconds: Histogram | None = None
    e2e_seconds: Histogram | None = None
    request_prompt_tokens: Histogram | None = None
    request_generation_tokens: Histogram | None = None
    engine_config: Mapping[str, str] = field(default_factory=dict)  # e.g. vLLM's cache_config_info labels
    # Fields the page carried with a value outside their domain (left None above), and why, e.g.
    # {"kv_cache_usage_ratio": "5 is outside 0..1"}.
    invalid: Mapping[str, str] = field(default_factory=dict)

    def absent_fields(self) -> tuple[str, ...]:
        """The normalised fields the engine does not report: None, and not for being invalid."""
        return tuple(name for name in NORMALISED_FIELDS if getattr(self, name) is None and name not in self.invalid)


# Every field of a reading that holds a value from the engine (not who said it, nor the engine's config).
NORMALISED_FIELDS = tuple(
    f.name for f in fields(EngineReading) if f.name not in ("engine", "instance", "model", "engine_config", "invalid")
)


def json_number(value: float | None) -> float | str | None:
    """JSON has no infinity: +Inf travels as the string "+Inf", NaN as null."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


def reading_dict(reading: EngineReading) -> dict[str, Any]:
    """The reading as JSON: an instance of /api/v1/state and `plimsoll probe --format json`."""
    return {
        "engine": reading.engine,
        "dp_rank": reading.instance,
        "model": reading.model,
        "kv_cache_usage_ratio": json_number(reading.kv_cache_usage_ratio),
        "kv_cache_capacity_tokens": reading.kv_cache_capacity_tokens,
        "kv_block_size": reading.kv_block_size,
        "requests_running": json_number(reading.requests_running),
        "requests_waiting": json_number(reading.requests_waiting),
        "preemptions_total": json_number(reading.preemptions_total),
        "prompt_tokens_total": json_number(reading.prompt_tokens_total),
        "generation_tokens_total": json_number(reading.generation_tokens_total),
        # A field the page carried with a value outside its domain, and why; and the fields the engine does not
        # report at all: null above means one or the other.
        "invalid": dict(reading.invalid),
        "absent": list(reading.absent_fields()),
    }


@dataclass(frozen=True)
class Detection:
    """How sure an adapter is that a page is its engine's, and why (shown by `plimsoll probe`)."""

    score: float  # 0 = not mine, 1 = certain
    evidence: tuple[str, ...] = ()


class EngineAdapter(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def needs(self) -> tuple[str, ...]:
        """The names this adapter reads: sample names, and histogram families (whose _bucket, _sum and _count
        samples it reads). Pages are parsed for the union of these only, so a name missing here is invisible."""
        ...

    def detect(self, page: ParsedPage) -> Detection: ...

    def read(self, page: ParsedPage, max_instances: int = PageLimits.max_instances) -> list[EngineReading]:
        """One reading per engine instance; raises TooManyInstances when the page has more than max_instances."""
        ...
