"""The knee against the capacity model's KV pool."""

import pytest

from exporter.capacity.deployment import Deployment
from exporter.capacity.plan import plan
from exporter.catalog import find_gpu, load_model
from exporter.loadtest.measure import RequestRecord
from exporter.loadtest.model import mean_footprint_tokens, model_prediction

PLAN = plan(load_model("llama-3-8b"), find_gpu("H100"), Deployment(max_model_len=8192))


def _record(prompt: int | None, output: int | None, error: str | None = None) -> RequestRecord:
    return RequestRecord(0.0, 0.1, None if error else 1.0, prompt, output, error)


def test_the_model_predicts_the_concurrency_at_which_the_pool_fills() -> None:
    prediction = model_prediction(PLAN, None, footprint_tokens=640.0, knee_concurrency=100)
    assert prediction is not None
    assert prediction.source == "model"
    assert prediction.kv_cache_tokens == PLAN.pool.tokens
    # 640 tokens are exactly 40 of the plan's 16-token blocks: no rounding.
    assert PLAN.pool.block_size == 16
    assert prediction.predicted_concurrency == pytest.approx(PLAN.pool.tokens / 640.0)
    assert prediction.ratio == pytest.approx(100 / prediction.predicted_concurrency)


def test_the_model_comes_first_and_the_engines_own_pool_is_shown_beside_it() -> None:
    prediction = model_prediction(PLAN, 4096, 64.0, 8)
    assert prediction is not None
    assert (prediction.source, prediction.engine_kv_cache_tokens) == ("model", 4096)


def test_without_a_model_the_engines_pool_is_the_prediction() -> None:
    prediction = model_prediction(None, 4096, 64.0, 8)
    assert prediction is not None
    assert prediction.to_dict() == {
        "kv_cache_tokens": 4096,
        "source": "engine",
        "request_footprint_tokens": 64.0,
        "block_size": None,
        "predicted_concurrency": 64.0,
        "knee_concurrency": 8,
        "ratio": 0.125,
        "engine_kv_cache_tokens": 4096,
    }


def test_the_footprint_is_rounded_up_to_whole_blocks_of_the_pool() -> None:
    # The recorded vLLM CPU run: 4096 tokens in 32 blocks of 128; a 137-token request holds 2 blocks, so 16 fill
    # the pool (the engine read 90% KV usage at concurrency 16), not the 29.9 that tokens alone would say.
    prediction = model_prediction(None, 4096, 137.2, 16, engine_block_size=128)
    assert prediction is not None
    assert prediction.predicted_concurrency == 16.0
    assert prediction.ratio == 1.0
    rounded, whole = model_prediction(PLAN, None, 17.0, 1), model_prediction(PLAN, None, 32.0, 1)
    assert rounded is not None and whole is not None
    assert rounded.predicted_concurrency == whole.predicted_concurrency


def test_no_prediction_without_a_pool_or_a_footprint() -> None:
    assert model_prediction(None, None, 64.0, 8) is None
    assert model_prediction(PLAN, 4096, 0.0, 8) is None


def test_without_a_knee_there_is_a_prediction_but_no_ratio() -> None:
    prediction = model_prediction(None, 4096, 64.0, None)
    assert prediction is not None and prediction.ratio is None and prediction.to_dict()["ratio"] is None


def test_a_bigger_pool_predicts_more_concurrency() -> None:
    bigger = plan(load_model("llama-3-8b"), find_gpu("H200"), PLAN.deployment)
    small, large = model_prediction(PLAN, None, 640.0, 1), model_prediction(bigger, None, 640.0, 1)
    assert small is not None and large is not None
    assert large.predicted_concurrency > small.predicted_concurrency


def test_the_footprint_is_the_mean_of_completed_requests_with_usage() -> None:
    records = [_record(100, 20), _record(200, 40), _record(None, None), _record(999, 999, error="http 503")]
    assert mean_footprint_tokens(records) == 180.0
    assert mean_footprint_tokens([_record(None, None)]) == 0.0
