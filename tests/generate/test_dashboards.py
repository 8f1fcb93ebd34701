"""The Grafana dashboards: modern panels, the variables, units, thresholds taken from the config, only the metric
names the daemon exports, and output that is deterministic and matches the committed files."""

import json
import math
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

from exporter.config import Config, SloConfig, load_config
from exporter.core.scale_up import LAG_BUCKETS
from exporter.daemon.collector import SnapshotCollector
from exporter.daemon.snapshot import FAILURE_REASONS, Snapshot
from exporter.generate import dashboards, rules
from exporter.generate.rules import saturation_gate_ratio
from exporter.scaling import DEMAND_RECORD
from exporter.sources.nvml import NvmlSnapshot
from tests.generate.conftest import promtool_rule_tests
from tests.generate.queries import panel_queries, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "plimsoll.example.yaml"
MODERN_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table"}
PROMQL_FUNCTIONS = {
    "sum",
    "min",
    "max",
    "count",
    "group",
    "rate",
    "increase",
    "histogram_quantile",
    "vector",
    "predict_linear",
    "deriv",
}
# Prometheus' own series, read where a panel mirrors an alert on the daemons' scrape jobs.
PROMETHEUS_SERIES = {"up"}
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset"}


@pytest.fixture(scope="module")
def example() -> Config:
    return load_config(EXAMPLE)


def built(config: Config) -> dict[str, dict[str, Any]]:
    return {item.path: json.loads(item.text) for item in dashboards.artifacts(config)}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but row headers."""
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            yield panel
        yield from panel.get("panels", [])


def all_panels(config: Config) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, dashboard in built(config).items():
        for panel in panels(dashboard):
            yield path, panel


def exported_metric_names() -> set[str]:
    """What the daemon's collector exposes, family by family (an NVML-up snapshot, so GPU families are there too)."""
    nvml = NvmlSnapshot(up=True, driver_version="x", gpus=(), error=None)
    snapshot = Snapshot(taken_at=0.0, ready=True, nvml=nvml, targets=())
    names = set()
    for family in SnapshotCollector(lambda: snapshot, lambda: []).collect():
        names.add(family.name + {"counter": "_total", "info": "_info", "histogram": "_bucket"}.get(family.type, ""))
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside strings, label matchers, ranges and label lists
    that are neither functions, aggregations nor keywords. Fails on a function it does not know."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match.groups()
        if call:
            assert word in PROMQL_FUNCTIONS, f"unknown PromQL function {word!r} in {expr!r}"
        elif word not in PROMQL_KEYWORDS:
            names.add(word)
    return names


def threshold_steps(panel: dict[str, Any]) -> list[tuple[list[float], str]]:
    """(step values, thresholds style) of the panel's defaults and of each override that sets thresholds."""
    defaults = panel["fieldConfig"]["defaults"]
    style = defaults.get("custom", {}).get("thresholdsStyle", {}).get("mode", "")
    found = [([s["value"] for s in defaults["thresholds"]["steps"][1:]], style)]
    for override in panel["fieldConfig"].get("overrides", []):
        props = {p["id"]: p["value"] for p in override["properties"]}
        if "thresholds" in props:
            mode = props.get("custom.thresholdsStyle", {}).get("mode", style)
            found.append(([s["value"] for s in props["thresholds"]["steps"][1:]], mode))
    return found


def drawn_lines(panel: dict[str, Any]) -> set[float]:
    return {value for values, style in threshold_steps(panel) if "line" in style for value in values}


def panel_titled(config: Config, title: str) -> dict[str, Any]:
    matches = [panel for _, panel in all_panels(config) if panel["title"] == title]
    assert len(matches) == 1, f"{len(matches)} panels titled {title!r}"
    return matches[0]


def queries_of(panel: dict[str, Any]) -> list[str]:
    return [target["expr"] for target in panel["targets"]]


def test_three_dashboards_with_fixed_uids(example):
    found = {path: dashboard["uid"] for path, dashboard in built(example).items()}
    assert found == {
        "dashboards/plimsoll-fleet.json": "plimsoll-fleet",
        "dashboards/plimsoll-instance.json": "plimsoll-instance",
        "dashboards/plimsoll-capacity-plan.json": "plimsoll-capacity-plan",
    }


def test_every_panel_is_a_modern_type(example):
    for path, panel in all_panels(example):
        assert panel["type"] in MODERN_TYPES, f"{path}: {panel['title']!r} is a {panel['type']} panel"


def test_every_dashboard_has_the_datasource_variable_and_model_node_target_variables(example):
    for path, dashboard in built(example).items():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert set(variables) == {"datasource", "node", "model", "target"}, path
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for name, label in (("node", "instance"), ("model", "model"), ("target", "target")):
            variable = variables[name]
            assert variable["type"] == "query"
            assert variable["datasource"] == dashboards.DATASOURCE
            assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"
            assert re.fullmatch(rf"label_values\(plimsoll_\w+(\{{[^}}]*\}})?, {label}\)", variable["query"]), variable[
                "query"
            ]


def test_every_panel_and_query_reads_the_datasource_variable(example):
    for path, panel in all_panels(example):
        assert panel["datasource"] == dashboards.DATASOURCE, f"{path}: {panel['title']}"
        assert panel["targets"], f"{path}: {panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == dashboards.DATASOURCE


def test_every_panel_has_a_unit_and_a_description(example):
    for path, panel in all_panels(example):
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{path}: {panel['title']!r} has no unit"
        assert len(panel.get("description") or "") > 40, f"{path}: {panel['title']!r} says not what it answers"


def test_the_poll_failures_panel_names_every_reason_the_daemon_counts(example):
    description = panel_titled(example, "Target polls: failures per second by reason")["description"]
    assert f": {', '.join(FAILURE_REASONS)}. " in description


def recorded_names(config: Config) -> set[str]:
    """The recording rules `plimsoll generate` writes for the config."""
    return {rule["record"] for group in rules.groups(config) for rule in group["rules"] if "record" in rule}


def test_every_query_filters_on_the_variables_it_can(example):
    recorded = recorded_names(example)
    for _, panel in all_panels(example):
        for expr in queries_of(panel):
            if panel["title"] == dashboards.ENGINE_HISTOGRAM_PANEL:
                assert 'model_name=~"$model"' in expr
            elif metric_names(expr) <= recorded:
                # Per-model records keep no node or target: each read filters on the model.
                reads = re.findall(r"(\w+:[\w:]+)(\{[^}]*\})?", expr)
                assert reads and all(selector == '{model=~"$model"}' for _, selector in reads), expr
            else:
                assert 'instance=~"$node"' in expr, expr
            if re.search(r"plimsoll_(kv_cache|headroom|requests|slo_\w*requests|model|saturation_eta)", expr):
                assert 'target=~"$target"' in expr and 'model=~"$model"' in expr, expr


def test_queries_use_only_metric_names_the_daemon_exports_or_the_generated_rules_record(example):
    exported = exported_metric_names() | recorded_names(example)
    assert {"plimsoll_kv_cache_usage_ratio", "plimsoll_preemptions_total", "plimsoll_build_info"} <= exported
    engine_native = set()
    for dashboard, title, expr in panel_queries(example):
        unknown = metric_names(expr) - exported - PROMETHEUS_SERIES
        if title == dashboards.ENGINE_HISTOGRAM_PANEL:
            assert all(name.startswith("vllm:") for name in unknown), expr
            engine_native |= unknown
        else:
            assert not unknown, f"{dashboard} / {title}: {sorted(unknown)} are not series the daemon exports"
    assert engine_native == set(dashboards.VLLM_HISTOGRAMS.values())
    for dashboard in built(example).values():
        for variable in dashboard["templating"]["list"][1:]:
            assert metric_names(re.sub(r"^label_values\((.*), \w+\)$", r"\1", variable["query"])) <= exported


def test_metric_name_parser_finds_names_and_skips_labels_and_functions():
    expr = (
        'sum by (instance, gpu) (group by (instance, gpu, target) (a_bytes{target!=""}) * on (instance, target) '
        'group_left () b:c_total{x="y"}[5m]) / (1 - 0.99) or vector(0)'
    )
    assert metric_names(expr) == {"a_bytes", "b:c_total"}


def test_queries_list_every_query_of_every_panel_and_render_substitutes_the_variables(example):
    listed = panel_queries(example)
    expected = [
        (dashboard["title"], panel["title"], expr)
        for dashboard in built(example).values()
        for panel in panels(dashboard)
        for expr in queries_of(panel)
    ]
    assert listed == expected
    for _, _, expr in listed:
        rendered = render(expr)
        assert "$" not in rendered
        assert "[$__rate_interval]" not in rendered
    assert render('up{instance=~"$node"}[$__rate_interval]') == 'up{instance=~".*"}[5m]'
    assert render('x{model=~"$model"}', {"model": "llama"}) == 'x{model=~"llama"}'


def test_slo_latency_thresholds_are_drawn_as_lines_and_follow_the_config(example):
    panel = panel_titled(example, dashboards.ENGINE_HISTOGRAM_PANEL)
    assert drawn_lines(panel) == {s.threshold_seconds for s in example.slos} == {0.5, 0.05, 30.0}
    for expr, slo in zip(queries_of(panel), example.slos, strict=True):
        assert expr.startswith(f"histogram_quantile({slo.objective}, ")

    stricter = replace(example, slos=(SloConfig("ttft", 0.25, 0.995), *example.slos[1:]))
    panel = panel_titled(stricter, dashboards.ENGINE_HISTOGRAM_PANEL)
    assert drawn_lines(panel) == {0.25, 0.05, 30.0}
    assert queries_of(panel)[0].startswith("histogram_quantile(0.995, ")


def test_slo_objectives_are_drawn_on_the_sli_panels(example):
    for slo, title in zip(
        example.slos,
        ("TTFT SLI: requests within 500 ms", "ITL SLI: requests within 50 ms", "End-to-end SLI: requests within 30 s"),
        strict=True,
    ):
        panel = panel_titled(example, title)
        assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
        assert drawn_lines(panel) == {slo.objective}
        assert all(f'slo="{slo.name}"' in expr for expr in queries_of(panel))

    changed = replace(example, slos=(SloConfig("ttft", 0.2, 0.95),))
    assert drawn_lines(panel_titled(changed, "TTFT SLI: requests within 200 ms")) == {0.95}
    titles = {panel["title"] for _, panel in all_panels(changed)}
    assert not any(title.startswith(("ITL SLI", "End-to-end SLI")) for title in titles)


def test_an_objective_of_seven_nines_is_described_as_such_not_as_100_percent(example):
    seven_nines = replace(example, slos=(SloConfig("ttft", 0.2, 0.9999999),))
    description = panel_titled(seven_nines, "TTFT SLI: requests within 200 ms")["description"]
    assert "against the objective 99.99999%" in description


def test_burn_rate_panel_divides_by_each_objectives_budget_and_draws_the_page_factor(example):
    panel = panel_titled(example, "SLO burn rate over 1h, per model")
    assert drawn_lines(panel) == {1.0, 14.4}
    assert [expr.endswith("/ (1 - 0.99)") for expr in queries_of(panel)] == [True, True, True]
    four_weeks = replace(example, slo_period_seconds=28 * 86400.0, slos=(SloConfig("ttft", 0.5, 0.999),))
    panel = panel_titled(four_weeks, "SLO burn rate over 1h, per model")
    assert sorted(drawn_lines(panel)) == pytest.approx([1.0, 0.02 * 28 * 24])
    assert queries_of(panel)[0].endswith("/ (1 - 0.999)")


@pytest.mark.parametrize("kv_usage", [0.9, 0.8])
def test_saturation_threshold_is_on_every_kv_usage_panel(example, kv_usage):
    config = replace(example, saturation_kv_usage=kv_usage)
    usage_panels = [
        panel
        for _, panel in all_panels(config)
        if any("plimsoll_kv_cache_usage_ratio" in expr for expr in queries_of(panel))
    ]
    assert len(usage_panels) == 3
    for panel in usage_panels:
        values = {v for values, _ in threshold_steps(panel) for v in values}
        assert values == {saturation_gate_ratio(config), kv_usage}, panel["title"]
        if panel["type"] == "timeseries":
            assert drawn_lines(panel) == {saturation_gate_ratio(config), kv_usage}


def test_time_to_saturation_shows_never_for_inf_and_turns_red_inside_the_alert_horizon(example):
    config = replace(example, lead_time_seconds=600.0)
    eta_panels = [
        panel
        for _, panel in all_panels(config)
        if any("plimsoll_saturation_eta_seconds" in expr for expr in queries_of(panel))
    ]
    assert len(eta_panels) == 3
    for panel in eta_panels:
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["unit"] == "s"
        steps = defaults["thresholds"]["steps"]
        assert [s["color"] for s in steps] == ["red", "orange", "green"]
        # The lead time plus the alert's 5m hold: where "saturation ahead" looks.
        assert [s["value"] for s in steps[1:]] == [900.0, 1800.0]
        (mapping,) = defaults["mappings"]
        assert mapping["type"] == "value"
        assert {key: value["text"] for key, value in mapping["options"].items()} == {
            "+Inf": "never",
            "Infinity": "never",
        }


def test_no_slos_configured_leaves_out_the_slo_panels():
    for _, panel in all_panels(Config()):
        assert "slo" not in " ".join(queries_of(panel)) and "vllm:" not in " ".join(queries_of(panel))


def test_panels_sit_on_the_grid_without_overlapping(example):
    for path, dashboard in built(example).items():
        cells: dict[tuple[int, int], str] = {}
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)) and None not in ids, path
        for panel in dashboard["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, f"{path}: {panel['title']}"
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, f"{path}: {panel['title']!r} overlaps {cells[(x, y)]!r}"
                    cells[(x, y)] = panel["title"]


def test_output_is_deterministic(example):
    first = dashboards.artifacts(example)
    second = dashboards.artifacts(load_config(EXAMPLE))
    assert first == second
    for item in first:
        assert item.text.endswith("}\n")
        assert json.loads(item.text)["version"] == 0 and json.loads(item.text)["id"] is None


def test_committed_dashboards_match_the_example_config(example):
    for item in dashboards.artifacts(example):
        committed = ROOT / item.path
        assert committed.exists(), f"{item.path} is not committed"
        assert committed.read_text() == item.text, (
            f"{item.path} is stale: regenerate with plimsoll generate --config deploy/plimsoll.example.yaml --out ."
        )


# One value, read by the alert and by the dashboard line that mirrors it: each knob of `alerting:` set to a value
# found nowhere else, then found in both outputs.


def with_alerting(config: Config, **knobs: Any) -> Config:
    return replace(config, alerting=replace(config.alerting, **knobs))


def alert(config: Config, name: str) -> dict[str, Any]:
    (found,) = [r for g in rules.groups(config) for r in g["rules"] if r.get("alert") == name]
    return found


def test_runbook_url_is_in_every_alert_and_linked_from_every_dashboard(example):
    url = "https://wiki.example.com/ops/plimsoll"
    config = with_alerting(example, runbook_url=url)
    for group in rules.groups(config):
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["annotations"]["runbook_url"] == f"{url}#{rule['alert'].lower()}"
    for path, dashboard in built(config).items():
        assert [link["url"] for link in dashboard["links"] if link["type"] == "link"] == [url], path


def test_a_runbook_url_holding_grafana_variable_syntax_is_linked_as_written_not_expanded(example):
    # Grafana expands $name, ${name} and [[name]] in a link's URL; percent-encoded, the server reads the same page.
    url = "https://wiki.example.com/ops/$node/${job}/[[model]]/a$/b[c"
    config = with_alerting(example, runbook_url=url)
    for path, dashboard in built(config).items():
        (link,) = [link["url"] for link in dashboard["links"] if link["type"] == "link"]
        assert link == "https://wiki.example.com/ops/%24node/%24{job}/%5B[model]]/a$/b[c", path
        assert unquote(link) == url, path
    assert alert(config, "PlimsollExporterAbsent")["annotations"]["runbook_url"] == f"{url}#plimsollexporterabsent"


def test_exporter_job_is_what_the_absent_alert_and_the_daemons_panel_match(example):
    config = with_alerting(example, exporter_job="monitoring/plim-.*")
    assert 'up{job=~"monitoring/plim-.*"} == 1' in alert(config, "PlimsollExporterAbsent")["expr"]
    daemons = panel_titled(config, "Daemons reporting")
    (expr,) = queries_of(daemons)
    assert 'up{job=~"monitoring/plim-.*", instance=~"$node"} == 1' in expr
    # A code span: Grafana renders descriptions as Markdown, where the stars of .* would start italics.
    assert "matching `monitoring/plim-.*`," in daemons["description"]


def test_rule_labels_label_the_prometheus_rule_and_replace_the_default_release(example):
    # No dashboard counterpart: these select the PrometheusRule (and the monitors), they are not a threshold.
    config = with_alerting(example, rule_labels=(("prometheus", "ops"),))
    (resource,) = [a for a in rules.artifacts(config) if a.path == rules.PROMETHEUS_RULE_PATH]
    labels = yaml.safe_load(resource.text)["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/name": "plimsoll",
        "app.kubernetes.io/component": "alerting-rules",
        "prometheus": "ops",
    }
    assert rules.prometheus_rule_labels(config) == {"app.kubernetes.io/name": "plimsoll", "prometheus": "ops"}


def test_fleet_headroom_floor_is_the_alert_and_the_per_model_headroom_lines(example):
    config = with_alerting(example, fleet_headroom_min_requests=17.0)
    assert alert(config, "PlimsollFleetHeadroomLow")["expr"].rstrip().endswith("< 17")
    for title in ("Headroom per model now (requests of p95 size)", "Headroom per model (requests)"):
        assert threshold_steps(panel_titled(config, title))[0][0] == [17.0], title
    assert drawn_lines(panel_titled(config, "Headroom per model (requests)")) == {17.0}


def test_capacity_drift_ratio_is_the_alert_and_the_drift_lines(example):
    config = with_alerting(example, capacity_drift_ratio=0.35)
    expr = alert(config, "PlimsollCapacityModelDrift")["expr"]
    assert "> 0.35" in expr and "< -0.35" in expr
    assert drawn_lines(panel_titled(config, "Capacity model drift per target")) == {-0.35, 0.35}


def test_vram_growth_limit_is_the_alert_and_the_growth_line(example):
    config = with_alerting(example, vram_growth_bytes_per_hour=3 * 1024**3)
    rule = alert(config, "PlimsollVRAMUnexplainedGrowing")
    assert "* 3600 > 3221225472" in rule["expr"] and "3GiB/h" in rule["annotations"]["description"]
    panel = panel_titled(config, "Unexplained VRAM growth per GPU (per hour)")
    assert drawn_lines(panel) == {3 * 1024**3}
    assert queries_of(panel) == ['deriv(plimsoll_vram_unexplained_bytes{instance=~"$node"}[1h]) * 3600']


def test_saturation_gate_is_the_ahead_alert_gate_and_the_orange_kv_usage_line(example):
    config = with_alerting(replace(example, saturation_kv_usage=0.8), saturation_gate_fraction=0.5)
    assert alert(config, "PlimsollKVCacheSaturationAhead")["expr"].startswith(
        "max_over_time(plimsoll_kv_cache_usage_ratio[5m]) > 0.4\n"
    )
    for title in ("KV usage per model (fullest replica)", "KV cache usage vs saturation threshold"):
        assert drawn_lines(panel_titled(config, title)) == {0.4, 0.8}, title


def test_saturation_hold_sets_the_ahead_alert_for_and_horizon_and_the_eta_red_zone(example):
    config = with_alerting(example, saturation_ahead_for_seconds=420.0)  # lead 15m + 7m = 1320 s
    rule = alert(config, "PlimsollKVCacheSaturationAhead")
    assert rule["for"] == "7m" and "plimsoll_saturation_eta_seconds < 1320" in rule["expr"]
    for title in ("Soonest saturation", "Time to saturation per model and target", "Time to saturation"):
        assert threshold_steps(panel_titled(config, title))[0][0] == [1320.0, 2640.0], title


def test_saturation_trend_window_is_the_ahead_alert_fit_and_the_projected_usage(example):
    config = with_alerting(example, saturation_trend_window_seconds=2700.0)
    assert (
        "predict_linear(plimsoll_kv_cache_usage_ratio[45m], 1200)"
        in alert(config, "PlimsollKVCacheSaturationAhead")["expr"]
    )
    projected = [
        e for e in queries_of(panel_titled(config, "KV cache usage vs saturation threshold")) if "predict" in e
    ]
    assert projected == [f"predict_linear(plimsoll_kv_cache_usage_ratio{{{dashboards.ENGINE}}}[45m], 1200)"]


# The "Replicas and cost" row: the replica and cost records, by name, only where the rules write them.

REPLICA_PANELS = ("Replicas needed vs running per model", "Demand against capacity per model (requests)")
SCALE_UP_PANELS = ("Scale-up lag per model (over the time range)", "Scale-up pending per model")
HOURLY_COST_PANEL = "GPU cost per hour per model"
DAILY_COST_PANELS = ("GPU cost per day, replicas running", "GPU cost per day, replicas not needed")


def fleet_titles(config: Config) -> list[str]:
    return [panel["title"] for panel in built(config)["dashboards/plimsoll-fleet.json"]["panels"]]


def test_replicas_and_cost_row_is_there_only_with_autoscaling_or_prices(example):
    assert example.autoscaling is not None and example.gpu_hour_prices
    titles = fleet_titles(example)
    assert titles[titles.index("Replicas and cost") :] == [
        "Replicas and cost",
        *REPLICA_PANELS,
        *SCALE_UP_PANELS,
        HOURLY_COST_PANEL,
        *DAILY_COST_PANELS,
    ]
    assert "Replicas and cost" not in fleet_titles(replace(example, autoscaling=None, gpu_hour_prices=()))
    unpriced = fleet_titles(replace(example, gpu_hour_prices=()))
    assert unpriced[unpriced.index("Replicas and cost") + 1 :] == [*REPLICA_PANELS, *SCALE_UP_PANELS]
    unscaled = fleet_titles(replace(example, autoscaling=None))
    assert unscaled[unscaled.index("Replicas and cost") + 1 :] == [HOURLY_COST_PANEL, DAILY_COST_PANELS[0]]
    unscaled_hourly = queries_of(panel_titled(replace(example, autoscaling=None), HOURLY_COST_PANEL))
    assert unscaled_hourly == [f'{rules.HOURLY_COST_RUNNING_RECORD}{{model=~"$model"}}']


def test_replica_and_cost_panels_read_the_records_the_rules_write(example):
    recorded = recorded_names(example)
    read = {
        name
        for title in (*REPLICA_PANELS, HOURLY_COST_PANEL, *DAILY_COST_PANELS)
        for expr in queries_of(panel_titled(example, title))
        for name in metric_names(expr)
    }
    assert read <= recorded
    assert read == {
        rules.RUNNING_RECORD,
        rules.NEEDED_RECORD,
        DEMAND_RECORD,
        rules.DEMAND_PEAK_RECORD,
        rules.CAPACITY_RECORD,
        rules.HOURLY_COST_RUNNING_RECORD,
        rules.HOURLY_COST_NOT_NEEDED_RECORD,
        rules.DAILY_COST_RUNNING_RECORD,
        rules.DAILY_COST_NOT_NEEDED_RECORD,
    }
    (capacity,) = [e for e in queries_of(panel_titled(example, REPLICA_PANELS[1])) if rules.CAPACITY_RECORD in e]
    # What the replicas running hold: one replica's capacity times how many run.
    assert capacity == (
        f'{rules.CAPACITY_RECORD}{{model=~"$model"}} * on (model) {rules.RUNNING_RECORD}{{model=~"$model"}}'
    )


def test_cost_panels_say_per_hour_and_per_day_in_their_units(example):
    assert panel_titled(example, HOURLY_COST_PANEL)["fieldConfig"]["defaults"]["unit"] == "suffix:/h"
    for title in DAILY_COST_PANELS:
        panel = panel_titled(example, title)
        assert panel["type"] == "stat" and panel["fieldConfig"]["defaults"]["unit"] == "suffix:/day", title
        (expr,) = queries_of(panel)
        assert expr.startswith("sum(model:plimsoll_gpu_daily_cost:"), expr


def test_scale_up_panels_read_the_lag_histogram_over_the_range_and_the_pending_age(example):
    lag, pending = (panel_titled(example, title) for title in SCALE_UP_PANELS)
    buckets = (
        'sum by (le, model) (increase(plimsoll_scale_up_lag_seconds_bucket{instance=~"$node", model=~"$model"}'
        "[$__range]))"
    )
    assert queries_of(lag) == [f"histogram_quantile(0.5, {buckets})", f"histogram_quantile(0.9, {buckets})"]
    assert all(target["instant"] for target in lag["targets"])  # the lags measured in the range, not a window
    assert queries_of(pending) == [
        'max by (model) (plimsoll_scale_up_pending_seconds{instance=~"$node", model=~"$model"})'
    ]
    assert lag["fieldConfig"]["defaults"]["unit"] == pending["fieldConfig"]["defaults"]["unit"] == "s"
    # The start-up each lag is held against, per workload the daemon measures (those with a knee).
    assert "`meta-llama/Llama-3.1-8B-Instruct` 5 min" in lag["description"] and "tiny-llama" not in lag["description"]


def test_no_scale_up_panels_without_a_workload_with_a_knee(example):
    assert example.autoscaling is not None
    unmeasured = replace(
        example,
        autoscaling=replace(
            example.autoscaling,
            workloads=tuple(replace(w, knee_concurrency=None) for w in example.autoscaling.workloads),
        ),
    )
    titles = fleet_titles(unmeasured)
    assert "Replicas and cost" in titles and not set(SCALE_UP_PANELS) & set(titles)


def test_scale_up_lag_quantiles_are_those_of_the_lags_measured_in_the_range(example, prometheus_tools, tmp_path):
    """promtool evaluates the panel's queries over the daemon's histogram after four lags, 20 s, 50 s, 100 s and
    500 s, ten minutes into an hour: the median falls in the (30, 60] bucket, the 90th percentile in (300, 600]."""
    lags = (20, 50, 100, 500)
    series = [
        {
            "series": f'plimsoll_scale_up_lag_seconds_bucket{{instance="fleet", model="m", le="{le}"}}',
            "values": f"0x10 {sum(lag <= bound for lag in lags)}x50",
        }
        for le, bound in [*((f"{b:.1f}", b) for b in LAG_BUCKETS), ("+Inf", math.inf)]
    ]
    median, p90 = (render(e, {"__range": "1h"}) for e in queries_of(panel_titled(example, SCALE_UP_PANELS[0])))
    # Interpolated within the bucket, as histogram_quantile does: rank 2 of 4 ends (30, 60]; rank 3.6 is 60% into
    # (300, 600].
    tests = [
        {"expr": median, "eval_time": "60m", "exp_samples": [{"labels": '{model="m"}', "value": 60}]},
        {"expr": p90, "eval_time": "60m", "exp_samples": [{"labels": '{model="m"}', "value": 480}]},
    ]
    unit = {"rule_files": [], "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}
    promtool_rule_tests(prometheus_tools["promtool"], tmp_path, unit)
