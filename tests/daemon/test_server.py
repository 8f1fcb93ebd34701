"""The HTTP endpoints over a daemon polling recorded pages: exposition conventions and the JSON/HTML views."""

import asyncio
import gzip
import logging
import socket
import threading
import time
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config, ConfigError, Target, load_config
from exporter.daemon import server
from exporter.daemon.poll import Daemon
from exporter.daemon.server import DAEMON, build_app
from tests.daemon.pages import FIRST_POLL_TIMEOUT_S, page_server, serve_daemon


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_follow_prometheus_conventions():
    async def check(client):
        response = await client.get("/metrics")
        return response.status, await response.text()

    status, text = serve_daemon(check)
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

    families = _families(serve_daemon(check))

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

    encoding, body = serve_daemon(check)
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
                await _until(lambda: daemon.snapshot.ready, "the first poll", FIRST_POLL_TIMEOUT_S)
                return during, (await client.get("/readyz")).status

    assert asyncio.run(go()) == ((200, 503), 200)


def test_state_api_and_status_page_show_each_target():
    async def check(client):
        state = await (await client.get("/api/v1/state")).json()
        page = await (await client.get("/")).text()
        return state, page

    state, page = serve_daemon(check)
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
        serve_daemon(lambda client: asyncio.sleep(0))
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

    content_type, text, first, second = serve_daemon(check)
    assert content_type.startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")
    poll_line = [line for line in first.splitlines() if line.startswith("plimsoll_poll_duration_seconds ")]
    assert poll_line and poll_line[0] not in second  # a new poll renders anew, not the cached page


def test_state_and_status_page_are_rendered_once_per_snapshot(monkeypatch):
    rendered: list[str] = []

    def counting(name, render):
        def wrapper(snapshot):
            rendered.append(name)
            return render(snapshot)

        return wrapper

    monkeypatch.setattr(server, "state_dict", counting("state", server.state_dict))
    monkeypatch.setattr(server, "status_page", counting("page", server.status_page))

    async def check(client):
        bodies = [await (await client.get(path)).read() for path in ("/api/v1/state", "/") * 5]
        before = sorted(rendered)
        await client.server.app[DAEMON].poll_once(client.session)
        await client.get("/api/v1/state")
        await client.get("/")
        return bodies, before, sorted(rendered)

    bodies, before, after = serve_daemon(check)
    assert before == ["page", "state"], "ten requests, one snapshot: each page rendered once"
    assert after == ["page", "page", "state", "state"], "a new snapshot is rendered anew"
    assert len(set(bodies[0::2])) == 1 and len(set(bodies[1::2])) == 1


def _reloading(reload, config: Config) -> tuple[Daemon, "server.Reloader"]:
    daemon = Daemon(config)
    return daemon, server.Reloader(daemon, reload, None)


async def _until(condition, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g}s: {what}"
        await asyncio.sleep(0.01)


def test_a_sighup_during_a_reload_runs_one_more_reload_after_it_never_two_at_once():
    first, second = Config(nvml=False, poll_interval_seconds=7.0), Config(nvml=False, poll_interval_seconds=9.0)
    release = threading.Event()
    running: list[int] = []
    calls: list[int] = []
    overlapped: list[bool] = []

    def reload() -> Config:
        overlapped.append(bool(running))
        running.append(1)
        calls.append(1)
        try:
            release.wait(5.0)
            return first if len(calls) == 1 else second
        finally:
            running.pop()

    async def go() -> Daemon:
        daemon, reloader = _reloading(reload, Config(nvml=False))
        reloader.on_sighup()
        await _until(lambda: calls == [1], "the first reload running")
        reloader.on_sighup()
        reloader.on_sighup()
        release.set()
        await _until(lambda: daemon.config == second, "the second reload applied")
        await reloader.stop()
        return daemon

    daemon = asyncio.run(go())
    assert len(calls) == 2, "three SIGHUPs, one while a reload ran: two reloads"
    assert overlapped == [False, False]
    assert daemon.config == second


def _after_a_rejected_reload(reload: Callable[[], Config], running: Config, caplog: pytest.LogCaptureFixture) -> Daemon:
    """The daemon once a SIGHUP's reload was rejected and the rejection logged."""

    async def go() -> Daemon:
        daemon, reloader = _reloading(reload, running)
        reloader.on_sighup()
        await _until(lambda: "config reload rejected" in caplog.text, "the rejection logged")
        return daemon

    with caplog.at_level(logging.INFO, logger="plimsoll.server"):
        return asyncio.run(go())


def test_a_rejected_reload_keeps_the_running_config_and_says_why(caplog):
    running = Config(nvml=False, poll_interval_seconds=7.0)

    def reload() -> Config:
        raise ConfigError(["plimsoll.yaml: poll_interval: 5 has no unit: write 5s"])

    assert _after_a_rejected_reload(reload, running, caplog).config is running
    assert "keeping the running config:\nplimsoll.yaml: poll_interval: 5 has no unit" in caplog.text


def test_a_reload_that_finds_the_config_file_emptied_while_it_is_rewritten_keeps_the_running_targets(caplog, tmp_path):
    config_file = tmp_path / "plimsoll.yaml"
    config_file.write_text("")  # truncated by the writer, its new text not written yet
    running = Config(targets=(Target("llama", "http://127.0.0.1:8000/metrics"),), nvml=False)

    assert _after_a_rejected_reload(lambda: load_config(config_file, environ={}), running, caplog).config is running
    assert f"{config_file}: the config is empty (write {{}} for every default)" in caplog.text


def test_a_reload_warns_about_the_fields_that_need_a_restart_and_applies_the_rest(caplog):
    new = Config(nvml=False, listen="127.0.0.1:19999", poll_interval_seconds=9.0)

    async def go() -> Daemon:
        daemon, reloader = _reloading(lambda: new, Config(nvml=False))
        reloader.on_sighup()
        await _until(lambda: daemon.config is new, "the new config applied")
        return daemon

    with caplog.at_level(logging.WARNING, logger="plimsoll.server"):
        asyncio.run(go())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "listen" in warning and "restart" in warning


def test_sighup_without_a_reload_is_logged_and_nothing_changes(caplog):
    running = Config(nvml=False)

    async def go() -> Daemon:
        daemon, reloader = _reloading(None, running)
        reloader.on_sighup()
        return daemon

    with caplog.at_level(logging.INFO, logger="plimsoll.server"):
        daemon = asyncio.run(go())
    assert daemon.config is running
    assert "SIGHUP: no --config or --web-config to reload" in caplog.text


def test_a_listen_address_that_cannot_be_bound_is_one_line_saying_what_to_do():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(server.ListenError) as in_use:
            server.listen_socket(f"127.0.0.1:{port}")
    with pytest.raises(server.ListenError) as nonsense:
        server.listen_socket("nonsense")
    assert str(in_use.value) == (
        f"cannot listen on 127.0.0.1:{port}: address already in use (another plimsoll? set --listen)"
    )
    assert str(nonsense.value).startswith("cannot listen on nonsense: ")
    assert "\n" not in str(nonsense.value)


def test_the_header_deadline_closes_a_trickling_first_request_and_spares_a_prompt_one():
    timeout = 0.5

    async def read_response(reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))[15:])
        return head + await reader.readexactly(length)

    async def go() -> tuple[float, bytes, bytes]:
        app = build_app(Daemon(Config(nvml=False, request_header_timeout_seconds=timeout)))
        runner = web.AppRunner(app, keepalive_timeout=3600)  # aiohttp's own idle timer out of the way
        await runner.setup()
        sock = server.listen_socket("127.0.0.1:0")
        await server.BoundSite(runner, sock, None, app[server.HEADER_DEADLINE]).start()
        port = sock.getsockname()[1]
        try:
            request = b"GET /healthz HTTP/1.1\r\nHost: plimsoll\r\n\r\n"
            prompt_reader, prompt_writer = await asyncio.open_connection("127.0.0.1", port)
            prompt_writer.write(request)
            first = await read_response(prompt_reader)
            started = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: plimsoll\r\n")
            closed = asyncio.ensure_future(reader.read(1))
            while not closed.done():
                assert time.monotonic() - started < 10 * timeout, "the trickling connection was never closed"
                writer.write(b"X-Slow: 1\r\n")
                await asyncio.wait({closed}, timeout=0.05)
            closed_after = time.monotonic() - started
            # The prompt connection is past its deadline by now; having sent a request in time, it stays open.
            prompt_writer.write(request)
            second = await read_response(prompt_reader)
            prompt_writer.close()
            writer.close()
            return closed_after, first, second
        finally:
            await runner.cleanup()

    closed_after, first, second = asyncio.run(go())
    assert timeout <= closed_after < 4 * timeout
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
