"""`plimsoll run` (the real CLI, as a process) against a real vLLM engine while load fills its KV pool.

One run is recorded for the module: clients join one at a time, each sending requests back to back whose prompts
take two blocks and whose outputs need two more, so KV usage climbs until the pool saturates, stays there while
the engine preempts, and falls when the load stops. The daemon polls every 100 ms and its API is sampled every
50 ms. The load changes over tens of seconds rather than in a burst of a second or two: a throttled VM can leave
the daemon unscheduled for a moment (see `_engine_cpu` in tests/support/vllm_cpu.py), and a short burst can fall
entirely into such a gap. Each test checks one claim against that recording.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.vllm_cpu import REPO_ROOT, RequestResult, VllmServer, free_port, send_ramp

pytestmark = pytest.mark.integration

MODEL_DIR = REPO_ROOT / "tests" / "data" / "tiny-llama"
POLL_INTERVAL_S = 0.1
SAMPLE_INTERVAL_S = 0.05
# About three blocks a client on average and 31 usable blocks: saturated from the tenth client or so.
CLIENTS = 24
CLIENT_STEP_S = 0.75
HOLD_S = 10.0
PROMPT_TOKENS = 200
OUTPUT_TOKENS = 256
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str) -> str:
    with _OPENER.open(url, timeout=10) as response:
        return response.read().decode()


@dataclass(frozen=True)
class Recording:
    states: tuple[dict, ...]  # /api/v1/state, one per sample
    metrics_after: str  # /metrics once the ramp is over
    requests: tuple[RequestResult, ...]  # every request the load completed


def _instance(state: dict) -> dict | None:
    (target,) = state["targets"]
    return target["instances"][0] if target["up"] and target["instances"] else None


@pytest.fixture(scope="module")
def recording(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recording]:
    port = free_port()
    config = Path(tmp_path_factory.mktemp("plimsoll")) / "plimsoll.yaml"
    config.write_text(
        f"""listen: "127.0.0.1:{port}"
poll_interval: {POLL_INTERVAL_S}s
nvml: false
targets:
  - name: tiny
    url: {vllm_server.base_url}/metrics
    model: {MODEL_DIR}
slos:
  ttft: {{threshold: 500ms, objective: 0.99}}
saturation: {{kv_usage: 0.9}}
"""
    )
    daemon = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config", str(config)], cwd=REPO_ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(base + "/readyz")
                break
            except OSError:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise
                time.sleep(0.2)
        states = [json.loads(_get(base + "/api/v1/state"))]
        completed: list[RequestResult] = []
        load = threading.Thread(
            target=lambda: completed.extend(
                send_ramp(vllm_server.base_url, CLIENTS, CLIENT_STEP_S, HOLD_S, OUTPUT_TOKENS, PROMPT_TOKENS)
            ),
            daemon=True,
        )
        load.start()
        while load.is_alive():
            states.append(json.loads(_get(base + "/api/v1/state")))
            time.sleep(SAMPLE_INTERVAL_S)
        time.sleep(10 * POLL_INTERVAL_S)  # the last counters reach the engine's page after the last response
        states.append(json.loads(_get(base + "/api/v1/state")))
        assert completed, "the load thread failed; its exception is printed above"
        yield Recording(tuple(states), _get(base + "/metrics"), tuple(completed))
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, "plimsoll run did not drain and exit cleanly on SIGTERM"


def test_daemon_reports_the_engines_capacity_exactly(recording: Recording) -> None:
    capacities = {i["kv_cache_capacity_tokens"] for s in recording.states if (i := _instance(s))}
    assert capacities == {4096}  # 32 blocks of 128 tokens, as vLLM's cache_config_info says


def test_model_predicts_the_engines_capacity_within_one_percent(recording: Recording) -> None:
    instance = _instance(recording.states[-1])
    assert instance is not None
    assert instance["model_kv_cache_capacity_tokens"] == pytest.approx(4096, rel=0.01)
    assert abs(instance["model_capacity_error_ratio"]) <= 0.01


def test_kv_usage_rises_under_load(recording: Recording) -> None:
    usage = [i["kv_cache_usage_ratio"] for s in recording.states if (i := _instance(s))]
    assert usage[0] < 0.3  # idle, or the tail of an earlier test's burst
    assert max(usage) > 0.8, f"KV usage never passed 0.8; saw {usage}"


def test_preemptions_are_counted(recording: Recording) -> None:
    families = {f.name: f for f in text_string_to_metric_families(recording.metrics_after)}
    (preemptions,) = [s.value for s in families["plimsoll_preemptions"].samples if s.labels["target"] == "tiny"]
    assert preemptions > 0


def test_time_to_saturation_is_reported_while_usage_climbs(recording: Recording) -> None:
    etas = [
        i["saturation_eta_seconds"] for s in recording.states if (i := _instance(s)) and i["kv_cache_usage_ratio"] < 0.9
    ]
    finite = [eta for eta in etas if eta not in ("+Inf", None) and eta > 0]
    assert finite, f"no finite saturation ETA below the threshold; saw {etas}"
    assert min(finite) < 60  # the decode fills the pool within seconds


def test_slo_counters_track_the_engines_requests(recording: Recording) -> None:
    instance = _instance(recording.states[-1])
    assert instance is not None
    assert instance["slos"]["ttft"]["total"] >= len(recording.requests)
