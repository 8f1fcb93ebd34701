"""llama.cpp: the b9014 capture (no KV metrics), an older page that still had them, and /slots."""

import json

import pytest

from exporter.sources.engines.llamacpp import ADAPTER, capacity_from_slots
from exporter.sources.promtext import parse

OLD_PAGE = """\
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 1024
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode -nan(ind)
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


def test_current_build_reads_load_and_tokens_and_no_kv(engine_page):
    [reading] = ADAPTER.read(parse(engine_page("llamacpp-b9014.prom")))
    assert (reading.engine, reading.instance, reading.model) == ("llamacpp", "", None)
    assert (reading.requests_running, reading.requests_waiting) == (1.0, 0.0)
    assert (reading.prompt_tokens_total, reading.generation_tokens_total) == (65.0, 8.0)
    assert reading.kv_cache_usage_ratio is None
    assert reading.kv_cache_capacity_tokens is None


def test_older_build_kv_usage_ratio_is_read():
    page = parse(OLD_PAGE)
    assert page.skipped_lines == 0  # the Windows NaN spelling included
    [reading] = ADAPTER.read(page)
    assert reading.kv_cache_usage_ratio == 0.25
    assert (reading.requests_running, reading.requests_waiting) == (2.0, 1.0)


def test_capacity_from_slots_adds_up_each_slots_context():
    # The cassette that recorded the b9014 page answered /slots with this.
    assert capacity_from_slots('[{"id": 0, "n_ctx": 256, "speculative": false, "is_processing": false}]') == 256
    assert capacity_from_slots('[{"id": 0, "n_ctx": 2048}, {"id": 1, "n_ctx": 2048}]') == 4096


def test_capacity_from_slots_is_none_when_no_slot_says():
    assert capacity_from_slots("[]") is None
    assert capacity_from_slots('[{"id": 0}, {"n_ctx": "256"}, {"n_ctx": true}, 7]') is None


def test_capacity_from_slots_is_none_outside_a_kv_pools_size():
    # JSON integers have no bound: 10**400 tokens, exported, made every scrape of the daemon's /metrics fail.
    assert capacity_from_slots(json.dumps([{"n_ctx": 10**400}])) is None
    assert capacity_from_slots(json.dumps([{"n_ctx": 2**40}, {"n_ctx": 1}])) is None
    assert capacity_from_slots('[{"n_ctx": 0}, {"n_ctx": 0}]') is None  # a pool of no tokens is not one
    assert capacity_from_slots(json.dumps([{"n_ctx": 2**40}])) == 2**40


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("[" * 100_000 + "]" * 100_000, id="nested past the decoder's recursion"),
        pytest.param("<html><body>404</body></html>", id="HTML"),
        pytest.param('{"n_ctx": 4096}', id="an object, not a list"),
        pytest.param("[" + "1" * 5_000 + "]", id="an integer of more digits than Python converts"),
    ],
)
def test_a_slots_body_that_is_not_a_list_of_slots_is_no_capacity(body):
    # A RecursionError here marked the whole target down, though its /metrics page was read.
    assert capacity_from_slots(body) is None
