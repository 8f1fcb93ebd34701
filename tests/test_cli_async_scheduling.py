"""`plan --no-async-scheduling`: vLLM's switch reaches the sliding-window reserve, typed or read from --from."""

import json

import pytest

from exporter.cli import main

GEMMA4 = ("plan", "--model", "gemma-4-26b-a4b", "--gpu", "H100", "--max-model-len", "4096")
BATCH = ("--max-num-batched-tokens", "2048", "--language-model-only", "--format", "json")


def concurrency(capsys, *flags: str) -> float:
    assert main([*GEMMA4, *BATCH, *flags]) == 0
    return float(json.loads(capsys.readouterr().out)["max_concurrency"])


def test_no_async_scheduling_keeps_one_batch_beyond_the_window_so_more_requests_fit(capsys):
    async_on = concurrency(capsys)
    one_batch = concurrency(capsys, "--no-async-scheduling")
    # One batch: 128 + 5 x 193 blocks a request; two: 128 + 5 x 257.
    assert one_batch / async_on == pytest.approx((128 + 5 * 257) / (128 + 5 * 193), rel=1e-3)
    # vLLM before v0.26 reserved one batch whatever the scheduling.
    assert concurrency(capsys, "--vllm-version", "0.25") == one_batch


def test_from_reads_the_switch_and_takes_its_positive_as_the_default(capsys):
    one_batch = concurrency(capsys, "--no-async-scheduling")
    launch = "vllm serve gemma-4-26b-a4b --max-model-len 4096 --max-num-batched-tokens 2048 --language-model-only"
    from_flags = ("plan", "--gpu", "H100", "--format", "json")
    assert main([*from_flags, "--from", f"{launch} --no-async-scheduling"]) == 0
    assert float(json.loads(capsys.readouterr().out)["max_concurrency"]) == one_batch
    assert main([*from_flags, "--from", f"{launch} --async-scheduling"]) == 0
    assert float(json.loads(capsys.readouterr().out)["max_concurrency"]) == concurrency(capsys)


def test_each_pipeline_stage_keeps_a_batch_in_flight_and_async_scheduling_one_more(capsys):
    # vLLM's VllmConfig.max_concurrent_batches: PP + 1 with async scheduling, PP without. At PP 2 and 8,192 tokens a
    # request takes 256 full-attention blocks and, in each of the fullest stage's 7 sliding groups,
    # ceil(min(1023 + batches x 2048, 8192) / 16) + 1 blocks: 449 for three batches, 321 for two.
    flags = ("plan", "--model", "gemma-4-26b-a4b", "--gpu", "H100", "--max-model-len", "8192", "--pp", "2", *BATCH)

    def pp2(*more: str) -> float:
        assert main([*flags, *more]) == 0
        return float(json.loads(capsys.readouterr().out)["max_concurrency"])

    assert pp2("--no-async-scheduling") / pp2() == pytest.approx((256 + 7 * 449) / (256 + 7 * 321), rel=1e-3)
