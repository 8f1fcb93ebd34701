import dataclasses
from collections.abc import Iterable

import pytest

from exporter.loadtest.judge import (
    SequentialTest,
    certainly_failing,
    certainly_saturated,
    engine_signals,
    judged_so_far,
    summarize,
    wilson_interval,
    worth_extending,
)
from exporter.loadtest.measure import EngineSample, RequestRecord, SloSpec, StepRun
from exporter.loadtest.sketch import RELATIVE_ACCURACY, DurationSummary
from exporter.loadtest.thresholds import derive_thresholds

SLOS = SloSpec(ttft_seconds=0.5, itl_seconds=0.05, objective=0.9)


def record(ttft: float = 0.1, itl: tuple[float, ...] = (0.02, 0.02), error: str | None = None) -> RequestRecord:
    return RequestRecord(
        sent_at=0.0,
        ttft_seconds=None if error else ttft,
        e2e_seconds=None if error else ttft + sum(itl),
        prompt_tokens=None if error else 100,
        output_tokens=None if error else len(itl) + 1,
        error=error,
        gap_count=0 if error else len(itl),
        gap_total_seconds=0.0 if error else sum(itl),
    )


def step(requests: list[RequestRecord], engine: tuple[EngineSample, ...] = (), gaps: Iterable[float] = ()) -> StepRun:
    """A step of `requests` whose completed ones streamed `gaps` between them."""
    itl_gaps = DurationSummary()
    for gap in gaps:
        itl_gaps.add(gap)
    return StepRun(
        concurrency=4,
        duration_seconds=10.0,
        requests=tuple(requests),
        itl_gaps=itl_gaps,
        engine=engine,
        engine_error=None,
        client_lag_p99_seconds=0.001,
        ended_early=None,
        window_seconds=10.0,
        completed_in_window=sum(1 for r in requests if r.completed),
        output_tokens_in_window=sum(r.output_tokens or 0 for r in requests if r.completed),
    )


@pytest.mark.parametrize(("objective", "good_in_a_row"), [(0.9, 18), (0.95, 37), (0.99, 194), (0.5, 3)])
def test_a_step_with_no_misses_passes_after_the_good_requests_wald_s_boundary_needs(
    objective: float, good_in_a_row: int
) -> None:
    # ln(BETA / (1 - ALPHA)) / ln((1 - fail_rate) / (1 - pass_rate)): 2.944 / 0.1719 = 17.1 at 0.9.
    test = SequentialTest(objective)
    assert test.verdict(good_in_a_row - 1, good_in_a_row - 1) == "unsure"
    assert test.verdict(good_in_a_row, good_in_a_row) == "pass"
    assert test.good_requests_to_pass(0, 0) == good_in_a_row


def test_the_sequential_test_tests_half_against_twice_the_allowed_miss_rate() -> None:
    test = SequentialTest(0.99)
    assert test.pass_rate == pytest.approx(0.005)
    assert test.fail_rate == pytest.approx(0.02)
    # At objective 0.5 twice the allowance would be certain failure: halfway to 1 instead.
    assert SequentialTest(0.5).fail_rate == pytest.approx(0.75)


def test_wilson_interval_matches_the_published_value_and_stays_in_zero_to_one() -> None:
    # Wilson (1927) / Newcombe (1998) example: 81 of 263, 95% interval 0.2553 to 0.3662.
    low, high = wilson_interval(81, 263)
    assert low == pytest.approx(0.2553, abs=5e-4)
    assert high == pytest.approx(0.3662, abs=5e-4)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_three_misses_among_the_first_requests_fail_a_step_and_one_does_not() -> None:
    test = SequentialTest(0.9)
    assert test.verdict(good=0, total=3) == "fail"  # 3 x ln 4 = 4.16 > ln 19 = 2.94
    assert test.verdict(good=9, total=10) == "unsure"
    assert test.verdict(good=27, total=30) == "unsure"  # 3 misses in 30: the objective exactly, undecided
    assert test.verdict(good=30, total=30) == "pass"


def test_errors_and_timeouts_are_misses_and_count_as_requests() -> None:
    summary = summarize(step([record()] * 27 + [record(error="timeout")] * 3), SLOS)
    assert summary.requests == 30
    assert summary.errors == 3
    assert summary.slo_attainment == pytest.approx(0.9)
    assert summary.failing_slo == "errors"


def test_a_request_with_one_output_token_has_no_gaps_and_passes_itl() -> None:
    summary = summarize(step([record(itl=())] * 30), SLOS)
    assert summary.slo_attainment == 1.0
    assert summary.verdict == "pass"


def test_itl_is_judged_on_each_requests_mean_gap_and_names_the_failing_slo() -> None:
    # One long gap in a request whose mean stays under the threshold is not a miss.
    bursty, slow = (0.01, 0.01, 0.12), (0.06, 0.07)
    summary = summarize(step([record(itl=bursty)] * 20 + [record(itl=slow)] * 10, gaps=bursty * 20 + slow * 10), SLOS)
    assert summary.slo_attainment == pytest.approx(20 / 30)
    assert summary.failing_slo == "itl"
    # The step's ITL percentiles are over every gap, not over the requests' means (whose p99 is 0.065).
    assert summary.itl_p99_seconds == pytest.approx(0.12, rel=RELATIVE_ACCURACY)
    assert summary.itl_p50_seconds == pytest.approx(0.01, rel=RELATIVE_ACCURACY)


def test_an_unsure_step_is_decided_by_its_point_estimate() -> None:
    summary = summarize(step([record()] * 12), SLOS)
    assert summary.verdict == "unsure"
    assert summary.passed


def test_a_step_is_certainly_failing_once_the_misses_cross_the_fail_boundary() -> None:
    slow = record(ttft=2.0)
    assert certainly_failing([slow] * 2, SLOS) is None
    message = certainly_failing([slow] * 3, SLOS)
    assert message is not None and "3 of 3 requests missed" in message
    assert certainly_failing([record()] * 20 + [slow] * 3, SLOS) is None


def test_a_look_judges_only_requests_sent_before_the_oldest_still_in_flight() -> None:
    fast_late = dataclasses.replace(record(), sent_at=2.0)
    slow_early = dataclasses.replace(record(ttft=2.0), sent_at=0.5)
    early = dataclasses.replace(record(), sent_at=0.1)
    # A request sent at 1.0 is still in flight: the fast one sent after it waits for it.
    assert judged_so_far([fast_late, slow_early, early], oldest_in_flight=1.0) == [early, slow_early]
    assert judged_so_far([fast_late, slow_early, early], oldest_in_flight=None) == [early, slow_early, fast_late]


def test_engine_samples_become_p90_usage_mean_queue_and_preemptions_over_the_step() -> None:
    samples = tuple(
        EngineSample(
            t=i / 2,
            kv_cache_usage_ratio=i / 10,
            requests_running=4.0,
            requests_waiting=float(i % 2),
            preemptions_total=100.0 + i,
        )
        for i in range(11)
    )
    summary = summarize(step([record()] * 30, samples), SLOS)
    assert summary.kv_cache_usage_ratio == pytest.approx(0.9)
    assert summary.kv_cache_usage_max == pytest.approx(1.0)
    assert summary.requests_waiting == pytest.approx(5 / 11)
    assert summary.preemptions == 10.0
    assert summary.engine == samples


def test_a_step_without_engine_samples_has_no_engine_readings() -> None:
    summary = summarize(step([record()] * 30), SLOS)
    assert summary.kv_cache_usage_ratio is None
    assert summary.requests_waiting is None
    assert summary.preemptions is None


def test_a_step_without_requests_fails_to_pass() -> None:
    summary = summarize(step([]), SLOS)
    assert summary.slo_attainment is None
    assert not summary.passed
    assert summary.request_rate == 0.0


def test_an_unsure_step_runs_on_only_when_the_extension_can_reach_a_pass() -> None:
    slos = SloSpec(ttft_seconds=0.5, itl_seconds=None, objective=0.99)  # 194 good in a row pass
    assert worth_extending([record()] * 100, slos, extension_share=1.0)  # as long again gives 200
    assert not worth_extending([record()] * 40, slos, extension_share=1.0)  # 80 at best
    assert not worth_extending([record()] * 200, slos, extension_share=1.0)  # already a pass


PLANNED = 20  # a 5 s step read at 4 Hz


def sample(usage: float, waiting: float, preemptions: float = 0.0) -> EngineSample:
    return EngineSample(
        t=0.0, kv_cache_usage_ratio=usage, requests_running=4.0, requests_waiting=waiting, preemptions_total=preemptions
    )


def test_a_step_is_certainly_saturated_once_no_sample_to_come_can_undo_its_signals() -> None:
    # 20 planned samples: p90 at the ceiling needs 20 - floor(0.9 x 19) = 3 full, the queue's tenth 2 waiting.
    enough = [sample(0.97, 1)] * 2 + [sample(0.97, 0)] + [sample(0.5, 0)] * 2
    assert certainly_saturated(enough, PLANNED) == (
        "certainly saturated: KV cache full in 3 and requests waiting in 2 of 5 samples"
    )
    # The worst the rest of the step could bring (an empty cache, nothing waiting) leaves both signals standing.
    assert {"kv_full", "queue"} <= set(engine_signals(enough + [sample(0.0, 0)] * (PLANNED - len(enough))))


@pytest.mark.parametrize(
    "samples",
    [
        [sample(0.97, 1)] * 2 + [sample(0.5, 0)] * 3,  # 2 full: the rest of the step could pull p90 under
        [sample(0.97, 1)] + [sample(0.97, 0)] * 4,  # 1 waiting: the rest could leave it under a tenth
        [sample(0.94, 3)] * 5,  # a queue, but the cache is not at the ceiling
        [sample(0.97, 1)] * 4,  # too early: under a quarter of the step read
    ],
)
def test_a_step_is_not_ended_while_the_rest_of_it_could_still_undo_a_signal(samples: list[EngineSample]) -> None:
    assert certainly_saturated(samples, PLANNED) is None
    if len(samples) >= PLANNED / 4:
        # Exact, not merely cautious: the worst continuation does lose a signal.
        rest = [sample(0.0, 0)] * (PLANNED - len(samples))
        assert not {"kv_full", "queue"} <= set(engine_signals(samples + rest))


def test_a_preemption_is_saturation_at_once() -> None:
    samples = [sample(0.6, 0, 7.0)] * 4 + [sample(0.6, 0, 8.0)]
    assert certainly_saturated(samples, PLANNED) == "certainly saturated: the engine preempted requests"


def test_an_absurd_queue_on_the_engine_s_page_keeps_a_finite_mean_and_a_threshold() -> None:
    # 1e308 waiting is a number the page may hold; two of them summed are infinity, which result.json cannot hold.
    engine = tuple(EngineSample(t, 0.5, 1e308, 1e308, 0.0) for t in (0.0, 0.25, 0.5))
    summary = summarize(step([record()] * 20, engine), SLOS)
    assert summary.requests_waiting == pytest.approx(1e308)
    assert summary.requests_running == pytest.approx(1e308)
    assert derive_thresholds(summary).queue is not None
