"""The generated rules and dashboards against a real Prometheus scraping a running fleet, and alerts delivered
through a real Alertmanager.

The fleet (tests/support/recorded_fleet.py): two Plimsoll daemons serving /metrics over HTTP on loopback, polling
recorded engine pages every 0.5 s (vLLM at saturation, a vLLM burst and a preempting vLLM replayed while Prometheus
watches, SGLang's sample, a dead port) with a recorded GPU snapshot in place of NVML on one node and a lost driver
on the other; configured as deploy/plimsoll.example.yaml (its SLOs, saturation threshold and lead time).

Prometheus (the fetched binary) scrapes both daemons every second as job "plimsoll", and the replayed vLLM page
itself as job "vllm" (for the one dashboard panel that reads vLLM's own histograms); it loads the rule file
`plimsoll generate` writes for that config, evaluated every second, plus a test-only group of three real alerts
with `for: 0s`, sent to an Alertmanager configured as deploy/alertmanager/alertmanager.yml with its webhooks
pointed at a receiver in this process and its group waits cut to a second.

Rates over windows longer than the test (30m .. 3d) return data once two samples are inside them; the fixture
waits (polling Prometheus until a deadline, no sleeps) until Prometheus has seen each replayed stage, so the
counters have risen inside every window.

Every panel query and every recording rule must parse and return at least one sample that is a number (not NaN);
the engine-histogram panel has its data from the "vllm" job. The one exception is the scale-up lag's quantiles:
nothing scales up here, so they must find each timed workload's histogram, whose quantiles read NaN. Every alert
expression must parse, each operand its conditions compare must return data, and each alert must find exactly the
series FIRING names.

Skips only when the prometheus_tools fixture says this machine cannot have the tools.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.config import Config, load_config
from exporter.generate import dashboards, rules
from tests.generate.queries import panel_queries, render, rule_expressions
from tests.support.prometheus import (
    Alertmanager,
    NotReady,
    Prometheus,
    QueryError,
    WebhookReceiver,
    prometheus_config,
    running_alertmanager,
    running_prometheus,
    wait_until,
    webhook_receiver,
    webhooks_to,
    with_short_waits,
)
from tests.support.promql import operands
from tests.support.recorded_fleet import LEAKING_GPU, Fleet, recorded_fleet

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "deploy" / "plimsoll.example.yaml"
ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
EXPORTER_JOB = "plimsoll"  # matches rules.EXPORTER_JOB_REGEX, as a plain scrape config names it
ENGINE_JOB = "vllm"
ENGINE_PAGE = "vllm-1gib-burst"  # the replay Prometheus scrapes directly for the engine-histogram panel
STAGE_TIMEOUT_S = 20.0  # per replay stage: a few scrapes and polls
DATA_TIMEOUT_S = 10.0  # per query: a rule evaluation or two behind the last stage
DELIVERY_TIMEOUT_S = 20.0
# The alerts the delivery group copies with `for: 0s`; Prometheus sends them to Alertmanager as soon as they fire.
DELIVERED = ("PlimsollKVCacheSaturated", "PlimsollKVCacheSaturationAhead", "PlimsollTargetDown")

# What each alert expression finds on this fleet: the labels that tell the firing series apart. The recorded pages
# make most alerts fire; the quiet ones, and why:
# - PlimsollFleetHeadroomLow: tiny-llama's replicas fit thousands of p95-size requests between them, and SGLang's
#   sample has no token histograms, so no footprint and no headroom in requests;
# - PlimsollSLOErrorBudgetBurn: the recorded vLLM engines met their SLOs (0.2% of ITLs over 50 ms at most), and
#   SGLang's sample (almost every TTFT over 500 ms) is one fixed page, so its counters never rise;
# - PlimsollExporterAbsent: both daemons are up; its operands (`up{job=~...} == 1`, plimsoll_build_info) must
#   return data, which is what keeps it quiet.
FIRING: dict[str, set[tuple[str, ...]]] = {
    "PlimsollKVCacheSaturationAhead": {("vllm-saturated",)},
    "PlimsollKVCacheSaturated": {("vllm-saturated",)},
    "PlimsollPreemptions": {("vllm-preempting",)},
    "PlimsollFleetHeadroomLow": set(),
    "PlimsollCapacityModelDrift": {("vllm-burst",)},  # configured for 2 GiB of KV, the engine allocated 1 GiB
    "PlimsollVRAMUnexplainedGrowing": {(LEAKING_GPU,)},
    "PlimsollSLOErrorBudgetBurn": set(),
    "PlimsollTargetDown": {("down",)},
    "PlimsollNVMLDown": {("node-b",)},
    "PlimsollExporterAbsent": set(),
}


@dataclass
class Stack:
    config: Config  # the daemon's, which the rule file was generated from
    rule_text: str  # the rule file Prometheus loaded
    fleet: Fleet
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: WebhookReceiver


def _delivery_rules(config: Config) -> dict[str, Any]:
    """Copies of real alerts with `for: 0s`, so they fire (and are sent) within the test."""
    found = []
    for group in rules.groups(config):
        for rule in group["rules"]:
            if rule.get("alert") in DELIVERED:
                found.append({**copy.deepcopy(rule), "for": "0s"})
    assert sorted(r["alert"] for r in found) == sorted(DELIVERED)
    return {"groups": [{"name": "plimsoll-delivery-test", "rules": found}]}


def _value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def _has(prometheus: Prometheus, expr: str) -> list[dict[str, Any]] | None:
    return prometheus.query(expr) or None


def _wait_for(prometheus: Prometheus, expr: str, what: str, timeout_s: float = STAGE_TIMEOUT_S) -> None:
    wait_until(lambda: _has(prometheus, expr), timeout_s, f"{what} ({expr})")


def _play(fleet: Fleet, prometheus: Prometheus) -> None:
    """Move the replays through their stages, each only once Prometheus has recorded the one before: the SLI, token
    and preemption counters then rise inside every window the queries read."""
    burst = 'target="vllm-burst"'
    _wait_for(prometheus, f'plimsoll_slo_requests_total{{{burst}, slo="e2e"}} == 0', "the idle stage, via Plimsoll")
    _wait_for(prometheus, 'plimsoll_preemptions_total{target="vllm-preempting"} == 0', "the preempting engine's peak")
    _wait_for(prometheus, f'vllm:e2e_request_latency_seconds_count{{job="{ENGINE_JOB}"}} == 0', "the idle engine")
    fleet.advance(ENGINE_PAGE)
    _wait_for(prometheus, f"plimsoll_requests_running{{{burst}}} == 8", "the burst's peak, via Plimsoll")
    _wait_for(prometheus, f'vllm:num_requests_running{{job="{ENGINE_JOB}"}} == 8', "the burst's peak, scraped")
    fleet.advance(ENGINE_PAGE)
    fleet.advance("vllm-2mib-preempting")
    _wait_for(prometheus, f'plimsoll_slo_requests_total{{{burst}, slo="e2e"}} == 11', "after the burst, via Plimsoll")
    _wait_for(prometheus, f'vllm:e2e_request_latency_seconds_count{{job="{ENGINE_JOB}"}} == 11', "after, scraped")
    _wait_for(prometheus, 'plimsoll_preemptions_total{target="vllm-preempting"} == 5', "the preemptions")


@pytest.fixture(scope="module")
def stack(prometheus_tools: dict[str, str]) -> Iterator[Stack]:
    base = load_config(EXAMPLE_CONFIG)
    with tempfile.TemporaryDirectory(prefix="plimsoll-prometheus-") as tmp, contextlib.ExitStack() as running:
        workdir = Path(tmp)
        fleet = running.enter_context(recorded_fleet(base))
        webhook = running.enter_context(webhook_receiver())
        routes = with_short_waits(webhooks_to(yaml.safe_load(ALERTMANAGER_CONFIG.read_text()), webhook.url))
        alertmanager = running.enter_context(
            running_alertmanager(prometheus_tools["alertmanager"], workdir / "alertmanager", routes)
        )
        rule_text = next(a.text for a in rules.artifacts(fleet.config) if a.path == rules.RULES_PATH)
        rule_file = workdir / rules.RULES_PATH
        rule_file.parent.mkdir(parents=True)
        rule_file.write_text(rule_text)
        delivery_file = rule_file.parent / "delivery.rules.yaml"
        delivery_file.write_text(yaml.safe_dump(_delivery_rules(fleet.config), sort_keys=False))
        scrape = [
            {"job_name": EXPORTER_JOB, "static_configs": [{"targets": [fleet.node_a, fleet.node_b]}]},
            {
                "job_name": ENGINE_JOB,
                "metrics_path": f"/page/{ENGINE_PAGE}",
                "static_configs": [{"targets": [fleet.pages_address]}],
            },
        ]
        config = prometheus_config(scrape, [rule_file, delivery_file], alertmanager=alertmanager.address)
        prometheus = running.enter_context(
            running_prometheus(prometheus_tools["prometheus"], workdir / "prometheus", config)
        )
        try:
            _play(fleet, prometheus)
        except NotReady as late:
            raise AssertionError(f"{late}\n--- prometheus log ---\n{prometheus.tool.log_tail()}") from late
        yield Stack(fleet.config, rule_text, fleet, prometheus, alertmanager, webhook)


def _data(prometheus: Prometheus, expr: str) -> list[dict[str, Any]]:
    """The query's samples, polled until some are a number (not NaN) or the deadline passes; a query Prometheus
    rejects fails at once."""
    last: list[dict[str, Any]] = []

    def probe() -> list[dict[str, Any]] | None:
        nonlocal last
        last = prometheus.query(expr)
        return last if any(not math.isnan(_value(s)) for s in last) else None

    with contextlib.suppress(NotReady):
        return wait_until(probe, DATA_TIMEOUT_S, expr)
    return last


def _describe(samples: list[dict[str, Any]]) -> str:
    return "no series" if not samples else f"only NaN: {[s['metric'] for s in samples]}"


# The dashboards


def _panel_id(dashboard: str, panel: str, index: int) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", f"{dashboard.removeprefix('Plimsoll / ')}-{panel}").strip("-") + f"-{index}"


PANEL_QUERIES = panel_queries(load_config(EXAMPLE_CONFIG))
# No replica is added in the recorded fleet, so no scale-up lag is measured: the lag histogram of each workload the
# daemons time is there with every bucket at 0, and its quantiles are NaN (the panel shows no value).
SCALE_UP_LAG_PANEL = "Scale-up lag per model (over the time range)"


@pytest.mark.parametrize(
    "panel_query",
    PANEL_QUERIES,
    ids=[_panel_id(d, p, i) for i, (d, p, _) in enumerate(PANEL_QUERIES)],
)
def test_every_panel_query_parses_and_returns_data(stack, panel_query):
    dashboard, panel, expr = panel_query
    query = render(expr)
    if panel == SCALE_UP_LAG_PANEL:
        assert stack.config.autoscaling is not None
        timed = {w.model for w in stack.config.autoscaling.workloads if w.knee_concurrency is not None}
        assert {s["metric"].get("model") for s in stack.prometheus.query(query)} == timed, query
        return
    samples = _data(stack.prometheus, query)
    assert any(not math.isnan(_value(s)) for s in samples), f"{dashboard} / {panel}: {_describe(samples)}\n{query}"
    if panel == dashboards.ENGINE_HISTOGRAM_PANEL:
        assert {s["metric"].get("model_name") for s in samples} == {"tiny-llama"}


# The rules


def test_the_rules_under_test_are_the_committed_ones(stack):
    # The daemon's config differs from the example only in its targets and poll interval, which rules do not read.
    assert stack.rule_text == (ROOT / rules.RULES_PATH).read_text()


def test_prometheus_loads_every_generated_rule_and_evaluates_it_without_error(stack):
    def evaluated() -> list[dict[str, Any]] | None:
        loaded = [
            rule
            for group in stack.prometheus.get("/api/v1/rules")["groups"]
            if group["name"] != "plimsoll-delivery-test"
            for rule in group["rules"]
        ]
        return loaded if all(r["lastEvaluation"] > "0001-01-01T00:00:00Z" for r in loaded) else None

    loaded = wait_until(evaluated, DATA_TIMEOUT_S, "every rule evaluated once")
    # The API lists groups by name; within a group, rules keep the file's order.
    assert sorted(r["name"] for r in loaded) == sorted(name for _, name, _ in rule_expressions(stack.config))
    assert [r.get("lastError", "") for r in loaded if r["health"] != "ok"] == []


RULE_EXPRESSIONS = rule_expressions(load_config(EXAMPLE_CONFIG))
RECORDING = [(group, name, expr) for group, name, expr in RULE_EXPRESSIONS if ":" in name]
ALERTING = [(group, name, expr) for group, name, expr in RULE_EXPRESSIONS if ":" not in name]


@pytest.mark.parametrize("rule", RECORDING, ids=[name for _, name, _ in RECORDING])
def test_every_recording_rule_returns_data(stack, rule):
    group, name, expr = rule
    samples = _data(stack.prometheus, expr)
    assert any(not math.isnan(_value(s)) for s in samples), f"{group} {name}: {_describe(samples)}\n{expr}"
    recorded = _data(stack.prometheus, name)
    assert recorded, f"{name}: Prometheus recorded nothing"


def _alert_id(name: str, expr: str) -> str:
    """The alert's name, and for the burn alerts (one name, many rules) their windows and SLO."""
    windows = re.findall(r"ratio_rate(\w+)\{slo=\"(\w+)\"", expr)
    return "-".join([name, *(window for window, _ in windows), *sorted({slo for _, slo in windows})])


@pytest.mark.parametrize("rule", ALERTING, ids=[_alert_id(name, expr) for _, name, expr in ALERTING])
def test_every_alert_expression_parses_and_its_operands_return_data(stack, rule):
    group, name, expr = rule
    stack.prometheus.query(expr)  # parses: a rejected query raises QueryError
    empty = []
    for operand in operands(expr):
        samples = _data(stack.prometheus, operand)
        if not any(not math.isnan(_value(s)) for s in samples):
            empty.append(f"{operand}: {_describe(samples)}")
    assert empty == [], f"{group} {name}:\n" + "\n".join(empty)


def _firing_key(stack: Stack, sample: dict[str, Any]) -> tuple[str, ...]:
    labels = sample["metric"]
    if "target" in labels:
        return (labels["target"],)
    if "gpu" in labels:
        return (labels["gpu"],)
    return ("node-b",) if labels.get("instance") == stack.fleet.node_b else (labels.get("instance", ""),)


@pytest.mark.parametrize("alert", sorted(FIRING))
def test_each_alert_fires_exactly_where_the_recorded_fleet_says(stack, alert):
    expressions = [expr for _, name, expr in ALERTING if name == alert]
    expected = FIRING[alert]

    def found() -> set[tuple[str, ...]]:
        return {_firing_key(stack, s) for expr in expressions for s in stack.prometheus.query(expr)}

    if expected:
        with contextlib.suppress(NotReady):
            wait_until(lambda: found() == expected or None, DATA_TIMEOUT_S, f"{alert} fires on {expected}")
    assert found() == expected


def test_a_broken_target_makes_target_down_pending(stack):
    pending = 'ALERTS{alertname="PlimsollTargetDown", alertstate="pending"}'
    samples = wait_until(lambda: _has(stack.prometheus, pending), DATA_TIMEOUT_S, pending)
    assert [(s["metric"]["target"], s["metric"]["instance"]) for s in samples] == [("down", stack.fleet.node_a)]
    # The generated rule holds it for 5m: pending, not firing, within the test (the firing one is the delivery copy).
    (rule,) = [
        rule
        for group in stack.prometheus.get("/api/v1/rules?type=alert")["groups"]
        if group["name"] == rules.GROUP_EXPORTER
        for rule in group["rules"]
        if rule["name"] == "PlimsollTargetDown"
    ]
    assert rule["state"] == "pending"
    assert [(a["labels"]["target"], a["state"]) for a in rule["alerts"]] == [("down", "pending")]


def test_a_query_prometheus_rejects_fails_the_check(stack):
    with pytest.raises(QueryError, match="parse error"):
        stack.prometheus.query("sum by (model) (plimsoll_kv_cache_usage_ratio[5m]")


# Delivery through Alertmanager


def _received(webhook: WebhookReceiver, path: str, alertname: str, target: str) -> dict[str, Any] | None:
    for alert in webhook.alerts(path):
        labels = alert["labels"]
        if labels["alertname"] == alertname and labels.get("target") == target and alert["status"] == "firing":
            return alert
    return None


def test_target_down_reaches_the_ticket_webhook_with_its_labels(stack):
    alert = wait_until(
        lambda: _received(stack.webhook, "/ticket", "PlimsollTargetDown", "down"),
        DELIVERY_TIMEOUT_S,
        "PlimsollTargetDown for target down at the ticket webhook",
    )
    labels = alert["labels"]
    assert alert["receiver"] == "ticket"
    assert labels["severity"] == "ticket"
    assert labels["instance"] == stack.fleet.node_a and labels["job"] == EXPORTER_JOB
    assert alert["annotations"]["runbook_url"].endswith("#plimsolltargetdown")
    assert "down" in alert["annotations"]["summary"]


def test_saturation_pages_through_the_pager_webhook(stack):
    alert = wait_until(
        lambda: _received(stack.webhook, "/pager", "PlimsollKVCacheSaturated", "vllm-saturated"),
        DELIVERY_TIMEOUT_S,
        "PlimsollKVCacheSaturated for vllm-saturated at the pager webhook",
    )
    assert alert["receiver"] == "pager"
    assert alert["labels"]["severity"] == "page"
    assert {"model": "tiny-llama", "dp_rank": "0"}.items() <= alert["labels"].items()


def _state(alertmanager: Alertmanager, *matchers: str) -> dict[str, Any] | None:
    found = alertmanager.alerts(*matchers)
    return found[0]["status"] if len(found) == 1 else None


def test_saturated_inhibits_saturation_ahead_sent_by_prometheus(stack):
    # Prometheus sends both for vllm-saturated: 97% full with requests waiting, and (ETA 0) "ahead" as well.
    ahead = ('alertname="PlimsollKVCacheSaturationAhead"', 'target="vllm-saturated"')
    status = wait_until(
        lambda: (s := _state(stack.alertmanager, *ahead)) and s["state"] == "suppressed" and s,
        DELIVERY_TIMEOUT_S,
        "SaturationAhead for vllm-saturated inhibited",
    )
    (source,) = stack.alertmanager.alerts('alertname="PlimsollKVCacheSaturated"', 'target="vllm-saturated"')
    assert status["inhibitedBy"] == [source["fingerprint"]]
    # One page, the more urgent one: once Saturated has paged, "ahead" has not (and, inhibited, will not).
    wait_until(
        lambda: _received(stack.webhook, "/pager", "PlimsollKVCacheSaturated", "vllm-saturated"),
        DELIVERY_TIMEOUT_S,
        "PlimsollKVCacheSaturated for vllm-saturated at the pager webhook",
    )
    assert _received(stack.webhook, "/pager", "PlimsollKVCacheSaturationAhead", "vllm-saturated") is None


def test_saturated_inhibits_saturation_ahead_for_the_same_engine_only(stack):
    now = datetime.now(UTC)
    times = {"startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}
    engine = {"instance": "api-node:19842", "target": "api-test", "model": "api-model", "severity": "page"}
    stack.alertmanager.post(
        [
            {"labels": {"alertname": "PlimsollKVCacheSaturated", **engine, "dp_rank": "0"}, **times},
            {"labels": {"alertname": "PlimsollKVCacheSaturationAhead", **engine, "dp_rank": "0"}, **times},
            {"labels": {"alertname": "PlimsollKVCacheSaturationAhead", **engine, "dp_rank": "1"}, **times},
        ]
    )
    ahead = ('alertname="PlimsollKVCacheSaturationAhead"', 'target="api-test"')
    inhibited = wait_until(
        lambda: (s := _state(stack.alertmanager, *ahead, 'dp_rank="0"')) and s["state"] == "suppressed" and s,
        DELIVERY_TIMEOUT_S,
        "SaturationAhead on dp_rank 0 inhibited by Saturated on dp_rank 0",
    )
    (source,) = stack.alertmanager.alerts('alertname="PlimsollKVCacheSaturated"', 'target="api-test"')
    assert inhibited["inhibitedBy"] == [source["fingerprint"]]
    other_rank = _state(stack.alertmanager, *ahead, 'dp_rank="1"')
    assert other_rank is not None and other_rank["state"] == "active" and other_rank["inhibitedBy"] == []
