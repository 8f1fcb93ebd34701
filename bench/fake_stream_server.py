"""A fast fake OpenAI-compatible streaming server for the load-generator benchmark: every completion streams
`--tokens` chunks, one each `--itl-ms`, then usage and [DONE]. It records how late its own chunks were (its
event loop's lag), so a benchmark can tell the server's limit from the client's: GET /lag returns the p99.

Run: python -m bench.fake_stream_server --port 18999 [--itl-ms 20] [--tokens 32]
"""

import argparse
import asyncio
import json
import time

from aiohttp import web


def make_app(itl_seconds: float, tokens: int) -> web.Application:
    lags: list[float] = []

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            body = await request.json()
            wanted = int(body.get("max_tokens", tokens))
            await response.prepare(request)
            due = time.monotonic()
            for _ in range(wanted):
                due += itl_seconds
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                lags.append(max(0.0, time.monotonic() - due))
                chunk = {"choices": [{"index": 0, "text": " a"}]}
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            counts = {"prompt_tokens": 8, "completion_tokens": wanted, "total_tokens": wanted + 8}
            usage = {"choices": [], "usage": counts}
            await response.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        except ConnectionResetError:
            pass  # a client that stops at its deadline closes streams mid-request: expected, not the server's error
        return response

    async def lag(_: web.Request) -> web.Response:
        ordered = sorted(lags)
        p99 = ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0
        lags.clear()
        return web.json_response({"chunk_lag_p99_seconds": p99, "chunks": len(ordered)})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/lag", lag)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    web.run_app(make_app(args.itl_ms / 1000, args.tokens), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
