"""`plimsoll loadtest` (the real CLI, as a process) against the real vLLM CPU engine: the saturation point is where
the engine's KV pool says it is, on any machine, in every run.

The pool is known by construction (tests/integration/conftest.py): 32 blocks of 128 tokens, of which vLLM keeps
one as its null block. A request of ~48 words (about 200 prompt tokens with the tiny model's byte-level tokenizer,
the run's marker included) and 32 output tokens holds two blocks, so 15 run at once: at concurrency 15 the pool is
full (97%) and nothing waits; from 16 a request waits for one to finish. So the saturation point is 16 whatever
the machine's speed: the engine, not the clock, decides it.

The SLO is derived from the same engine unloaded (concurrency 1, measured first), never a fixed latency: a fixed
TTFT that breaks at 20 on a slow machine never breaks on a fast one. Each run is under a minute: 5 s steps from
where one request sent alone says the pool still holds every request (15), up to 32, bisection to 10%, and the
answer confirmed by a second run of it and the level beside it; the run's own --max-duration and the subprocess
timeout bound it. The engine is the session's, which reaps it.
"""

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.loadtest.contract import KNEE_KEYS
from tests.support.vllm_cpu import REPO_ROOT, VllmServer

pytestmark = pytest.mark.integration

RUNS = 3
POOL_REQUESTS = 15  # 31 usable blocks / 2 blocks a request
SATURATION_POINT = POOL_REQUESTS + 1
# The SLO: TTFT this many times the unloaded p99. Queueing past the pool multiplies TTFT by the queue's depth over
# the pool; under it TTFT grows only with the batch.
TTFT_OVER_UNLOADED = 6
RUN_TIMEOUT_S = 300
WORKLOAD = ("--prompt-tokens", "48", "--output-tokens", "32", "--ignore-eos", "--request-timeout", "30s")
STEP_KEYS = KNEE_KEYS | {"requests", "errors", "duration_seconds", "verdict", "engine_signals", "preemptions"}


def _loadtest(server: VllmServer, out: Path, *args: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "exporter", "loadtest", "--url", server.base_url, *WORKLOAD, *args]
    argv += ["--out", str(out)]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    # Shown when a test fails: the progress lines and the table are the first thing to read.
    print(done.stderr, done.stdout, sep="\n")
    assert done.returncode == 0, f"loadtest exited {done.returncode}: {done.stderr[-2000:]}"
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def unloaded_ttft_p99(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> float:
    result = _loadtest(vllm_server, tmp_path_factory.mktemp("unloaded"), "--concurrency", "1", "--step-duration", "4s")
    (step,) = result["steps"]
    assert step["errors"] == 0 and step["requests"] >= 5, step
    return float(step["ttft_p99_seconds"])


@pytest.fixture(scope="module")
def runs(
    vllm_server: VllmServer, unloaded_ttft_p99: float, tmp_path_factory: pytest.TempPathFactory
) -> Sequence[Mapping[str, Any]]:
    slo = f"ttft={max(1, round(unloaded_ttft_p99 * 1000 * TTFT_OVER_UNLOADED))}ms"
    search = ("--slo", slo, "--objective", "0.9", "--max-concurrency", "32", "--tolerance", "0.1")
    timing = ("--step-duration", "5s", "--warmup", "1s", "--max-duration", "4m")
    return tuple(
        _loadtest(vllm_server, tmp_path_factory.mktemp(f"loadtest{index}"), *search, *timing) for index in range(RUNS)
    )


def test_the_saturation_point_is_where_the_kv_pool_overflows_in_every_run(runs: Sequence[Mapping[str, Any]]) -> None:
    for result in runs:
        saturation = result["saturation"]
        assert saturation is not None, result["reason"]
        assert saturation["concurrency"] == SATURATION_POINT, (saturation["signals"], result["reason"])
        assert {"kv_full", "queue"} <= set(saturation["signals"]), saturation["signals"]
        # The level under it was measured and not saturated: the answer is exact, not the top of a wide bracket.
        assert saturation["unsaturated_below"] == POOL_REQUESTS


def test_the_search_starts_at_the_last_level_the_pool_holds(runs: Sequence[Mapping[str, Any]]) -> None:
    # One request alone holds two of the 32 blocks; less the block vLLM keeps back, the pool holds 15 of them.
    for result in runs:
        assert result["steps"][0]["concurrency"] == POOL_REQUESTS, [step["concurrency"] for step in result["steps"]]


def test_below_the_pool_nothing_waits_and_above_it_requests_do(runs: Sequence[Mapping[str, Any]]) -> None:
    for result in runs:
        for step in result["steps"]:
            if step["concurrency"] <= POOL_REQUESTS:
                assert "queue" not in step["engine_signals"], step
            if step["concurrency"] >= 2 * SATURATION_POINT:
                assert "queue" in step["engine_signals"], step


def test_thresholds_and_the_capacity_come_from_the_lower_answer(runs: Sequence[Mapping[str, Any]]) -> None:
    for result in runs:
        point = result["operating_point"]
        knee = result["knee"]
        assert point == min(SATURATION_POINT, knee["concurrency"] if knee else SATURATION_POINT)
        assert result["thresholds"]["knee_concurrency"] == point
        # Calibrated where at most the one request the pool cannot hold waits: never a deep queue.
        assert result["thresholds"]["queue"] <= 1
        assert result["limited_by"] in {"kv_cache", "slo:ttft"}, result["reason"]


def test_the_engine_pool_predicts_the_saturation_point(runs: Sequence[Mapping[str, Any]]) -> None:
    for result in runs:
        prediction = result["model_prediction"]
        assert prediction["source"] == "engine" and prediction["block_size"] == 128
        # Two blocks a request in 32 blocks: 16 by the pool's arithmetic (the engine's null block takes one).
        assert prediction["predicted_concurrency"] == pytest.approx(16.0)


def test_result_json_keeps_the_contract(runs: Sequence[Mapping[str, Any]]) -> None:
    result = runs[0]
    assert result["version"] == 2
    assert all(set(step) >= STEP_KEYS for step in result["steps"])
    assert set(result["saturation"]) >= STEP_KEYS | {"signals", "unsaturated_below"}
    if result["knee"] is not None:
        assert set(result["knee"]) >= KNEE_KEYS
    assert set(result["slos"]) == {"ttft_seconds", "itl_seconds", "objective"}
    assert set(result["thresholds"]) >= {"kv_usage", "queue", "margin", "knee_concurrency"}
    assert result["interrupted"] is False
