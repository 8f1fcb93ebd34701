"""The scale-up lag as the status page and `plimsoll status` show it: one row per autoscaled model, from the state
document the daemon writes of its snapshot, beside the start-up `plimsoll autoscale replay` assumes."""

import json
from typing import Any

import pytest
from rich.console import Console

from exporter.core import status_format
from exporter.core.scale_up import Lags
from exporter.daemon.snapshot import ScaleUpState, Snapshot
from exporter.daemon.views import state_dict, status_page
from exporter.status import client


def _measured(*seconds: float) -> Lags:
    lags = Lags()
    for lag in seconds:
        lags = lags.add(lag)
    return lags


MEASURED = ScaleUpState(
    model="meta-llama/Llama-3.1-8B-Instruct",
    workload="Deployment inference/vllm-llama-8b",
    startup_seconds=300.0,
    knee_concurrency=24,
    ready_replicas=3,
    demand=80.0,
    capacity=72.0,
    lags=_measured(400.0, 250.0, 330.5),
    pending_seconds=75.2,
)
UNMEASURED = ScaleUpState(
    model="qwen",
    workload="StatefulSet inference/qwen",
    startup_seconds=3900.0,
    knee_concurrency=8,
    ready_replicas=1,
    demand=2.0,
    capacity=8.0,
    lags=Lags(),
    pending_seconds=0.0,
)


def _state() -> dict[str, Any]:
    snapshot = Snapshot(taken_at=1.0, ready=True, nvml=None, targets=(), scale_up=(MEASURED, UNMEASURED))
    document: dict[str, Any] = json.loads(json.dumps(state_dict(snapshot)))
    return document


def test_each_autoscaled_model_is_a_row_with_its_lags_beside_the_assumed_start_up() -> None:
    measured, unmeasured = status_format.scale_up_rows(_state())
    assert measured == status_format.ScaleUpRow(
        model="meta-llama/Llama-3.1-8B-Instruct",
        workload="Deployment inference/vllm-llama-8b",
        replicas="3",
        demand="80 / 72",
        last_lag=status_format.Cell("5m 30s"),
        median_lag=status_format.Cell("5m 30s of 3"),
        pending="1m 15s",
        assumed="5m",
    )
    assert unmeasured.last_lag == status_format.Cell(status_format.NO_LAG_YET, missing=True)
    assert unmeasured.median_lag == status_format.Cell(status_format.NO_LAG_YET, missing=True)
    assert (unmeasured.pending, unmeasured.assumed) == ("none", "1h 5m")


def test_the_state_holds_the_last_lag_and_the_median_apart() -> None:
    (measured, _) = _state()["scale_up"]
    assert (measured["last_lag_seconds"], measured["lag_median_seconds"], measured["lags_count"]) == (330.5, 330.5, 3)
    lags = _measured(100.0, 200.0, 900.0)
    snapshot = Snapshot(
        taken_at=1.0, ready=True, nvml=None, targets=(), scale_up=(ScaleUpState(**{**vars(MEASURED), "lags": lags}),)
    )
    (model,) = state_dict(snapshot)["scale_up"]
    assert (model["last_lag_seconds"], model["lag_median_seconds"]) == (900.0, 200.0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (14.9, "14s"),
        (59.99, "59s"),
        (60.0, "1m"),
        (330.5, "5m 30s"),
        (3599.0, "59m 59s"),
        (3600.0, "1h"),
        (3900.0, "1h 5m"),
        (90000.0, "25h"),
    ],
)
def test_lags_are_written_to_the_second_under_an_hour(seconds: float, text: str) -> None:
    assert status_format.seconds_text(seconds) == text


def test_the_status_page_shows_the_rows_and_hides_the_section_without_autoscaling() -> None:
    page = status_page(Snapshot(taken_at=1.0, ready=True, nvml=None, targets=(), scale_up=(MEASURED,)))
    assert '<section id="scale-up">' in page
    assert "<td>Deployment inference/vllm-llama-8b</td>" in page and '<td class="num">5m 30s of 3</td>' in page
    assert '<section id="scale-up" hidden>' in status_page(Snapshot(taken_at=1.0, ready=True, nvml=None, targets=()))


def _printed(state: dict[str, Any]) -> str:
    console = Console(width=250, record=True)
    console.print(client.render(client.Fetched(state, 2.0), "http://daemon"))
    return console.export_text()


def test_plimsoll_status_prints_the_rows_under_the_instances() -> None:
    printed = _printed({**_state(), "saturation_kv_usage": 0.9})
    assert "start-up assumed by replay" in printed
    (line,) = [line for line in printed.splitlines() if "vllm-llama-8b" in line]
    assert line.split() == [
        "meta-llama/Llama-3.1-8B-Instruct",
        "Deployment",
        "inference/vllm-llama-8b",
        "3",
        "80",
        "/",
        "72",
        "5m",
        "30s",
        "5m",
        "30s",
        "of",
        "3",
        "1m",
        "15s",
        "5m",
    ]
    assert "scale-up lag" not in _printed({**_state(), "scale_up": []})
