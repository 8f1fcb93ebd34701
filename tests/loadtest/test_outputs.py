"""result.json: the contract keys, plain JSON values, and files written whole or not at all."""

import errno
import json

import pytest

from exporter import files
from exporter.loadtest.outputs import KNEE_FIELDS, result_document, write_outputs
from tests.loadtest import built_steps

CONTRACT_KEYS = {
    "version",
    "target",
    "endpoint",
    "model",
    "started_at",
    "slos",
    "workload",
    "knee",
    "limited_by",
    "reason",
    "steps",
    "model_prediction",
    "thresholds",
    "interrupted",
    "notes",
}


def test_result_json_has_the_contract_keys_and_the_knee_fields(tmp_path):
    written = write_outputs(tmp_path, built_steps.several_steps())
    document = json.loads(written.result.read_text())
    assert document.keys() >= CONTRACT_KEYS
    assert set(document["knee"]) == set(KNEE_FIELDS)
    assert document["knee"]["concurrency"] == 12
    assert document["limited_by"] == "kv_cache"
    assert document["slos"] == {"ttft_seconds": 0.5, "itl_seconds": 0.05, "objective": 0.9}


def test_every_step_is_listed_in_the_order_run_with_counts_and_engine_readings(tmp_path):
    document = json.loads(write_outputs(tmp_path, built_steps.several_steps()).result.read_text())
    assert [step["concurrency"] for step in document["steps"]] == [1, 2, 4, 8, 16, 12, 14]
    first = document["steps"][0]
    assert {"requests", "errors", "duration_seconds", "verdict", "slo_attainment", "itl_p99_seconds"} <= first.keys()
    assert first["engine"][0].keys() == {
        "t",
        "kv_cache_usage_ratio",
        "requests_running",
        "requests_waiting",
        "preemptions_total",
    }


def test_thresholds_in_the_result_come_from_the_knee_with_the_margin():
    thresholds = result_document(built_steps.several_steps())["thresholds"]
    # KV usage 0.86 at the knee x 0.95 = 0.817; 1.3 waiting rounds up to 2.
    assert thresholds == {"kv_usage": 0.817, "queue": 2, "margin": 0.05, "knee_concurrency": 12}


def test_no_knee_gives_a_null_knee_no_thresholds_file_and_still_a_report(tmp_path):
    written = write_outputs(tmp_path, built_steps.no_knee())
    document = json.loads(written.result.read_text())
    assert document["knee"] is None
    assert document["thresholds"]["kv_usage"] is None and document["thresholds"]["queue"] is None
    assert written.thresholds is None and not (tmp_path / "thresholds.yaml").exists()
    assert written.report.stat().st_size > 0


def test_an_interrupted_run_says_so_and_keeps_what_it_measured(tmp_path):
    document = json.loads(write_outputs(tmp_path, built_steps.interrupted()).result.read_text())
    assert document["interrupted"] is True
    assert document["steps"][-1]["interrupted"] is True
    assert document["notes"] == ["interrupted by Ctrl-C"]


def test_a_write_that_fails_on_a_full_disk_leaves_the_previous_result_whole(tmp_path, monkeypatch):
    write_outputs(tmp_path, built_steps.several_steps())
    before = (tmp_path / "result.json").read_text()

    def disk_full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", disk_full)
    with pytest.raises(OSError):
        write_outputs(tmp_path, built_steps.no_knee())
    assert (tmp_path / "result.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "result.json", "thresholds.yaml"]
