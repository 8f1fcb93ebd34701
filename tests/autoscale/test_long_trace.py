"""A trace whose few samples span the most a replay takes (105 days, 604,800 syncs), through the real CLI with
`--tune`: its steady stretches are recorded as runs of syncs, not one decision per sync, and its figures are those
the sync-by-sync replay gave (measured before the runs were introduced)."""

import json
from pathlib import Path

from exporter.cli import main
from tests.autoscale.week import replay_inputs

SPAN = 105 * 86400


def test_two_rows_105_days_apart_record_a_handful_of_decisions(tmp_path: Path) -> None:
    argv = replay_inputs(tmp_path, lambda _: 25.0, 15, model="m", name="vllm-two", max_replicas=60, startup="300s")
    (tmp_path / "demand.csv").write_text(f"time,demand\n0,25\n{SPAN},25\n")
    assert main([*argv, "--tune"]) == 0
    document = json.loads((tmp_path / "replay" / "result.json").read_text())
    (workload,) = document["workloads"]
    decisions = workload["decisions"]
    # Once the row leaves the 10-min window the demand reads 0: the 4 replicas are held by the scale-down window,
    # go one per 300 s (held by the policy between), then are held by min replicas until the last row asks for
    # more. The sync-by-sync replay recorded each of those 604,760 syncs; they are 8 entries.
    assert len(decisions) == 8
    assert sum(decision["syncs"] for decision in decisions) == 604_760
    assert (decisions[-2]["reason"], decisions[-2]["current_replicas"], decisions[-2]["syncs"]) == (
        "min replicas",
        1,
        604_679,
    )
    figures = [workload[key] for key in ("replica_hours", "overflow_seconds", "overflow_request_seconds")]
    assert figures == [2521.25, 9070500.0, 136054500.0] and workload["peak_replicas"] == 4
    tune = document["tune"]
    lowest = [tune["lowest_overflow"][key] for key in ("margin", "demand_window_seconds", "replica_hours")]
    assert tune["chosen"] is None and lowest == [0.6, 600.0, 2521.8333333333335]
