"""`make demo`'s loop as a test: from a live engine (the session's real vLLM CPU engine, not replayed pages),
through `plimsoll loadtest --write`, `plimsoll generate`, `plimsoll run`, a real Prometheus evaluating the generated
rules and a real Alertmanager with the example routes, to a webhook receiver.

It asserts what the demo shows a person: the knee is found and becomes the threshold; a steady load below the
threshold pages nobody; under the ramp the saturation-ahead page reaches the pager's webhook before KV usage
crosses the threshold, before the first request waits and before the first preemption. The loop is bounded (the
ramp stops shortly after the first request waits or is preempted, or after RAMP_LIMIT_SECONDS), about five minutes
in all, and every process it starts is stopped when it returns: the test checks their ports are closed.

Skips only where the Prometheus tools cannot be had (the prometheus_tools fixture) or vLLM cannot be installed.
"""

import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from deploy.local import demo
from tests.generate import conftest as generate_conftest
from tests.support.vllm_cpu import REPO_ROOT, VllmServer

pytestmark = pytest.mark.integration
prometheus_tools = generate_conftest.prometheus_tools

MODEL_DIR = REPO_ROOT / ".cache" / "tiny-llama"  # what the vllm_server fixture serves


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((parts.hostname or "127.0.0.1", parts.port or 80)) == 0


@pytest.fixture(scope="module")
def summary(vllm_server: VllmServer, prometheus_tools: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    return demo.run_loop(vllm_server, MODEL_DIR, Path(tmp_path_factory.mktemp("demo")))


def test_the_saturation_point_is_found_and_written_as_the_saturation_threshold(summary) -> None:
    # The session's engine holds 15 of the demo's requests (tests/integration/test_loadtest_vllm.py): the 16th waits.
    assert summary.knee_concurrency == 16
    # The threshold written is the KV usage measured there less the 5% margin: below it, so the alert comes first,
    # and taken from it (a clamp to [0.5, 0.99] alone would not land within the margin of the measurement).
    assert summary.point_kv_usage is not None and summary.threshold_ratio is not None
    assert summary.point_kv_usage * 0.95 - 0.001 <= summary.threshold_ratio < summary.point_kv_usage


def test_a_steady_load_below_the_threshold_pages_nobody(summary) -> None:
    assert summary.steady_kv_usage_max is not None and summary.steady_kv_usage_max > 0.1, "the steady load held no KV"
    assert summary.steady_kv_usage_max < summary.threshold_ratio
    assert summary.pages_during_steady == []


def test_the_saturation_ahead_page_arrives_before_the_threshold_a_queue_or_a_preemption(summary) -> None:
    assert summary.alert_delivered_at is not None, f"no page arrived; received: {summary.pages_received}"
    assert summary.threshold_crossed_at is not None, "the ramp never reached the threshold: nothing was proven"
    assert summary.alert_firing_at is not None and summary.alert_firing_at <= summary.alert_delivered_at
    assert summary.alert_delivered_at < summary.threshold_crossed_at
    for saturated in (summary.first_waiting_at, summary.first_preemption_at):
        if saturated is not None:
            assert summary.alert_delivered_at < saturated
    assert summary.kv_usage_at_delivery is not None and summary.kv_usage_at_delivery < summary.threshold_ratio


def test_the_loop_leaves_nothing_running(summary) -> None:
    started = {name: url for name, url in summary.urls.items() if url.startswith("http://")}
    assert set(started) >= {"status page", "prometheus alerts", "alertmanager"}
    assert [name for name, url in started.items() if _listening(url)] == []
