"""The engine adapters, and which one a page belongs to.

Adding an engine: one module exposing an `EngineAdapter` as `ADAPTER`, and one line in `ADAPTERS`.
"""

from collections.abc import Callable, Iterable

from exporter.sources.engines import llamacpp, lmdeploy, nim, sglang, tgi, trtllm, vllm
from exporter.sources.engines.base import Detection, EngineAdapter, EngineReading
from exporter.sources.promtext import ParsedPage, parse

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


def detect(page: ParsedPage) -> tuple[EngineAdapter | None, list[tuple[str, Detection]]]:
    """The adapter that scores highest at or above the threshold (ties go to the earlier in ADAPTERS), and every
    adapter's detection, best first."""
    scored = sorted(((adapter, adapter.detect(page)) for adapter in ADAPTERS), key=lambda pair: -pair[1].score)
    best, detection = scored[0]
    return (best if detection.score >= DETECTION_THRESHOLD else None), [(a.name, d) for a, d in scored]


def read_page(text: str, engine: str = "auto") -> tuple[str | None, list[EngineReading]]:
    """Parse a page for what the adapters read and read it: with `engine="auto"` as the best-scoring engine's,
    otherwise as the named engine's. A page no engine claims gives (None, [])."""
    if engine == "auto":
        page = parse(text, keep_filter(ADAPTERS))
        found, _ = detect(page)
        if found is None:
            return None, []
        adapter = found
    else:
        adapter = adapter_named(engine)
        page = parse(text, keep_filter((adapter,)))
    return adapter.name, adapter.read(page)


def adapter_named(engine: str) -> EngineAdapter:
    for adapter in ADAPTERS:
        if adapter.name == engine:
            return adapter
    raise ValueError(f"unknown engine {engine!r}: expected auto or one of {', '.join(a.name for a in ADAPTERS)}")


def keep_filter(adapters: Iterable[EngineAdapter]) -> Callable[[str], bool]:
    """Keep the samples of the names the adapters read, and the _bucket/_sum/_count samples of their histograms."""
    wanted = frozenset(name for adapter in adapters for name in adapter.needs)

    def keep(name: str) -> bool:
        if name in wanted:
            return True
        stem, _, suffix = name.rpartition("_")
        return suffix in _HISTOGRAM_SUFFIXES and stem in wanted

    return keep
