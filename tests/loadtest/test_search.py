"""The knee search over simulated engines whose true knee is known by brute force, and over scripted steps."""

import asyncio
import dataclasses
import math
from collections.abc import Callable

import pytest

from exporter.loadtest.judge import StepSummary, summarize
from exporter.loadtest.measure import SloSpec, StepRun
from exporter.loadtest.search import Search, find_knee, pool_start
from tests.support.simulated_engine import (
    SimulatedEngine,
    SimulatedWorkload,
    brute_force_knee,
    simulated_step,
    step_runner,
)

TOLERANCE = 0.1
MAX_CONCURRENCY = 64
DURATION, WARMUP = 10.0, 2.0
WORKLOAD = SimulatedWorkload(prompt_tokens=256, output_tokens=64, spread=0.2, seed=7)

# Each shape is limited by one thing, the others far away.
SHAPES: dict[str, tuple[SimulatedEngine, SloSpec, str]] = {
    # ITL grows with the batch: 20 ms + 1 ms per request breaks a 60 ms objective near 40 requests.
    "slo-limited": (
        SimulatedEngine(itl_base_seconds=0.02, itl_per_request_seconds=0.001),
        SloSpec(ttft_seconds=1.0, itl_seconds=0.06, objective=0.99),
        "slo:itl",
    ),
    # 400 blocks of 16 tokens hold about 20 requests of 320 tokens: past that, requests queue and are preempted.
    "kv-limited": (
        SimulatedEngine(kv_blocks=400, itl_base_seconds=0.02),
        SloSpec(ttft_seconds=0.5, itl_seconds=0.06, objective=0.99),
        "kv_cache",
    ),
    # A proxy in front refuses a 25th concurrent request while the engine still has room.
    "error-limited": (
        SimulatedEngine(itl_base_seconds=0.02, max_in_flight=24),
        SloSpec(ttft_seconds=10.0, itl_seconds=0.06, objective=0.99),
        "errors",
    ),
}


def search(engine: SimulatedEngine, slos: SloSpec, max_concurrency: int = MAX_CONCURRENCY) -> Search:
    runner = step_runner(engine, WORKLOAD, slos, DURATION, WARMUP)
    return asyncio.run(find_knee(runner, max_concurrency, TOLERANCE, latency_slos=slos.judges_latency))


@pytest.mark.parametrize("shape", SHAPES)
def test_the_knee_found_is_the_true_knee_within_the_tolerance(shape: str) -> None:
    engine, slos, _ = SHAPES[shape]
    true_knee, passed = brute_force_knee(engine, WORKLOAD, slos, MAX_CONCURRENCY, DURATION, WARMUP)
    assert passed == tuple(sorted(passed, reverse=True)), "the simulated shape should pass monotonically"
    assert true_knee is not None and true_knee < MAX_CONCURRENCY
    found = search(engine, slos)
    assert found.knee is not None
    assert abs(found.knee.concurrency - true_knee) <= max(1, TOLERANCE * true_knee)


@pytest.mark.parametrize("shape", SHAPES)
def test_limited_by_names_what_the_simulated_engine_ran_out_of(shape: str) -> None:
    engine, slos, limit = SHAPES[shape]
    assert search(engine, slos).limited_by == limit


def test_a_lagging_load_generator_is_reported_as_the_limit_not_the_server() -> None:
    engine, slos, _ = SHAPES["kv-limited"]
    found = search(dataclasses.replace(engine, client_lag_seconds=0.08), slos)
    assert found.limited_by == "client"
    assert "80 ms" in found.reason


def test_doubling_then_bisection_runs_only_the_answer_and_the_level_above_it_twice() -> None:
    engine, slos, _ = SHAPES["slo-limited"]
    found = search(engine, slos)
    ran = [step.concurrency for step in found.steps]
    assert ran[:7] == [1, 2, 4, 8, 16, 32, 64]
    repeated = sorted(level for level in set(ran) if ran.count(level) > 1)
    assert found.knee is not None
    assert repeated == sorted(ran[-2:]) and ran[-2] == found.knee.concurrency
    assert all(ran.count(level) <= 2 for level in ran)


def _kv_truth(slos: SloSpec) -> int:
    engine, _, _ = SHAPES["kv-limited"]
    return min(
        level
        for level in range(16, 33)
        if summarize(simulated_step(engine, level, WORKLOAD, DURATION, warmup=WARMUP), slos).engine_saturated
    )


NO_SLO = SloSpec(ttft_seconds=None, itl_seconds=None, objective=0.99)


def test_the_kv_usage_at_concurrency_one_sends_the_rise_straight_under_the_pool_skipping_the_doublings() -> None:
    engine, _, _ = SHAPES["kv-limited"]
    truth = _kv_truth(NO_SLO)
    found = search(engine, NO_SLO)
    assert found.saturation is not None
    assert (found.saturation.step.concurrency, found.saturation.below) == (truth, truth - 1)
    ran = [step.concurrency for step in found.steps]
    # The usage at 1 (5.3% of the pool) predicts 19; at 18 the usage measured there predicts 22, which saturates.
    assert ran[:3] == [1, 18, 22], ran
    assert not {2, 4, 8, 16}.intersection(ran), ran
    # Past the saturation bracket's rise: a quarter above it (28), then at most two steps into (18, 22), then the
    # confirmation (the last two). Doubling to 32 then bisecting (16, 32) took nine levels before the confirmation.
    assert len(ran[:-2]) <= 6, ran


def search_from(engine: SimulatedEngine, slos: SloSpec, start: int) -> Search:
    runner = step_runner(engine, WORKLOAD, slos, DURATION, WARMUP)
    return asyncio.run(find_knee(runner, MAX_CONCURRENCY, TOLERANCE, latency_slos=slos.judges_latency, start=start))


def test_the_start_is_what_the_pool_holds_less_one_block_in_whole_blocks() -> None:
    # The integration tests' vLLM engine: 32 blocks of 128 tokens, requests of 200 tokens hold two blocks each; vLLM
    # keeps one block back, so 15 run at once and the 16th waits.
    assert pool_start(32 * 128, 128, 200) == 15
    # A pool counted in tokens (SGLang): no block to round to.
    assert pool_start(10_000, None, 300) == 33
    # A request larger than the pool: the search starts at 1.
    assert pool_start(4096, 16, 10_000) == 1


def test_a_start_at_the_pool_finds_the_same_saturation_point_in_fewer_levels() -> None:
    engine, _, _ = SHAPES["kv-limited"]
    truth = _kv_truth(NO_SLO)
    start = pool_start(engine.kv_blocks * engine.block_tokens, engine.block_tokens, 256 + 64)
    from_one, from_pool = search(engine, NO_SLO), search_from(engine, NO_SLO, start)
    for found in (from_one, from_pool):
        assert found.saturation is not None
        assert (found.saturation.step.concurrency, found.saturation.below) == (truth, truth - 1)
    ran = [step.concurrency for step in from_pool.steps]
    assert ran[0] == start and min(ran) == start, ran
    assert len(ran) < len(from_one.steps), (ran, [step.concurrency for step in from_one.steps])


def test_a_start_past_the_saturation_point_is_bisected_down_to_it() -> None:
    engine, _, _ = SHAPES["kv-limited"]
    truth = _kv_truth(NO_SLO)
    found = search_from(engine, NO_SLO, 2 * truth)
    assert found.saturation is not None
    assert (found.saturation.step.concurrency, found.saturation.below) == (truth, truth - 1)


def test_a_start_at_the_maximum_on_a_batch_limited_engine_finds_the_saturation_point_under_it() -> None:
    # 16 batch slots and a pool that holds far more than the maximum: the start is the maximum, where requests queue
    # with the KV cache nearly empty, and with no level above it no throughput plateau can be judged there.
    engine = SimulatedEngine(itl_base_seconds=0.02, max_batch=16)
    from_one, from_max = search(engine, NO_SLO), search_from(engine, NO_SLO, MAX_CONCURRENCY)
    assert from_one.saturation is not None and from_one.limited_by == "saturation"
    assert from_max.saturation is not None, [step.concurrency for step in from_max.steps]
    assert from_max.limited_by == "saturation"
    assert from_max.saturation.step.concurrency == from_one.saturation.step.concurrency
    assert from_max.saturation.below == from_one.saturation.below


@pytest.mark.parametrize("start", [1, MAX_CONCURRENCY])
def test_a_latency_slo_does_not_move_the_saturation_point_of_a_batch_limited_engine(start: int) -> None:
    # 16 batch slots: the 17th request waits and the throughput is flat from there on. With a TTFT objective the
    # steps over it fail and end early, and a short window's throughput is lumpy (16 requests finish together):
    # 11.6 requests/s at 20 against 8.9 over a whole step. One such step must not hide the plateau under it.
    engine = SimulatedEngine(itl_base_seconds=0.02, max_batch=16)
    slos = SloSpec(ttft_seconds=0.5, itl_seconds=0.06, objective=0.99)
    for found in (search_from(engine, NO_SLO, start), search_from(engine, slos, start)):
        assert found.saturation is not None, [step.concurrency for step in found.steps]
        assert (found.saturation.step.concurrency, found.saturation.below) == (17, 16), [
            (step.concurrency, round(step.request_rate, 2)) for step in found.steps
        ]
        assert found.saturation.signals == ("throughput_plateau", "queue")


def test_a_start_whose_step_fails_finds_the_knee_under_it() -> None:
    engine, slos, _ = SHAPES["slo-limited"]
    true_knee, _ = brute_force_knee(engine, WORKLOAD, slos, MAX_CONCURRENCY, DURATION, WARMUP)
    assert true_knee is not None
    found = search_from(engine, slos, MAX_CONCURRENCY)
    assert found.steps[0].concurrency == MAX_CONCURRENCY and not found.steps[0].passed
    assert found.knee is not None
    assert abs(found.knee.concurrency - true_knee) <= max(1, TOLERANCE * true_knee)


async def _pool_of_15(concurrency: int) -> StepSummary:
    """vLLM's pool of 15 requests: at 15 its KV cache is full and nothing waits; from 16, requests queue (14.6 run
    on average: requests end and the next start between samples); the SLO holds to 16."""
    slos = SloSpec(ttft_seconds=0.5, itl_seconds=None, objective=0.9)
    run = StepRun(concurrency, 10.0, (), (), "unreachable", 0.001, None, 10.0, 0, 0)
    signals = ("kv_full", "queue") if concurrency > 15 else ("kv_full",) if concurrency == 15 else ()
    return dataclasses.replace(
        summarize(run, slos),
        passed=concurrency <= 16,
        kv_cache_usage_ratio=0.97 * min(1.0, concurrency / 15),
        requests_running=min(14.6, concurrency - 0.4),
        engine_signals=signals,
    )


def test_a_level_that_fills_the_pool_without_a_queue_is_followed_by_one_more_request() -> None:
    found = asyncio.run(find_knee(_pool_of_15, 32, TOLERANCE, latency_slos=True, start=15))
    # 16 next (doubling to 30 and bisecting back took three levels more), a quarter above it where the SLO fails,
    # and the confirmation.
    assert [step.concurrency for step in found.steps] == [15, 16, 20, 15, 16]
    assert found.saturation is not None and found.saturation.step.concurrency == 16


def test_a_start_one_level_past_the_pool_probes_one_under_it_first() -> None:
    # A request a block larger than the one measured alone put the start at 16, saturated.
    found = asyncio.run(find_knee(_pool_of_15, 32, TOLERANCE, latency_slos=True, start=16))
    # 15 next (14.6 requests ran at 16), not a bisection from 0 (8, 12, 14, 15): three levels fewer.
    assert [step.concurrency for step in found.steps] == [16, 20, 15, 15, 16]
    assert found.saturation is not None and (found.saturation.step.concurrency, found.saturation.below) == (16, 15)


def test_no_knee_when_every_level_down_to_one_fails_from_a_higher_start() -> None:
    steps = scripted(knee=0)

    async def run_step(concurrency: int) -> StepSummary:
        return steps(concurrency)

    found = asyncio.run(find_knee(run_step, 512, TOLERANCE, latency_slos=True, start=40))
    ran = [step.concurrency for step in found.steps]
    assert found.knee is None
    assert ran[0] == 40 and 1 in ran, ran


def test_an_slo_knee_above_the_saturation_point_is_bracketed_to_a_quarter_not_the_tolerance() -> None:
    engine, _, _ = SHAPES["kv-limited"]
    # A TTFT of 1.5 s holds past the pool (21 requests): the queue's wait breaks it between 27 and 33.
    loose = SloSpec(ttft_seconds=1.5, itl_seconds=None, objective=0.99)
    found = search(engine, loose, max_concurrency=128)
    assert found.saturation is not None and found.knee is not None
    assert found.knee.concurrency > found.saturation.step.concurrency
    ran = [step.concurrency for step in found.steps]
    failing = [
        step.concurrency for step in found.steps if not step.passed and step.concurrency > found.knee.concurrency
    ]
    assert failing, ran
    gap = min(failing) - found.knee.concurrency
    assert 0.1 * found.knee.concurrency < gap <= 0.25 * found.knee.concurrency or gap <= 1, ran
    # The rise past the first saturated level (22) went a quarter above it, where the SLO failed, and no higher: the
    # doubling to 44 and the bisection back down cost two more levels.
    first_saturated = next(step.concurrency for step in found.steps if step.engine_saturated)
    assert max(ran) == math.ceil(1.25 * first_saturated), ran


def test_a_server_that_never_fails_is_limited_by_the_maximum_concurrency_tried_last() -> None:
    engine, slos, _ = SHAPES["slo-limited"]
    found = search(engine, slos, max_concurrency=20)
    assert [step.concurrency for step in found.steps] == [1, 2, 4, 8, 16, 20]
    assert found.knee is not None and found.knee.concurrency == 20
    assert found.limited_by == "max_concurrency"


def scripted(knee: int, interrupt_at: int | None = None) -> Callable[[int], StepSummary]:
    """Steps that pass up to `knee`, fail above, and are interrupted at `interrupt_at`."""
    slos = SloSpec(ttft_seconds=0.5, itl_seconds=None, objective=0.9)

    def run(concurrency: int) -> StepSummary:
        run = StepRun(
            concurrency, 10.0, (), (), "unreachable", 0.001, None, 10.0, 0, 0, interrupted=concurrency == interrupt_at
        )
        return dataclasses.replace(summarize(run, slos), passed=concurrency <= knee)

    return run


def run_scripted(knee: int, max_concurrency: int, interrupt_at: int | None = None) -> Search:
    steps = scripted(knee, interrupt_at)

    async def run_step(concurrency: int) -> StepSummary:
        return steps(concurrency)

    return asyncio.run(find_knee(run_step, max_concurrency, TOLERANCE, latency_slos=True))


def test_past_the_saturation_point_the_rise_goes_a_quarter_at_a_time_and_needs_no_bisection() -> None:
    slos = SloSpec(ttft_seconds=0.5, itl_seconds=None, objective=0.9)

    async def run_step(concurrency: int) -> StepSummary:
        # Saturated from 16 with the KV cache full; queueing alone breaks the SLO above 22.
        run = StepRun(concurrency, 10.0, (), (), "unreachable", 0.001, None, 10.0, 0, 0)
        signals = ("kv_full", "queue") if concurrency >= 16 else ()
        return dataclasses.replace(summarize(run, slos), passed=concurrency <= 22, engine_signals=signals)

    found = asyncio.run(find_knee(run_step, 64, TOLERANCE, latency_slos=True))
    ran = [step.concurrency for step in found.steps]
    # 16 saturates, 20 and 25 are a quarter apart: 25 fails, and (20, 25) is as close as a knee past saturation
    # needs. Doubling to 32 and bisecting back took three levels more.
    assert ran[:6] == [1, 2, 4, 8, 16, 20], ran
    assert ran[6] == 25 and 32 not in ran, ran
    assert found.knee is not None and found.knee.concurrency == 20
    assert found.saturation is not None and found.saturation.step.concurrency <= 16


def test_bisection_stops_within_the_tolerance_of_the_knee() -> None:
    found = run_scripted(knee=300, max_concurrency=512)
    assert found.knee is not None
    assert 300 - found.knee.concurrency <= 0.1 * found.knee.concurrency
    assert [step.concurrency for step in found.steps][:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def test_no_knee_when_concurrency_one_fails() -> None:
    found = run_scripted(knee=0, max_concurrency=512)
    assert found.knee is None
    assert [step.concurrency for step in found.steps] == [1]


def test_an_interrupted_step_ends_the_search_keeping_the_knee_so_far() -> None:
    found = run_scripted(knee=300, max_concurrency=512, interrupt_at=64)
    assert [step.concurrency for step in found.steps] == [1, 2, 4, 8, 16, 32, 64]
    assert found.knee is not None and found.knee.concurrency == 32
    assert found.limited_by == "none"


def test_a_maximum_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        run_scripted(knee=3, max_concurrency=0)


# A noisy engine whose KV pool (400 blocks of 16 tokens) holds about 21 requests of 320 +- 20% tokens: past it
# requests queue for a whole request's lifetime, and TTFT breaks 0.5 s. Every iteration's time is drawn from a
# log-normal with sigma 0.3, so a step's attainment is a draw, not a given.
NOISY = SimulatedEngine(kv_blocks=400, itl_base_seconds=0.02, itl_per_request_seconds=0.0005, noise=0.3)
NOISY_WORKLOAD = SimulatedWorkload(prompt_tokens=256, output_tokens=64, spread=0.2, seed=5)
NOISY_SLOS = SloSpec(ttft_seconds=0.5, itl_seconds=None, objective=0.9)
SEEDS = 20


def _true_knee(levels: range) -> int:
    """The highest concurrency whose attainment over a 600 s run (about 10,000 requests) meets the objective."""
    attainment = {
        level: summarize(simulated_step(NOISY, level, NOISY_WORKLOAD, 600.0, warmup=20.0), NOISY_SLOS).slo_attainment
        for level in levels
    }
    ordered = [attainment[level] or 0.0 for level in levels]
    assert ordered == sorted(ordered, reverse=True), f"attainment should fall with load: {attainment}"
    meeting = [level for level in levels if (attainment[level] or 0.0) >= NOISY_SLOS.objective]
    assert meeting and meeting[-1] < levels[-1], f"the knee should lie inside {levels}: {attainment}"
    return meeting[-1]


# From 1; from where the pool holds the mean request, less a block (19); from the maximum, as an engine whose pool
# is reported ten times too large, or that runs out of batch slots first, starts.
@pytest.mark.parametrize("start", [1, pool_start(400 * 16, 16, 320), 64])
def test_over_20_seeds_the_knee_is_within_one_bisection_step_of_the_truth_and_never_15_percent_above(
    start: int,
) -> None:
    truth = _true_knee(range(14, 28))
    knees = []
    for seed in range(SEEDS):
        found = asyncio.run(
            find_knee(
                step_runner(NOISY, NOISY_WORKLOAD, NOISY_SLOS, 20.0, 5.0, noise_seed=seed),
                64,
                TOLERANCE,
                latency_slos=True,
                start=start,
            )
        )
        assert found.knee is not None
        knees.append(found.knee.concurrency)
    within = [knee for knee in knees if abs(knee - truth) <= max(1.0, TOLERANCE * truth)]
    assert len(within) >= 18, (truth, knees)
    assert max(knees) <= 1.15 * truth, (truth, knees)


def test_fresh_prompts_keep_an_engine_s_prefix_cache_from_raising_the_knee() -> None:
    # Prefill-bound: 512 +- 20% prompt tokens at 0.4 ms each. A cached prompt skips its prefill entirely.
    engine = SimulatedEngine(
        itl_base_seconds=0.01, itl_per_request_seconds=0.0002, prefill_seconds_per_token=0.0004, noise=0.1
    )
    slos = SloSpec(ttft_seconds=0.4, itl_seconds=None, objective=0.9)

    def knee(prefix_cache: bool, fresh_prompts: bool) -> int | None:
        workload = SimulatedWorkload(
            prompt_tokens=512, output_tokens=64, spread=0.2, seed=1, fresh_prompts=fresh_prompts
        )
        run_step = step_runner(dataclasses.replace(engine, prefix_cache=prefix_cache), workload, slos, 20.0, 5.0)
        found = asyncio.run(find_knee(run_step, 128, TOLERANCE, latency_slos=True))
        return None if found.knee is None else found.knee.concurrency

    uncached = knee(prefix_cache=False, fresh_prompts=True)
    assert uncached is not None
    # The same prompts every step (as loadtest once sent them) let the cache serve later steps' prefills.
    assert (knee(prefix_cache=True, fresh_prompts=False) or 0) > 1.5 * uncached
    assert knee(prefix_cache=True, fresh_prompts=True) == uncached
