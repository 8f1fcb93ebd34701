"""A replay with `--tune` through the real CLI with `--out`, for the report's tests: six hours at one sample per
15 s of demand rising smoothly from 10 to 100 requests in flight and back (slow beside a start-up: the tuner finds
cheaper knobs within the default budget), with a ten-minute step of 90 more half an hour in where `burst` (faster
than a start-up, at the trough: no candidate keeps a tight budget)."""

import math
from pathlib import Path

from exporter.cli import main

STEP = 15
SPAN = 6 * 3600
KNEE = 10


def _demand_at(time: int, burst: bool) -> float:
    smooth = 55 - 45 * math.cos(2 * math.pi * time / SPAN)
    return smooth + (90 if burst and 1800 <= time < 2400 else 0)


def replay_tuned(tmp_path: Path, *, burst: bool = False, budget: str = "0.5%") -> Path:
    """The --out directory of the replay."""
    demand = tmp_path / "day.csv"
    rows = ["time,demand"] + [f"{time},{_demand_at(time, burst):.3f}" for time in range(0, SPAN + 1, STEP)]
    demand.write_text("\n".join(rows) + "\n")
    config = tmp_path / "plimsoll.yaml"
    config.write_text(
        "pricing:\n  gpu_hour:\n    H100-80GB: 2.5\n"
        "autoscaling:\n  margin: 0.8\n  demand_window: 10m\n  workloads:\n"
        "    - model: llama\n      name: vllm-llama\n      namespace: inference\n"
        f"      min_replicas: 1\n      max_replicas: 30\n      startup: 120s\n      knee_concurrency: {KNEE}\n"
        "      gpu: H100-80GB\n"
    )
    out = tmp_path / "replay"
    argv = ["autoscale", "replay", "--config", str(config), "--demand", str(demand), "--out", str(out)]
    assert main([*argv, "--tune", "--overflow-budget", budget]) == 0
    return out
