"""The HTTP endpoints over a daemon polling recorded pages: exposition conventions and the JSON/HTML views."""

import asyncio
import gzip

import aiohttp
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config, SloConfig, Target
from exporter.daemon import Daemon
from exporter.server import DAEMON, build_app
from tests.conftest import TESTS
from tests.daemon.pages import page_server


def _serve(check, poll: bool = True):
    async def go():
        async with page_server() as base:
            targets = (
                Target("tiny", base + "/page/vllm-cpu-0.32-2mib_peak.prom", model=str(TESTS / "data" / "tiny-llama")),
                Target("down", base + "/error"),
            )
            config = Config(
                targets=targets, nvml=False, poll_interval_seconds=3600, slos=(SloConfig("ttft", 0.5, 0.99),)
            )
            daemon = Daemon(config)
            app = build_app(daemon)
            async with TestClient(TestServer(app)) as client:
                if poll:
                    while not daemon.snapshot.ready:
                        await asyncio.sleep(0.01)
                return await check(client)

    return asyncio.run(go())


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_follow_prometheus_conventions():
    async def check(client):
        response = await client.get("/metrics")
        return response.status, await response.text()

    status, text = _serve(check)
    families = _families(text)
    assert status == 200
    for name, family in families.items():
        assert name.startswith("plimsoll_"), name
        assert family.documentation, f"{name} has no HELP"
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), name
        if name.endswith("_ratio") and name != "plimsoll_model_capacity_error_ratio":
            assert all(0 <= s.value <= 1 for s in family.samples), name
    series = [(s.name, tuple(sorted(s.labels.items()))) for f in families.values() for s in f.samples]
    assert len(series) == len(set(series)), "duplicate series"
    assert "timestamp" not in text.lower().replace("timestamp_seconds", "")


def test_metrics_carry_headroom_model_and_target_health():
    async def check(client):
        return await (await client.get("/metrics")).text()

    families = _families(_serve(check))

    def value(name, **labels):
        return [s.value for s in families[name].samples if labels.items() <= s.labels.items()]

    assert value("plimsoll_target_up", target="tiny") == [1.0]
    assert value("plimsoll_target_up", target="down") == [0.0]
    assert value("plimsoll_target_poll_failures", target="down", reason="http_status") == [1.0]
    assert value("plimsoll_kv_cache_capacity_tokens", target="tiny", source="engine") == [4096.0]
    assert value("plimsoll_kv_cache_capacity_tokens", target="tiny", source="model") == [4096.0]
    assert value("plimsoll_model_kv_bytes_per_token", target="tiny") == [512.0]
    assert value("plimsoll_model_capacity_error_ratio", target="tiny") == [0.0]
    assert value("plimsoll_slo_requests", target="tiny", slo="ttft") == [12.0]
    assert value("plimsoll_slo_objective_ratio", slo="ttft") == [0.99]
    assert "plimsoll_nvml_up" not in families  # NVML switched off: no GPU series, so no NVML alert either


def test_metrics_are_gzipped_when_asked():
    async def check(client):
        response = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        return response.headers.get("Content-Encoding"), await response.read()

    encoding, body = _serve(check)
    assert encoding == "gzip"
    assert b"plimsoll_target_up" in gzip.decompress(body)


def test_readyz_waits_for_the_first_poll_and_healthz_does_not():
    async def go():
        async with page_server() as base:
            # the first poll takes the slow target's whole 1-second timeout
            config = Config(targets=(Target("slow", base + "/slow"),), nvml=False, timeout_seconds=1.0)
            daemon = Daemon(config)
            async with TestClient(TestServer(build_app(daemon))) as client:
                during = ((await client.get("/healthz")).status, (await client.get("/readyz")).status)
                while not daemon.snapshot.ready:
                    await asyncio.sleep(0.01)
                return during, (await client.get("/readyz")).status

    assert asyncio.run(go()) == ((200, 503), 200)


def test_state_api_and_status_page_show_each_target():
    async def check(client):
        state = await (await client.get("/api/v1/state")).json()
        page = await (await client.get("/")).text()
        return state, page

    state, page = _serve(check)
    targets = {t["target"]: t for t in state["targets"]}
    assert targets["tiny"]["instances"][0]["kv_cache_capacity_tokens"] == 4096
    assert targets["down"]["up"] is False and targets["down"]["last_failure"] == "http_status"
    assert 0 < targets["tiny"]["scrape_duration_seconds"] <= state["poll_duration_seconds"]
    assert "tiny" in page and "down (http_status)" in page


def test_client_session_is_closed_on_shutdown():
    sessions = []
    original = aiohttp.ClientSession.__init__

    def spy(self, *args, **kwargs):
        sessions.append(self)
        original(self, *args, **kwargs)

    aiohttp.ClientSession.__init__ = spy
    try:
        _serve(lambda client: asyncio.sleep(0))
    finally:
        aiohttp.ClientSession.__init__ = original
    assert sessions and all(s.closed for s in sessions)


def test_metrics_negotiate_openmetrics_and_follow_a_new_snapshot():
    async def check(client):
        open_metrics = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        text = await open_metrics.text()
        daemon = client.server.app[DAEMON]
        first = await (await client.get("/metrics")).text()
        await daemon.poll_once(client.session)
        second = await (await client.get("/metrics")).text()
        return open_metrics.headers["Content-Type"], text, first, second

    content_type, text, first, second = _serve(check)
    assert content_type.startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")
    poll_line = [line for line in first.splitlines() if line.startswith("plimsoll_poll_duration_seconds ")]
    assert poll_line and poll_line[0] not in second  # a new poll renders anew, not the cached page
