"""What the NVML reader sees on this machine, and what one read costs.

    .venv/bin/python -m bench.nvml_probe [--reads 100]

Prints one JSON object: the first snapshot, then the mean and p99 milliseconds of the next reads. Without an
NVIDIA driver the snapshot is up=false with the reason, and the timing is that of a failing init.
"""

import argparse
import dataclasses
import json
import logging
import statistics
import time

from exporter.sources.nvml import NvmlReader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=100, help="timed reads after the first (default 100)")
    args = parser.parse_args()
    if args.reads < 2:
        parser.error("--reads must be at least 2 to give a p99")
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")

    # No back-off, so that on a machine without a driver every timed read pays for a real init attempt.
    reader = NvmlReader(retry_interval_s=0.0)
    try:
        snapshot = reader.read()
        durations_ms = []
        for _ in range(args.reads):
            start = time.perf_counter()
            reader.read()
            durations_ms.append((time.perf_counter() - start) * 1000)
    finally:
        reader.close()

    timing = {
        "reads": args.reads,
        "mean_ms": round(statistics.fmean(durations_ms), 4),
        "p99_ms": round(statistics.quantiles(durations_ms, n=100, method="inclusive")[98], 4),
    }
    print(json.dumps({"snapshot": dataclasses.asdict(snapshot), "timing": timing}, indent=2))


if __name__ == "__main__":
    main()
