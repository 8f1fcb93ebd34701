"""How long does finding the answer take? `plimsoll loadtest` against GuideLLM's searches, on one real vLLM CPU
engine (the tests' tiny model and 2 MiB KV pool: it saturates at 16 by construction), one after the other, in one
run, with the same workload and per-level duration.

The SLO is derived from the engine unloaded, as the integration test does: TTFT at most 6x its p99 at concurrency 1,
met by 90% of requests. Each tool then answers the question it offers:

- `plimsoll loadtest --slo ...`: the SLO knee and the saturation point, rising from where one request alone says
  the engine's KV pool still holds every request, up to 32, bisection to 10%, the answer confirmed by a second run
  of it and the level beside it;
- `plimsoll loadtest` with no SLO: the saturation point alone;
- GuideLLM `goodput`: the highest concurrency meeting the same TTFT objective at 90% attainment (doubling from its
  default 4 to 32, bisection to 10%);
- GuideLLM `knee`: the throughput knee over 5 concurrencies from 1 to 32 plus its adaptive pass;
- GuideLLM `sweep`: its default 10-point request-rate sweep between synchronous and maximum throughput (no single
  answer: the rates a user reads the knee from by eye).

Every level runs 5 s (`--step-seconds`; `--pair-only` runs the SLO-knee pair alone). GuideLLM runs no warm-up
here (none is its default); plimsoll runs its minimum (`--warmup 0s`: each step still warms up for the p99 lifetime
of a request at the level below, scaled by the load where that level queued, so its workers ramp in over at least
one request's lifetime). Times are wall clock from the command's start to its exit, start-up included (GuideLLM's is
about 10 s on this machine: it loads torch and a tokenizer). GuideLLM comes from a throwaway venv named by
--guidellm (`python3 -m venv /tmp/gl-venv && /tmp/gl-venv/bin/pip install guidellm==0.8.1`), never Plimsoll's
dependencies; its rows are skipped, and say so, without it.

Run: .venv/bin/python -m bench.search_time_bench --guidellm /tmp/gl-venv [--repeat 2] [--step-seconds 30 --pair-only]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.vllm_cpu import DEFAULT_CACHE_DIR, SERVED_MODEL_NAME, ensure_vllm, free_port, start_vllm

REPO = Path(__file__).resolve().parent.parent
PROMPT_WORDS, PROMPT_TOKENS, OUTPUT_TOKENS = 48, 195, 32
MAX_CONCURRENCY, OBJECTIVE, TTFT_OVER_UNLOADED = 32, 0.9, 6
QUIET_PEER_ENV = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class Row:
    tool: str
    seconds: float
    levels_run: int
    answer: str


def _timed(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def _plimsoll_argv(base: str, out: Path, *args: str) -> list[str]:
    argv = [sys.executable, "-m", "exporter", "loadtest", "--url", base, "--prompt-tokens", str(PROMPT_WORDS)]
    argv += ["--output-tokens", str(OUTPUT_TOKENS), "--ignore-eos", "--request-timeout", "30s", "--out", str(out)]
    return argv + list(args)


def _unloaded_ttft_p99(base: str, out: Path) -> float:
    _timed(_plimsoll_argv(base, out, "--concurrency", "1", "--step-duration", "4s"))
    (step,) = json.loads((out / "result.json").read_text())["steps"]
    return float(step["ttft_p99_seconds"])


def _plimsoll(base: str, out: Path, slo_ms: int | None, step_seconds: int) -> Row:
    search = ["--max-concurrency", str(MAX_CONCURRENCY), "--tolerance", "0.1", "--objective", str(OBJECTIVE)]
    search += ["--step-duration", f"{step_seconds}s", "--warmup", "0s", "--max-duration", "6m"]
    if slo_ms is not None:
        search += ["--slo", f"ttft={slo_ms}ms"]
    seconds = _timed(_plimsoll_argv(base, out, *search))
    result = json.loads((out / "result.json").read_text())
    saturation = result["saturation"]
    answer = f"saturation {saturation['concurrency'] if saturation else 'not reached'}"
    if slo_ms is not None:
        knee = result["knee"]
        answer = f"knee {knee['concurrency'] if knee else 'none'}, {answer} ({result['limited_by']})"
    tool = "plimsoll loadtest --slo" if slo_ms is not None else "plimsoll loadtest (no SLO)"
    return Row(tool, seconds, len(result["steps"]), answer)


def _guidellm(
    venv: Path, model_dir: Path, base: str, out: Path, profile: dict[str, Any], slo_ms: int | None, step_seconds: int
) -> Any:
    backend = {"kind": "openai_http", "target": base, "model": SERVED_MODEL_NAME, "request_format": "/v1/completions"}
    argv = [str(venv / "bin" / "guidellm"), "run", "--disable-progress"]
    argv += ["--backend", json.dumps({**backend, "http2": False})]
    argv += ["--profile", json.dumps(profile)]
    argv += ["--constraint", json.dumps({"kind": "max_duration", "seconds": step_seconds})]
    argv += ["--tokenizer", json.dumps({"kind": "huggingface_auto", "model": str(model_dir)})]
    data = {"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS}
    argv += ["--data", json.dumps(data), "--output", json.dumps({"kind": "json", "path": str(out)})]
    if slo_ms is not None:
        argv += ["--metrics", json.dumps({"kind": "generative", "slo": {"ttft_ms": slo_ms}})]
    seconds = _timed(argv, env={**os.environ, **QUIET_PEER_ENV})
    return seconds, json.loads(out.read_text())


def _goodput(venv: Path, model_dir: Path, base: str, out: Path, slo_ms: int, step_seconds: int) -> Row:
    profile = {"kind": "goodput", "target_attainment": OBJECTIVE, "max_streams": MAX_CONCURRENCY, "tolerance": 0.1}
    seconds, report = _guidellm(venv, model_dir, base, out, profile, slo_ms, step_seconds)
    (search,) = report["conclusions"]
    answer = f"highest passing {search['best_passing_streams']}, lowest failing {search['lowest_failing_streams']}"
    return Row("guidellm goodput", seconds, len(report["benchmarks"]), answer)


def _knee(venv: Path, model_dir: Path, base: str, out: Path, step_seconds: int) -> Row:
    profile = {"kind": "knee", "min_streams": 1, "max_streams": MAX_CONCURRENCY, "count": 5, "adaptive": True}
    seconds, report = _guidellm(venv, model_dir, base, out, profile, None, step_seconds)
    (conclusion,) = report["conclusions"]
    final = conclusion["final"]
    oversaturated = final["saturation"]["first_oversaturated_concurrency"]
    answer = f"knee {final['throughput']['knee']}, over-saturated from {oversaturated}"
    return Row("guidellm knee", seconds, len(report["benchmarks"]), answer)


def _sweep(venv: Path, model_dir: Path, base: str, out: Path, step_seconds: int) -> Row:
    sweep = {"kind": "sweep", "sweep_size": 10}
    seconds, report = _guidellm(venv, model_dir, base, out, sweep, None, step_seconds)
    rates = [b["metrics"]["requests_per_second"]["total"]["mean"] for b in report["benchmarks"]]
    answer = f"{len(rates)} rates, {min(rates):.1f}-{max(rates):.1f} req/s achieved (no single answer)"
    return Row("guidellm sweep", seconds, len(report["benchmarks"]), answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guidellm", type=Path, help="a venv with guidellm installed (its rows skipped without)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=0,
        help="then run the SLO-knee pair (plimsoll --slo, guidellm goodput) this many times more, alternating which "
        "goes first, for the spread of their ratio",
    )
    parser.add_argument("--step-seconds", type=int, default=5, help="each level's duration, both tools (default: 5)")
    parser.add_argument(
        "--pair-only", action="store_true", help="only the SLO-knee pair: no saturation-only run, no knee or sweep"
    )
    args = parser.parse_args()
    step = args.step_seconds
    guidellm = args.guidellm if args.guidellm and (args.guidellm / "bin" / "guidellm").exists() else None
    install = ensure_vllm(DEFAULT_CACHE_DIR)
    rows: list[Row] = []
    with start_vllm(install, free_port()) as server, tempfile.TemporaryDirectory() as tmp:
        base, work = server.base_url, Path(tmp)
        _unloaded_ttft_p99(base, work / "warm-up")  # the first requests after start-up are the slowest
        slo_ms = max(1, round(_unloaded_ttft_p99(base, work / "unloaded") * 1000 * TTFT_OVER_UNLOADED))
        rows.append(_plimsoll(base, work / "plimsoll-slo", slo_ms, step))
        if not args.pair_only:
            rows.append(_plimsoll(base, work / "plimsoll", None, step))
        if guidellm is not None:
            rows.append(_goodput(guidellm, install.model_dir, base, work / "goodput.json", slo_ms, step))
            if not args.pair_only:
                rows.append(_knee(guidellm, install.model_dir, base, work / "knee.json", step))
                rows.append(_sweep(guidellm, install.model_dir, base, work / "sweep.json", step))
            for round_ in range(args.repeat):
                plimsoll_first = round_ % 2 == 1
                if plimsoll_first:
                    rows.append(_plimsoll(base, work / f"plimsoll-slo-{round_}", slo_ms, step))
                rows.append(_goodput(guidellm, install.model_dir, base, work / f"goodput-{round_}.json", slo_ms, step))
                if not plimsoll_first:
                    rows.append(_plimsoll(base, work / f"plimsoll-slo-{round_}", slo_ms, step))
    print(
        f"engine: vLLM CPU, KV pool of 15 requests (saturates at 16); SLO ttft={slo_ms}ms at {OBJECTIVE:g}; "
        f"{step} s a level"
    )
    if guidellm is None:
        print("guidellm skipped: pass --guidellm VENV, a venv with guidellm installed")
    header = f"{'tool':<28} {'wall s':>7} {'levels':>6}  answer"
    print(header + "\n" + "-" * 100)
    for row in rows:
        print(f"{row.tool:<28} {row.seconds:>7.0f} {row.levels_run:>6}  {row.answer}")


if __name__ == "__main__":
    main()
