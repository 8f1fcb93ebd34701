"""Data, expert and pipeline parallelism: what each GPU holds, what a replica holds, and the layouts tried."""

import pytest

from exporter.capacity.deployment import Deployment
from exporter.capacity.fleet import plan_fleet
from exporter.capacity.plan import PlanError, check_inputs, plan
from exporter.capacity.weights import weight_breakdown
from exporter.catalog import find_gpu, load_model

GIB = 1024**3


def test_data_parallel_engines_split_moe_experts_over_dp_times_tp_and_keep_attention_whole():
    arch = load_model("deepseek-v3")
    tp8 = weight_breakdown(arch, tp=8)
    tp1_dp8 = weight_breakdown(arch, tp=1, data_parallel=8, expert_parallel=True)
    assert tp1_dp8.expert_bytes == pytest.approx(tp8.expert_bytes, rel=0.01)  # experts over 8 GPUs either way
    assert tp1_dp8.attention_bytes == pytest.approx(8 * tp8.attention_bytes, rel=0.01)  # attention per engine


def test_expert_parallel_holds_whole_experts_rounded_up_per_gpu():
    arch = load_model("qwen3-30b-a3b")  # 128 experts
    sliced = weight_breakdown(arch, tp=1, data_parallel=3)
    whole = weight_breakdown(arch, tp=1, data_parallel=3, expert_parallel=True)
    assert whole.expert_bytes / sliced.expert_bytes == pytest.approx(43 / (128 / 3), rel=1e-6)


def test_data_parallel_does_not_change_a_dense_models_weights_per_gpu():
    arch = load_model("llama-3.1-8b")
    assert weight_breakdown(arch, tp=2, data_parallel=4).per_gpu_bytes == weight_breakdown(arch, tp=2).per_gpu_bytes


def test_a_dp_replica_has_one_kv_pool_per_engine_and_dp_x_tp_x_pp_gpus():
    arch, gpu = load_model("deepseek-v3"), find_gpu("H200")
    result = plan(arch, gpu, Deployment(data_parallel=8, expert_parallel=True, max_model_len=32768))
    assert result.fits
    assert result.num_gpus == 8
    assert result.replica_kv_tokens == 8 * result.pool.tokens
    answer = result.to_dict()
    assert (answer["data_parallel"], answer["expert_parallel"], answer["gpus"]) == (8, True, 8)


def test_mla_latent_is_the_same_on_every_tp_rank():
    arch, gpu = load_model("deepseek-v3"), find_gpu("H200")
    tp8 = plan(arch, gpu, Deployment(tensor_parallel=8, max_model_len=32768))
    dp8 = plan(arch, gpu, Deployment(data_parallel=8, expert_parallel=True, max_model_len=32768))
    assert tp8.layout.bytes_per_token == dp8.layout.bytes_per_token == (512 + 64) * 2 * 61


def test_deepseek_v3_on_h100_at_tp_8_gets_fixes_that_each_fit():
    arch, gpu = load_model("deepseek-v3"), find_gpu("H100")
    deployment = Deployment(tensor_parallel=8)
    result = plan(arch, gpu, deployment)
    assert not result.fits
    fixes = result.suggestions[1:]
    assert "--tp 8 --pp 2 fits (16 GPUs, 2 nodes of 8)" in fixes
    for fix in fixes:
        flags = fix.split(" fits")[0].split()
        sizes = dict(zip(flags[::2], flags[1::2], strict=False))
        fixed = plan(
            arch,
            gpu,
            Deployment(
                tensor_parallel=int(sizes.get("--tp", 8)),
                pipeline_parallel=int(sizes.get("--pp", 1)),
                data_parallel=int(sizes.get("--dp", 1)),
                expert_parallel="--enable-expert-parallel" in flags,
            ),
        )
        assert fixed.fits, fix


def test_llama_405b_at_tp_8_is_offered_fp8_weights_labelled_as_a_precision_change():
    result = plan(load_model("llama-3.1-405b"), find_gpu("H100"), Deployment(tensor_parallel=8))
    assert "--quantization fp8 fits (changes precision: fp8 weights)" in result.suggestions


def test_inverse_planning_crosses_nodes_when_one_node_cannot_hold_the_model():
    arch = load_model("llama-3.1-405b")
    options = plan_fleet(arch, [find_gpu("L40S")], Deployment(), concurrency=8, context_tokens=4096)
    as_asked = [o for o in options if not o.precision.changes]
    assert as_asked and as_asked[0].plan.num_gpus > 8
    assert as_asked[0].plan.deployment.tensor_parallel == 8


def test_inverse_planning_keeps_a_given_tensor_parallel_size():
    arch = load_model("llama-3.1-70b")
    options = plan_fleet(arch, [find_gpu("H100")], Deployment(), 64, 8192, tensor_parallel=4)
    assert options and {o.plan.deployment.tensor_parallel for o in options} == {4}


def test_inverse_planning_ranks_by_fleet_cost_when_prices_are_known():
    arch, deployment = load_model("qwen3-8b"), Deployment(kv_cache_dtype="bfloat16")
    gpus = [find_gpu("H100"), find_gpu("L4")]
    by_gpus = plan_fleet(arch, gpus, deployment, 200, 8192)
    by_cost = plan_fleet(arch, gpus, deployment, 200, 8192, gpu_hour_prices={"H100-80GB": 50.0, "L4": 0.01})
    assert by_gpus[0].plan.gpu == "H100-80GB"
    assert by_cost[0].plan.gpu == "L4"
    assert by_cost[0].cost_per_hour == pytest.approx(0.01 * by_cost[0].gpus)
    costs = [o.cost_per_hour for o in by_cost]
    assert costs == sorted(costs)


def test_fp8_options_are_labelled_and_never_replace_the_asked_precision():
    arch = load_model("llama-3.1-70b")
    options = plan_fleet(arch, [find_gpu("H100")], Deployment(), 64, 8192)
    assert [o.precision.changes for o in options if not o.precision.changes] == [()]
    changed = [o for o in options if o.precision.changes]
    assert changed and changed[0].gpus < next(o.gpus for o in options if not o.precision.changes)
    assert changed[0].to_dict()["changes_precision"]


def test_kv_cache_memory_larger_than_the_gpu_is_refused():
    with pytest.raises(PlanError, match=r"--kv-cache-memory .* more than"):
        check_inputs(load_model("llama-3.1-8b"), find_gpu("L4"), Deployment(kv_cache_memory_bytes=100 * GIB))


def test_max_model_len_above_the_models_maximum_names_vllms_override():
    with pytest.raises(PlanError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        check_inputs(load_model("llama-3.1-8b"), find_gpu("H100"), Deployment(max_model_len=200_000))


def test_sglang_breakdown_says_nothing_of_vllm():
    result = plan(load_model("llama-3.1-8b"), find_gpu("H100"), Deployment(engine="sglang"))
    assert not [line.how for line in result.breakdown if "vLLM" in line.how or "profiling" in line.how]


def test_breakdown_items_are_words_without_table_punctuation():
    result = plan(load_model("llama-3.1-8b"), find_gpu("H100"), Deployment())
    for line in result.to_dict()["breakdown"]:
        assert line["item"][0].isalpha() and not line["item"].endswith((":", ")")), line
