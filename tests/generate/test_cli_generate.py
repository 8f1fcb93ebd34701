"""`plimsoll generate` as users and `make lint` call it."""

import os
import stat
import subprocess
import sys

import pytest
import yaml

from exporter.cli import main
from exporter.generate import command as generate
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


def test_check_says_stale_of_a_fifo_or_bytes_that_are_not_utf8_without_hanging_or_a_traceback(tmp_path, capsys):
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    rules = tmp_path / "rules" / "plimsoll.rules.yaml"
    rules.unlink()
    os.mkfifo(rules)  # read whole, it would wait for a writer forever
    binary = tmp_path / "deploy" / "kubernetes" / "prometheusrule.yaml"
    binary.write_bytes(b"\xff\xfe" + binary.read_bytes())
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    assert [line.split(" (regenerate")[0] for line in lines] == [f"stale: {rules}", f"stale: {binary}"]


def test_an_out_that_cannot_be_written_under_is_named_without_a_traceback(tmp_path, capsys):
    not_a_folder = tmp_path / "out"
    not_a_folder.write_text("a file\n")
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(not_a_folder)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        f"plimsoll generate: --out {not_a_folder}: cannot write {not_a_folder / 'rules'} (Not a directory)\n"
    )
    assert captured.out == ""


def test_a_folder_where_a_file_goes_is_named_and_no_file_is_written(tmp_path, capsys):
    in_the_way = tmp_path / "dashboards" / "plimsoll-capacity-plan.json"  # the last file generate writes
    in_the_way.mkdir(parents=True)
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        f"plimsoll generate: --out {tmp_path}: cannot write {in_the_way} (a folder is in the way of the file)\n"
    )
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_run_that_cannot_write_removes_the_folders_it_made_and_only_those(tmp_path, capsys):
    out = tmp_path / "out"
    in_the_way = out / "dashboards" / "plimsoll-capacity-plan.json"  # the last file generate writes
    in_the_way.mkdir(parents=True)
    (out / "rules").mkdir()  # the user's, empty: not generate's to remove
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(out)]) == 1
    assert "a folder is in the way of the file" in capsys.readouterr().err
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "dashboards",
        "dashboards/plimsoll-capacity-plan.json",
        "rules",
    ]
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path / "new" / "out")]) == 0  # made whole


def test_two_runs_under_different_hash_seeds_write_identical_bytes(tmp_path):
    """String hashing, and so the order of any set or dict built from one, changes from process to process."""
    for seed in ("1", "2"):
        subprocess.run(
            [sys.executable, "-m", "exporter", "generate", "--config", str(EXAMPLE), "--out", str(tmp_path / seed)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            capture_output=True,
            timeout=120,
        )
    first = {p.relative_to(tmp_path / "1"): p.read_bytes() for p in (tmp_path / "1").rglob("*") if p.is_file()}
    second = {p.relative_to(tmp_path / "2"): p.read_bytes() for p in (tmp_path / "2").rglob("*") if p.is_file()}
    assert first and first == second


def test_committed_artifacts_are_current():
    assert main(["generate", "--config", str(EXAMPLE), "--out", str(TESTS.parent), "--check"]) == 0


def test_a_different_objective_changes_the_rules(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("slos: {ttft: {threshold: 250ms, objective: 0.999}}\n")
    main(["generate", "--config", str(config), "--out", str(tmp_path)])
    text = (tmp_path / "rules" / "plimsoll.rules.yaml").read_text()
    assert "* (1 - 0.999))" in text  # each burn alert's error ratio: its factor times the budget
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


def test_workloads_whose_scalers_would_collide_are_named_with_the_config_file_and_nothing_is_written(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    workloads = [
        {"model": model, "name": name, "namespace": "b", "max_replicas": 2}
        for model, name in [("m", "a.b"), ("n", "a-b")]
    ]
    config.write_text(yaml.safe_dump({"autoscaling": {"workloads": workloads}}))
    assert main(["generate", "--config", str(config), "--out", str(tmp_path / "out")]) != 0
    assert f"plimsoll generate: {config}: autoscaling.workloads[1].name: 'a-b' in namespace b gives" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "out").exists()


def test_a_bad_alerting_value_is_named_and_nothing_is_written(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("alerting: {capacity_drift_ratio: 2}\n")
    assert main(["generate", "--config", str(config), "--out", str(tmp_path / "out")]) != 0
    assert "alerting.capacity_drift_ratio: 2 is not a ratio between 0 and 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _promtool_takes_job_regex(promtool: str, workdir, job: str) -> bool:
    rule_file = workdir / "job.rules.yaml"
    rule_file.write_text(
        yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "r", "expr": f'up{{job=~"{job}"}}'}]}]})
    )
    return subprocess.run([promtool, "check", "rules", str(rule_file)], capture_output=True, timeout=60).returncode == 0


# Each compiles in Python and makes Prometheus refuse the whole rule file (promtool: "invalid or unsupported Perl
# syntax", "invalid nested repetition operator", "invalid repeat count", "invalid character class range", "missing
# closing ]"); a backreference needs a backslash, refused with the quotes.
@pytest.mark.parametrize(
    ("job", "reason"),
    [
        ("(?!test).*plimsoll", "uses regex syntax Prometheus lacks"),
        ("plim(?=soll)", "uses regex syntax Prometheus lacks"),
        ("(?x)plimsoll", "uses regex syntax Prometheus lacks"),
        ("(?P<modèle>plimsoll)", "uses regex syntax Prometheus lacks"),
        (".*plimsoll.*+", "uses regex syntax Prometheus lacks"),
        ("[?+]*+plimsoll", "uses regex syntax Prometheus lacks"),
        ("[*]{2}+plimsoll", "uses regex syntax Prometheus lacks"),
        ("(plim)soll-\\1", "must be a non-empty regex without quotes or backslashes"),
        ("plim{1001}soll", "repeats more than 1000 times"),
        ("[[:letter:]]+plimsoll", "is not a regex Prometheus takes ([:letter:] is not a POSIX class"),
        ("plimsoll-[[:alpha:]z-a]", "is not a regex Prometheus takes (z-a is a range running backwards)"),
        ("plimsoll-[[:digit:]", "is not a regex Prometheus takes (the [ at position 9 is never closed)"),
    ],
)
def test_an_exporter_job_prometheus_would_refuse_is_named_and_nothing_is_written(
    tmp_path, capsys, prometheus_tools, job, reason
):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"alerting": {"exporter_job": job}}))
    assert main(["generate", "--config", str(config), "--out", str(tmp_path / "out")]) != 0
    assert f"alerting.exporter_job: {job!r} {reason}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert not _promtool_takes_job_regex(prometheus_tools["promtool"], tmp_path, job)


def test_an_exporter_job_holding_a_go_template_is_refused_before_prometheus_expands_it(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("alerting: {exporter_job: 'plim{{soll}}'}\n")
    assert main(["generate", "--config", str(config), "--out", str(tmp_path / "out")]) != 0
    assert "alerting.exporter_job: 'plim{{soll}}' holds {{: Prometheus would read it as a template" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "job", ["plimsoll$node", "plimsoll${__user.login}", "[[model]]plimsoll", "plimsoll$|x$__range"]
)
def test_an_exporter_job_grafana_would_rewrite_as_a_dashboard_variable_is_refused(tmp_path, capsys, job):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"alerting": {"exporter_job": job}}))
    assert main(["generate", "--config", str(config), "--out", str(tmp_path / "out")]) != 0
    assert f"alerting.exporter_job: {job!r} holds $name, ${{...}} or [[name]], which Grafana would replace" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "out").exists()


# Inside a character class, ?, +, *, ( and { are literals, and [:alpha:] is RE2's POSIX class (a "nested set" that
# Python warns about: the warning must not reach the user's terminal).
@pytest.mark.filterwarnings("error::FutureWarning")
@pytest.mark.parametrize(
    "job",
    [
        "plim[?+]soll",
        "[*]plimsoll",
        "plimsoll[(?=]x",
        "[]a-]plimsoll",
        "[[:alpha:]]+-plimsoll",
        "[^]{]{2}x",
        "^plimsoll$",
    ],
)
def test_an_exporter_job_prometheus_takes_reaches_the_absent_alert_as_written(tmp_path, prometheus_tools, job):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"alerting": {"exporter_job": job}}))
    assert main(["generate", "--config", str(config), "--out", str(tmp_path)]) == 0
    alerts = yaml.safe_load((tmp_path / "rules" / "plimsoll.rules.yaml").read_text())
    exprs = [rule["expr"] for group in alerts["groups"] for rule in group["rules"] if "alert" in rule]
    assert any(f'up{{job=~"{job}"}}' in expr for expr in exprs)
    assert _promtool_takes_job_regex(prometheus_tools["promtool"], tmp_path, job)


SCALERS = "deploy/kubernetes/autoscaling"
LLAMA_SCALED_OBJECT = f"{SCALERS}/vllm-llama-8b-scaledobject.yaml"


def _check(out, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    status = main(["generate", "--config", str(EXAMPLE), "--out", str(out), "--check"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out.splitlines()


def test_check_lints_a_hand_edited_scaler_naming_file_object_and_field(tmp_path, capsys):
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    path = tmp_path / LLAMA_SCALED_OBJECT
    edited = path.read_text().replace("stabilizationWindowSeconds: 600", "stabilizationWindowSeconds: 7200")
    path.write_text(edited.replace("      threshold: '19.2'", "      threshold: '19.2'\n      metricName: demand"))
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    where = f"lint: {path}: ScaledObject inference/vllm-llama-8b"
    assert lines == [
        f"stale: {path} (regenerate: plimsoll generate --config {EXAMPLE} --out {tmp_path})",
        f"{where}: spec.triggers[0].metadata.metricName: deprecated (KEDA 2.10) and removed (2.12): delete it",
        f"{where}: spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSeconds: 7200 "
        "above 3600: Kubernetes refuses it and KEDA's ScaledObject with it",
    ]


def test_check_lints_a_scaler_the_config_does_not_generate(tmp_path, capsys):
    # Generated files are all current; the extra HPA, written by hand, averages a latency over replicas.
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    extra = tmp_path / SCALERS / "by-hand-hpa.yml"
    extra.write_text(
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: by-hand, namespace: ml}\n"
        "spec:\n  minReplicas: 1\n  maxReplicas: 3\n  metrics:\n  - type: Pods\n    pods:\n"
        "      metric: {name: vllm_ttft_seconds_p95}\n      target: {type: AverageValue, averageValue: 500m}\n"
    )
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    (line,) = lines
    assert line.startswith(
        f"lint: {extra}: HorizontalPodAutoscaler ml/by-hand: spec.metrics[0].pods.target.type: AverageValue on a "
        "latency (vllm_ttft_seconds_p95)"
    )


def test_check_says_in_one_line_a_file_is_not_yaml_and_skips_yaml_that_holds_no_scaler(tmp_path, capsys):
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    broken = tmp_path / SCALERS / "broken.yaml"
    broken.write_text("kind: ScaledObject\nspec: {triggers: [\n")
    kustomization = tmp_path / SCALERS / "kustomization.yaml"
    kustomization.write_text("resources: [vllm-llama-8b-scaledobject.yaml]\n")
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    assert lines[0] == (
        f"skipped: {kustomization}: holds no ScaledObject, HorizontalPodAutoscaler or prometheus-adapter "
        "externalRules, so it was not linted"
    )
    assert lines[1].startswith(f"lint: {broken}: not YAML (") and lines[1].endswith("; fix it or regenerate it")
    assert len(lines) == 2
    broken.unlink()
    assert _check(tmp_path, capsys)[0] == 0  # a file without a scaler is said, not failed


def test_check_refuses_an_alias_bomb_or_runaway_nesting_in_a_scaler_file_without_expanding_it(tmp_path, capsys):
    # A billion laughs behind a scaler's kind: the lint quotes the query, which would expand it in memory.
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    anchors = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    anchors += [f"a{n}: &a{n} [{','.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 9)]
    bomb = tmp_path / SCALERS / "bomb-scaledobject.yaml"
    trigger = "spec: {triggers: [{type: prometheus, metadata: {query: *a8}}]}"
    bomb.write_text("kind: ScaledObject\n" + "\n".join(anchors) + "\n" + trigger + "\n")
    deep = tmp_path / SCALERS / "deep.yaml"
    deep.write_text("kind: ScaledObject\n---\n" + "[" * 50_000)
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    assert lines == [
        f"lint: {bomb}: not YAML (not usable YAML: aliases expand this document to 2,345,679,032 values from 41 "
        "written (at most 100,000 more are allowed)); fix it or regenerate it",
        f"lint: {deep}: not YAML (not usable YAML: nested too deeply); fix it or regenerate it",
    ]


def test_check_stops_linting_a_scaler_folder_past_its_size_budget_and_fails(tmp_path, capsys, monkeypatch):
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    folder = tmp_path / SCALERS
    for index in range(50):
        (folder / f"zz-{index:02}.yaml").write_text("kind: ConfigMap\n" + "# padding\n" * 3000)
    monkeypatch.setattr(generate, "MAX_SCALER_FOLDER_CHARS", 1 << 20)
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    assert lines[-1].startswith(f"lint: {folder}: over 1 MiB of YAML in all, so the lint stopped at zz-")
    assert len([line for line in lines if line.startswith("skipped: ")]) < 50


def test_check_names_fields_a_hand_edit_made_the_wrong_type_without_a_traceback(tmp_path, capsys):
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    odd = tmp_path / SCALERS / "odd-scaledobject.yaml"
    odd.write_text(
        "kind: ScaledObject\nmetadata: {name: odd}\nspec:\n  minReplicaCount: two\n  triggers: {type: prometheus}\n"
        "  advanced: {horizontalPodAutoscalerConfig: {behavior: {scaleDown: {policies: [{periodSeconds: 1m}]},"
        " scaleUp: [oops]}}}\n---\nkind: ScaledObject\nspec: 7\n"
    )
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    assert lines == [
        f"lint: {odd}: ScaledObject odd: spec.minReplicaCount: 'two' is not a number of replicas",
        f"lint: {odd}: ScaledObject odd: spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.policies[0]"
        ".periodSeconds: '1m' is not a number of seconds",
    ]


def test_check_reads_a_null_behavior_field_as_unset_as_kubernetes_does(tmp_path, capsys):
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    nulls = tmp_path / SCALERS / "nulls-hpa.yaml"
    nulls.write_text(
        "kind: HorizontalPodAutoscaler\nmetadata: {name: nulls}\nspec:\n  maxReplicas: 4\n  behavior:\n"
        "    scaleUp: {stabilizationWindowSeconds: null, policies: [{periodSeconds: ~}]}\n"
        "    scaleDown: {stabilizationWindowSeconds: 60, policies: [{periodSeconds: 10}]}\n"
    )
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    # Unset, scale-up's policy period is the HPA's 15 s: scale-down's 10 s reacts sooner.
    assert lines == [
        f"lint: {nulls}: HorizontalPodAutoscaler nulls: spec.behavior.scaleDown: reacts faster than scaleUp (shorter "
        "stabilization or policy period): the fleet shrinks before it can grow back, and a start-up later the SLO burns"
    ]


def test_check_writes_terminal_escapes_from_a_scaler_file_as_text(tmp_path, capsys):
    main(["generate", "--config", str(EXAMPLE), "--out", str(tmp_path)])
    evil = tmp_path / SCALERS / "evil.yaml"
    evil.write_text('kind: ScaledObject\nmetadata: {name: "\\e]0;pwned\\a\\e[2J"}\nspec: {minReplicaCount: 500}\n')
    status, lines = _check(tmp_path, capsys)
    assert status == 1
    assert lines == [
        f"lint: {evil}: ScaledObject \\x1b]0;pwned\\x07\\x1b[2J: spec.minReplicaCount: min replicas 500 above max "
        "replicas 100: the scaler is refused or pinned"
    ]


def test_a_workload_name_whose_scaler_file_name_would_not_fit_is_refused_and_the_longest_that_fits_is_written(
    tmp_path, capsys
):
    config = tmp_path / "c.yaml"
    longest = "a" * 237  # "-scaledobject.yaml" makes it 255 characters, the most a file name holds
    for name in (longest, longest + "a"):
        workload = {"model": "m", "name": name, "namespace": "b", "max_replicas": 2}
        config.write_text(yaml.safe_dump({"autoscaling": {"workloads": [workload]}}))
        out = tmp_path / f"out-{len(name)}"
        code = main(["generate", "--config", str(config), "--out", str(out)])
        err = capsys.readouterr().err
        if name == longest:
            assert code == 0, err
            assert (out / SCALERS / f"{name}-scaledobject.yaml").is_file()
        else:
            assert code != 0 and "Traceback" not in err
            assert "autoscaling.workloads[0].name: 238 characters is too long: at most 237" in err
            assert not out.exists()
