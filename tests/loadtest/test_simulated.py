"""The simulated engine behaves as its parameters say, so the search tests built on it mean something."""

import pytest

from exporter.loadtest.judge import SequentialTest, summarize
from exporter.loadtest.measure import SloSpec
from exporter.loadtest.sketch import RELATIVE_ACCURACY
from tests.support.simulated_engine import SimulatedEngine, SimulatedWorkload, simulated_step

FIXED = SimulatedWorkload(prompt_tokens=64, output_tokens=32)


def test_inter_token_latency_is_the_base_plus_the_per_request_cost_of_the_batch() -> None:
    engine = SimulatedEngine(itl_base_seconds=0.02, itl_per_request_seconds=0.001, prefill_seconds_per_token=0.0)
    run = simulated_step(engine, 8, FIXED, duration=5.0, warmup=1.0)
    # A full batch of 8 while the window is open; smaller ones only as the last requests drain after it.
    assert run.itl_gaps.quantile(0.5) == pytest.approx(0.028, rel=RELATIVE_ACCURACY)
    assert run.itl_gaps.minimum_seconds >= 0.021 - 1e-9
    assert run.itl_gaps.maximum_seconds == pytest.approx(0.028)
    means = {round(record.mean_itl_seconds or 0.0, 9) for record in run.requests if record.completed}
    assert means and all(0.021 - 1e-9 <= mean <= 0.028 + 1e-9 for mean in means)


def test_requests_sent_during_the_warm_up_are_discarded() -> None:
    run = simulated_step(SimulatedEngine(), 4, FIXED, duration=3.0, warmup=2.0)
    assert run.requests
    assert min(record.sent_at for record in run.requests) >= 0.0
    assert run.window_seconds == pytest.approx(3.0)


def test_a_small_kv_pool_fills_and_preempts_instead_of_growing_the_batch() -> None:
    # 40 blocks of 16 tokens: 6 requests of 96 tokens each.
    run = simulated_step(SimulatedEngine(kv_blocks=40), 16, FIXED, duration=5.0, warmup=1.0)
    assert max(sample.kv_cache_usage_ratio or 0 for sample in run.engine) >= 0.95
    assert max(sample.requests_running or 0 for sample in run.engine) <= 7
    assert max(sample.requests_waiting or 0 for sample in run.engine) >= 9
    assert run.engine[-1].preemptions_total


def test_past_the_queue_bound_new_requests_are_refused() -> None:
    run = simulated_step(SimulatedEngine(max_batch=4, queue_bound=2), 10, FIXED, duration=3.0, warmup=1.0)
    errors = {record.error for record in run.requests}
    assert errors == {None, "http 503"}
    assert max(sample.requests_waiting or 0 for sample in run.engine) <= 2


def test_a_certainly_failing_step_ends_early_says_why_and_still_judges_the_requests_in_flight() -> None:
    slos = SloSpec(ttft_seconds=0.001, itl_seconds=None, objective=0.99)
    run = simulated_step(SimulatedEngine(), 4, FIXED, duration=30.0, slos=slos, warmup=1.0)
    assert run.ended_early is not None and "certainly failing" in run.ended_early
    assert run.duration_seconds < 5.0
    # Every request sent before the end was awaited: 4 clients, each sent one after its last until the end.
    assert run.window_seconds < run.duration_seconds
    assert all(record.completed for record in run.requests)


def test_an_unsure_step_that_cannot_reach_a_pass_is_not_extended() -> None:
    slos = SloSpec(ttft_seconds=1.0, itl_seconds=None, objective=0.99)
    # One request at a time, about 0.4 s each: 10 s holds 25 requests, and 20 s would not hold the 194 a pass needs.
    run = simulated_step(SimulatedEngine(), 1, FIXED, duration=10.0, slos=slos, warmup=1.0)
    assert len(run.requests) < SequentialTest(0.99).good_requests_to_pass(0, 0)
    assert run.window_seconds == pytest.approx(10.0, abs=0.5)


def test_an_unsure_step_is_extended_until_it_passes_and_a_passing_step_runs_its_whole_duration() -> None:
    slos = SloSpec(ttft_seconds=1.0, itl_seconds=None, objective=0.99)
    # Four at a time, about 0.4 s each: 10 s holds ~100 requests, 20 s the 194 a pass needs.
    extended = simulated_step(SimulatedEngine(), 4, FIXED, duration=10.0, slos=slos, warmup=1.0)
    assert 10.0 < extended.window_seconds <= 20.0
    assert len(extended.requests) >= SequentialTest(0.99).good_requests_to_pass(0, 0)
    assert summarize(extended, slos).verdict == "pass"
    # Twice as many pass within the planned 10 s, and still run all of it: a passing step is never cut short.
    whole = simulated_step(SimulatedEngine(), 16, FIXED, duration=10.0, slos=slos, warmup=1.0)
    assert whole.ended_early is None
    assert whole.window_seconds == pytest.approx(10.0, abs=0.01)
