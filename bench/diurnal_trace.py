"""A day of LLM serving demand as `plimsoll autoscale replay --demand` reads it: requests in flight for one model,
summed over its replicas, one sample per 15 s (the step `--prometheus` range-queries at), with a burst.

The shape: a trough at night (`--trough` requests in flight at 03:00 UTC), a peak in the afternoon (`--peak` at
15:00), a flatter bottom than a sine (the cosine curve raised to 1.5: the night stays quiet for longer and the
morning ramp is steep, as interactive traffic is); on it, slow swings of a few percent (an AR(1) with a time
constant of about five minutes: a popular feature, a client's batch) and a sample's own noise (normal, with the
variance of a Poisson count of the demand); then a burst (`--burst` extra requests from `--burst-start`, reached in
one minute, held for `--burst-minutes`, gone in two more: a launch, a retry storm, a batch job against the online
endpoint). Demand is a whole number of requests, never below 0. Seeded: the same arguments write the same bytes.

No queue columns: a queue is what the fleet that served the demand did with it, and a synthetic trace has no fleet,
so the replay models the demand signal only (docs/autoscaling.md, "A worked example").

Run: .venv/bin/python -m bench.diurnal_trace --out docs/examples/diurnal-burst.csv
"""

import argparse
import math
import random
from collections.abc import Sequence
from pathlib import Path

STEP_SECONDS = 15
DAY_SECONDS = 86400
START = 1772409600  # 2026-03-02T00:00:00Z, a Monday
TROUGH_HOUR = 3.0
SHAPE_POWER = 1.5
SWING_SHARE = 0.04  # the slow swings' standard deviation, as a share of the curve
SWING_TIME_CONSTANT_SECONDS = 300.0
BURST_RISE_SECONDS = 60
BURST_FALL_SECONDS = 120


def curve(seconds: float, trough: float, peak: float) -> float:
    """The smooth daily demand at `seconds` after midnight."""
    phase = 2 * math.pi * (seconds / 3600 - TROUGH_HOUR) / 24
    return trough + (peak - trough) * math.pow((1 - math.cos(phase)) / 2, SHAPE_POWER)


def burst(seconds: float, start: float, size: float, minutes: float) -> float:
    """The burst's extra requests: a one-minute rise, a hold, a two-minute fall."""
    into = seconds - start
    hold = minutes * 60
    if into < 0 or into >= hold + BURST_FALL_SECONDS:
        return 0.0
    if into < BURST_RISE_SECONDS:
        return size * into / BURST_RISE_SECONDS
    if into < hold:
        return size
    return size * (1 - (into - hold) / BURST_FALL_SECONDS)


def trace(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(Unix time, requests in flight) every STEP_SECONDS over `args.days` days, both ends included."""
    rng = random.Random(args.seed)
    keep = math.exp(-STEP_SECONDS / SWING_TIME_CONSTANT_SECONDS)
    swing = 0.0
    burst_start = args.burst_start * 3600
    rows = []
    for step in range(args.days * DAY_SECONDS // STEP_SECONDS + 1):
        seconds = step * STEP_SECONDS
        # Stationary AR(1): each step keeps `keep` of the swing and adds what holds its deviation at SWING_SHARE.
        swing = keep * swing + rng.gauss(0, SWING_SHARE * math.sqrt(1 - keep * keep))
        mean = curve(seconds % DAY_SECONDS, args.trough, args.peak) * (1 + swing)
        mean += burst(seconds, burst_start, args.burst, args.burst_minutes)
        demand = max(0, round(rng.gauss(mean, math.sqrt(mean))))
        rows.append((START + seconds, demand))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the CSV to write (columns time, demand)")
    parser.add_argument("--days", type=int, default=1, help="how many days (default 1)")
    parser.add_argument("--trough", type=float, default=12.0, help="requests in flight at 03:00 (default 12)")
    parser.add_argument("--peak", type=float, default=150.0, help="requests in flight at 15:00 (default 150)")
    parser.add_argument("--burst", type=float, default=100.0, help="the burst's extra requests (default 100)")
    parser.add_argument(
        "--burst-start", type=float, default=10.5, help="hours into the trace the burst starts (default 10.5)"
    )
    parser.add_argument("--burst-minutes", type=float, default=20.0, help="how long the burst holds (default 20)")
    parser.add_argument("--seed", type=int, default=19, help="the noise's seed (default 19)")
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error("--days: at least 1")
    if min(args.trough, args.peak, args.burst, args.burst_minutes) < 0:  # a negative mean has no Poisson noise
        parser.error("--trough, --peak, --burst and --burst-minutes: each at least 0")
    lines = ["time,demand", *(f"{time},{demand}" for time, demand in trace(args))]
    try:
        Path(args.out).write_text("\n".join(lines) + "\n")
    except OSError as error:
        parser.error(f"--out {args.out}: cannot write it ({error.strerror})")


if __name__ == "__main__":
    main()
