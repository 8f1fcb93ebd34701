import pytest

from exporter.loadtest.judge import (
    early_failure,
    min_requests,
    settled,
    summarize,
    verdict,
    wilson_interval,
    worth_extending,
)
from exporter.loadtest.measure import EngineSample, RequestRecord, SloSpec, StepRun

SLOS = SloSpec(ttft_seconds=0.5, itl_seconds=0.05, objective=0.9)


def record(ttft: float = 0.1, itl: tuple[float, ...] = (0.02, 0.02), error: str | None = None) -> RequestRecord:
    return RequestRecord(
        sent_at=0.0,
        ttft_seconds=None if error else ttft,
        itl_seconds=() if error else itl,
        e2e_seconds=None if error else ttft + sum(itl),
        prompt_tokens=None if error else 100,
        output_tokens=None if error else len(itl) + 1,
        error=error,
    )


def step(requests: list[RequestRecord], engine: tuple[EngineSample, ...] = ()) -> StepRun:
    return StepRun(
        concurrency=4,
        duration_seconds=10.0,
        requests=tuple(requests),
        engine=engine,
        engine_error=None,
        client_lag_p99_seconds=0.001,
        ended_early=None,
        window_seconds=10.0,
        completed_in_window=sum(1 for r in requests if r.completed),
        output_tokens_in_window=sum(r.output_tokens or 0 for r in requests if r.completed),
    )


@pytest.mark.parametrize(("objective", "needed"), [(0.99, 300), (0.9, 30), (0.95, 60), (0.5, 20), (0.999, 3000)])
def test_min_requests_expects_three_misses_at_the_objective_and_at_least_twenty(objective: float, needed: int) -> None:
    assert min_requests(objective) == needed


def test_wilson_interval_matches_the_published_value_and_stays_in_zero_to_one() -> None:
    # Wilson (1927) / Newcombe (1998) example: 81 of 263, 95% interval 0.2553 to 0.3662.
    low, high = wilson_interval(81, 263)
    assert low == pytest.approx(0.2553, abs=5e-4)
    assert high == pytest.approx(0.3662, abs=5e-4)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_a_step_fails_only_when_the_upper_bound_is_under_the_objective() -> None:
    assert verdict(good=5, total=10, objective=0.9) == "fail"
    assert verdict(good=9, total=10, objective=0.9) == "unsure"  # upper bound 0.98: may still pass


def test_a_step_passes_only_with_enough_requests_meeting_the_objective() -> None:
    assert verdict(good=29, total=29, objective=0.9) == "unsure"
    assert verdict(good=27, total=30, objective=0.9) == "pass"
    assert verdict(good=26, total=30, objective=0.9) == "unsure"


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
    bursty = record(itl=(0.01, 0.01, 0.12))
    slow = record(itl=(0.06, 0.07))
    summary = summarize(step([bursty] * 20 + [slow] * 10), SLOS)
    assert summary.slo_attainment == pytest.approx(20 / 30)
    assert summary.failing_slo == "itl"
    assert summary.itl_p99_seconds == pytest.approx(0.12)


def test_an_unsure_step_is_decided_by_its_point_estimate() -> None:
    summary = summarize(step([record()] * 12), SLOS)
    assert summary.verdict == "unsure"
    assert summary.passed


def test_a_step_is_certainly_failing_only_after_ten_requests() -> None:
    slow = record(ttft=2.0)
    assert early_failure([slow] * 9, SLOS) is None
    message = early_failure([slow] * 10, SLOS)
    assert message is not None and "after 10 requests" in message
    assert early_failure([record()] * 9 + [slow], SLOS) is None


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


def test_a_step_is_settled_once_it_passes_with_the_requests_a_pass_needs() -> None:
    slos = SloSpec(ttft_seconds=0.5, itl_seconds=None, objective=0.9)
    assert settled([record()] * 29, slos) is None  # a pass at 0.9 needs 30 requests
    assert settled([record()] * 30, slos) == "passing: 30 of 30 requests met the SLOs"
    assert "certainly failing" in str(settled([record(ttft=2.0)] * 10, slos))


def test_an_unsure_step_runs_on_only_when_the_extension_can_reach_a_pass() -> None:
    slos = SloSpec(ttft_seconds=0.5, itl_seconds=None, objective=0.99)  # a pass needs 300 requests
    assert worth_extending([record()] * 150, slos)  # twice as long gives 300
    assert not worth_extending([record()] * 40, slos)  # concurrency 1 on a slow server: 80 at best
    assert not worth_extending([record()] * 300, slos)  # already a pass: nothing to extend for
