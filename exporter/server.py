"""The aiohttp app: /metrics, /healthz, /readyz, /api/v1/state and the status page at /.

The poll loop is a background task owned by the app's cleanup_ctx: started when the app starts, cancelled and
awaited when it stops, so SIGTERM drains cleanly. /metrics renders the current snapshot and never waits on a poll.
"""

import asyncio
import contextlib
import gzip
import logging
import signal
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.collector import SnapshotCollector
from exporter.config import Config
from exporter.daemon import Daemon
from exporter.sources.nvml import NvmlReader
from exporter.views import state_dict, status_page

log = logging.getLogger("plimsoll.server")


class MetricsPage:
    """/metrics rendered once per snapshot and format, then served as bytes.

    prometheus-client's own handler renders on every request: 5 ms for 8 targets and 8 GPUs, which 50 concurrent
    scrapers turn into a queue. The snapshot only changes once per poll, so its text is cached with it; the
    content negotiation (text or OpenMetrics) is still prometheus-client's."""

    def __init__(self, registry: CollectorRegistry, daemon: Daemon):
        self._registry = registry
        self._daemon = daemon
        self._snapshot: object = None
        self._rendered: dict[tuple[str, bool], bytes] = {}

    def render(self, accept: str, gzipped: bool) -> tuple[bytes, str]:
        snapshot = self._daemon.snapshot
        if snapshot is not self._snapshot:
            self._snapshot, self._rendered = snapshot, {}
        encoder, content_type = choose_encoder(accept)
        key = (content_type, gzipped)
        if key not in self._rendered:
            text = self._rendered.get((content_type, False)) or encoder(self._registry)
            self._rendered[(content_type, False)] = text
            if gzipped:
                self._rendered[key] = gzip.compress(text, compresslevel=6)
        return self._rendered[key], content_type

    async def handle(self, request: web.Request) -> web.Response:
        gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
        body, content_type = self.render(request.headers.get("Accept", ""), gzipped)
        headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)


DAEMON = web.AppKey("daemon", Daemon)
CONFIG_PATH = web.AppKey("config_path", str)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[DAEMON].snapshot.ready:
        return web.Response(text="ready\n")
    return web.Response(status=503, text="first poll not done\n")


async def _state(request: web.Request) -> web.Response:
    return web.json_response(state_dict(request.app[DAEMON].snapshot))


async def _index(request: web.Request) -> web.Response:
    return web.Response(text=status_page(request.app[DAEMON].snapshot), content_type="text/html")


async def _poll_loop(app: web.Application) -> AsyncIterator[None]:
    daemon = app[DAEMON]
    connector = aiohttp.TCPConnector(limit_per_host=2)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=True) as session:
        task = asyncio.create_task(daemon.run(session), name="plimsoll-poll")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _reload_on_sighup(app: web.Application) -> AsyncIterator[None]:
    path = app.get(CONFIG_PATH)
    loop = asyncio.get_running_loop()
    if path:
        loop.add_signal_handler(signal.SIGHUP, app[DAEMON].reload, path)
    yield
    if path:
        loop.remove_signal_handler(signal.SIGHUP)


def build_app(daemon: Daemon, config_path: str | None = None) -> web.Application:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SnapshotCollector(
            lambda: daemon.snapshot,
            lambda: [(s.name, s.threshold_seconds, s.objective) for s in daemon.config.slos],
        )
    )
    app = web.Application()
    app[DAEMON] = daemon
    if config_path:
        app[CONFIG_PATH] = config_path
    app.router.add_get("/metrics", MetricsPage(registry, daemon).handle)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/api/v1/state", _state)
    app.router.add_get("/", _index)
    app.cleanup_ctx.append(_poll_loop)
    app.cleanup_ctx.append(_reload_on_sighup)
    return app


def serve(config: Config, config_path: str | None) -> None:
    """Run until SIGTERM or SIGINT; aiohttp then runs the cleanup contexts, which stop the poll loop."""
    nvml = NvmlReader() if config.nvml else None
    daemon = Daemon(config, nvml=nvml)
    log.info("plimsoll serving on %s, polling every %gs", config.listen, config.poll_interval_seconds)
    try:
        # No access log: Prometheus scrapes every few seconds and each line would say the same thing.
        web.run_app(build_app(daemon, config_path), host=config.host, port=config.port, print=None, access_log=None)
    finally:
        if nvml is not None:
            nvml.close()
