"""How long `plimsoll loadtest`'s knee search takes against a full fixed-grid sweep, on the simulated engine.

The grid is 10 concurrency levels of equal step duration spanning 1..max concurrency, every level run for its whole
duration, knee = the highest passing level (a fixed grid of concurrencies: not GuideLLM's sweep, which spreads
request rates between its synchronous and its maximum throughput). The search is find_knee (doubling, bisection to
the tolerance, the answer run twice), with the runner's rules. The engines are noisy (each iteration's time drawn
from a log-normal), and the true knee is the highest concurrency whose attainment over a 300 s run meets the
objective, every lower one too: measured, not judged by the search's own test.

Time is counted two ways: VIRTUAL seconds of load (warm-up + measured duration of every step: what the wall time
would be against a real server; the drain of in-flight requests after a step is left out of both) and the real
CPU seconds this process spent simulating.

Run: .venv/bin/python -m bench.knee_bench [--max-concurrency 128] [--step-duration 30] [--warmup 5] [--json]
"""

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

from exporter.loadtest.judge import StepSummary, summarize
from exporter.loadtest.measure import SloSpec
from exporter.loadtest.search import find_knee
from tests.support.simulated_engine import SimulatedEngine, SimulatedWorkload, simulated_step, step_runner

TRUTH_SECONDS = 300.0

GRID_LEVELS = 10
TOLERANCE = 0.1
WORKLOAD = SimulatedWorkload(prompt_tokens=256, output_tokens=64, spread=0.2, seed=1)
TTFT_SECONDS, ITL_SECONDS = 0.5, 0.05

SHAPES: dict[str, SimulatedEngine] = {
    "ITL grows with the batch": SimulatedEngine(itl_base_seconds=0.010, itl_per_request_seconds=0.0005, noise=0.2),
    "KV pool of 2,000 blocks": SimulatedEngine(kv_blocks=2000, itl_per_request_seconds=0.0002, noise=0.2),
    "64 slots, queue of 32": SimulatedEngine(max_batch=64, queue_bound=32, itl_per_request_seconds=0.0002, noise=0.2),
}


@dataclass(frozen=True)
class Strategy:
    knee: int | None
    steps: int
    virtual_seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class Row:
    shape: str
    true_knee: int | None
    search: Strategy
    grid: Strategy


def virtual_seconds(steps: tuple[StepSummary, ...] | list[StepSummary], warmup: float) -> float:
    return sum(warmup + step.duration_seconds for step in steps)


def run_search(
    engine: SimulatedEngine, slos: SloSpec, max_concurrency: int, duration: float, warmup: float
) -> Strategy:
    started = time.process_time()
    runner = step_runner(engine, WORKLOAD, slos, duration, warmup)
    found = asyncio.run(find_knee(runner, max_concurrency, TOLERANCE, latency_slos=slos.judges_latency))
    return Strategy(
        knee=found.knee.concurrency if found.knee else None,
        steps=len(found.steps),
        virtual_seconds=virtual_seconds(found.steps, warmup),
        cpu_seconds=time.process_time() - started,
    )


def measured_knee(engine: SimulatedEngine, slos: SloSpec, max_concurrency: int) -> int | None:
    """The highest concurrency whose long-run attainment meets the objective, every lower one too."""
    knee = None
    for level in range(1, max_concurrency + 1):
        run = simulated_step(engine, level, WORKLOAD, TRUTH_SECONDS, warmup=20.0, noise_seed=7919)
        if (summarize(run, slos).slo_attainment or 0.0) < slos.objective:
            break
        knee = level
    return knee


def grid_levels(max_concurrency: int) -> list[int]:
    span = max_concurrency - 1
    return sorted({1 + round(span * index / (GRID_LEVELS - 1)) for index in range(GRID_LEVELS)})


def run_grid(engine: SimulatedEngine, slos: SloSpec, max_concurrency: int, duration: float, warmup: float) -> Strategy:
    started = time.process_time()
    # A fixed grid runs every level for its whole duration: no early end, no extension.
    steps = [
        summarize(simulated_step(engine, level, WORKLOAD, duration, warmup=warmup), slos)
        for level in grid_levels(max_concurrency)
    ]
    passing = [step.concurrency for step in steps if step.passed]
    return Strategy(
        knee=max(passing, default=None),
        steps=len(steps),
        virtual_seconds=virtual_seconds(steps, warmup),
        cpu_seconds=time.process_time() - started,
    )


def distance(knee: int | None, true_knee: int | None) -> str:
    if knee is None or true_knee is None:
        return "n/a" if knee == true_knee else "missed"
    return f"{(knee - true_knee) / true_knee:+.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-concurrency", type=int, default=128)
    parser.add_argument("--step-duration", type=float, default=30.0, help="seconds of each step (virtual)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of warm-up before each step (virtual)")
    parser.add_argument("--objective", type=float, default=0.99, help="share of requests within the SLOs")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    slos = SloSpec(ttft_seconds=TTFT_SECONDS, itl_seconds=ITL_SECONDS, objective=args.objective)

    rows = []
    for shape, engine in SHAPES.items():
        true_knee = measured_knee(engine, slos, args.max_concurrency)
        rows.append(
            Row(
                shape=shape,
                true_knee=true_knee,
                search=run_search(engine, slos, args.max_concurrency, args.step_duration, args.warmup),
                grid=run_grid(engine, slos, args.max_concurrency, args.step_duration, args.warmup),
            )
        )

    if args.json:
        print(json.dumps([_as_dict(row) for row in rows], indent=2))
        return
    print(
        f"max concurrency {args.max_concurrency}, steps of {args.warmup:g} s warm-up + {args.step_duration:g} s, "
        f"objective {slos.objective:g}, tolerance {TOLERANCE:g}; grid levels {grid_levels(args.max_concurrency)}"
    )
    header = (
        f"{'shape':<26} {'true':>5} | {'search knee':>11} {'steps':>5} {'virtual s':>9} {'cpu s':>6} | "
        f"{'grid knee':>9} {'steps':>5} {'virtual s':>9} {'cpu s':>6} | {'time ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        s, g = row.search, row.grid
        print(
            f"{row.shape:<26} {row.true_knee or '-':>5} | "
            f"{f'{s.knee} ({distance(s.knee, row.true_knee)})':>11} {s.steps:>5} {s.virtual_seconds:>9.0f} "
            f"{s.cpu_seconds:>6.2f} | "
            f"{f'{g.knee} ({distance(g.knee, row.true_knee)})':>9} {g.steps:>5} {g.virtual_seconds:>9.0f} "
            f"{g.cpu_seconds:>6.2f} | {s.virtual_seconds / g.virtual_seconds:>10.2f}"
        )


def _as_dict(row: Row) -> dict[str, object]:
    return {
        "shape": row.shape,
        "true_knee": row.true_knee,
        "search": row.search.__dict__,
        "grid": row.grid.__dict__,
        "time_ratio": row.search.virtual_seconds / row.grid.virtual_seconds,
        "search_knee_error": distance(row.search.knee, row.true_knee),
        "grid_knee_error": distance(row.grid.knee, row.true_knee),
    }


if __name__ == "__main__":
    main()
