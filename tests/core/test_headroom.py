"""Headroom from what a page says, however odd: a real vLLM capture edited as a broken or hostile engine would send
it gives headroom or None, never an exception (which marked the whole target down as an error)."""

import math
import re

import pytest

from exporter.core.headroom import Headroom, headroom
from exporter.sources.engines import read_page
from exporter.sources.engines.base import EngineReading
from tests.conftest import ENGINE_FIXTURES

# After a burst: 12 requests in the token histograms, KV usage 0 of a 4,096-token pool.
PAGE = (ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_after.prom").read_text()
_TOKEN_SUMS = re.compile(r"^vllm:request_(?:prompt|generation)_tokens_sum\{.*\n", re.MULTILINE)


def _with_sums(prompt: str, generation: str) -> str:
    page = re.sub(r"^(vllm:request_prompt_tokens_sum\{.*\}) \S+$", rf"\1 {prompt}", PAGE, flags=re.MULTILINE)
    return re.sub(r"^(vllm:request_generation_tokens_sum\{.*\}) \S+$", rf"\1 {generation}", page, flags=re.MULTILINE)


def _read(page: str) -> tuple[EngineReading, Headroom]:
    """The page's one engine reading and the headroom the daemon computes from it."""
    (reading,) = read_page(page).readings
    room = headroom(
        reading.kv_cache_usage_ratio,
        reading.kv_cache_capacity_tokens,
        reading.request_prompt_tokens,
        reading.request_generation_tokens,
    )
    return reading, room


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(_TOKEN_SUMS.sub("", PAGE), id="no _sum lines"),
        pytest.param(_with_sums("1e-310", "0"), id="a denormal footprint"),
    ],
)
def test_a_footprint_the_page_does_not_give_leaves_requests_that_fit_unknown(page):
    reading, room = _read(page)
    assert reading.request_prompt_tokens is not None and reading.request_prompt_tokens.count == 12
    assert room.kv_cache_headroom_tokens == 4096.0
    assert room.headroom_requests_mean is None


def test_the_recorded_page_fits_whole_requests():
    _, room = _read(PAGE)
    assert room.footprint_mean_tokens is not None and room.headroom_requests_mean is not None
    assert room.headroom_requests_mean == 4096 // room.footprint_mean_tokens


def test_a_count_above_the_inf_bucket_leaves_the_p95_at_the_largest_finite_bound():
    # A torn scrape: 8 more requests finished between the +Inf bucket's line and _count's.
    page = PAGE.replace(
        'vllm:request_prompt_tokens_count{engine="0",model_name="tiny-llama"} 12.0',
        'vllm:request_prompt_tokens_count{engine="0",model_name="tiny-llama"} 20.0',
    )
    reading, room = _read(page)
    assert reading.request_prompt_tokens is not None and reading.request_prompt_tokens.count == 20
    assert room.footprint_p95_tokens is not None and math.isfinite(room.footprint_p95_tokens)
    assert room.headroom_requests_p95 is not None and room.headroom_requests_p95 > 0
