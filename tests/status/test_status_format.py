"""The words the status page and `plimsoll status` share (exporter/core/status_format.py), over /api/v1/state
documents."""

import math

import pytest

from exporter.core import status_format
from exporter.core.status_format import Cell


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        ("+Inf", "never"),
        (math.inf, "never"),
        (0.0, "now"),
        (0.4, "1s"),
        (59.2, "1m"),
        (59.0, "59s"),
        (240.0, "4m"),
        (299.9, "4m"),
        (3600.0, "1h"),
        (7500.0, "2h 5m"),
        (3 * 86400 + 5, "3d"),
    ],
)
def test_time_to_saturation_reads_as_a_duration(seconds, text):
    assert status_format.duration(seconds) == text


def test_headroom_is_rounded_down_to_whole_tokens_and_requests():
    assert status_format.whole(2867.9) == "2,867"
    assert status_format.whole(0.99) == "0"


def test_drift_carries_its_sign_and_usage_does_not():
    assert status_format.percent(-0.5, signed=True) == "-50%"
    assert status_format.percent(0.255, signed=True) == "+26%"
    assert status_format.percent(0.62) == "62%"


@pytest.mark.parametrize(("usage", "level"), [(None, "none"), (0.5, "ok"), (0.8, "near"), (0.9, "at"), (1.0, "at")])
def test_kv_usage_is_coloured_at_and_near_the_threshold(usage, level):
    assert status_format.kv_level(usage, 0.9) == level


def _instance(**changes):
    instance = {
        "engine": "vllm",
        "dp_rank": "0",
        "model": "tiny-llama",
        "kv_cache_usage_ratio": 0.6,
        "kv_cache_headroom_tokens": 1638.4,
        "headroom_requests_p95": 12.0,
        "requests_running": 3.0,
        "requests_waiting": 0.0,
        "preemptions_total": 1.0,
        "saturation_eta_seconds": 245.0,
        "model_capacity_error_ratio": -0.5,
        "kv_usage_history": [[100.0, 0.5], [105.0, 0.6]],
        "reasons": {},
    }
    return {**instance, **changes}


def _state(*targets, gpus=()):
    return {
        "taken_at": 1000.0,
        "saturation_kv_usage": 0.9,
        "nvml": {"up": bool(gpus), "error": None if gpus else "NVML disabled", "driver_version": "580", "gpus": gpus},
        "targets": list(targets),
    }


def _target(name, *instances, up=True, failure=None, error=None):
    return {
        "target": name,
        "up": up,
        "engine": "vllm" if up else None,
        "last_failure": failure,
        "last_error": error,
        "instances": list(instances),
    }


def test_an_instance_row_reads_as_an_operator_reads_it():
    (row,) = status_format.instance_rows(_state(_target("a", _instance())))
    assert (row.target, row.engine, row.model.text, row.kv_usage.text, row.kv_level) == (
        "a",
        "vllm",
        "tiny-llama",
        "60%",
        "ok",
    )
    assert row.headroom_tokens == Cell("1,638") and row.headroom_requests_p95 == Cell("12")
    assert (row.running_waiting.text, row.preemptions.text, row.saturation_in.text) == ("3 / 0", "1", "4m")
    assert row.model_drift.text == "-50%" and row.kv_usage_history == ((100.0, 0.5), (105.0, 0.6))


def test_the_dp_rank_shows_only_where_a_target_has_several_instances():
    rows = status_format.instance_rows(
        _state(_target("one", _instance()), _target("two", _instance(dp_rank="0"), _instance(dp_rank="1")))
    )
    assert [r.engine for r in rows] == ["vllm", "vllm 0", "vllm 1"]


def test_a_missing_value_shows_the_reason_the_state_gives():
    reasons = {"model_capacity_error_ratio": "no model given", "preemptions_total": "engine does not report it"}
    (row,) = status_format.instance_rows(
        _state(_target("a", _instance(model_capacity_error_ratio=None, preemptions_total=None, reasons=reasons)))
    )
    assert row.model_drift == Cell("no model given", missing=True)
    assert row.preemptions == Cell("engine does not report it", missing=True)


def test_a_down_target_is_one_row_saying_why():
    (row,) = status_format.instance_rows(_state(_target("b", up=False, failure="refused", error="connection refused")))
    assert row.down == "down (refused): connection refused"


def test_gpu_rows_carry_each_process_and_its_target():
    gpu = {
        "gpu": "0",
        "name": "NVIDIA H100 80GB HBM3",
        "total_bytes": 80 * 2**30,
        "used_bytes": 70 * 2**30,
        "unexplained_bytes": None,
        "processes": [
            {"pid": 41, "used_bytes": 69 * 2**30, "target": "a"},
            {"pid": 42, "used_bytes": None, "target": None},
        ],
    }
    (row,) = status_format.gpu_rows(_state(gpus=[gpu]))
    assert row.memory == "70.0 / 80.0 GiB" and row.unexplained.missing
    assert [(p.pid, p.memory, p.target) for p in row.processes] == [
        ("41", "69.0 GiB", "a"),
        ("42", "-", "unattributed"),
    ]


def test_the_age_is_by_the_daemons_clock():
    assert status_format.age(1000.0, 1003.4) == "3s ago"
    assert status_format.age(0.0, 1003.4) == "no poll yet"


def test_an_implausible_snapshot_time_is_worded_not_counted():
    now = 1_795_674_320.0
    assert status_format.age(1.0, now) == "time not plausible: over a year ago (check the daemon's clock)"
    assert status_format.age(now + 86400, now) == "time not plausible: in the future (check the daemon's clock)"
    assert status_format.age(now + 1, now) == "0s ago"  # the Date header's whole seconds lag the snapshot's time
    assert status_format.age(now - 86400, now) == "86400s ago"  # a stalled daemon: old, but a real age


@pytest.mark.parametrize(
    ("nvml", "line"),
    [
        ({"up": True, "driver_version": "580.95", "error": None}, "NVML up, driver 580.95"),
        ({"up": True, "driver_version": None, "error": None}, "NVML up"),
        ({"up": False, "driver_version": None, "error": "NVML disabled"}, "NVML down: NVML disabled"),
        ({"up": False, "driver_version": None, "error": None}, "NVML down"),
    ],
)
def test_the_nvml_line_leaves_out_what_the_state_holds_null(nvml, line):
    assert status_format.nvml_line({"nvml": nvml}) == line
