"""result.json: the contract keys, plain JSON values, and files written whole or not at all; --save-requests."""

import csv
import errno
import json
from pathlib import Path

import pytest

from exporter import files
from exporter.loadtest.measure import RequestRecord, StepRun
from exporter.loadtest.outputs import KNEE_FIELDS, REQUEST_FIELDS, requests_text, result_document, write_outputs
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
    "knee_range",
    "saturation",
    "operating_point",
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
    assert document["version"] == 2
    assert set(document["knee"]) == set(KNEE_FIELDS)
    assert document["knee"]["concurrency"] == 12
    assert document["knee_range"] == [12, 12]
    assert document["limited_by"] == "kv_cache"
    assert document["slos"] == {"ttft_seconds": 0.5, "itl_seconds": 0.05, "objective": 0.9}


def test_the_saturation_point_is_recorded_with_its_signals_and_the_operating_point_is_the_lower_answer(tmp_path):
    document = json.loads(write_outputs(tmp_path, built_steps.several_steps()).result.read_text())
    saturation = document["saturation"]
    assert saturation["concurrency"] == 14
    assert saturation["signals"] == ["kv_full", "queue"]
    assert saturation["unsaturated_below"] == 12
    assert set(KNEE_FIELDS) <= saturation.keys() and "engine" not in saturation  # its samples are in `steps`
    assert document["operating_point"] == 12  # the knee, below the saturation point
    below = result_document(built_steps.saturated_below_knee())
    assert (below["knee"]["concurrency"], below["saturation"]["concurrency"], below["operating_point"]) == (16, 8, 8)


def test_no_answer_records_no_saturation_and_no_operating_point():
    document = result_document(built_steps.no_knee())
    assert (document["knee_range"], document["saturation"], document["operating_point"]) == (None, None, None)


def test_every_step_is_listed_in_the_order_run_with_counts_and_engine_readings(tmp_path):
    document = json.loads(write_outputs(tmp_path, built_steps.several_steps()).result.read_text())
    assert [step["concurrency"] for step in document["steps"]] == [1, 2, 4, 8, 16, 12, 14]
    first = document["steps"][0]
    assert {"requests", "errors", "duration_seconds", "verdict", "slo_attainment", "itl_p99_seconds"} <= first.keys()
    assert {"warmup_seconds", "e2e_p50_seconds", "waiting_sample_share", "engine_signals"} <= first.keys()
    assert [step["engine_signals"] for step in document["steps"]][-3:] == [
        ["kv_full", "queue"],
        ["queue"],
        ["kv_full", "queue"],
    ]
    assert first["engine"][0].keys() == {
        "t",
        "kv_cache_usage_ratio",
        "requests_running",
        "requests_waiting",
        "preemptions_total",
    }


def test_thresholds_in_the_result_come_from_the_operating_point_with_the_margin():
    thresholds = result_document(built_steps.several_steps())["thresholds"]
    # The knee (12) is the lower answer: KV usage 0.86 there x 0.95 = 0.817; 1.3 waiting rounds up to 2.
    assert thresholds == {"kv_usage": 0.817, "queue": 2, "margin": 0.05, "knee_concurrency": 12}
    # The saturation point (8) is below the knee (16): KV usage 0.6 there x 0.95 = 0.57; 2.0 waiting stays 2.
    thresholds = result_document(built_steps.saturated_below_knee())["thresholds"]
    assert thresholds == {"kv_usage": 0.57, "queue": 2, "margin": 0.05, "knee_concurrency": 8}


def test_no_knee_gives_a_null_knee_no_thresholds_file_and_still_a_report(tmp_path):
    written = write_outputs(tmp_path, built_steps.no_knee())
    document = json.loads(written.result.read_text())
    assert document["knee"] is None
    assert document["thresholds"]["kv_usage"] is None and document["thresholds"]["queue"] is None
    assert written.thresholds is None and not (tmp_path / "thresholds.yaml").exists()
    assert written.report.stat().st_size > 0


def test_a_run_without_thresholds_removes_an_earlier_runs_thresholds_file_from_the_same_directory(tmp_path):
    assert write_outputs(tmp_path, built_steps.several_steps()).thresholds == tmp_path / "thresholds.yaml"
    written = write_outputs(tmp_path, built_steps.no_knee())
    assert written.thresholds is None and not (tmp_path / "thresholds.yaml").exists()


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


def test_a_report_that_cannot_be_written_leaves_the_previous_runs_set_as_it_was(tmp_path):
    write_outputs(tmp_path, built_steps.several_steps())
    before = {name: (tmp_path / name).read_text() for name in ("result.json", "thresholds.yaml")}
    (tmp_path / "report.html").unlink()
    (tmp_path / "report.html").mkdir()  # in the way of the new report
    with pytest.raises(IsADirectoryError) as raised:
        write_outputs(tmp_path, built_steps.no_knee())  # would remove thresholds.yaml
    assert raised.value.filename == str(tmp_path / "report.html")
    assert {name: (tmp_path / name).read_text() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "result.json", "thresholds.yaml"]


def _record(sent_at: float, *, error: str | None = None, ttft: float = 0.1, itl: float = 0.01) -> RequestRecord:
    return RequestRecord(
        sent_at=sent_at,
        ttft_seconds=None if error else ttft,
        e2e_seconds=None if error else ttft + 4 * itl,
        prompt_tokens=8,
        output_tokens=None if error else 3,
        error=error,
        gap_count=0 if error else 2,
        gap_total_seconds=0.0 if error else itl + itl * 3,
    )


def _step_run(concurrency: int, *records: RequestRecord) -> StepRun:
    return StepRun(
        concurrency=concurrency,
        duration_seconds=1.0,
        requests=records,
        engine=(),
        engine_error=None,
        client_lag_p99_seconds=0.0,
        ended_early=None,
        window_seconds=1.0,
        completed_in_window=len(records),
        output_tokens_in_window=0,
    )


# Step 1's requests recorded out of send order (they complete out of order); the first of step 2 is too slow for
# the TTFT SLO (0.5 s), the second failed.
SAVED_RUNS = (
    _step_run(1, _record(0.4), _record(0.1)),
    _step_run(4, _record(0.2, ttft=0.9), _record(0.3, error="http 503"), _record(0.35, itl=0.2)),
)


def _save(out: Path, path: Path) -> None:
    write_outputs(out, built_steps.several_steps(), (path, requests_text(path, SAVED_RUNS, built_steps.SLOS)))


def test_saved_requests_are_part_of_the_set_a_requests_file_that_cannot_be_written_leaves_the_earlier_result(
    tmp_path,
):
    out, path = tmp_path / "out", tmp_path / "requests.jsonl"
    out.mkdir()
    (out / "result.json").write_text("earlier\n")
    path.mkdir()  # where the requests were to go
    with pytest.raises(IsADirectoryError):
        _save(out, path)
    assert (out / "result.json").read_text() == "earlier\n" and not (out / "report.html").exists()


def test_saved_requests_as_csv_are_a_row_each_in_send_order_with_whether_each_was_good(tmp_path):
    path = tmp_path / "deep" / "requests.csv"
    _save(tmp_path / "out", path)
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(REQUEST_FIELDS)
    assert [(row["step"], row["concurrency"], row["sent_at"]) for row in rows] == [
        ("1", "1", "0.1"),
        ("1", "1", "0.4"),
        ("2", "4", "0.2"),
        ("2", "4", "0.3"),
        ("2", "4", "0.35"),
    ]
    # Missed: TTFT 0.9 s > 0.5 s, an error, and a mean ITL of 0.4 s > 50 ms.
    assert [row["good"] for row in rows] == ["True", "True", "False", "False", "False"]
    assert rows[3]["error"] == "http 503" and rows[3]["ttft_seconds"] == ""
    assert float(rows[0]["mean_itl_seconds"]) == pytest.approx(0.02)


def test_saved_requests_as_json_lines_are_an_object_each_with_nulls_for_what_was_not_measured(tmp_path):
    path = tmp_path / "requests.jsonl"
    _save(tmp_path / "out", path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 5
    assert all(list(row) == list(REQUEST_FIELDS) for row in rows)
    assert [row["good"] for row in rows] == [True, True, False, False, False]
    failed = rows[3]
    assert (failed["error"], failed["ttft_seconds"], failed["e2e_seconds"], failed["output_tokens"]) == (
        "http 503",
        None,
        None,
        None,
    )
    assert rows[2]["ttft_seconds"] == 0.9 and rows[2]["step"] == 2 and rows[2]["concurrency"] == 4
