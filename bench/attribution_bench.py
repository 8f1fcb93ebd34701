"""The cost of attributing GPU processes to targets from /proc, on this machine's real /proc.

Starts a few hundred processes holding ~20 fds each (a busy host), serves a "target" from this process, and
poses as NVML reporting 8 of its children (the TP workers of an engine whose API server is this process) and one
orphan nothing explains. Times, in ms:

  cold     a first pass (a fresh Attributor): every chain walked, the listeners' fds read
  steady   the pass every poll costs once answers are cached: one stat per GPU process
  retry    a pass re-examining the unexplained process (every 30 s by default)
  scan     one full fd scan of every process (listening_pids), the cost the container rule pays per new socket

    .venv/bin/python -m bench.attribution_bench --processes 300 --fds 20
"""

import argparse
import os
import socket
import statistics
import subprocess
import time
from pathlib import Path

from exporter.config import Target
from exporter.sources.nvml import GpuProcess, GpuReading, NvmlSnapshot
from exporter.sources.processes import Attributor, listening_pids

ROOT = Path(__file__).resolve().parent.parent


def _snapshot(pids: list[int]) -> NvmlSnapshot:
    gpus = tuple(
        GpuReading(str(i), f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80 << 30, 70 << 30, 0, 10 << 30, (GpuProcess(p, 1),))
        for i, p in enumerate(pids)
    )
    return NvmlSnapshot(up=True, driver_version="bench", gpus=gpus, error=None)


def _time(run, iterations: int) -> tuple[float, float]:
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=300)
    parser.add_argument("--fds", type=int, default=20, help="extra fds each background process holds")
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()

    pairs = [socket.socketpair() for _ in range((args.fds + 1) // 2)]
    fds = [s.fileno() for pair in pairs for s in pair][: args.fds]
    children = [subprocess.Popen(["sleep", "600"], pass_fds=fds) for _ in range(args.processes)]
    orphan_starter = subprocess.run(
        ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    orphan = int(orphan_starter.stdout)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        workers = [c.pid for c in children[:8]]
        nvml = _snapshot([*workers, orphan])
        targets = [Target("engine", f"http://127.0.0.1:{port}/metrics"), Target("other", "http://127.0.0.1:9/")]
        total_fds = sum(len(os.listdir(f"/proc/{p}/fd")) for p in os.listdir("/proc") if p.isdigit() and _ok(p))
        processes = sum(1 for p in os.listdir("/proc") if p.isdigit())
        result = Attributor().attribute(nvml, targets)
        assert all(result[w] == "engine" for w in workers) and result[orphan] == "", result
        print(f"/proc: {processes} processes, {total_fds} readable fds; 9 GPU processes, 2 targets")

        cold = _time(lambda: Attributor().attribute(nvml, targets), args.iterations)
        warm_attributor = Attributor()
        warm_attributor.attribute(nvml, targets)
        steady = _time(lambda: warm_attributor.attribute(nvml, targets), args.iterations)
        clock = [0.0]
        retrying = Attributor(retry_seconds=1.0, clock=lambda: clock[0])
        retrying.attribute(nvml, targets)

        def retry() -> None:
            clock[0] += 1.0
            retrying.attribute(nvml, targets)

        again = _time(retry, args.iterations)
        scan = _time(lambda: listening_pids(port), max(10, args.iterations // 10))
        print(f"{'pass':8} {'median ms':>10} {'p95 ms':>8}")
        for name, (median, p95) in (("cold", cold), ("steady", steady), ("retry", again), ("scan", scan)):
            print(f"{name:8} {median:10.3f} {p95:8.3f}")
    finally:
        for child in children:
            child.kill()
            child.wait()
        os.kill(orphan, 9)
        server.close()


def _ok(pid: str) -> bool:
    try:
        os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    return True


if __name__ == "__main__":
    main()
