"""plimsoll_target_gpu_hourly_cost: what a target's GPUs cost per hour, priced by NVML's names or the target's
gpu_type, and absent wherever one of its GPUs has no price.

The first tests poll a recorded vLLM page in process (a fake NVML reader where NVML matters); the last runs a real
`plimsoll run` with NVML off over loopback and reads its /metrics as Prometheus would.
"""

import asyncio
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.capacity.deployment import Deployment
from exporter.config import Config, Target
from exporter.daemon.collector import SnapshotCollector
from exporter.daemon.poll import Daemon
from exporter.daemon.snapshot import Snapshot
from exporter.sources.nvml import GpuReading, NvmlSnapshot
from tests.conftest import ENGINE_FIXTURES, TESTS
from tests.daemon.pages import page_server
from tests.support.daemon_process import app_in_thread, running_daemon
from tests.support.prometheus import NotReady, http, wait_until

PEAK = "/page/vllm-cpu-0.32-2mib_peak.prom"
SERVED_MODEL = "tiny-llama"  # the model_name label on the recorded page
TINY_LLAMA = str(TESTS / "data" / "tiny-llama")
PRICES = (("H100-80GB", 2.49), ("L4", 0.8))
COST = "plimsoll_target_gpu_hourly_cost"
METRICS_TIMEOUT_S = 10.0


class _Gpus:
    """A fake NVML reader: GPUs with these product names, indices 0, 1, ..."""

    def __init__(self, *names: str):
        self._names = names

    def read(self) -> NvmlSnapshot:
        gpus = tuple(
            GpuReading(str(i), f"GPU-{i}", name, 80 << 30, 70 << 30, 0, 10 << 30, ())
            for i, name in enumerate(self._names)
        )
        return NvmlSnapshot(up=True, driver_version="580.95.05", gpus=gpus, error=None)


def _costs_of(snapshot: Snapshot) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshot, lambda: []))
    return _costs(generate_latest(registry).decode())


def _costs(page: str) -> dict[tuple[str, str], float]:
    (family,) = (f for f in text_string_to_metric_families(page) if f.name == COST)
    return {(s.labels["target"], s.labels["model"]): s.value for s in family.samples}


def _poll(make_target: Callable[[str], Target], nvml: _Gpus | None = None) -> dict[tuple[str, str], float]:
    async def go() -> Snapshot:
        async with page_server() as base, aiohttp.ClientSession() as session:
            config = Config(targets=(make_target(base + PEAK),), nvml=nvml is not None, gpu_hour_prices=PRICES)
            return await Daemon(config, nvml=nvml).poll_once(session)

    return _costs_of(asyncio.run(go()))


def test_gpus_nvml_attributes_to_the_target_are_priced_by_their_product_names() -> None:
    costs = _poll(lambda url: Target("llama", url, gpus=("0", "2")), _Gpus(*["NVIDIA H100 80GB HBM3"] * 3))
    assert costs == {("llama", SERVED_MODEL): pytest.approx(2 * 2.49)}


def test_nvml_names_win_over_the_gpu_type_the_config_gives() -> None:
    # The config says L4; NVML sees an H100 under the target: the card that is there is the one paid for.
    costs = _poll(lambda url: Target("llama", url, gpus=("0",), gpu_type="L4"), _Gpus("NVIDIA H100 80GB HBM3"))
    assert costs == {("llama", SERVED_MODEL): pytest.approx(2.49)}


def test_one_attributed_gpu_without_a_price_leaves_the_target_without_a_cost_and_the_log_names_it(caplog) -> None:
    costs = _poll(lambda url: Target("llama", url, gpus=("0", "1")), _Gpus("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    assert costs == {}
    (line,) = [r.getMessage() for r in caplog.records if "gpu_hourly_cost" in r.getMessage()]
    assert line.startswith("target llama: pricing.gpu_hour prices no GPU named 'NVIDIA H200' ")


def test_without_nvml_the_gpu_type_is_priced_for_each_configured_gpu() -> None:
    costs = _poll(lambda url: Target("llama", url, gpus=("0", "1", "2"), gpu_type="H100"))
    assert costs == {("llama", SERVED_MODEL): pytest.approx(3 * 2.49)}


def test_without_nvml_or_gpus_the_capacity_plan_says_how_many_gpus_the_target_uses() -> None:
    deployment = Deployment(tensor_parallel=2, pipeline_parallel=2)
    costs = _poll(lambda url: Target("llama", url, model=TINY_LLAMA, gpu_type="L4", deployment=deployment))
    assert costs == {("llama", SERVED_MODEL): pytest.approx(4 * 0.8)}


def test_a_gpu_type_without_a_gpu_count_has_no_cost_and_the_log_says_what_to_give(caplog) -> None:
    # No gpus and no model to plan: how many L4s the engine runs on is unknown, and one would be a guess.
    assert _poll(lambda url: Target("llama", url, gpu_type="L4")) == {}
    (line,) = [r.getMessage() for r in caplog.records if "gpu_hourly_cost" in r.getMessage()]
    assert line.startswith("target llama: its GPUs are unknown (") and "gpu_type with gpus" in line


def test_a_gpu_type_without_a_price_has_no_cost() -> None:
    assert _poll(lambda url: Target("llama", url, gpus=("0",), gpu_type="A10G")) == {}


def test_a_down_target_has_no_cost_series_though_its_gpus_are_configured() -> None:
    # Nothing listens on port 9. Priced, it would carry the configured model name where the engine's series carry
    # the served one: a second series for the target and a model of its own in every sum by model.
    down = Target("down", "http://127.0.0.1:9/metrics", model="llama-3.1-8b", gpus=("0",), gpu_type="H100")
    assert _poll(lambda url: down) == {}


def test_prices_a_reload_changes_are_applied_and_those_replaced_are_not_kept() -> None:
    async def go() -> tuple[Snapshot, int]:
        async with page_server() as base, aiohttp.ClientSession() as session:
            target = Target("llama", base + PEAK, gpus=("0",), gpu_type="H100")
            daemon = Daemon(Config(targets=(target,), nvml=False, gpu_hour_prices=PRICES))
            for price in (1.0, 2.0, 3.0):
                daemon.apply(Config(targets=(target,), nvml=False, gpu_hour_prices=(("H100-80GB", price),)))
                snapshot = await daemon.poll_once(session)
            return snapshot, len(daemon._costs)

    snapshot, kept = asyncio.run(go())
    assert _costs_of(snapshot) == {("llama", SERVED_MODEL): pytest.approx(3.0)}
    assert kept == 1


def _recorded_vllm() -> web.Application:
    page = (ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_peak.prom").read_text()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def test_plimsoll_run_exports_the_cost_of_a_priced_gpu_type_and_none_for_an_unpriced_one(tmp_path) -> None:
    with app_in_thread(_recorded_vllm()) as engine:
        target = {"url": engine + "/metrics", "model": TINY_LLAMA, "deployment": {"tensor_parallel": 2}}
        config = {
            "poll_interval": "500ms",
            "targets": [
                {"name": "priced", "gpu_type": "L4", **target},
                {"name": "unpriced", "gpu_type": "A10G", **target},
            ],
            "pricing": {"gpu_hour": {"NVIDIA L4": 0.8, "H100-80GB": 2.49}},
        }
        with running_daemon(tmp_path, config) as daemon:

            def both_read() -> dict[tuple[str, str], float] | None:
                daemon.assert_running()
                status, page = http("GET", daemon.url + "/metrics")
                if status != 200 or 'plimsoll_target_up{target="unpriced"} 1.0' not in page:
                    return None
                costs = _costs(page)
                return costs if ("priced", SERVED_MODEL) in costs else None

            try:
                costs = wait_until(both_read, METRICS_TIMEOUT_S, "both targets read and the priced one costed")
            except NotReady as error:
                raise AssertionError(f"{error}\n{daemon.log()[-3000:]}") from None
    # L4 is priced under its NVML name and found by preset; tensor_parallel 2 is two of them.
    assert costs == {("priced", SERVED_MODEL): pytest.approx(2 * 0.8)}
