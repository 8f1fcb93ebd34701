"""The plan: the vLLM budget arithmetic, what does not fit, inverse planning, and invariants."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.capacity.deployment import Deployment
from exporter.capacity.fleet import plan_fleet
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import PlanError, plan
from exporter.catalog import find_gpu, gpu_presets, load_model

GIB = 1024**3


def test_kv_budget_is_utilization_times_memory_minus_weights_activation_and_overhead():
    result = plan(load_model("llama-3.1-8b"), find_gpu("H100"), Deployment(gpu_memory_utilization=0.9))
    expected = (
        round(result.gpu_memory_bytes * 0.9)
        - result.weights.per_gpu_bytes
        - result.activation_bytes
        - result.non_torch_bytes
        - result.cuda_graph_bytes
    )
    assert result.kv_cache_bytes == expected
    assert result.pool.num_blocks == expected // (16 * 131072)
    assert result.pool.tokens == result.pool.num_blocks * 16


def test_kv_cache_memory_flag_uses_only_the_per_token_math():
    result = plan(load_model("llama-3.1-8b"), find_gpu("H100"), Deployment(kv_cache_memory_bytes=4 * GIB))
    assert result.pool.tokens == 4 * GIB // 131072
    assert result.activation_bytes == 0


def test_enforce_eager_frees_the_cuda_graph_estimate():
    arch, gpu = load_model("llama-3.1-8b"), find_gpu("H100")
    eager = plan(arch, gpu, Deployment(enforce_eager=True))
    graphs = plan(arch, gpu, Deployment())
    assert eager.cuda_graph_bytes == 0
    assert eager.kv_cache_bytes - graphs.kv_cache_bytes == graphs.cuda_graph_bytes


def test_a_model_too_big_for_the_gpu_is_an_answer_with_shortfall_and_fixes():
    result = plan(load_model("llama-3.1-70b"), find_gpu("A100-80GB"), Deployment(max_model_len=8192))
    assert not result.fits
    one_request = 8192 * result.layout.bytes_per_token
    assert result.shortfall_bytes == one_request - result.kv_cache_bytes  # the budget is negative: weights overflow
    assert result.shortfall_bytes > 50 * GIB
    assert any("--tp 2" in s for s in result.suggestions)


def test_suggests_the_longest_context_that_fits():
    arch, gpu = load_model("llama-3.1-8b"), find_gpu("L4")
    result = plan(arch, gpu, Deployment(max_model_len=131072))
    assert not result.fits
    (hint,) = [s for s in result.suggestions if s.startswith("--max-model-len")]
    longest = int(hint.split()[1])
    assert plan(arch, gpu, Deployment(max_model_len=longest)).fits
    assert not plan(arch, gpu, Deployment(max_model_len=longest + 16)).fits


def test_tp_must_divide_attention_heads():
    with pytest.raises(PlanError, match="does not divide"):
        plan(load_model("llama-3.1-8b"), find_gpu("H100"), Deployment(tensor_parallel=3))


def test_large_gpu_gets_vllms_larger_batch_defaults_except_a100():
    arch = load_model("llama-3.1-8b")
    assert plan(arch, find_gpu("H100"), Deployment()).deployment.max_num_batched_tokens == 8192
    assert plan(arch, find_gpu("A100-80GB"), Deployment()).deployment.max_num_batched_tokens == 2048


def test_sglang_sizes_the_pool_from_mem_fraction_static():
    result = plan(
        load_model("llama-3.1-8b"), find_gpu("H100"), Deployment(engine="sglang", gpu_memory_utilization=0.88)
    )
    assert result.deployment.block_size == 1
    assert result.kv_cache_bytes == round(result.gpu_memory_bytes * 0.88) - result.weights.per_gpu_bytes - (
        result.non_torch_bytes
    )


def test_fleet_plan_finds_fewest_gpus_for_the_load():
    arch = load_model("llama-3.1-70b")
    options = plan_fleet(arch, [find_gpu("H100")], Deployment(), concurrency=64, context_tokens=8192)
    full_precision = [o for o in options if not o.precision.changes]
    best = full_precision[0]
    assert best.requests_per_replica * best.replicas >= 64
    assert best.gpus == min(o.gpus for o in full_precision)
    assert best.plan.deployment.tensor_parallel >= 2  # 70B in 16 bits does not fit one 80 GB GPU


def test_fleet_plan_ranks_every_gpu_that_fits():
    arch = load_model("llama-3.1-8b")
    options = plan_fleet(arch, list(gpu_presets()), Deployment(), concurrency=100, context_tokens=4096)
    assert [o.gpus for o in options] == sorted(o.gpus for o in options)
    assert {o.plan.gpu for o in options} >= {"H100-80GB", "L4"}


@settings(max_examples=60, deadline=None)
@given(small=st.integers(20, 200), extra=st.integers(0, 200))
def test_capacity_is_monotone_in_gpu_memory(small, extra):
    arch = load_model("qwen3-8b")
    low = plan(arch, GpuSpec("a", small * GIB), Deployment(max_model_len=4096))
    high = plan(arch, GpuSpec("b", (small + extra) * GIB), Deployment(max_model_len=4096))
    assert high.pool.tokens >= low.pool.tokens >= 0


@settings(max_examples=60, deadline=None)
@given(memory=st.integers(1, 200), utilization=st.floats(0.05, 1.0))
def test_pool_is_never_negative_and_never_exceeds_its_budget(memory, utilization):
    result = plan(
        load_model("gemma-2-9b"),
        GpuSpec("g", memory * GIB),
        Deployment(gpu_memory_utilization=utilization, max_model_len=8192),
    )
    assert result.pool.num_blocks >= 0
    assert result.pool.pool_bytes <= max(0, result.kv_cache_bytes)
