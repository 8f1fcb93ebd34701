"""A week of demand at one sample per 15 s (40,321 samples: more than a chart is pixels wide) replayed through the
real CLI with `--out`, for the report's tests: a diurnal cycle, a ten-minute burst on day three and one sample far
above everything on day five, for a workload whose model name is markup."""

import math
from collections.abc import Callable
from pathlib import Path

from exporter.cli import main

HOSTILE_MODEL = "<script>document.title='owned'</script><img src=http://example.invalid/x.png>"
STEP = 15
SPAN = 7 * 86400
BURST = (3 * 86400, 3 * 86400 + 600)
SPIKE_TIME, SPIKE = 5 * 86400, 400.0
KNEE = 10


def demand_at(time: int) -> float:
    diurnal = 40 + 30 * math.sin(time / 86400 * 2 * math.pi)
    burst = 90 if BURST[0] <= time < BURST[1] else 0
    return diurnal + burst + (SPIKE if time == SPIKE_TIME else 0)


def replay_inputs(
    tmp_path: Path,
    demand: Callable[[int], float],
    span: int,
    *,
    model: str,
    name: str,
    max_replicas: int,
    startup: str,
) -> list[str]:
    """A demand CSV sampled every STEP seconds over `span` and a one-workload config (knee KNEE, H100s at 2.5 an
    hour) written under `tmp_path`: the argv of their replay into tmp_path/replay."""
    trace = tmp_path / "demand.csv"
    rows = ["time,demand"] + [f"{time},{demand(time):.3f}" for time in range(0, span + 1, STEP)]
    trace.write_text("\n".join(rows) + "\n")
    config = tmp_path / "plimsoll.yaml"
    config.write_text(
        "pricing:\n  gpu_hour:\n    H100-80GB: 2.5\n"
        "autoscaling:\n  margin: 0.8\n  demand_window: 10m\n  workloads:\n"
        f"    - model: {model!r}\n      name: {name}\n      namespace: inference\n"
        f"      min_replicas: 1\n      max_replicas: {max_replicas}\n      startup: {startup}\n"
        f"      knee_concurrency: {KNEE}\n      gpu: H100-80GB\n"
    )
    return ["autoscale", "replay", "--config", str(config), "--demand", str(trace), "--out", str(tmp_path / "replay")]


def replay_a_week(tmp_path: Path) -> Path:
    """The --out directory of the replay."""
    argv = replay_inputs(
        tmp_path, demand_at, SPAN, model=HOSTILE_MODEL, name="vllm-week", max_replicas=60, startup="300s"
    )
    assert main(argv) == 0
    return tmp_path / "replay"
