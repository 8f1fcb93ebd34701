"""`plimsoll plan` as scripts and people use it: flags, JSON keys, errors and exit codes."""

import json

import pytest

from exporter.cli import main

REQUIRED_KEYS = {
    "kv_cache_tokens",
    "kv_bytes_per_token",
    "weights_bytes",
    "activation_bytes",
    "overhead_bytes",
    "kv_cache_bytes",
    "max_concurrency",
    "fits",
    "breakdown",
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_carries_the_contract_keys(capsys):
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--format", "json")
    answer = json.loads(out)
    assert code == 0
    assert answer.keys() >= REQUIRED_KEYS
    assert answer["kv_bytes_per_token"] == 131072
    assert answer["fits"] is True


def test_every_documented_flag_is_accepted(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--model", "qwen3-32b",
        "--gpu-memory", "79.15GiB",
        "--tp", "2",
        "--pp", "1",
        "--gpu-memory-utilization", "0.9",
        "--max-model-len", "32768",
        "--max-num-batched-tokens", "4096",
        "--max-num-seqs", "128",
        "--dtype", "auto",
        "--kv-cache-dtype", "fp8",
        "--block-size", "32",
        "--engine", "vllm",
        "--format", "json",
    )  # fmt: skip
    answer = json.loads(out)
    assert code == 0
    assert answer["block_size"] == 32 and answer["max_num_seqs"] == 128
    assert answer["gpu_memory_bytes"] == round(79.15 * 1024**3)


@pytest.mark.parametrize("size", ["2097152", "2MiB", "0.002097152GB"])
def test_sizes_accept_binary_decimal_and_plain_bytes(capsys, size):
    _, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", "--kv-cache-memory", size, "--format", "json")
    assert json.loads(out)["kv_cache_tokens"] == 2097152 // 131072


def test_table_shows_a_breakdown_a_person_can_check(capsys):
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "A100-80GB")
    assert code == 0
    for item in ("budget", "- weights", "- activation peak", "= KV cache budget", "KV bytes per token"):
        assert item in out
    assert "2 x 8 KV heads x 128 head_dim x 2 B x 32 layers" in out


def test_not_fitting_is_an_answer_not_a_crash(capsys):
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-70b", "--gpu", "L4", "--format", "json")
    answer = json.loads(out)
    assert code == 0
    assert answer["fits"] is False
    assert answer["shortfall_bytes"] > 0
    assert answer["suggestions"][0].startswith("short by")


def test_unknown_preset_names_the_closest_ones(capsys):
    code, _, err = run(capsys, "plan", "--model", "lama-3.1-8b")
    assert code == 2
    assert "unknown model 'lama-3.1-8b'" in err
    assert "llama-3.1-8b" in err


def test_unknown_gpu_says_how_to_give_memory_instead(capsys):
    code, _, err = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "H1000")
    assert code == 2
    assert "--gpu-memory" in err
    assert "--list-gpus" in err


def test_an_unknown_gpu_name_with_its_memory_is_planned_under_that_name(capsys):
    gpu = ("--gpu", "NVIDIA Foo 9000", "--gpu-memory", "90GiB")
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", *gpu, "--format", "json")
    assert code == 0
    answer = json.loads(out)
    assert answer["gpu"] == "NVIDIA Foo 9000"
    assert answer["gpu_memory_bytes"] == 90 * 1024**3


def test_a_gpu_name_longer_than_any_card_prints_is_refused(capsys):
    code, _, err = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "ab" * 100, "--gpu-memory", "90GiB")
    assert code == 2
    assert "at most 80 printable characters" in err


def test_config_missing_a_key_names_the_key_and_the_file(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}))
    code, _, err = run(capsys, "plan", "--model", str(config))
    assert code == 2
    assert str(config) in err
    assert "num_hidden_layers" in err


def test_config_directory_is_read(capsys):
    from tests.conftest import TESTS

    code, out, _ = run(capsys, "plan", "--model", str(TESTS / "data" / "tiny-llama"), "--format", "json")
    assert code == 0
    assert json.loads(out)["kv_bytes_per_token"] == 512


def test_utilization_given_as_percent_gets_a_hint(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--model", "llama-3.1-8b", "--gpu-memory-utilization", "90"])
    assert exit_info.value.code == 2
    assert "did you mean 0.9" in capsys.readouterr().err


def test_inverse_planning_answers_gpus_and_replicas(capsys):
    code, out, _ = run(
        capsys, "plan", "--model", "llama-3.1-70b", "--gpu", "H100", "--concurrency", "64",
        "--prompt-tokens", "6000", "--output-tokens", "2000", "--format", "json",
    )  # fmt: skip
    answer = json.loads(out)
    assert code == 0
    assert answer["context_tokens"] == 8000
    best = answer["options"][0]
    assert best["gpus"] == best["tensor_parallel"] * best["replicas"]
    assert best["requests_per_replica"] * best["replicas"] >= 64


def test_inverse_planning_over_any_gpu_ranks_presets(capsys):
    code, out, _ = run(
        capsys, "plan", "--model", "qwen3-8b", "--gpu", "any", "--concurrency", "32", "--context", "8192"
    )
    assert code == 0
    assert "best:" in out
    assert out.count("\n  ") > 3


def test_inverse_planning_needs_request_size(capsys):
    code, _, err = run(capsys, "plan", "--model", "qwen3-8b", "--concurrency", "32")
    assert code == 2
    assert "--context" in err


def test_context_with_prompt_tokens_is_an_error(capsys):
    code, _, err = run(
        capsys, "plan", "--model", "qwen3-8b", "--concurrency", "8", "--context", "4096", "--prompt-tokens", "100"
    )
    assert code == 2
    assert "not both" in err


def test_request_size_without_concurrency_is_an_error_not_ignored(capsys):
    code, _, err = run(capsys, "plan", "--model", "qwen3-8b", "--prompt-tokens", "1000", "--output-tokens", "100")
    assert code == 2
    assert "--prompt-tokens, --output-tokens" in err and "--concurrency" in err


def test_max_model_len_above_the_models_maximum_is_an_error(capsys):
    code, _, err = run(capsys, "plan", "--model", "llama-3.1-8b", "--max-model-len", "262144")
    assert code == 2
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            (),
            "longer than meta-llama/Llama-3.1-8B-Instruct's maximum of 131072 tokens (max_position_embeddings "
            "131072): size the requests at 131072 tokens or fewer",
        ),
        (("--max-model-len", "4096"), "do not fit --max-model-len 4096: raise it, or size the requests smaller"),
    ],
)
def test_requests_longer_than_the_model_or_max_model_len_are_refused_with_the_fix(capsys, flags, says):
    code, out, err = run(capsys, "plan", "--model", "llama-3.1-8b", "--concurrency", "8", "--context", "200000", *flags)
    assert code == 2 and out == ""
    assert says in err and len(err.strip().splitlines()) == 1


def test_data_and_expert_parallel_show_in_table_and_json(capsys):
    argv = ["plan", "--model", "deepseek-v3", "--gpu", "H200", "--dp", "8", "--enable-expert-parallel"]
    code, out, _ = run(capsys, *argv, "--max-model-len", "32768")
    assert code == 0
    assert "x 8 (TP 1, PP 1, DP 8, EP)" in out
    _, out, _ = run(capsys, *argv, "--max-model-len", "32768", "--format", "json")
    answer = json.loads(out)
    assert (answer["data_parallel"], answer["expert_parallel"], answer["gpus"]) == (8, True, 8)
    assert answer["kv_cache_tokens_per_replica"] == 8 * answer["kv_cache_tokens"]


def test_gpu_hour_prices_from_config_and_flags_rank_by_cost(capsys, tmp_path):
    config = tmp_path / "plimsoll.yaml"
    config.write_text("pricing:\n  gpu_hour:\n    H100-80GB: 0.01\n    L4: 9.0\n")
    argv = ["plan", "--model", "qwen3-8b", "--gpu", "any", "--concurrency", "64", "--context", "8192"]
    code, out, _ = run(capsys, *argv, "--config", str(config), "--format", "json")
    answer = json.loads(out)
    assert code == 0 and answer["ranked_by"] == "cost_per_hour"
    assert answer["options"][0]["gpu"] == "H100-80GB"
    _, out, _ = run(capsys, *argv, "--config", str(config), "--gpu-hour-price", "H100=99", "--format", "json")
    priced = [o for o in json.loads(out)["options"] if o["gpu"] == "H100-80GB"]
    assert priced[0]["gpu_hour_price"] == 99.0
    _, out, _ = run(capsys, *argv, "--config", str(config))
    assert "ranked by cost per hour" in out and "cost/hour" in out


def test_every_plan_gives_a_kv_token_range_around_its_figure_in_json_and_table(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    low, high = answer["kv_cache_tokens_range"]
    assert low < answer["kv_cache_tokens"] < high
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "H100"]) == 0
    assert f"likely {low:,} to {high:,} KV tokens per engine" in capsys.readouterr().out


def test_a_given_kv_pool_size_is_not_an_estimate_so_its_range_is_one_figure(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--kv-cache-memory", "20GiB", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["kv_cache_tokens_range"] == [answer["kv_cache_tokens"]] * 2


def test_a_plan_with_no_kv_pool_at_all_prints_no_range_line(capsys):
    assert main(["plan", "--model", "llama-3.1-70b", "--gpu", "L40S", "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT: 0 KV tokens" in out and "likely" not in out


@pytest.mark.parametrize(
    ("price", "named"),
    [
        ("H100=inf", "'inf' is not a price per GPU-hour"),
        ("H100=nan", "'nan' is not a price per GPU-hour"),
        ("H100=-1", "is not a price"),
        ("H10=2", "H10: neither a GPU preset"),
        ("=2", "is not GPU=PRICE"),
    ],
)
def test_a_gpu_hour_price_is_checked_as_the_configs_pricing_is(capsys, price, named):
    argv = ["plan", "--model", "llama-3.1-8b", "--concurrency", "4", "--context", "1000", "--gpu-hour-price", price]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--gpu-hour-price" in err and named in err


def test_a_layer_partition_sizes_the_kv_cache_by_its_fullest_stage(capsys):
    common = ("plan", "--model", "qwen3-235b-a22b", "--gpu-memory", "95.01GiB", "--kv-cache-memory", "26.84GiB")
    code, out, _ = run(capsys, *common, "--pp-layer-partition", "20,20,27,27", "--format", "json")
    assert code == 0
    answer = json.loads(out)
    assert answer["pipeline_parallel"] == 4  # implied by the four stages
    assert answer["kv_bytes_per_token"] == 2 * 4 * 128 * 2 * 27
    launch = "VLLM_PP_LAYER_PARTITION=20,20,27,27 vllm serve qwen3-235b-a22b -pp 4"
    code, out, _ = run(capsys, *common, "--from", launch, "--format", "json")
    assert code == 0 and json.loads(out)["kv_bytes_per_token"] == answer["kv_bytes_per_token"]


def test_a_layer_partition_that_does_not_add_up_is_refused_as_vllm_refuses_it(capsys):
    code, _, err = run(capsys, "plan", "--model", "qwen3-235b-a22b", "--pp", "4", "--pp-layer-partition", "24,24,23")
    assert code == 2
    assert "must give 4 stages (--pp) whose layers add up to the model's 94" in err


def test_language_model_only_plans_as_every_modality_off_whatever_the_limits_say(capsys):
    def answer(*flags: str) -> dict:
        code, out, _ = run(capsys, "plan", "--model", "qwen2.5-vl-7b", *flags, "--format", "json")
        assert code == 0
        return dict(json.loads(out))

    off = answer("--limit-mm-per-prompt", '{"image": 0, "video": 0}')
    assert off["weights_bytes"] < answer()["weights_bytes"]  # the vision tower is not loaded
    assert answer("--language-model-only") == off
    # vLLM's get_limit_per_prompt answers 0 under the switch, whatever --limit-mm-per-prompt allows.
    assert answer("--language-model-only", "--limit-mm-per-prompt", '{"image": 4}') == off
    assert answer("--from", "vllm serve qwen2.5-vl-7b --language-model-only") == off


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ("--pp-layer-partition", "-1,33"),
            "argument --pp-layer-partition: expected one argument (layers per pipeline stage, e.g. 24,24,23,23",
        ),
        (("--max-model-len", "-5K"), "argument --max-model-len/--context-length: expected one argument (context"),
    ],
)
def test_a_value_read_as_a_flag_is_refused_naming_the_flag_what_it_takes_and_how_to_give_it(capsys, flags, says):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", "llama-3.1-8b", *flags])
    assert exit_.value.code == 2
    [error] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert says in error and f"a value that starts with '-' reads as a flag: write {flags[0]}=VALUE" in error
    # Given as the error says, the value reaches the flag's own check.
    with pytest.raises(SystemExit):
        main(["plan", "--model", "llama-3.1-8b", f"{flags[0]}={flags[1]}"])
    [error] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert f"argument {flags[0]}" in error and "expected one argument" not in error
