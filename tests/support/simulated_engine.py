"""A simulated LLM engine in virtual time, for testing the judge and the knee search (and the knee benchmark).

It behaves like a continuously batching engine (vLLM's scheduler, simplified): a KV pool of `kv_blocks` blocks of
`block_tokens` tokens; at most `max_batch` requests decode together; each engine iteration takes
`itl_base + itl_per_request x batch + prefill_per_token x tokens prefilled in it`; a request waits in a FIFO queue
while slots or blocks run out; when a running request needs a block and none is free, the newest running request is
preempted (its blocks freed, recomputed later); past `queue_bound` waiting requests, new ones are refused at once.
With `noise`, each iteration's time is multiplied by a seeded log-normal factor, so attainment near the knee is a
share, not a step function. With `prefix_cache`, a prompt the engine has seen before (any earlier step) skips its
prefill, as vLLM's prefix caching does: what a load test that repeats prompts would measure.

`simulated_step` drives it with N closed-loop clients as the runner does (clients ramped in over the first half
of the warm-up, the warm-up discarded, a look every half second with the runner's sequential test, an early end
when certainly failing, an extension while unsure, and every request sent in the window awaited) and returns the
StepRun the runner would, so the judge and the search are tested on the same values. A 30 s step runs in
milliseconds.
"""

import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from exporter.loadtest.judge import (
    MAX_EXTENSION,
    StepSummary,
    certainly_failing,
    judged_so_far,
    summarize,
    worth_extending,
)
from exporter.loadtest.measure import EngineSample, RequestRecord, SloSpec, StepRun
from exporter.loadtest.runner import CHECK_INTERVAL_SECONDS
from exporter.loadtest.sketch import DurationSummary

SAMPLE_INTERVAL_SECONDS = 0.5


@dataclass(frozen=True)
class SimulatedEngine:
    kv_blocks: int = 100_000
    block_tokens: int = 16
    max_batch: int = 1024
    itl_base_seconds: float = 0.010
    itl_per_request_seconds: float = 0.0005
    prefill_seconds_per_token: float = 0.00001
    queue_bound: int | None = None  # waiting requests past which new ones are refused ("http 503")
    max_in_flight: int | None = None  # a proxy in front: requests past this many in the engine are refused
    refusal_seconds: float = 0.05  # round trip of a refused request before its client sends again
    client_lag_seconds: float = 0.001  # how late the load generator sends: reported as its loop lag
    noise: float = 0.0  # sigma of the log-normal factor on each iteration's time (0: deterministic)
    prefix_cache: bool = False  # a prompt seen before skips its prefill


@dataclass(frozen=True)
class SimulatedWorkload:
    prompt_tokens: int = 256
    output_tokens: int = 64
    spread: float = 0.0  # each length drawn uniformly within +- this share
    seed: int = 0
    fresh_prompts: bool = True  # False: every step sends the same prompts again (what loadtest once did)


@dataclass
class EngineState:
    """What the engine keeps from one step to the next: the prompts in its prefix cache."""

    cached: set[int] = field(default_factory=set)


@dataclass
class _Request:
    client: int
    sent: float
    prompt: int
    output: int
    identity: int = 0  # which prompt: equal identities are the same text
    generated: int = 0
    blocks: int = 0
    first_token: float | None = None
    last_token: float | None = None
    gaps: DurationSummary = field(default_factory=DurationSummary)


def simulated_step(
    engine: SimulatedEngine,
    concurrency: int,
    workload: SimulatedWorkload,
    duration: float,
    *,
    slos: SloSpec | None = None,
    warmup: float = 5.0,
    timeout: float = 60.0,
    state: EngineState | None = None,
    prompts: Iterator[int] | None = None,
    noise_seed: int = 0,
) -> StepRun:
    """One load step; with `slos`, it ends early when certainly failing and extends while unsure, as the runner.
    `prompts` yields each request's prompt identity (default: a fresh one each); `state` carries the prefix cache
    between steps; `noise_seed` seeds the iteration-time noise."""
    rng = random.Random(workload.seed * 1_000_003 + concurrency)
    noise = random.Random(noise_seed * 1_000_003 + concurrency)
    state = state or EngineState()
    identities = prompts or _fresh()
    start, end, longest_end = warmup, warmup + duration, warmup + MAX_EXTENSION * duration
    next_send = [warmup / 2 * client / concurrency + engine.client_lag_seconds for client in range(concurrency)]
    waiting: deque[_Request] = deque()
    running: list[_Request] = []
    free_blocks = engine.kv_blocks
    preemptions = 0
    records: list[RequestRecord] = []
    itl_gaps = DurationSummary()  # of the measured requests that completed, as the runner keeps them
    completions: list[tuple[float, int]] = []  # (when, output tokens) of every completed request, as the runner
    samples: list[EngineSample] = []
    next_sample = start
    now = 0.0
    ended_early: str | None = None
    next_check = start

    def length(mean: int) -> int:
        return max(1, round(mean * (1 + rng.uniform(-workload.spread, workload.spread))))

    def blocks_for(tokens: int) -> int:
        return -(-tokens // engine.block_tokens)

    def preempt(request: _Request) -> None:
        nonlocal free_blocks, preemptions
        free_blocks += request.blocks
        request.blocks = 0
        waiting.appendleft(request)
        preemptions += 1

    def finish(request: _Request, at: float, error: str | None) -> None:
        nonlocal free_blocks
        free_blocks += request.blocks
        request.blocks = 0
        next_send[request.client] = at + (engine.refusal_seconds if error == "http 503" else 0.0)
        next_send[request.client] += engine.client_lag_seconds
        if error is None:
            completions.append((at, request.generated))
        if request.sent < start:
            return
        if error is None:
            itl_gaps.merge(request.gaps)
        records.append(
            RequestRecord(
                sent_at=request.sent - start,
                ttft_seconds=None if request.first_token is None else request.first_token - request.sent,
                e2e_seconds=None if error else at - request.sent,
                prompt_tokens=None if error else request.prompt,
                output_tokens=None if error else request.generated,
                error=error,
                gap_count=request.gaps.count,
                gap_total_seconds=request.gaps.total_seconds,
            )
        )

    def oldest_in_flight() -> float | None:
        sent = [r.sent - start for queue in (running, waiting) for r in queue if r.sent >= start]
        return min(sent, default=None)

    while True:
        # The runner's looks: every CHECK_INTERVAL_SECONDS of the window, the sequential test on the requests sent
        # before the oldest one in flight; at the planned end, an extension while unsure and worth it.
        while slos is not None and ended_early is None and next_check <= min(now, end):
            judged = judged_so_far(records, oldest_in_flight())
            ended_early = certainly_failing(judged, slos)
            if ended_early is not None:
                end = now
            elif next_check >= end - 1e-9 and end < longest_end:
                share = (longest_end - end) / max(end - start, 1e-9)
                if worth_extending(judged, slos, share):
                    end = min(longest_end, end + CHECK_INTERVAL_SECONDS)
            next_check += CHECK_INTERVAL_SECONDS
        # The step's measured window: no new sends after it closes; in-flight requests drain.
        sending = now < end
        if sending:
            for client, when in enumerate(next_send):
                if when > now:
                    continue
                request = _Request(
                    client, when, length(workload.prompt_tokens), length(workload.output_tokens), next(identities)
                )
                next_send[client] = float("inf")
                full = engine.max_in_flight is not None and len(running) + len(waiting) >= engine.max_in_flight
                if full or (engine.queue_bound is not None and len(waiting) >= engine.queue_bound):
                    finish(request, when, "http 503")
                else:
                    waiting.append(request)
        if not sending and not running and not waiting:
            break
        if not running and not waiting:
            now = min(min(next_send), end, next_check if slos is not None and ended_early is None else end)
            continue

        # Running requests that need one more block take it; when none is left, the newest is preempted.
        index = 0
        while index < len(running):
            request = running[index]
            needed = blocks_for(request.prompt + request.generated + 1) - request.blocks
            while needed > free_blocks and len(running) > index + 1:
                preempt(running.pop())
            if needed > free_blocks:
                preempt(running.pop(index))
                continue
            free_blocks -= needed
            request.blocks += needed
            index += 1
        prefill_tokens = 0
        while waiting and len(running) < engine.max_batch:
            candidate = waiting[0]
            tokens = candidate.prompt + candidate.generated + 1
            if blocks_for(tokens) > free_blocks:
                break
            waiting.popleft()
            candidate.blocks = blocks_for(tokens)
            free_blocks -= candidate.blocks
            if not (engine.prefix_cache and candidate.identity in state.cached):
                prefill_tokens += tokens - 1
            state.cached.add(candidate.identity)
            running.append(candidate)
        # Sampled after the scheduler admitted what fits, as a real engine's gauges are read between iterations: a
        # request that arrived a moment ago and is admitted in this iteration is not counted as waiting.
        while sending and next_sample <= now:
            samples.append(
                EngineSample(
                    t=next_sample - start,
                    kv_cache_usage_ratio=1 - free_blocks / engine.kv_blocks,
                    requests_running=float(len(running)),
                    requests_waiting=float(len(waiting)),
                    preemptions_total=float(preemptions),
                )
            )
            next_sample += SAMPLE_INTERVAL_SECONDS
        if not running:
            # Nothing fits even alone: the head of the queue can never run.
            head = waiting.popleft()
            finish(head, now, "bad response: prompt larger than the KV cache")
            continue
        factor = noise.lognormvariate(0.0, engine.noise) if engine.noise > 0 else 1.0
        now += factor * (
            engine.itl_base_seconds
            + engine.itl_per_request_seconds * len(running)
            + engine.prefill_seconds_per_token * prefill_tokens
        )
        still_running = []
        for request in running:
            if request.first_token is None:
                request.first_token = now
            else:
                request.gaps.add(now - (request.last_token or now))
            request.last_token = now
            request.generated += 1
            if request.generated >= request.output:
                finish(request, now, None)
            else:
                still_running.append(request)
        running = still_running
        for queue in (running, waiting):
            for request in [r for r in queue if now - r.sent > timeout]:
                queue.remove(request)
                finish(request, now, "timeout")

    window_end = max(start, min(now, end))
    in_window = [tokens for when, tokens in completions if start <= when <= window_end]
    return StepRun(
        concurrency=concurrency,
        duration_seconds=max(0.0, now - start),  # the last awaited request's end, as the runner counts it
        window_seconds=window_end - start,
        completed_in_window=len(in_window),
        output_tokens_in_window=sum(in_window),
        requests=tuple(records),
        itl_gaps=itl_gaps,
        engine=tuple(samples),
        engine_error=None,
        client_lag_p99_seconds=engine.client_lag_seconds,
        ended_early=ended_early,
        warmup_seconds=warmup,
    )


def _fresh() -> Iterator[int]:
    number = 0
    while True:
        number += 1
        yield number


def _repeated() -> Iterator[int]:
    """The same sequence of prompts every step (a workload stream restarted per step)."""
    return _fresh()


def step_runner(
    engine: SimulatedEngine,
    workload: SimulatedWorkload,
    slos: SloSpec,
    duration: float,
    warmup: float = 5.0,
    noise_seed: int = 0,
) -> Callable[[int], Awaitable[StepSummary]]:
    """A `run_step` for find_knee that runs simulated steps on one engine (its prefix cache kept between steps)
    and judges them like the command does; each run of a level draws new noise."""
    state = EngineState()
    run_stream = _fresh()
    runs = 0

    async def run_step(concurrency: int) -> StepSummary:
        nonlocal runs
        runs += 1
        prompts = run_stream if workload.fresh_prompts else _repeated()
        run = simulated_step(
            engine,
            concurrency,
            workload,
            duration,
            slos=slos,
            warmup=warmup,
            state=state,
            prompts=prompts,
            noise_seed=noise_seed * 1009 + runs,
        )
        return summarize(run, slos)

    return run_step


def brute_force_knee(
    engine: SimulatedEngine,
    workload: SimulatedWorkload,
    slos: SloSpec,
    max_concurrency: int,
    duration: float,
    warmup: float = 5.0,
) -> tuple[int | None, tuple[bool, ...]]:
    """The true knee: the highest concurrency below which every step passes, found by running every concurrency
    from 1 to the maximum; and whether each one passed (so a test can see passing is monotone)."""
    passed = tuple(
        summarize(simulated_step(engine, c, workload, duration, slos=slos, warmup=warmup), slos).passed
        for c in range(1, max_concurrency + 1)
    )
    first_fail = passed.index(False) + 1 if False in passed else max_concurrency + 1
    return (first_fail - 1 or None), passed
