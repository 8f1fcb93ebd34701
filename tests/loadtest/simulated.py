"""A simulated LLM engine in virtual time, for testing the judge and the knee search (and the knee benchmark).

It behaves like a continuously batching engine (vLLM's scheduler, simplified): a KV pool of `kv_blocks` blocks of
`block_tokens` tokens; at most `max_batch` requests decode together; each engine iteration takes
`itl_base + itl_per_request x batch + prefill_per_token x tokens prefilled in it`; a request waits in a FIFO queue
while slots or blocks run out; when a running request needs a block and none is free, the newest running request is
preempted (its blocks freed, recomputed later); past `queue_bound` waiting requests, new ones are refused at once.

`simulated_step` drives it with N closed-loop clients exactly as the runner does (warm-up discarded, an early end
when the step is certainly failing, an extension up to twice the duration while unsure) and returns the StepRun
the runner would, so the judge and the search are tested on the same values. A 30 s step runs in milliseconds.
"""

import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from exporter.loadtest.judge import MAX_EXTENSION, StepSummary, settled, summarize, worth_extending
from exporter.loadtest.measure import EngineSample, RequestRecord, SloSpec, StepRun

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
    refusal_seconds: float = 0.05  # round trip of a refused request before its client sends again
    client_lag_seconds: float = 0.001  # how late the load generator sends: reported as its loop lag


@dataclass(frozen=True)
class SimulatedWorkload:
    prompt_tokens: int = 256
    output_tokens: int = 64
    spread: float = 0.0  # each length drawn uniformly within +- this share
    seed: int = 0


@dataclass
class _Request:
    client: int
    sent: float
    prompt: int
    output: int
    generated: int = 0
    blocks: int = 0
    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)


def simulated_step(
    engine: SimulatedEngine,
    concurrency: int,
    workload: SimulatedWorkload,
    duration: float,
    *,
    slos: SloSpec | None = None,
    warmup: float = 5.0,
    timeout: float = 60.0,
) -> StepRun:
    """One load step; with `slos`, it ends early when certainly failing and extends while unsure, as the runner."""
    rng = random.Random(workload.seed * 1_000_003 + concurrency)
    start, end, longest_end = warmup, warmup + duration, warmup + MAX_EXTENSION * duration
    next_send = [engine.client_lag_seconds * (client + 1) / concurrency for client in range(concurrency)]
    waiting: deque[_Request] = deque()
    running: list[_Request] = []
    free_blocks = engine.kv_blocks
    preemptions = 0
    records: list[RequestRecord] = []
    completions: list[tuple[float, int]] = []  # (when, output tokens) of every completed request, as the runner
    samples: list[EngineSample] = []
    next_sample = start
    now = 0.0
    ended_early: str | None = None
    judged = 0

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
        records.append(
            RequestRecord(
                sent_at=request.sent - start,
                ttft_seconds=None if request.first_token is None else request.first_token - request.sent,
                itl_seconds=tuple(request.gaps),
                e2e_seconds=None if error else at - request.sent,
                prompt_tokens=None if error else request.prompt,
                output_tokens=None if error else request.generated,
                error=error,
            )
        )

    while True:
        # The step's measured window: no new sends after it closes; in-flight requests drain.
        extendable = slos is not None and ended_early is None and end < longest_end
        if now >= end and extendable and worth_extending(records, slos):
            end = min(longest_end, now + SAMPLE_INTERVAL_SECONDS)
        sending = now < end and ended_early is None
        if sending:
            for client, when in enumerate(next_send):
                if when > now:
                    continue
                request = _Request(client, when, length(workload.prompt_tokens), length(workload.output_tokens))
                next_send[client] = float("inf")
                if engine.queue_bound is not None and len(waiting) >= engine.queue_bound:
                    finish(request, when, "http 503")
                else:
                    waiting.append(request)
        if ended_early is not None or (not sending and not running and not waiting):
            break
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
        if not running and not waiting:
            now = min(min(next_send), end)
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
            prefill_tokens += tokens - 1
            running.append(candidate)
        if not running:
            # Nothing fits even alone: the head of the queue can never run.
            head = waiting.popleft()
            finish(head, now, "bad response: prompt larger than the KV cache")
            continue
        now += (
            engine.itl_base_seconds
            + engine.itl_per_request_seconds * len(running)
            + engine.prefill_seconds_per_token * prefill_tokens
        )
        still_running = []
        for request in running:
            if request.first_token is None:
                request.first_token = now
            else:
                request.gaps.append(now - (request.last_token or now))
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
        if slos is not None and ended_early is None and len(records) > judged:
            judged = len(records)
            ended_early = settled(records, slos)
            if ended_early is not None:
                end = now

    window_end = max(start, min(now, end))
    in_window = [tokens for when, tokens in completions if start <= when <= window_end]
    return StepRun(
        concurrency=concurrency,
        duration_seconds=max(0.0, min(now, end) - start),
        window_seconds=window_end - start,
        completed_in_window=len(in_window),
        output_tokens_in_window=sum(in_window),
        requests=tuple(records),
        engine=tuple(samples),
        engine_error=None,
        client_lag_p99_seconds=engine.client_lag_seconds,
        ended_early=ended_early,
    )


def step_runner(
    engine: SimulatedEngine, workload: SimulatedWorkload, slos: SloSpec, duration: float, warmup: float = 5.0
) -> Callable[[int], Awaitable[StepSummary]]:
    """A `run_step` for find_knee that runs simulated steps and judges them like the command does."""

    async def run_step(concurrency: int) -> StepSummary:
        run = simulated_step(engine, concurrency, workload, duration, slos=slos, warmup=warmup)
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
