"""exporter/target_model.py: the settings a vLLM engine reports in vllm:cache_config_info complete the configured
deployment; a label that cannot be such a setting (the engine's text: 0, NaN, negative, absurd) is taken as
unreported, never planned with."""

import pytest

from exporter.capacity.deployment import Deployment
from exporter.catalog import find_gpu, load_model
from exporter.target_model import model_plan

MODEL = load_model("qwen2.5-7b")
GPU = find_gpu("H100-80GB")


def _pool_tokens(engine_config: dict[str, str]) -> int:
    plan = model_plan(MODEL, Deployment(), "vllm", engine_config, GPU)
    assert plan is not None
    return plan.pool.tokens


def test_a_reported_setting_is_planned_with() -> None:
    assert _pool_tokens({"gpu_memory_utilization": "0.5"}) < _pool_tokens({})
    assert _pool_tokens({"kv_cache_memory_bytes": str(8 << 30)}) < _pool_tokens({})


UNUSABLE = ["0", "-1", "nan", "inf", "1e308", "None", ""]


@pytest.mark.parametrize(
    ("key", "label"),
    [
        *(("gpu_memory_utilization", label) for label in [*UNUSABLE, "2"]),
        *(("block_size", label) for label in [*UNUSABLE, "0.5"]),  # 0.5 reads as 0 blocks: the plan divides by it
        *(("kv_cache_memory_bytes", label) for label in UNUSABLE),
    ],
)
def test_a_label_that_cannot_be_the_setting_is_taken_as_unreported(key: str, label: str) -> None:
    assert _pool_tokens({key: label}) == _pool_tokens({})
