"""The generated Prometheus rules: their structure, their link to the config, and the real tools' verdict.

promtool and amtool come from the `prometheus_tools` fixture (tests/generate/conftest.py), which skips only when
this machine cannot have them.
"""

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from exporter.config import AutoscalingConfig, Config, ScaledWorkload, SloConfig, load_config
from exporter.core.slo import burn_rate_factors
from exporter.core.units import parse_duration
from exporter.generate import rules
from exporter.generate.command import stale
from exporter.scaling import DEMAND_RECORD
from tests.generate.queries import rule_expressions

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "deploy" / "plimsoll.example.yaml"
RULE_FILE = ROOT / "rules" / "plimsoll.rules.yaml"
RULE_TESTS = sorted((ROOT / "rules" / "tests").glob("*.yaml"))
RUNBOOK = ROOT / "rules" / "RUNBOOK.md"
ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
FETCH_SCRIPT = ROOT / "deploy" / "local" / "fetch-prometheus-tools.sh"
CANNOT_FETCH = 3  # the script's exit status when this machine cannot have the tools

ALERTS = {
    "PlimsollKVCacheSaturationAhead",
    "PlimsollKVCacheSaturated",
    "PlimsollPreemptions",
    "PlimsollSLOErrorBudgetBurn",
    "PlimsollFleetHeadroomLow",
    "PlimsollCapacityModelDrift",
    "PlimsollVRAMUnexplainedGrowing",
    "PlimsollTargetDown",
    "PlimsollNVMLDown",
    "PlimsollExporterAbsent",
    "PlimsollOverProvisioned",
}
SLOS = (
    SloConfig("ttft", 0.5, 0.99),
    SloConfig("itl", 0.05, 0.99),
    SloConfig("e2e", 30.0, 0.99),
)


@pytest.fixture(scope="session")
def example_config() -> Config:
    return load_config(EXAMPLE_CONFIG)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, timeout=300)


def _groups(config: Config) -> list[dict]:
    text = next(a.text for a in rules.artifacts(config) if a.path == rules.RULES_PATH)
    return yaml.safe_load(text)["groups"]


def _alerts(config: Config) -> list[dict]:
    return [rule for group in _groups(config) for rule in group["rules"] if "alert" in rule]


def _burn_thresholds(config: Config, slo: str) -> list[tuple[str, str, float, float]]:
    """(long window, short window, factor, objective) read back from each burn alert's expression."""
    found = []
    for rule in _alerts(config):
        if rule["alert"] == "PlimsollSLOErrorBudgetBurn" and rule["labels"]["slo"] == slo:
            factor, objective = re.search(r"> \(([0-9.e+-]+) \* \(1 - ([0-9.]+)\)\)", rule["expr"]).groups()
            found.append(
                (rule["labels"]["long_window"], rule["labels"]["short_window"], float(factor), float(objective))
            )
    return found


def _github_anchors(markdown: str) -> set[str]:
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


# Structure


def test_every_alert_has_severity_hold_summary_description_and_a_runbook_section(example_config):
    anchors = _github_anchors(RUNBOOK.read_text())
    alerts = _alerts(example_config)
    assert {rule["alert"] for rule in alerts} == ALERTS
    for rule in alerts:
        assert rule["labels"]["severity"] in ("page", "ticket", "info"), rule["alert"]
        assert parse_duration(rule["for"]) > 0, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), rule["alert"]
        url = annotations["runbook_url"]
        assert url.startswith(f"{example_config.alerting.runbook_url}#"), url
        assert url.rsplit("#", 1)[1] in anchors, f"{rule['alert']}: no section for {url} in rules/RUNBOOK.md"


def test_the_runbook_has_no_section_for_an_alert_that_does_not_exist():
    sections = re.findall(r"^## (Plimsoll\w+)", RUNBOOK.read_text(), flags=re.MULTILINE)
    assert sorted(sections) == sorted(ALERTS)


def test_descriptions_carry_the_value_and_the_labels_a_person_needs(example_config):
    up_or_down = ("PlimsollTargetDown", "PlimsollNVMLDown", "PlimsollExporterAbsent")  # their value is always 0 or 1
    for rule in _alerts(example_config):
        description = rule["annotations"]["description"]
        assert ("$value" in description) != (rule["alert"] in up_or_down), rule["alert"]
        if rule["alert"] not in (*up_or_down, "PlimsollVRAMUnexplainedGrowing"):  # series without a model label
            assert "$labels.model" in description, rule["alert"]
        if rule["alert"] in ("PlimsollKVCacheSaturationAhead", "PlimsollKVCacheSaturated", "PlimsollTargetDown"):
            assert "$labels.target" in description and "$labels.instance" in description, rule["alert"]
    ratios = [r for r in _alerts(example_config) if r["alert"].startswith(("PlimsollKVCache", "PlimsollSLO"))]
    assert all("humanizePercentage" in r["annotations"]["description"] for r in ratios)


def test_recording_rules_follow_level_metric_operations(example_config):
    for group in _groups(example_config):
        for rule in group["rules"]:
            if "record" in rule:
                # The operations part is left out where there is none (a constant, a clamp of other records).
                level, metric, *operations = rule["record"].split(":")
                assert level and len(operations) <= 1 and all(operations), rule["record"]
                assert metric.startswith("plimsoll_"), rule["record"]


def test_fleet_aggregates_by_model_and_by_node(example_config):
    records = {rule["record"] for group in _groups(example_config) for rule in group["rules"] if "record" in rule}
    for level in ("model", "instance_model"):
        assert {
            f"{level}:plimsoll_kv_cache_capacity_tokens:sum",
            f"{level}:plimsoll_kv_cache_headroom_tokens:sum",
            f"{level}:plimsoll_headroom_requests:sum",
            f"{level}:plimsoll_kv_cache_usage_ratio:max",
            f"{level}:plimsoll_kv_cache_usage_ratio:avg",
        } <= records


def test_the_example_config_gives_the_workbook_burn_rates(example_config):
    # 99% over 30 days: page at 14.4x over 1h/5m and 6x over 6h/30m, ticket at 3x over 1d/2h and 1x over 3d/6h.
    for slo in ("ttft", "itl", "e2e"):
        assert _burn_thresholds(example_config, slo) == [
            ("1h", "5m", 14.4, 0.99),
            ("6h", "30m", 6.0, 0.99),
            ("1d", "2h", 3.0, 0.99),
            ("3d", "6h", 1.0, 0.99),
        ]
    severities = [(r["labels"]["severity"], r["for"]) for r in _alerts(example_config) if r["labels"].get("slo")]
    assert severities[:4] == [("page", "2m30s"), ("page", "15m"), ("ticket", "1h"), ("ticket", "3h")]


def test_a_stricter_objective_lowers_the_error_ratio_that_fires():
    config = Config(slos=(SloConfig("ttft", 0.5, 0.999),))
    thresholds = _burn_thresholds(config, "ttft")
    expected = burn_rate_factors(0.999, 30)
    assert [(f, o) for _, _, f, o in thresholds] == [(pytest.approx(w.factor), 0.999) for w in expected]
    error_ratios = [f * (1 - o) for _, _, f, o in thresholds]
    assert error_ratios == pytest.approx([w.error_ratio for w in expected])
    assert error_ratios[0] == pytest.approx(0.0144)


def test_an_objective_of_many_nines_keeps_its_error_budget_and_is_not_called_100_percent():
    thresholds = _burn_thresholds(Config(slos=(SloConfig("ttft", 0.5, 0.9999999999999),)), "ttft")
    assert [objective for _, _, _, objective in thresholds] == [0.9999999999999] * 4
    seven_nines = Config(slos=(SloConfig("ttft", 0.5, 0.9999999),))
    descriptions = [r["annotations"]["description"] for r in _alerts(seven_nines) if r["labels"].get("slo")]
    assert len(descriptions) == 4 and all("objective of 99.99999% within it" in d for d in descriptions)


def test_a_shorter_period_lowers_the_burn_factors():
    config = Config(slos=(SloConfig("itl", 0.05, 0.99),), slo_period_seconds=7 * 86400.0)
    factors = [f for _, _, f, _ in _burn_thresholds(config, "itl")]
    assert factors == pytest.approx([w.factor for w in burn_rate_factors(0.99, 7)])
    assert factors == pytest.approx([3.36, 1.4, 0.7, 0.7 / 3])
    descriptions = [r["annotations"]["description"] for r in _alerts(config) if r["labels"].get("slo")]
    assert all("a 7d period" in d for d in descriptions)


def test_a_burn_rate_beyond_every_request_failing_fires_when_all_fail():
    # 90% objective: 14.4x the 10% budget is 144% of requests, which cannot happen; that window fires at 100%.
    config = Config(slos=(SloConfig("e2e", 30.0, 0.9),))
    exprs = [r["expr"] for r in _alerts(config) if r["labels"].get("long_window") == "1h"]
    assert len(exprs) == 1 and exprs[0].count(">= 1\n") == 2


def test_burn_alerts_exist_only_for_the_configured_slos():
    only_ttft = Config(slos=(SloConfig("ttft", 0.3, 0.995),))
    burn = [r for r in _alerts(only_ttft) if r["alert"] == "PlimsollSLOErrorBudgetBurn"]
    assert len(burn) == 4 and {r["labels"]["slo"] for r in burn} == {"ttft"}
    assert "took over 300ms" in burn[0]["annotations"]["description"]
    assert "objective of 99.5%" in burn[0]["annotations"]["description"]
    no_slos = Config()
    names = [group["name"] for group in _groups(no_slos)]
    assert rules.GROUP_SLI not in names and rules.GROUP_SLO not in names
    assert "PlimsollSLOErrorBudgetBurn" not in {r["alert"] for r in _alerts(no_slos)}


def test_sli_recording_rules_cover_every_window_the_burn_alerts_read(example_config):
    groups = {group["name"]: group["rules"] for group in _groups(example_config)}
    recorded = {rule["record"] for rule in groups[rules.GROUP_SLI]}
    read = {
        name for rule in groups[rules.GROUP_SLO] for name in re.findall(r"target_model_slo:\S+?(?=\{)", rule["expr"])
    }
    assert read == recorded
    assert [rules.duration(w) for w in rules.sli_windows(example_config)] == ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]


def test_saturation_alerts_follow_the_configured_threshold_and_lead_time():
    config = Config(saturation_kv_usage=0.8, lead_time_seconds=600.0)
    alerts = {r["alert"]: r for r in _alerts(config)}
    ahead = alerts["PlimsollKVCacheSaturationAhead"]["expr"]
    # Gate at 0.6 x 80% on the highest usage over the 5m hold; horizon = lead time + the hold.
    assert "max_over_time(plimsoll_kv_cache_usage_ratio[5m]) > 0.48" in ahead
    assert "plimsoll_saturation_eta_seconds < 900" in ahead
    assert "predict_linear(plimsoll_kv_cache_usage_ratio[30m], 900) > 0.8" in ahead
    assert "plimsoll_kv_cache_usage_ratio >= 0.8" in alerts["PlimsollKVCacheSaturated"]["expr"]
    assert "within about 10m" in alerts["PlimsollKVCacheSaturationAhead"]["annotations"]["summary"]


def test_prometheus_rule_holds_the_same_groups_as_the_rule_file(example_config):
    texts = {a.path: a.text for a in rules.artifacts(example_config)}
    assert set(texts) == {rules.RULES_PATH, rules.PROMETHEUS_RULE_PATH}
    resource = yaml.safe_load(texts[rules.PROMETHEUS_RULE_PATH])
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["kind"] == "PrometheusRule"
    assert resource["metadata"]["name"] == "plimsoll"
    assert "release" in resource["metadata"]["labels"]
    assert "release" in texts[rules.PROMETHEUS_RULE_PATH].split("apiVersion")[0]  # the comment that explains it
    assert resource["spec"]["groups"] == yaml.safe_load(texts[rules.RULES_PATH])["groups"]


def test_generation_is_deterministic(example_config):
    assert rules.artifacts(example_config) == rules.artifacts(load_config(EXAMPLE_CONFIG))
    assert rules.artifacts(example_config) == rules.artifacts(replace(example_config, source="elsewhere.yaml"))


def test_expressions_list_every_rule_with_its_group(example_config):
    listed = rule_expressions(example_config)
    groups = _groups(example_config)
    assert len(listed) == sum(len(group["rules"]) for group in groups)
    assert {group for group, _, _ in listed} == {group["name"] for group in groups}
    assert {name for _, name, _ in listed} >= ALERTS
    assert all(expr.strip() for _, _, expr in listed)


def test_committed_rule_files_are_what_the_example_config_generates(example_config):
    assert stale(rules.artifacts(example_config), ROOT) == [], (
        "regenerate: plimsoll generate --config deploy/plimsoll.example.yaml --out ."
    )


LLAMA = ScaledWorkload("meta-llama/Llama-3.1-8B-Instruct", "Deployment", "vllm-llama", "inference", 2, 6, 300.0, 30)
TINY = ScaledWorkload("tiny-llama", "StatefulSet", "vllm-tiny", "inference", 1, 3, 120.0, None)
SCALED = Config(autoscaling=AutoscalingConfig(None, 0.5, 1800.0, 7200.0, (LLAMA, TINY)))


def _rules_named(config: Config, name: str) -> list[dict]:
    return [
        rule for group in _groups(config) for rule in group["rules"] if name in (rule.get("record"), rule.get("alert"))
    ]


def test_replica_rules_and_the_over_provisioning_ticket_exist_only_with_an_autoscaling_section():
    names = {group["name"] for group in _groups(Config())}
    assert rules.GROUP_AUTOSCALING not in names and rules.GROUP_AUTOSCALING_ALERTS not in names
    assert not _rules_named(Config(), "PlimsollOverProvisioned")
    scaled = [group["name"] for group in _groups(SCALED)]
    assert scaled[-2:] == [rules.GROUP_AUTOSCALING, rules.GROUP_AUTOSCALING_ALERTS]


def test_demand_is_running_plus_waiting_and_its_peak_spans_the_demand_window():
    (demand,) = _rules_named(SCALED, DEMAND_RECORD)
    assert re.sub(r"\s+", " ", demand["expr"]).strip() == (
        "sum by (model) ( plimsoll_requests_running + (plimsoll_requests_waiting or plimsoll_requests_running * 0) )"
    )
    (peak,) = _rules_named(SCALED, rules.DEMAND_PEAK_RECORD)
    assert peak["expr"] == f"max_over_time({DEMAND_RECORD}[30m])"


def test_a_knee_gives_a_constant_capacity_of_knee_times_margin_and_no_knee_the_capacity_model():
    knee, model = _rules_named(SCALED, rules.CAPACITY_RECORD)
    assert knee["expr"].strip() == "vector(15)"  # 30 requests x margin 0.5
    assert knee["labels"] == {"model": "meta-llama/Llama-3.1-8B-Instruct", "source": "knee"}
    assert model["labels"] == {"model": "tiny-llama", "source": "model"}
    assert 'plimsoll_kv_cache_capacity_tokens{source="engine", model="tiny-llama"}' in model["expr"]
    assert 'plimsoll_request_footprint_tokens{footprint="p95", model="tiny-llama"}' in model["expr"]
    assert model["expr"].rstrip().endswith(") * 0.5")


def test_replicas_needed_are_clamped_to_each_workload_s_min_and_max_and_say_their_source():
    llama, tiny = _rules_named(SCALED, rules.NEEDED_RECORD)
    assert re.sub(r"\s+", "", llama["expr"]) == (
        'clamp_max(clamp_min(ceil(model:plimsoll_demand_requests:peak{model="meta-llama/Llama-3.1-8B-Instruct"}/on'
        '(model)model:plimsoll_replica_capacity_requests{model="meta-llama/Llama-3.1-8B-Instruct"}),2),6)'
    )
    assert llama["labels"] == {"source": "knee"} and tiny["labels"] == {"source": "model"}
    assert re.search(r",\s*1\s*\),\s*3\s*\)", tiny["expr"]), tiny["expr"]


def test_the_over_provisioning_ticket_holds_for_the_configured_window_and_says_how_many_could_go():
    (alert,) = _rules_named(SCALED, "PlimsollOverProvisioned")
    assert alert["for"] == "2h" and alert["labels"]["severity"] == "ticket"
    assert alert["expr"] == f"{rules.RUNNING_RECORD} - on (model) {rules.NEEDED_RECORD} > 0\n"
    assert "{{ $value }} replicas could go" in alert["annotations"]["description"]
    assert "over 30m" in alert["annotations"]["description"]


def test_a_replica_is_an_instance_and_target_pair_whatever_its_data_parallel_ranks():
    (running,) = _rules_named(SCALED, rules.RUNNING_RECORD)
    assert running["expr"] == "count by (model) (count by (model, instance, target) (plimsoll_requests_running))"
    _, model = _rules_named(SCALED, rules.CAPACITY_RECORD)
    # The ranks' capacities are added up per replica before the model's replicas are averaged.
    assert re.sub(r"\s+", " ", model["expr"]).startswith("avg by (model) ( sum by (model, instance, target) ( ")


PRICES = (("H100-80GB", 2.49), ("L40S", 0.99))


def test_cost_rules_exist_only_with_prices_and_the_not_needed_cost_only_with_autoscaling_too():
    assert rules.GROUP_COST not in {group["name"] for group in _groups(SCALED)}
    priced = replace(Config(), gpu_hour_prices=PRICES)
    (group,) = [group for group in _groups(priced) if group["name"] == rules.GROUP_COST]
    assert [rule["record"] for rule in group["rules"]] == [
        rules.HOURLY_COST_RUNNING_RECORD,
        rules.DAILY_COST_RUNNING_RECORD,
    ]
    scaled_and_priced = replace(SCALED, gpu_hour_prices=PRICES)
    (group,) = [group for group in _groups(scaled_and_priced) if group["name"] == rules.GROUP_COST]
    exprs = {rule["record"]: rule["expr"].strip() for rule in group["rules"]}
    assert exprs == {
        rules.HOURLY_COST_RUNNING_RECORD: "sum by (model) (plimsoll_target_gpu_hourly_cost)",
        rules.HOURLY_COST_NOT_NEEDED_RECORD: (
            f"clamp_min({rules.RUNNING_RECORD} - on (model) {rules.NEEDED_RECORD}, 0)\n"
            "* on (model)\n"
            "avg by (model) (plimsoll_target_gpu_hourly_cost)"
        ),
        rules.DAILY_COST_RUNNING_RECORD: f"24 * {rules.HOURLY_COST_RUNNING_RECORD}",
        rules.DAILY_COST_NOT_NEEDED_RECORD: f"24 * {rules.HOURLY_COST_NOT_NEEDED_RECORD}",
    }


def test_the_over_provisioning_ticket_reads_the_cost_of_the_replicas_not_needed_only_with_prices():
    (unpriced,) = _rules_named(SCALED, "PlimsollOverProvisioned")
    (priced,) = _rules_named(replace(SCALED, gpu_hour_prices=PRICES), "PlimsollOverProvisioned")
    assert unpriced["expr"] == priced["expr"]
    assert rules.DAILY_COST_NOT_NEEDED_RECORD not in unpriced["annotations"]["description"]
    assert (
        f'printf "{rules.DAILY_COST_NOT_NEEDED_RECORD}{{model=%q}}" $labels.model | query'
        in (priced["annotations"]["description"])
    )


def test_every_alert_has_promtool_tests_that_fire_and_that_stay_quiet():
    fired, quiet = set(), set()
    for path in RULE_TESTS:
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == ["../plimsoll.rules.yaml"], path.name
        for test in document["tests"]:
            for check in test.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert fired == ALERTS
    assert quiet == ALERTS


# The real tools


def test_the_fetched_tools_are_recent_enough(prometheus_tools):
    versions = dict(re.findall(r"^(\w+), version (\d+\.\d+)", prometheus_tools["versions"], flags=re.MULTILINE))
    minimum = {"promtool": (2, 42), "prometheus": (2, 42), "amtool": (0, 25), "alertmanager": (0, 25)}
    for tool, at_least in minimum.items():
        assert tuple(int(p) for p in versions[tool].split(".")) >= at_least, prometheus_tools["versions"]


def test_promtool_accepts_the_rules_with_every_lint_fatal(prometheus_tools, example_config, tmp_path):
    odd = Config(slos=(SloConfig("ttft", 0.25, 0.999), SloConfig("e2e", 10.0, 0.9)), slo_period_seconds=7 * 86400.0)
    paths = [RULE_FILE]
    priced = replace(Config(), gpu_hour_prices=PRICES)
    for name, config in (
        ("example", example_config),
        ("odd", odd),
        ("defaults", Config()),
        ("scaled", SCALED),
        ("priced", priced),
    ):
        path = tmp_path / f"{name}.rules.yaml"
        path.write_text(next(a.text for a in rules.artifacts(config) if a.path == rules.RULES_PATH))
        paths.append(path)
    result = _run(prometheus_tools["promtool"], "check", "rules", "--lint=all", "--lint-fatal", *map(str, paths))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(paths), result.stdout


def test_promtool_rule_unit_tests_pass(prometheus_tools):
    result = _run(prometheus_tools["promtool"], "test", "rules", *(str(p.relative_to(ROOT)) for p in RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS), result.stdout


def test_amtool_accepts_the_alertmanager_config(prometheus_tools):
    result = _run(prometheus_tools["amtool"], "check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=page", "alertname=PlimsollKVCacheSaturationAhead"], "pager"),
        (["severity=ticket", "alertname=PlimsollPreemptions"], "ticket"),
        (["severity=info", "alertname=PlimsollCapacityModelDrift"], "info"),
        (["alertname=SomethingElse"], "ticket"),
    ],
)
def test_alertmanager_routes_by_severity(prometheus_tools, labels, receiver):
    result = _run(
        prometheus_tools["amtool"],
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER_CONFIG}",
        f"--verify.receivers={receiver}",
        *labels,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_saturated_inhibits_saturation_ahead_for_the_same_engine():
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    inhibitions = [
        rule
        for rule in config["inhibit_rules"]
        if rule["source_matchers"] == ['alertname="PlimsollKVCacheSaturated"']
        and rule["target_matchers"] == ['alertname="PlimsollKVCacheSaturationAhead"']
    ]
    assert len(inhibitions) == 1
    assert {"target", "model"} <= set(inhibitions[0]["equal"])


def test_the_fetch_script_says_what_to_do_without_apt(tmp_path):
    # A PATH with the shell and coreutils the script needs, and neither apt-get nor dpkg.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mkdir", "mktemp", "rm", "cat", "id"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(found)
    result = subprocess.run(
        [str(bin_dir / "bash"), str(FETCH_SCRIPT), str(tmp_path / "tools")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == CANNOT_FETCH, result.stderr
    assert "promtool/prometheus 2.42+ and amtool/alertmanager 0.25+" in result.stderr
    assert f"{tmp_path / 'tools'}/usr/bin" in result.stderr
    assert not (tmp_path / "tools").exists()
