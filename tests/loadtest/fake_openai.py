"""A small OpenAI-compatible streaming server for unit tests, on 127.0.0.1, told how to behave.

It streams one word per token at a set pace after a set first-token delay, reports usage in its last chunk,
records how many requests it held at once and when each arrived, and can stall mid-stream, hang, stop short of
max_tokens (as a model that reaches its end-of-sequence token does), answer errors (with a Retry-After),
redirect, answer without streaming, demand a key, answer /health with a status, serve a recorded /metrics page,
or lie as a hostile server does: a huge model list, token counts it never streamed, a Content-Type of its choosing.
"""

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# Long enough on loopback for the client to have read the part before, which it waits on.
_RAW_PART_PAUSE_SECONDS = 0.05


@dataclass
class Behaviour:
    ttft_seconds: float = 0.0
    itl_seconds: float = 0.0
    models: tuple[str, ...] = ("fake-model",)
    stream: bool = True
    stall_after_tokens: int | None = None  # stop sending (without closing) after this many tokens
    error_status: int | None = None  # answer every completion request with this status
    error_every: int | None = None  # answer every Nth completion request with 503
    api_key: str | None = None  # required as a bearer token when set
    metrics_page: str | None = None  # None: /metrics is 404
    usage: bool = True
    has_chat: bool = True
    raw_stream: bytes | None = None  # answer with exactly these bytes as an event stream (malformed streams)
    # Then these bytes, each part written a moment after the last, so that the client reads them apart (a line end
    # split across two reads); were two read as one, the stream would still be the same bytes.
    raw_stream_parts: tuple[bytes, ...] = ()
    raw_stream_held_open: bool = False  # after raw_stream, keep the connection open instead of ending the answer
    # Answer with exactly these bytes as application/json, with error_status or else 200 (a hostile error body).
    json_body: bytes | None = None
    # Stream at most this many tokens, as a model that reaches its end-of-sequence token early does; a request that
    # asks to ignore_eos gets every token it asks for, as from vLLM.
    answer_tokens: int | None = None
    health_status: int = 200  # what GET /health answers (503: an engine still loading its model)
    metrics_content_type: str = "text/plain"  # the Content-Type /metrics answers with
    models_padding_bytes: int = 0  # /v1/models streams this many bytes of padding inside its JSON (a huge answer)
    completion_tokens: Any = None  # the usage's completion_tokens, whatever was streamed (None: the truth)
    models_answer: Any = None  # GET /v1/models answers exactly this JSON (None: the listing of `models`)
    retry_after: str | None = None  # the Retry-After header sent with every error answer
    redirect_to: str | None = None  # answer every completion request with a 307 to this URL
    redirect_gets_to: str | None = None  # answer GET /v1/models and /health with a 307 to this base URL
    echo_authorization: bool = False  # an error answer's message (or /v1/models' redirect) repeats the Authorization
    # Take every completion request past this many and never answer it: an engine stuck behind a live API server.
    hang_after_requests: int | None = None


@dataclass
class Observed:
    in_flight: int = 0
    peak_in_flight: int = 0
    requests: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() as each completion request arrived
    hung: int = 0  # completion requests taken and never answered (hang_after_requests)
    metrics_reads: int = 0
    authorization: list[str | None] = field(default_factory=list)


class FakeOpenAI:
    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.observed = Observed()
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        if self.behaviour.has_chat:
            app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        return app

    def _authorised(self, request: web.Request) -> bool:
        self.observed.authorization.append(request.headers.get("Authorization"))
        wanted = self.behaviour.api_key
        return wanted is None or request.headers.get("Authorization") == f"Bearer {wanted}"

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if self.behaviour.redirect_gets_to is not None:
            echoed = f"?{request.headers.get('Authorization', '')}" if self.behaviour.echo_authorization else ""
            raise web.HTTPTemporaryRedirect(self.behaviour.redirect_gets_to + "/v1/models" + echoed)
        if not self._authorised(request):
            return web.json_response({"error": {"message": "unauthorised"}}, status=401)
        if self.behaviour.models_answer is not None:
            return web.json_response(self.behaviour.models_answer)
        listing = {"object": "list", "data": [{"id": m, "object": "model"} for m in self.behaviour.models]}
        if not self.behaviour.models_padding_bytes:
            return web.json_response(listing)
        return await self._padded(request, listing, self.behaviour.models_padding_bytes)

    async def _padded(self, request: web.Request, listing: dict[str, Any], padding: int) -> web.StreamResponse:
        """The listing with a `padding` string of that many bytes, streamed a MiB at a time, never held whole."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(json.dumps(listing)[:-1].encode() + b', "padding": "')
        chunk = b"x" * (1 << 20)
        for start in range(0, padding, len(chunk)):
            await response.write(chunk[: padding - start])
        await response.write(b'"}')
        await response.write_eof()
        return response

    async def _health(self, request: web.Request) -> web.Response:
        self.observed.authorization.append(request.headers.get("Authorization"))
        if self.behaviour.redirect_gets_to is not None:
            raise web.HTTPTemporaryRedirect(self.behaviour.redirect_gets_to + "/health")
        return web.Response(status=self.behaviour.health_status)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.observed.metrics_reads += 1
        if self.behaviour.metrics_page is None:
            raise web.HTTPNotFound()
        return web.Response(
            body=self.behaviour.metrics_page.encode(), headers={"Content-Type": self.behaviour.metrics_content_type}
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.observed.arrivals.append(time.monotonic())
        self.observed.in_flight += 1
        self.observed.peak_in_flight = max(self.observed.peak_in_flight, self.observed.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.observed.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        behaviour = self.behaviour
        body = await request.json()
        self.observed.requests += 1
        self.observed.bodies.append(body)
        if behaviour.hang_after_requests is not None and self.observed.requests > behaviour.hang_after_requests:
            self.observed.hung += 1
            await asyncio.sleep(3600)
        if not self._authorised(request):
            return web.json_response({"error": {"message": "unauthorised"}}, status=401)
        if body.get("model") not in behaviour.models:
            message = f"The model `{body.get('model')}` does not exist."
            return web.json_response({"error": {"message": message}}, status=404)
        if behaviour.redirect_to is not None:
            raise web.HTTPTemporaryRedirect(behaviour.redirect_to)
        headers = {"Retry-After": behaviour.retry_after} if behaviour.retry_after is not None else None
        if behaviour.json_body is not None:
            status = behaviour.error_status or 200
            return web.Response(body=behaviour.json_body, status=status, content_type="application/json")
        if behaviour.error_status is not None:
            message = request.headers.get("Authorization", "") if behaviour.echo_authorization else "told to fail"
            return web.json_response({"error": {"message": message}}, status=behaviour.error_status, headers=headers)
        if behaviour.error_every and self.observed.requests % behaviour.error_every == 0:
            return web.json_response({"error": {"message": "overloaded"}}, status=503, headers=headers)
        chat = request.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        prompt_tokens = len(prompt.split())
        tokens = int(body["max_tokens"])
        if behaviour.answer_tokens is not None and not body.get("ignore_eos"):
            tokens = min(tokens, behaviour.answer_tokens)
        if not behaviour.stream:
            text = " ".join("tok" for _ in range(tokens))
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
            return web.json_response({"choices": [{"text": text}], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if behaviour.raw_stream is not None:
            await response.write(behaviour.raw_stream)
            for part in behaviour.raw_stream_parts:
                await asyncio.sleep(_RAW_PART_PAUSE_SECONDS)
                await response.write(part)
            if behaviour.raw_stream_held_open:
                await asyncio.sleep(3600)
            await response.write_eof()
            return response
        await asyncio.sleep(behaviour.ttft_seconds)
        for index in range(tokens):
            if behaviour.stall_after_tokens is not None and index >= behaviour.stall_after_tokens:
                await asyncio.sleep(3600)
            if index:
                await asyncio.sleep(behaviour.itl_seconds)
            choice = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            await _event(response, {"choices": [choice]})
        if behaviour.usage:
            reported = tokens if behaviour.completion_tokens is None else behaviour.completion_tokens
            await _event(
                response, {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": reported}}
            )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload)}\n\n".encode())


@asynccontextmanager
async def serving(behaviour: Behaviour, port: int = 0) -> AsyncIterator[FakeOpenAI]:
    """The fake server on loopback (on `port`, else a free one) for the duration of the block; always shut down."""
    fake = FakeOpenAI(behaviour)
    runner = web.AppRunner(fake.app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.url = f"http://127.0.0.1:{bound}"
    try:
        yield fake
    finally:
        await runner.cleanup()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
