"""The daemon's own port: /metrics, /healthz, /readyz, /api/v1/state and the status page at /, and what bounds its
cost whoever connects.

The poll loop is a background task owned by the app's cleanup_ctx: started when the app starts, cancelled and
awaited when it stops, so SIGTERM drains cleanly. Every page is rendered once per snapshot and served as bytes; a
cap on requests in flight answers 503 past it; a client must send its request headers within
request_header_timeout; TLS and basic auth come from an exporter-toolkit web config (exporter/daemon/web_config.py).
SIGHUP rebuilds the config and re-reads the web config in a worker thread and hands them to the daemon and the port.
"""

import asyncio
import contextlib
import errno
import gzip
import json
import logging
import math
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.config import Config, ConfigError, restart_required
from exporter.daemon.collector import SnapshotCollector
from exporter.daemon.poll import Daemon
from exporter.daemon.snapshot import Snapshot
from exporter.daemon.views import state_dict, status_page
from exporter.daemon.web_config import BasicAuth, WebConfig, load_web_config
from exporter.sources.nvml import NvmlReader

log = logging.getLogger("plimsoll.server")

# A burst of clients waits in the kernel's accept queue instead of retransmitting SYNs for seconds.
LISTEN_BACKLOG = 1024
# A response that a client will not read within this long is abandoned: its bytes would otherwise sit in memory,
# and its slot under the request cap, for as long as the client likes.
SEND_TIMEOUT_SECONDS = 30.0
# Answered past the request cap and without credentials: a kubelet probe can neither wait for a slot nor carry a
# password, and restarting a daemon because scrapers are many would only lose its trend history. Both answer a
# constant from memory, so exempting them costs nothing.
PROBES = frozenset(("/healthz", "/readyz"))


class ListenError(ValueError):
    """The daemon's port could not be opened; the message says why and what to do."""


class Pages:
    """/metrics, /api/v1/state and / rendered once per snapshot (and format), then served as bytes.

    Rendering per request made 1,000 clients of /api/v1/state a 9-second queue and hundreds of MiB of garbage. The
    snapshot only changes when a poll publishes a new one (it is replaced, never mutated), so whatever was rendered
    from it is kept until then; content negotiation on /metrics (text or OpenMetrics) is still prometheus-client's."""

    def __init__(self, registry: CollectorRegistry, daemon: Daemon):
        self._registry = registry
        self._daemon = daemon
        self._snapshot: Snapshot | None = None
        self._rendered: dict[Hashable, bytes] = {}

    def _cached(self, key: Hashable, render: Callable[[Snapshot], bytes]) -> bytes:
        snapshot = self._daemon.snapshot
        if snapshot is not self._snapshot:
            self._snapshot, self._rendered = snapshot, {}
        if key not in self._rendered:
            self._rendered[key] = render(snapshot)
        return self._rendered[key]

    async def metrics(self, request: web.Request) -> web.Response:
        gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        text = self._cached(("metrics", content_type), lambda _: encoder(self._registry))
        body = self._cached(("metrics", content_type, "gzip"), lambda _: gzip.compress(text, 6)) if gzipped else text
        headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def state(self, request: web.Request) -> web.Response:
        body = self._cached("state", lambda snapshot: json.dumps(state_dict(snapshot)).encode())
        return web.Response(body=body, content_type="application/json")

    async def index(self, request: web.Request) -> web.Response:
        body = self._cached("index", lambda snapshot: status_page(snapshot).encode())
        return web.Response(body=body, content_type="text/html", charset="utf-8")


DAEMON = web.AppKey("daemon", Daemon)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[DAEMON].snapshot.ready:
        return web.Response(text="ready\n")
    return web.Response(status=503, text="first poll not done\n")


class RequestCap:
    """At most max_concurrent_requests in flight on the port (read from the running config, so a reload applies);
    past it, 503 at once rather than a queue.

    A request holds its slot until its response is written, not only while its handler runs: the handlers answer
    from memory in microseconds, and what costs memory under a crowd is response bytes waiting on slow readers."""

    def __init__(self, limit: Callable[[], int]):
        self._limit = limit
        self._in_flight = 0

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBES:
            return await handler(request)
        if self._in_flight >= self._limit():
            text = f"busy: {self._in_flight} requests in flight (max_concurrent_requests); retry shortly\n"
            return web.Response(status=503, text=text, headers={"Retry-After": "1"})
        self._in_flight += 1
        try:
            response = await handler(request)
            await _send(request, response)
            return response
        finally:
            self._in_flight -= 1


async def _send(request: web.Request, response: web.StreamResponse) -> None:
    """Write the response now (aiohttp would write it after the middleware returns, outside the cap). A client that
    does not read it within SEND_TIMEOUT_SECONDS is disconnected; one that left is not an error."""
    try:
        async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
            await response.prepare(request)
            await response.write_eof()
    except TimeoutError:
        log.debug("%s %s: not read within %gs; disconnected", request.remote, request.path, SEND_TIMEOUT_SECONDS)
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        pass


class WebSecurity:
    """The web config as it applies now: a reload swaps in the re-read file's basic auth, response headers and
    TLS certificates. The port stays on the protocol it was opened with (HTTP or HTTPS) and its TLS versions."""

    def __init__(self, web_config: WebConfig):
        self.web_config = web_config
        self.auth = BasicAuth(web_config.users)
        if web_config.tls is not None:
            # Called at each handshake, even one without SNI: a certificate renewed on disk (cert-manager's) serves
            # new connections after a SIGHUP, without closing the port.
            web_config.tls.sni_callback = self._current_tls

    def _current_tls(self, connection: ssl.SSLObject, server_name: str | None, opened_with: ssl.SSLContext) -> None:
        current = self.web_config.tls
        if current is not None and current is not opened_with:
            connection.context = current

    def use(self, web_config: WebConfig) -> None:
        self.web_config = web_config
        self.auth.use(web_config.users)

    @web.middleware
    async def require_credentials(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBES or not self.web_config.users:
            return await handler(request)
        verdict = await self.auth.check(request.headers.get("Authorization"), request.remote or "")
        if verdict.allowed:
            return await handler(request)
        if verdict.retry_after is not None:
            text = "too many failed logins from this address, or too many at once; retry later\n"
            return web.Response(status=429, text=text, headers={"Retry-After": str(math.ceil(verdict.retry_after))})
        return web.Response(
            status=401, text="401 Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="plimsoll"'}
        )

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(self.web_config.headers)

    async def close(self, app: web.Application) -> None:
        self.auth.close()


class HeaderDeadline:
    """Closes a connection whose first request has not fully arrived within request_header_timeout of its accept
    (a TLS handshake included), however it trickles in: aiohttp has no such limit, and a client that opens a
    thousand connections and sends a byte a second would keep them all. The factory arms a timer per accepted
    connection; the middleware disarms it once a request head was parsed and routed. Later requests on a kept-alive
    connection are bounded by aiohttp's keepalive_timeout, set to the same time by `_serve`: it runs from the end
    of each response and trickled bytes do not extend it."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._waiting: set[web.RequestHandler] = set()  # accepted, no request yet, timer not yet fired

    def protocols(self, factory: Callable[[], web.RequestHandler]) -> Callable[[], web.RequestHandler]:
        def accept() -> web.RequestHandler:
            connection = factory()
            self._waiting.add(connection)
            asyncio.get_running_loop().call_later(self.timeout, self._expire, connection)
            return connection

        return accept

    def _expire(self, connection: web.RequestHandler) -> None:
        if connection in self._waiting:
            self._waiting.discard(connection)
            # No transport yet: the TLS handshake is still running, and its own timeout (the same) ends it.
            if connection.transport is not None:
                connection.force_close()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self._waiting.discard(request.protocol)
        return await handler(request)


HEADER_DEADLINE = web.AppKey("header_deadline", HeaderDeadline)
WEB_SECURITY = web.AppKey("web_security", WebSecurity)


async def _poll_loop(app: web.Application) -> AsyncIterator[None]:
    daemon = app[DAEMON]
    # No pool limit: each target has at most one request in flight (its own task), so connections are already
    # bounded by the number of targets; a pool limit would only let hung targets on one host take the slots the
    # others on that host need.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=True) as session:
        task = asyncio.create_task(daemon.run(session), name="plimsoll-poll")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def build_app(daemon: Daemon, web_config: WebConfig | None = None) -> web.Application:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SnapshotCollector(
            lambda: daemon.snapshot,
            lambda: [(s.name, s.threshold_seconds, s.objective) for s in daemon.config.slos],
        )
    )
    deadline = HeaderDeadline(daemon.config.request_header_timeout_seconds)
    middlewares: list[Middleware] = [
        deadline.middleware,
        RequestCap(lambda: daemon.config.max_concurrent_requests).middleware,
    ]
    # Installed whenever a web config is given, with users or not: a reload may add them.
    security = WebSecurity(web_config) if web_config is not None else None
    if security is not None:
        middlewares.append(security.require_credentials)
    app = web.Application(middlewares=middlewares)
    app[DAEMON] = daemon
    app[HEADER_DEADLINE] = deadline
    if security is not None:
        app[WEB_SECURITY] = security
        app.on_response_prepare.append(security.add_headers)
        # On shutdown, before aiohttp waits for the handlers: those waiting for a bcrypt check are let go at once.
        app.on_shutdown.append(security.close)
    pages = Pages(registry, daemon)
    app.router.add_get("/metrics", pages.metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/api/v1/state", pages.state)
    app.router.add_get("/", pages.index)
    app.cleanup_ctx.append(_poll_loop)
    return app


class Reloader:
    """SIGHUP: rebuild the config (file, flags and environment) and re-read the web config, each in a worker thread
    so reading and validating never stall the event loop, and hand them to the daemon and the port. A bad file is
    logged as rejected and the running one stays; each log line says which file was applied or not. A SIGHUP during
    a reload runs one more reload after it (never two at once), so the last edit is the one applied."""

    def __init__(self, daemon: Daemon, reload: Callable[[], Config] | None, security: WebSecurity | None):
        self._daemon = daemon
        self._reload = reload
        self._security = security
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def on_sighup(self) -> None:
        if self._reload is None and self._security is None:
            log.info("SIGHUP: no --config or --web-config to reload")
        elif self._task is not None and not self._task.done():
            self._again = True
            log.info("SIGHUP during a reload: reloading again once it is done")
        else:
            self._task = asyncio.create_task(self._run(), name="plimsoll-reload")

    async def _run(self) -> None:
        await self._reload_once()
        while self._again:
            self._again = False
            await self._reload_once()

    async def _reload_once(self) -> None:
        if self._reload is not None:
            await self._reload_config(self._reload)
        if self._security is not None:
            await self._reload_web_config(self._security)

    async def _reload_config(self, reload: Callable[[], Config]) -> None:
        try:
            new = await asyncio.to_thread(reload)
        except ConfigError as error:
            log.error("config reload rejected, keeping the running config:\n%s", error)
            return
        except Exception as error:  # whatever else a reload hits, the daemon keeps its config and runs on
            log.error("config reload failed, keeping the running config: %s: %s", type(error).__name__, error)
            return
        pending = restart_required(self._daemon.config, new)
        if pending:
            log.warning("config reloaded; changes to %s take effect only after a restart", ", ".join(pending))
        self._daemon.apply(new)

    async def _reload_web_config(self, security: WebSecurity) -> None:
        """The file the port was opened with, re-read (a changed web_config path takes a restart)."""
        path = security.web_config.source
        try:
            new = await asyncio.to_thread(load_web_config, path)
        except ConfigError as error:
            log.error("web config reload rejected, keeping the running web config:\n%s", error)
            return
        except Exception as error:  # as for the config: the port keeps its web config and serves on
            log.error("web config reload failed, keeping the running one: %s: %s", type(error).__name__, error)
            return
        was_tls, is_tls = security.web_config.tls is not None, new.tls is not None
        security.use(new)
        if was_tls != is_tls:
            tls_note = "; switching between HTTP and HTTPS takes effect only after a restart"
        elif is_tls:
            tls_note = "; its certificates and client CA serve new connections (TLS versions take a restart)"
        else:
            tls_note = ""
        log.info(
            "web config %s applied: %d basic auth users, %d headers%s", path, len(new.users), len(new.headers), tls_note
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class MalformedRequestLog(logging.LoggerAdapter[logging.Logger]):
    """The logger aiohttp's connections report to. aiohttp logs every malformed request at ERROR with a
    traceback: a port scanner or a confused client would fill the log. The first is logged as one line, the rest
    at debug only; every other error keeps aiohttp's message and traceback."""

    def __init__(self, logger: logging.Logger):
        super().__init__(logger, {})
        self._malformed = 0

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if not isinstance(exc_info, HttpProcessingError):
            super().exception(msg, *args, exc_info=exc_info, **kwargs)
            return
        self._malformed += 1
        client = args[0] if args else "a client"
        what = " ".join(str(exc_info.message).split())[:200]
        if self._malformed == 1:
            self.logger.warning("malformed request from %s (%s); further ones are logged at debug only", client, what)
        else:
            self.logger.debug("malformed request #%d from %s (%s)", self._malformed, client, what)


class BoundSite(web.BaseSite):
    """A site on a socket bound before the app started, so a port in use fails before any background task, with
    the header deadline armed on every connection it accepts and on TLS handshakes (asyncio's default handshake
    timeout is 60 s, which a client that connects and never speaks would get per connection)."""

    def __init__(
        self, runner: web.BaseRunner, sock: socket.socket, tls: ssl.SSLContext | None, deadline: HeaderDeadline
    ):
        super().__init__(runner, ssl_context=tls)
        self._sock = sock
        self._deadline = deadline

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{'https' if self._ssl_context else 'http'}://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None, "the runner is set up before its sites start"
        self._server = await asyncio.get_running_loop().create_server(
            self._deadline.protocols(server),
            sock=self._sock,
            backlog=LISTEN_BACKLOG,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self._deadline.timeout if self._ssl_context else None,
        )


_BIND_HINTS = {
    errno.EADDRINUSE: "address already in use (another plimsoll? set --listen)",
    errno.EACCES: "permission denied (ports below 1024 need privileges; set --listen)",
    errno.EADDRNOTAVAIL: "no such address on this host (set --listen)",
}


def listen_socket(listen: str) -> socket.socket:
    """A TCP socket bound and listening on `listen` (host:port); ListenError with one line saying why not."""
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (ValueError, OverflowError, socket.gaierror) as error:
        reason = getattr(error, "strerror", None) or "not a host:port"
        raise ListenError(f"cannot listen on {listen}: {reason} (set --listen host:port)") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As asyncio's own servers: a restarted daemon can bind while the old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as error:
        sock.close()
        reason = _BIND_HINTS.get(error.errno or 0, f"{error.strerror} (set --listen)")
        raise ListenError(f"cannot listen on {listen}: {reason}") from None
    return sock


async def _serve(
    config: Config,
    reload: Callable[[], Config] | None,
    sock: socket.socket,
    web_config: WebConfig | None,
    nvml: NvmlReader | None,
) -> None:
    daemon = Daemon(config, nvml=nvml)
    app = build_app(daemon, web_config)
    reloader = Reloader(daemon, reload, app.get(WEB_SECURITY))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reloader.on_sighup)
    runner = web.AppRunner(
        app,
        access_log=None,  # Prometheus scrapes every few seconds and each line would say the same thing
        # The wait for a kept-alive connection's next request (see HeaderDeadline): idle connections go too.
        keepalive_timeout=config.request_header_timeout_seconds,
        logger=MalformedRequestLog(log),
    )
    await runner.setup()
    try:
        site = BoundSite(runner, sock, web_config.tls if web_config else None, app[HEADER_DEADLINE])
        await site.start()
        log.info("plimsoll serving on %s, polling every %gs", site.name, config.poll_interval_seconds)
        await stop.wait()
    finally:
        await reloader.stop()
        await runner.cleanup()
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(number)


def serve(config: Config, reload: Callable[[], Config] | None) -> None:
    """Run until SIGTERM or SIGINT, then stop the poll loop and return. The web config and the port are checked
    before anything starts: ConfigError or ListenError, each a message for the user. `reload` rebuilds the whole
    config on SIGHUP (None: nothing to reload)."""
    web_config = load_web_config(config.web_config) if config.web_config else None
    sock = listen_socket(config.listen)
    if web_config is not None and web_config.users and web_config.tls is None:
        log.warning("%s: basic auth without TLS: passwords cross the network in clear text", web_config.source)
    nvml = NvmlReader() if config.nvml else None
    try:
        asyncio.run(_serve(config, reload, sock, web_config, nvml))
    finally:
        sock.close()
        if nvml is not None:
            nvml.close()
