"""Load-test results built by hand for the output tests: several steps with a knee below the saturation point, the
saturation point below the knee, one step, no answer, interrupted."""

from dataclasses import replace

from exporter.loadtest.judge import KV_FULL_RATIO, QUEUE_SAMPLE_SHARE, EngineSignal, StepSummary
from exporter.loadtest.measure import EngineSample, SloSpec
from exporter.loadtest.outputs import RunResult, RunSettings
from exporter.loadtest.search import Saturation, Search

SLOS = SloSpec(ttft_seconds=0.5, itl_seconds=0.05, objective=0.9)


def engine_series(kv_end: float, waiting_end: float, seconds: int = 10) -> tuple[EngineSample, ...]:
    """Readings at 2 Hz rising linearly to the given KV usage and queue."""
    count = seconds * 2
    return tuple(
        EngineSample(
            t=i / 2,
            kv_cache_usage_ratio=kv_end * (i + 1) / count,
            requests_running=float(i % 4),
            requests_waiting=waiting_end * i / count,
            preemptions_total=0.0,
        )
        for i in range(count)
    )


def step(concurrency: int, *, passed: bool, kv: float | None = 0.5, waiting: float | None = 0.0) -> StepSummary:
    """A step whose engine readings rise to `kv` and `waiting`; its engine signals are the judge's reading of them
    (the KV cache full at KV_FULL_RATIO, a queue in QUEUE_SAMPLE_SHARE of the samples)."""
    attainment = 0.97 if passed else 0.6
    requests = 40 * concurrency
    early = f"certainly failing: {round(requests * (1 - attainment))} of {requests} requests missed (sequential test)"
    engine = () if kv is None else engine_series(kv, waiting or 0.0)
    waited = [sample.requests_waiting or 0.0 for sample in engine]
    waiting_share = sum(1 for value in waited if value > 0) / len(waited) if waited else None
    signals: list[EngineSignal] = []
    if kv is not None and kv >= KV_FULL_RATIO:
        signals.append("kv_full")
    if waiting_share is not None and waiting_share >= QUEUE_SAMPLE_SHARE:
        signals.append("queue")
    return StepSummary(
        concurrency=concurrency,
        request_rate=2.0 * concurrency,
        output_tokens_per_second=64.0 * concurrency,
        kv_cache_usage_ratio=kv,
        kv_cache_usage_max=None if kv is None else min(1.0, kv + 0.02),
        requests_waiting=waiting,
        requests_running=float(concurrency),
        waiting_sample_share=waiting_share,
        preemptions=0.0,
        engine_signals=tuple(signals),
        ttft_p50_seconds=0.05 * concurrency,
        ttft_p99_seconds=0.1 * concurrency,
        itl_p50_seconds=0.004 * concurrency,
        itl_p99_seconds=0.008 * concurrency,
        e2e_p50_seconds=0.8 + 0.2 * concurrency,
        e2e_p99_seconds=1.0 + 0.3 * concurrency,
        slo_attainment=attainment,
        attainment_low=attainment - 0.05,
        attainment_high=min(1.0, attainment + 0.03),
        requests=requests,
        errors=0 if passed else 3,
        duration_seconds=10.0,
        warmup_seconds=5.0,
        verdict="pass" if passed else "fail",
        passed=passed,
        failing_slo=None if passed else "itl",
        client_lag_p99_seconds=0.002,
        ended_early=None if passed else early,
        interrupted=False,
        engine=engine,
        engine_error="cannot reach http://127.0.0.1:9/metrics" if kv is None else None,
    )


def settings() -> RunSettings:
    return RunSettings(
        target=None,
        endpoint="http://127.0.0.1:8000/v1/completions",
        model="tiny-llama",
        started_at="2025-01-02T03:04:05Z",
        slos=SLOS,
        workload={"kind": "fixed", "prompt_tokens": 64, "output_tokens": 32},
        max_concurrency=64,
        tolerance=0.1,
        margin=0.05,
        lead_time_seconds=900.0,
    )


def several_steps() -> RunResult:
    """1, 2, 4, 8 pass, 16 fails, bisection passes 12 and fails 14: the knee is 12. The KV cache is full from 14
    on, with requests waiting: the saturation point is 14, above the knee, so the knee is the operating point."""
    steps = (
        step(1, passed=True, kv=0.1),
        step(2, passed=True, kv=0.2),
        step(4, passed=True, kv=0.4),
        step(8, passed=True, kv=0.7, waiting=0.2),
        step(16, passed=False, kv=0.99, waiting=6.5),
        step(12, passed=True, kv=0.86, waiting=1.3),
        step(14, passed=False, kv=0.95, waiting=3.0),
    )
    search = Search(
        knee=steps[5],
        knee_range=(12, 12),
        saturation=Saturation(steps[6], ("kv_full", "queue"), below=12),
        steps=steps,
        limited_by="kv_cache",
        reason="The engine saturated at concurrency 14: its KV cache filled (KV usage 95% (p90), requests waiting "
        "in 95% of the engine's samples); the SLOs broke at concurrency 14.",
    )
    return RunResult(settings=settings(), search=search, model_prediction=None, interrupted=False, notes=())


def saturated_below_knee() -> RunResult:
    """Every step meets the SLOs up to 16, but from 8 on requests queue while throughput stays flat: the engine
    saturated at 8 (a batch limit, its KV cache half empty), below the knee, so 8 is the operating point."""
    steps = (
        step(1, passed=True, kv=0.1),
        step(2, passed=True, kv=0.2),
        step(4, passed=True, kv=0.35),
        step(8, passed=True, kv=0.6, waiting=2.0),
        replace(step(16, passed=True, kv=0.62, waiting=9.0), request_rate=16.2),
        step(6, passed=True, kv=0.5),
    )
    search = Search(
        knee=steps[4],
        knee_range=(16, 16),
        saturation=Saturation(steps[3], ("throughput_plateau", "queue"), below=6),
        steps=steps,
        limited_by="saturation",
        reason="The engine saturated at concurrency 8 with room in its KV cache (KV usage 60% (p90), requests "
        "waiting in 95% of the engine's samples, throughput flat at 16.0 requests/s): a batch limit (max running "
        "requests) or compute holds it.",
    )
    return RunResult(settings=settings(), search=search, model_prediction=None, interrupted=False, notes=())


def one_step() -> RunResult:
    only = step(1, passed=True, kv=0.3)
    search = Search(
        knee=only,
        knee_range=(1, 1),
        saturation=None,
        steps=(only,),
        limited_by="max_concurrency",
        reason="Nothing failed up to 1.",
    )
    return RunResult(
        settings=replace(settings(), max_concurrency=1),
        search=search,
        model_prediction=None,
        interrupted=False,
        notes=(),
    )


def no_knee() -> RunResult:
    failing = step(1, passed=False, kv=None, waiting=None)
    search = Search(
        knee=None,
        knee_range=None,
        saturation=None,
        steps=(failing,),
        limited_by="slo:itl",
        reason="Concurrency 1 already misses ITL.",
    )
    return RunResult(settings=settings(), search=search, model_prediction=None, interrupted=False, notes=())


def interrupted() -> RunResult:
    steps = (step(1, passed=True), replace(step(2, passed=True), interrupted=True, requests=7))
    search = Search(
        knee=steps[0],
        knee_range=(1, 1),
        saturation=None,
        steps=steps,
        limited_by="none",
        reason="Interrupted at concurrency 2.",
    )
    return RunResult(
        settings=settings(), search=search, model_prediction=None, interrupted=True, notes=("interrupted by Ctrl-C",)
    )
