"""A replay with `--tune` through the real CLI with `--out`, for the report's tests: six hours at one sample per
15 s of demand rising smoothly from 10 to 100 requests in flight and back (slow beside a start-up: the tuner finds
cheaper knobs within the default budget), with a ten-minute step of 90 more half an hour in where `burst` (faster
than a start-up, at the trough: no candidate keeps a tight budget)."""

import math
from pathlib import Path

from exporter.cli import main
from tests.autoscale.week import replay_inputs

SPAN = 6 * 3600


def _demand_at(time: int, burst: bool) -> float:
    smooth = 55 - 45 * math.cos(2 * math.pi * time / SPAN)
    return smooth + (90 if burst and 1800 <= time < 2400 else 0)


def replay_tuned(tmp_path: Path, *, burst: bool = False, budget: str = "0.5%") -> Path:
    """The --out directory of the replay."""
    argv = replay_inputs(
        tmp_path,
        lambda time: _demand_at(time, burst),
        SPAN,
        model="llama",
        name="vllm-llama",
        max_replicas=30,
        startup="120s",
    )
    assert main([*argv, "--tune", "--overflow-budget", budget]) == 0
    return tmp_path / "replay"
