"""The harness drives a real vLLM engine: its KV pool is the size asked for, and a burst of load saturates it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support.vllm_cpu import RequestResult, VllmServer, fetch_metrics, send_load

pytestmark = pytest.mark.integration

# Each request holds 2 blocks once its prompt is in and 4 by its end (200 + 256 tokens of 128 a block), so twelve
# of them fill three quarters of the 31 usable blocks at once and then want 48: the engine must preempt. A short
# prompt needs its third block only for the last few tokens, and then a burst may end without preempting.
BURST_REQUESTS = 12
BURST_MAX_TOKENS = 256
BURST_PROMPT_LEN = 200
SAMPLE_INTERVAL_S = 0.05
# Counters reach /metrics after the engine's last step is logged, a moment after the last response.
SETTLE_TIMEOUT_S = 10.0

KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"


@dataclass(frozen=True)
class Burst:
    results: tuple[RequestResult, ...]
    kv_usage_samples: tuple[float, ...]
    preemptions_before: float
    preemptions_after: float


def _samples(page: str, name: str) -> list[Sample]:
    return [
        sample for family in text_string_to_metric_families(page) for sample in family.samples if sample.name == name
    ]


def _value(page: str, name: str) -> float:
    (sample,) = _samples(page, name)
    return sample.value


def _preemptions_settled(server: VllmServer, before: float) -> float:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        after = _value(fetch_metrics(server.base_url), PREEMPTIONS)
        if after > before or time.monotonic() >= deadline:
            return after
        time.sleep(SAMPLE_INTERVAL_S)


@pytest.fixture(scope="module")
def saturating_burst(vllm_server: VllmServer) -> Burst:
    """Send the burst all at once and sample /metrics while it runs."""
    url = vllm_server.base_url
    preemptions_before = _value(fetch_metrics(url), PREEMPTIONS)
    kv_usage: list[float] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        load = pool.submit(send_load, url, BURST_REQUESTS, BURST_MAX_TOKENS, BURST_PROMPT_LEN, BURST_REQUESTS)
        while not load.done():
            kv_usage.append(_value(fetch_metrics(url), KV_USAGE))
            time.sleep(SAMPLE_INTERVAL_S)
        results = load.result()
    return Burst(results, tuple(kv_usage), preemptions_before, _preemptions_settled(vllm_server, preemptions_before))


def test_cache_config_reports_the_requested_pool(vllm_server: VllmServer) -> None:
    (info,) = _samples(fetch_metrics(vllm_server.base_url), "vllm:cache_config_info")
    assert info.labels["block_size"] == "128"
    assert info.labels["num_gpu_blocks"] == "32"
    assert info.labels["kv_cache_size_tokens"] == "4096"


def test_kv_usage_rises_while_the_burst_runs(saturating_burst: Burst) -> None:
    assert [result.completion_tokens for result in saturating_burst.results] == [BURST_MAX_TOKENS] * BURST_REQUESTS
    assert saturating_burst.kv_usage_samples, "the burst ended before /metrics could be sampled"
    assert max(saturating_burst.kv_usage_samples) > 0.5, saturating_burst.kv_usage_samples


def test_preemptions_increase_after_saturation(saturating_burst: Burst) -> None:
    assert saturating_burst.preemptions_after > saturating_burst.preemptions_before
