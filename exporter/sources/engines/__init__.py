"""The engine adapters, which one a page belongs to, and reading one page safely.

Adding an engine: one module exposing an `EngineAdapter` as `ADAPTER`, and one line in `ADAPTERS`.

`read_page` is the one way the daemon reads a page: it never raises on what a page says, its cost is linear in the
page and bounded by `PageLimits`, and it holds no state between calls, so it may run in a worker thread.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from exporter.sources.engines import llamacpp, lmdeploy, nim, sglang, tgi, trtllm, vllm
from exporter.sources.engines.base import Detection, EngineAdapter, EngineReading, PageLimits, TooManyInstances
from exporter.sources.promtext import LABELS_PER_SAMPLE, ParsedPage, TooManyLabels, TooManySeries, parse

ADAPTERS: tuple[EngineAdapter, ...] = (
    vllm.ADAPTER,
    sglang.ADAPTER,
    trtllm.ADAPTER,
    tgi.ADAPTER,
    llamacpp.ADAPTER,
    lmdeploy.ADAPTER,
    nim.ADAPTER,
)

# At 0.5 a page needs an engine's prefix, or (for NIM's unprefixed names) half its load and KV gauges.
DETECTION_THRESHOLD = 0.5

_HISTOGRAM_SUFFIXES = frozenset(("bucket", "sum", "count"))
_DEFAULT_LIMITS = PageLimits()
_NAMES = ", ".join(adapter.name for adapter in ADAPTERS)
_NOT_METRICS = "the page is not Prometheus metrics (no # TYPE lines, no counters): check the target's URL and path"


def detect(page: ParsedPage) -> tuple[EngineAdapter | None, list[tuple[str, Detection]]]:
    """The adapter that scores highest at or above the threshold (ties go to the earlier in ADAPTERS), and every
    adapter's detection, best first."""
    scored = sorted(((adapter, adapter.detect(page)) for adapter in ADAPTERS), key=lambda pair: -pair[1].score)
    best, detection = scored[0]
    return (best if detection.score >= DETECTION_THRESHOLD else None), [(a.name, d) for a, d in scored]


@dataclass(frozen=True)
class PageRead:
    engine: str | None  # the adapter's name, None when no engine claims the page
    readings: tuple[EngineReading, ...]
    # None, or why the page gave nothing: "unknown_engine", "not_metrics", "too_many_series", "too_many_instances"
    failure: str | None = None
    detail: str | None = None  # a sentence for the operator saying what to do


def read_page(text: str, engine: str = "auto", limits: PageLimits = _DEFAULT_LIMITS) -> PageRead:
    """Parse a page for what the adapters read and read it: with `engine="auto"` as the best-scoring engine's,
    otherwise as the named engine's. Whatever the page holds, this returns; what went wrong is in `failure`."""
    if engine == "auto":
        adapters = ADAPTERS
    else:
        adapters = tuple(adapter for adapter in ADAPTERS if adapter.name == engine)
        if not adapters:
            detail = f"engine {engine!r} is not one Plimsoll reads: expected auto or one of {_NAMES}"
            return PageRead(None, (), "unknown_engine", detail)
    try:
        page = parse(text, keep_filter(adapters), limits.max_series)
    except TooManySeries as error:
        return PageRead(None if engine == "auto" else engine, (), "too_many_series", _too_many(error))
    adapter = adapters[0] if engine != "auto" else detect(page)[0]
    if adapter is None:
        if _looks_like_metrics(text):
            detail = f"none of the engines Plimsoll reads ({_NAMES}) is named on the page; `plimsoll probe` shows why"
            return PageRead(None, (), "unknown_engine", detail)
        return PageRead(None, (), "not_metrics", _NOT_METRICS)
    try:
        readings = adapter.read(page, limits.max_instances)
    except TooManyInstances as error:
        detail = (
            f"the page has {error.found:,} engine instances; at most {error.limit:,} are read "
            "(max_instances_per_target)"
        )
        return PageRead(adapter.name, (), "too_many_instances", detail)
    if not readings and not _looks_like_metrics(text):
        return PageRead(adapter.name, (), "not_metrics", _NOT_METRICS)
    if not readings and engine != "auto":
        # An engine named wrongly reads nothing from another engine's page: say so, rather than a target that is
        # up with nothing to show. A page no engine claims may be the named engine's before it reports anything.
        claimed = _claimed_by(text, limits)
        if claimed is not None and claimed.name != engine:
            detail = f"the page is {claimed.name}'s, not {engine}'s: set the target's engine to {claimed.name} or auto"
            return PageRead(engine, (), "unknown_engine", detail)
    return PageRead(adapter.name, tuple(readings))


def _claimed_by(text: str, limits: PageLimits) -> EngineAdapter | None:
    """The engine detection finds on the page, parsed for every engine's names."""
    try:
        return detect(parse(text, keep_filter(ADAPTERS), limits.max_series))[0]
    except TooManySeries:
        return None


def _too_many(error: TooManySeries) -> str:
    if isinstance(error, TooManyLabels):
        return (
            f"the page's samples of engine metrics carry more than {LABELS_PER_SAMPLE * error.limit:,} labels; at most "
            f"{LABELS_PER_SAMPLE} a sample of max_series_per_target ({error.limit:,}) are read"
        )
    return (
        f"the page has more than {error.limit:,} samples of engine metrics; at most {error.limit:,} are read "
        "(max_series_per_target)"
    )


def _looks_like_metrics(text: str) -> bool:
    return "# TYPE" in text or "_total" in text


def keep_filter(adapters: Iterable[EngineAdapter]) -> Callable[[str], bool]:
    """Keep the samples of the names the adapters read, and the _bucket/_sum/_count samples of their histograms."""
    wanted = frozenset(name for adapter in adapters for name in adapter.needs)

    def keep(name: str) -> bool:
        if name in wanted:
            return True
        stem, _, suffix = name.rpartition("_")
        return suffix in _HISTOGRAM_SUFFIXES and stem in wanted

    return keep
