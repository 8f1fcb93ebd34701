"""A week of demand at one sample per 15 s (40,321 samples: more than a chart is pixels wide) replayed through the
real CLI with `--out`, for the report's tests: a diurnal cycle, a ten-minute burst on day three and one sample far
above everything on day five, for a workload whose model name is markup."""

import math
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


def replay_a_week(tmp_path: Path) -> Path:
    """The --out directory of the replay."""
    demand = tmp_path / "week.csv"
    rows = ["time,demand"] + [f"{time},{demand_at(time):.3f}" for time in range(0, SPAN + 1, STEP)]
    demand.write_text("\n".join(rows) + "\n")
    config = tmp_path / "plimsoll.yaml"
    config.write_text(
        "pricing:\n  gpu_hour:\n    H100-80GB: 2.5\n"
        "autoscaling:\n  margin: 0.8\n  demand_window: 10m\n  workloads:\n"
        f"    - model: {HOSTILE_MODEL!r}\n      name: vllm-week\n      namespace: inference\n"
        f"      min_replicas: 1\n      max_replicas: 60\n      startup: 300s\n      knee_concurrency: {KNEE}\n"
        "      gpu: H100-80GB\n"
    )
    out = tmp_path / "replay"
    status = main(["autoscale", "replay", "--config", str(config), "--demand", str(demand), "--out", str(out)])
    assert status == 0
    return out
