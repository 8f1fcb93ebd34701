"""The engine's own view of a load step: its /metrics read at 4 Hz through Plimsoll's engine adapters.

Any engine Plimsoll reads works. A page that cannot be fetched or read is a reason, never an exception: the load
step goes on without engine readings and says why.
"""

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

import aiohttp

from exporter.loadtest.measure import EngineSample
from exporter.sources.engines import read_page
from exporter.sources.engines.base import EngineReading
from exporter.sources.http import fetch

SAMPLE_INTERVAL_SECONDS = 0.25
# A page read must not hold the sampler long: one slow read should cost a handful of samples, not the step.
READ_TIMEOUT_SECONDS = 2.0
MAX_PAGE_BYTES = 16 << 20


@dataclass(frozen=True)
class EngineRead:
    """One read of the engine's page: a sample, or why there is none."""

    sample: EngineSample | None
    engine: str | None
    capacity_tokens: int | None  # the engine's KV pool in tokens, where it reports it
    error: str | None
    block_size: int | None = None  # tokens per KV block, where the engine reports it
    # The engine's own settings (vLLM's cache_config_info labels): what completes a configured deployment's plan.
    engine_config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Watched:
    samples: tuple[EngineSample, ...]
    error: str | None  # why reads failed (all of them, or some): None when every read gave a sample


def combine(readings: Sequence[EngineReading], t: float) -> EngineSample:
    """One sample from every engine instance on the page (data-parallel ranks): the fullest KV cache, since the
    first instance to fill is the one that queues; requests and preemptions summed."""

    def total(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) if present else None

    usages = [r.kv_cache_usage_ratio for r in readings if r.kv_cache_usage_ratio is not None]
    return EngineSample(
        t=t,
        kv_cache_usage_ratio=max(usages) if usages else None,
        requests_running=total([r.requests_running for r in readings]),
        requests_waiting=total([r.requests_waiting for r in readings]),
        preemptions_total=total([r.preemptions_total for r in readings]),
    )


def _capacity(readings: Sequence[EngineReading]) -> int | None:
    capacities = [r.kv_cache_capacity_tokens for r in readings]
    if not capacities or None in capacities:
        return None
    return sum(c for c in capacities if c is not None)


async def read_engine(
    session: aiohttp.ClientSession, url: str, t: float, headers: Mapping[str, str] | None = None
) -> EngineRead:
    fetched = await fetch(session, url, READ_TIMEOUT_SECONDS, MAX_PAGE_BYTES, headers)
    if fetched.text is None:
        return EngineRead(None, None, None, f"{url}: {fetched.detail or fetched.failure}")
    read = read_page(fetched.text)
    if not read.readings:
        return EngineRead(None, read.engine, None, f"{url}: {read.detail or 'no engine reading on the page'}")
    first = read.readings[0]
    return EngineRead(
        sample=combine(read.readings, t),
        engine=read.engine,
        capacity_tokens=_capacity(read.readings),
        error=None,
        block_size=first.kv_block_size,
        engine_config=first.engine_config,
    )


async def watch(
    session: aiohttp.ClientSession,
    url: str,
    since: float,
    stop: asyncio.Event,
    samples: list[EngineSample],
    *,
    interval: float = SAMPLE_INTERVAL_SECONDS,
    headers: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Watched:
    """Sample the engine every `interval` until `stop` is set, appending to `samples` as they come (the step's
    controller reads them while it runs); each sample's t is seconds since `since` (the step's clock), and samples
    read before `since` (the warm-up) are dropped."""
    failures = 0
    last_error = None
    while not stop.is_set():
        started = clock()
        read = await read_engine(session, url, started - since, headers)
        if read.sample is not None:
            if read.sample.t >= 0:
                samples.append(read.sample)
        else:
            failures += 1
            last_error = read.error
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, interval - (clock() - started)))
    if last_error is None:
        return Watched(tuple(samples), None)
    if not samples:
        return Watched((), f"no engine readings: {last_error}")
    return Watched(tuple(samples), f"{failures} reads of the engine's metrics failed (last: {last_error})")
