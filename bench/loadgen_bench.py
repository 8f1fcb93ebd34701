"""Is the load generator the limit? `plimsoll loadtest`, `vllm bench serve` and GuideLLM against the same fast fake
server, at the same concurrencies, in one run, each client confined to one core and the server to the other.

The server (bench/fake_stream_server.py) streams 32 chunks a request, one every 20 ms, so at concurrency N the
truth is N x 50 tokens/s and an inter-token latency of 20 ms. A client that cannot keep up reads longer gaps and
fewer tokens/s than that; the server's own lag (how late its chunks were) is shown beside it, so a row where the
server, not the client, fell behind is visible as such. `vllm bench serve` comes from the vLLM venv the tests build
(`make vllm`); GuideLLM from a throwaway venv named by --guidellm (it pulls torch, so it is not one of Plimsoll's
dependencies: `python3 -m venv /tmp/gl-venv && /tmp/gl-venv/bin/pip install guidellm==0.8.1`). Either is skipped,
and says so, where it is missing.

Run: .venv/bin/python -m bench.loadgen_bench [--levels 16,64,256,512,1024] [--seconds 5] [--guidellm /tmp/gl-venv]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VLLM = REPO / ".cache" / "vllm-venv" / "bin" / "vllm"
TOKENIZER = REPO / ".cache" / "tiny-llama"
ITL_MS, TOKENS = 20.0, 32
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
QUIET_PEER_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class Row:
    client: str
    concurrency: int
    tokens_per_second: float
    itl_median_ms: float
    client_lag_p99_ms: float | None
    server_lag_p99_ms: float


def _cpus() -> tuple[str, str]:
    allowed = sorted(os.sched_getaffinity(0))
    return (str(allowed[0]), str(allowed[-1])) if len(allowed) > 1 else ("0", "0")


def _get(url: str) -> dict:
    with OPENER.open(url, timeout=5) as response:
        return json.load(response)


def _server_lag_ms(base: str) -> float:
    return _get(base + "/lag")["chunk_lag_p99_seconds"] * 1000


def _plimsoll(base: str, level: int, seconds: float, cpu: str, out: Path) -> Row:
    argv = ["taskset", "-c", cpu, sys.executable, "-m", "exporter", "loadtest", "--url", base]
    argv += ["--concurrency", str(level), "--step-duration", f"{seconds:g}s", "--warmup", "2s"]
    argv += ["--prompt-tokens", "8", "--output-tokens", str(TOKENS), "--ignore-eos", "--out", str(out)]
    subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    (step,) = json.loads((out / "result.json").read_text())["steps"]
    return Row(
        "plimsoll loadtest",
        level,
        step["output_tokens_per_second"],
        step["itl_p50_seconds"] * 1000,
        step["client_lag_p99_seconds"] * 1000,
        _server_lag_ms(base),
    )


def _vllm(base: str, level: int, seconds: float, cpu: str, out: Path) -> Row:
    # Enough prompts for about `seconds` of load at this concurrency (each request lives TOKENS x ITL).
    prompts = max(level, round(level * seconds / (TOKENS * ITL_MS / 1000)))
    argv = ["taskset", "-c", cpu, str(VLLM), "bench", "serve", "--backend", "openai", "--base-url", base]
    argv += ["--model", "fake", "--tokenizer", str(TOKENIZER), "--dataset-name", "random", "--input-len", "8"]
    argv += ["--output-len", str(TOKENS), "--ignore-eos", "--max-concurrency", str(level), "--num-prompts"]
    argv += [str(prompts), "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99", "--disable-tqdm"]
    argv += ["--save-result", "--result-dir", str(out), "--result-filename", "vllm.json"]
    subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True, env={**os.environ, **QUIET_PEER_ENV})
    result = json.loads((out / "vllm.json").read_text())
    return Row(
        "vllm bench serve",
        level,
        result["output_throughput"],
        result["median_itl_ms"],
        None,
        _server_lag_ms(base),
    )


def _guidellm(venv: Path, base: str, level: int, seconds: float, cpu: str, out: Path) -> Row:
    backend = {"kind": "openai_http", "target": base, "model": "fake", "request_format": "/v1/completions"}
    argv = ["taskset", "-c", cpu, str(venv / "bin" / "guidellm"), "run", "--disable-progress"]
    argv += ["--backend", json.dumps({**backend, "http2": False})]
    argv += ["--profile", json.dumps({"kind": "concurrent", "streams": [level]})]
    argv += ["--constraint", json.dumps({"kind": "max_duration", "seconds": seconds})]
    argv += ["--tokenizer", json.dumps({"kind": "huggingface_auto", "model": str(TOKENIZER)})]
    argv += ["--data", json.dumps({"kind": "synthetic_text", "prompt_tokens": 8, "output_tokens": TOKENS})]
    argv += ["--output", json.dumps({"kind": "json", "path": str(out / "guidellm.json")})]
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True, env={**os.environ, **QUIET_PEER_ENV})
    (benchmark,) = json.loads((out / "guidellm.json").read_text())["benchmarks"]
    metrics = benchmark["metrics"]
    return Row(
        "guidellm",
        level,
        metrics["output_tokens_per_second"]["total"]["mean"],
        metrics["inter_token_latency_ms"]["successful"]["median"],
        None,
        _server_lag_ms(base),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="16,64,256,512,1024")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=18999)
    parser.add_argument("--guidellm", type=Path, help="a venv with guidellm installed (skipped without)")
    args = parser.parse_args()
    guidellm = args.guidellm if args.guidellm and (args.guidellm / "bin" / "guidellm").exists() else None
    levels = [int(level) for level in args.levels.split(",")]
    client_cpu, server_cpu = _cpus()
    base = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        [
            *("taskset", "-c", server_cpu, sys.executable, str(REPO / "bench" / "fake_stream_server.py")),
            *("--port", str(args.port), "--itl-ms", f"{ITL_MS:g}", "--tokens", str(TOKENS)),
        ]
    )
    rows: list[Row] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(base + "/lag")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the fake server did not start within 30 s") from None
                time.sleep(0.2)
        with tempfile.TemporaryDirectory() as tmp:
            for level in levels:
                rows.append(_plimsoll(base, level, args.seconds, client_cpu, Path(tmp) / f"p{level}"))
                if VLLM.exists() and TOKENIZER.exists():
                    rows.append(_vllm(base, level, args.seconds, client_cpu, Path(tmp) / f"v{level}"))
                if guidellm is not None:
                    rows.append(_guidellm(guidellm, base, level, args.seconds, client_cpu, Path(tmp) / f"g{level}"))
    finally:
        server.terminate()
        server.wait(10)
    if not VLLM.exists():
        print(f"vllm bench serve skipped: {VLLM} missing (make vllm builds it)")
    if guidellm is None:
        print("guidellm skipped: pass --guidellm VENV, a venv with guidellm installed")
    truth = f"{1000 / ITL_MS:g} tokens/s a stream, ITL {ITL_MS:g} ms"
    print(f"client on CPU {client_cpu}, server on CPU {server_cpu}; truth: {truth}")
    header = (
        f"{'client':<18} {'concurrency':>11} {'tok/s':>8} {'of truth':>8} {'ITL p50':>8} {'client lag p99':>14} "
        f"{'server lag p99':>14}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        share = row.tokens_per_second / (row.concurrency * 1000 / ITL_MS)
        lag = "-" if row.client_lag_p99_ms is None else f"{row.client_lag_p99_ms:.1f} ms"
        print(
            f"{row.client:<18} {row.concurrency:>11} {row.tokens_per_second:>8.0f} {share:>8.0%} "
            f"{row.itl_median_ms:>6.1f}ms {lag:>14} {row.server_lag_p99_ms:>11.1f} ms"
        )


if __name__ == "__main__":
    main()
