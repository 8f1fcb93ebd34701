"""Do `plimsoll loadtest` and `vllm bench serve` measure the same thing? Both against one real vLLM CPU engine (the
tests' tiny model and 2 MiB KV pool), at the same fixed concurrencies, one after the other, in one run.

Plimsoll runs a `--concurrency` step (no search); vllm bench serve runs `--max-concurrency` with its random dataset
at about the same prompt length (plimsoll's 48 words come to ~195 tokens) and the same 32 output tokens, with
--ignore-eos. The engine is warmed first, and the two alternate which goes first at each level: on this one-CPU
engine the same command varies by 20-40% from one minute to the next, most right after the start. Printed side by
side with their ratios: TTFT (median), ITL over every gap (median), ITL as each
request's mean gap (vLLM's TPOT, averaged over requests), and requests per second. vLLM's numbers are its own
JSON result; plimsoll's are its result.json and --save-requests file.

Run: .venv/bin/python -m bench.peer_agreement [--levels 1,4,8,16,24] [--seconds 10]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.vllm_cpu import DEFAULT_CACHE_DIR, SERVED_MODEL_NAME, ensure_vllm, free_port, start_vllm

REPO = Path(__file__).resolve().parent.parent
PROMPT_WORDS, PROMPT_TOKENS, OUTPUT_TOKENS = 48, 195, 32


def _plimsoll(base: str, levels: list[int], seconds: float, out: Path) -> dict[int, dict[str, float]]:
    requests = out / "requests.jsonl"
    argv = [sys.executable, "-m", "exporter", "loadtest", "--url", base, "--concurrency", ",".join(map(str, levels))]
    argv += ["--step-duration", f"{seconds:g}s", "--warmup", "2s", "--prompt-tokens", str(PROMPT_WORDS)]
    argv += ["--output-tokens", str(OUTPUT_TOKENS), "--ignore-eos", "--out", str(out), "--save-requests", str(requests)]
    subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1800, check=True)
    steps = json.loads((out / "result.json").read_text())["steps"]
    rows = [json.loads(line) for line in requests.read_text().splitlines()]
    measured = {}
    for step in steps:
        tpots = [
            r["mean_itl_seconds"] for r in rows if r["concurrency"] == step["concurrency"] and r["mean_itl_seconds"]
        ]
        measured[step["concurrency"]] = {
            "ttft_ms": step["ttft_p50_seconds"] * 1000,
            "itl_ms": step["itl_p50_seconds"] * 1000,
            "tpot_ms": sum(tpots) / len(tpots) * 1000,
            "req_s": step["request_rate"],
            "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in rows) / len(rows),
        }
    return measured


def _vllm(venv: Path, model_dir: Path, base: str, level: int, seconds: float, out: Path) -> dict[str, float]:
    # About `seconds` of load: the request lifetime at this level from a first guess of 0.05 s per request in flight.
    prompts = max(2 * level, round(seconds * level / max(0.3, 0.05 * level)))
    argv = [str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "openai", "--base-url", base]
    argv += ["--model", SERVED_MODEL_NAME, "--tokenizer", str(model_dir), "--dataset-name", "random"]
    argv += ["--input-len", str(PROMPT_TOKENS), "--output-len", str(OUTPUT_TOKENS), "--ignore-eos"]
    argv += ["--max-concurrency", str(level), "--num-prompts", str(prompts), "--num-warmups", str(level)]
    argv += ["--percentile-metrics", "ttft,itl,tpot", "--metric-percentiles", "50,99", "--disable-tqdm"]
    argv += ["--save-result", "--result-dir", str(out), "--result-filename", f"vllm-{level}.json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    subprocess.run(argv, capture_output=True, text=True, timeout=900, check=True, env=env)
    result = json.loads((out / f"vllm-{level}.json").read_text())
    return {
        "ttft_ms": result["median_ttft_ms"],
        "itl_ms": result["median_itl_ms"],
        "tpot_ms": result["mean_tpot_ms"],
        "req_s": result["request_throughput"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,4,8,16,24")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    install = ensure_vllm(DEFAULT_CACHE_DIR)
    ours: dict[int, dict[str, float]] = {}
    theirs: dict[int, dict[str, float]] = {}
    with start_vllm(install, free_port()) as server, tempfile.TemporaryDirectory() as tmp:
        _plimsoll(server.base_url, [max(levels)], args.seconds, Path(tmp) / "warm-up")
        for index, level in enumerate(levels):
            # Alternate which client goes first, so neither always meets the engine as the other left it.
            for client in ("plimsoll", "vllm") if index % 2 == 0 else ("vllm", "plimsoll"):
                if client == "plimsoll":
                    ours.update(_plimsoll(server.base_url, [level], args.seconds, Path(tmp) / f"p{level}"))
                else:
                    theirs[level] = _vllm(
                        install.venv, install.model_dir, server.base_url, level, args.seconds, Path(tmp)
                    )
    prompt = sum(m["prompt_tokens"] for m in ours.values()) / len(ours)
    print(f"prompt tokens: plimsoll {prompt:.0f} (48 words and its marker), vllm bench serve {PROMPT_TOKENS}")
    header = f"{'concurrency':>11} | " + " | ".join(
        f"{name:>22}" for name in ("TTFT p50 ms", "ITL p50 ms (all gaps)", "TPOT mean ms", "requests/s")
    )
    print(header + "\n" + "-" * len(header))
    print(f"{'':>11} | " + " | ".join(f"{'plimsoll  vllm  ratio':>22}" for _ in range(4)))
    for level in levels:
        cells = []
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "req_s"):
            a, b = ours[level][key], theirs[level][key]
            cells.append(f"{a:>8.1f} {b:>6.1f} {a / b:>6.2f}")
        print(f"{level:>11} | " + " | ".join(f"{cell:>22}" for cell in cells))


if __name__ == "__main__":
    main()
