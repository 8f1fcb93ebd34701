"""`plimsoll generate` as users and `make lint` call it."""

import stat

from exporter.cli import main
from tests.conftest import TESTS

EXAMPLE = TESTS.parent / "deploy" / "plimsoll.example.yaml"


def test_generate_writes_rules_prometheusrule_and_dashboards_readable_by_others(tmp_path, capsys):
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)]) == 0
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {"rules/plimsoll.rules.yaml", "deploy/kubernetes/prometheusrule.yaml"} <= written
    assert any(p.startswith("dashboards/") and p.endswith(".json") for p in written)
    assert not [p for p in written if p.split("/")[-1].startswith(".")]  # no temporary file left behind
    mode = (tmp_path / "rules" / "plimsoll.rules.yaml").stat().st_mode
    assert mode & stat.S_IROTH  # Prometheus and Grafana run as other users


def test_check_passes_on_fresh_output_and_names_a_stale_file(tmp_path, capsys):
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path), "--check"]) == 0
    rules = tmp_path / "rules" / "plimsoll.rules.yaml"
    rules.write_text(rules.read_text().replace("0.9", "0.8", 1))
    capsys.readouterr()
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path), "--check"]) == 1
    out = capsys.readouterr().out
    assert f"stale: {rules}" in out
    assert out.count("stale: ") == 1


def test_committed_artifacts_are_current():
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(TESTS.parent), "--check"]) == 0


def test_a_different_objective_changes_the_rules(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("slos: {ttft: {threshold: 250ms, objective: 0.999}}\n")
    main(["generate", "--config", str(config), "--out", str(tmp_path)])
    text = (tmp_path / "rules" / "plimsoll.rules.yaml").read_text()
    assert "0.999" in text or "0.001" in text
    assert "0.25" in (tmp_path / "dashboards" / "plimsoll-instance.json").read_text()


def test_an_alerting_section_points_the_rules_and_dashboards_at_the_same_runbook_and_drift_ratio(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("alerting: {runbook_url: 'https://wiki.example.com/fork/RUNBOOK', capacity_drift_ratio: 0.33}\n")
    assert main(["generate", "--config", str(config), "--out", str(tmp_path)]) == 0
    rules = (tmp_path / "rules" / "plimsoll.rules.yaml").read_text()
    fleet = (tmp_path / "dashboards" / "plimsoll-fleet.json").read_text()
    assert "runbook_url: https://wiki.example.com/fork/RUNBOOK#plimsolltargetdown" in rules
    assert '"url": "https://wiki.example.com/fork/RUNBOOK"' in fleet
    assert "plimsoll_model_capacity_error_ratio > 0.33" in rules
    assert '"value": 0.33' in fleet and '"value": -0.33' in fleet


def test_a_bad_alerting_value_is_named_and_nothing_is_written(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("alerting: {capacity_drift_ratio: 2}\n")
    assert main(["generate", "--config", str(config), "--out", str(tmp_path / "out")]) != 0
    assert "alerting.capacity_drift_ratio: 2 is not a ratio between 0 and 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
