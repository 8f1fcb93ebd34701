"""What every engine adapter returns: one normalised reading per engine instance on a page.

`None` means the engine does not say; it never means zero. Counters are the engine's cumulative values as
scraped (resets are handled downstream, where history lives).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from exporter.sources.promtext import ParsedPage


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

    def read(self, page: ParsedPage) -> list[EngineReading]: ...
