"""A whole run's steps: each one's warm-up, its early end, the settle after it, and what it says about the run.

The runner holds one step's load; this module decides how each step is run and judged, and stops the run when
the server is gone. A step's warm-up lasts at least the lifetime of a request at the level below it (scaled up by
the load where that level already queued), so the measured part starts with the engine in its steady state. After
each step the engine is given time to return to the load it had before the run. The notes say what a reader must
know: other traffic on the engine, an engine that did not settle, requests the load generator itself failed, a
step left unsure.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from exporter.loadtest import runner
from exporter.loadtest.client import CONNECTION_FAILURES
from exporter.loadtest.judge import (
    StepSummary,
    certainly_failing,
    certainly_saturated,
    judged_so_far,
    summarize,
    worth_extending,
)
from exporter.loadtest.measure import EngineSample, RequestRecord, SloSpec, StepRun, describe_load
from exporter.loadtest.model import mean_footprint_tokens
from exporter.loadtest.search import Search, conclude, find_knee, pool_start
from exporter.loadtest.watch import SAMPLE_INTERVAL_SECONDS
from exporter.loadtest.workload import SyntheticWorkload

# How long the engine may take, after a step's last request, to run and queue no more than before the run.
SETTLE_SECONDS = 5.0


@dataclass(frozen=True)
class SearchSettings:
    slos: SloSpec
    max_concurrency: int
    tolerance: float
    levels: tuple[int, ...] = ()  # --concurrency: run exactly these, in order, instead of searching
    rates: tuple[float, ...] = ()  # --rate: open-loop steps at these requests/s, in order (at most max_concurrency
    #   in flight)


@dataclass(frozen=True)
class Outcome:
    search: Search
    model: str
    engine_capacity_tokens: int | None
    engine_block_size: int | None  # the engine allocates whole blocks: a request holds its footprint rounded up
    footprint_tokens: float  # mean prompt + output tokens of the operating point's requests (else of every step)
    step_runs: tuple[StepRun, ...]  # every step's requests, in the order run (--save-requests)
    notes: tuple[str, ...]
    interrupted: bool
    time_limited: bool  # --max-duration ended the search: its answers are lower bounds


class StepReporter(Protocol):
    """Where a run tells a person about its steps (the progress display)."""

    def message(self, text: str) -> None: ...

    def step_started(self, load: str, seconds: float) -> None: ...

    def step_finished(self, step: StepSummary) -> None: ...


async def run_steps(settings: runner.RunSettings, search: SearchSettings, progress: StepReporter) -> Outcome:
    """Open the run, search (or run the fixed levels), and gather what the result needs."""
    notes: list[str] = []
    async with runner.open_run(settings) as run:
        if run.engine.error is not None:
            notes.append(f"engine metrics unreachable at the start, the run goes on without them: {run.engine.error}")
        progress.message(
            f"load-testing {settings.url} ({run.model}, engine {run.engine.engine or 'unknown'}): "
            f"objective {search.slos.objective:g}, {_plan(search)}"
        )
        stepper = _Stepper(settings, search.slos, run, progress)
        with runner.ctrl_c_interrupts(run.interrupt):
            if search.rates:
                found = await _fixed(stepper, [(search.max_concurrency, rate) for rate in search.rates])
            elif search.levels:
                found = await _fixed(stepper, [(level, None) for level in search.levels])
            else:
                start = await stepper.search_start(search.max_concurrency)
                if stepper.cut_short():
                    found = conclude([], interrupted=True)
                else:
                    found = await find_knee(
                        stepper.step,
                        search.max_concurrency,
                        search.tolerance,
                        latency_slos=search.slos.judges_latency,
                        start=start,
                    )
        notes.extend(stepper.notes)
        notes.extend(_step_notes(found.steps))
        if _without_usage(stepper.runs):
            notes.append(
                "the server reported no token counts (`usage`, asked for with stream_options.include_usage): output "
                "tokens/s reads 0, and an answer shorter than its max_tokens is not caught"
            )
        if stepper.stopped_by_time_limit:
            notes.append(
                f"the run's time limit (--max-duration {settings.max_duration_seconds:g}s) ended the search: "
                "the answers are what was measured before it, lower bounds"
            )
        return Outcome(
            search=found,
            model=run.model,
            engine_capacity_tokens=run.engine.capacity_tokens,
            engine_block_size=run.engine.block_size,
            footprint_tokens=_footprint(found, stepper.runs),
            step_runs=tuple(stepper.runs),
            notes=tuple(dict.fromkeys(notes)),
            interrupted=run.interrupted.is_set(),
            time_limited=stepper.stopped_by_time_limit,
        )


def _plan(search: SearchSettings) -> str:
    if search.rates:
        rates = ", ".join(f"{rate:g}" for rate in search.rates)
        return f"open loop at {rates} requests/s (at most {search.max_concurrency} in flight)"
    if search.levels:
        return f"concurrency {', '.join(map(str, search.levels))}"
    return f"up to concurrency {search.max_concurrency}"


async def _fixed(stepper: "_Stepper", loads: Sequence[tuple[int, float | None]]) -> Search:
    steps = []
    for concurrency, rate in loads:
        step = await stepper.step(concurrency, rate)
        steps.append(step)
        if step.interrupted:
            return conclude(steps, interrupted=True)
    return conclude(steps, interrupted=False)


class _Stepper:
    """Runs the steps of one run: the `run_step` the search calls."""

    def __init__(
        self,
        settings: runner.RunSettings,
        slos: SloSpec,
        run: runner.Run,
        progress: StepReporter,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.slos, self.run, self.progress, self.clock = settings, slos, run, progress, clock
        self.runs: list[StepRun] = []
        self.summaries: list[StepSummary] = []
        self.notes: list[str] = []
        self.stopped_by_time_limit = False
        self.lifetime_alone = 0.0  # seconds a request took with nothing else in flight, where one was measured

    async def search_start(self, max_concurrency: int) -> int:
        """Where the search starts: 1, or, on an engine that reports its KV pool and a workload whose requests are
        all one length, where one request measured alone says the pool still holds every request (`pool_start`),
        at most `max_concurrency`: what a step at 1 would have told the search, in one request's time. Its lifetime
        stands in for that step's as the first step's warm-up."""
        engine, workload = self.run.engine, self.settings.workload
        if (
            max_concurrency == 1
            or engine.capacity_tokens is None
            or not isinstance(workload, SyntheticWorkload)
            or not workload.fixed_lengths
            or self.settings.allow_short_answers  # an answer may stop early: one request's length is not all's
        ):
            return 1
        alone = await runner.one_request(self.settings, self.run)
        if alone is None or alone.e2e_seconds is None or alone.prompt_tokens is None or alone.output_tokens is None:
            if alone is not None:
                why = alone.error or "the server reported no token counts"
                self.progress.message(f"one request sent alone failed ({why}): the search starts at concurrency 1")
            return 1
        self.lifetime_alone = alone.e2e_seconds
        footprint = alone.prompt_tokens + alone.output_tokens
        held = pool_start(engine.capacity_tokens, engine.block_size, footprint)
        start = min(held, max_concurrency)
        self.progress.message(
            f"one request alone holds {footprint} tokens of the engine's {engine.capacity_tokens}-token KV pool: "
            f"the search starts at concurrency {start}"
            + (f" (--max-concurrency; the pool holds {held})" if start < held else "")
        )
        return start

    def cut_short(self) -> bool:
        """Whether Ctrl-C, SIGTERM or the run's time limit came while one request was measured alone: the run ends
        before its first step, which would send after them."""
        return self._time_limit_spent() or self.run.interrupted.is_set()

    def _time_limit_spent(self) -> bool:
        """Whether the run's time limit is spent while the user let it run: that ends the search like Ctrl-C, but
        it is said in a note and the exit status stays the answer's."""
        if self.clock() >= self.run.deadline and not self.run.interrupted.is_set():
            self.stopped_by_time_limit = True
        return self.stopped_by_time_limit

    async def step(self, concurrency: int, offered_rate: float | None = None) -> StepSummary:
        """A closed-loop step at `concurrency`, or with `offered_rate` an open-loop one capped at it."""
        warmup = self.warmup_for(concurrency if offered_rate is None else offered_rate)
        self.progress.step_started(describe_load(concurrency, offered_rate), warmup + self.settings.step_seconds)
        slos = self.slos
        step_run = await runner.run_step(
            self.settings,
            concurrency,
            self.run,
            offered_rate=offered_rate,
            warmup_seconds=warmup,
            stop_early=self._stop_early,
            keep_going=lambda records, oldest, share: worth_extending(judged_so_far(records, oldest), slos, share),
        )
        _refuse_a_dead_server(step_run)
        self.notes.extend(_client_notes(step_run))
        summary = summarize(step_run, slos)
        self.runs.append(step_run)
        if not step_run.interrupted and self._time_limit_spent():
            summary = replace(summary, interrupted=True)  # the time limit cut this step short
        self.summaries.append(summary)
        self.progress.step_finished(summary)
        self.notes.extend(_traffic_notes(summary, self.run.baseline_load))
        if not summary.interrupted:
            unsettled = await runner.settle(self.run, self.settings, SETTLE_SECONDS)
            if unsettled is not None:
                self.notes.append(f"after {summary.load_text}: {unsettled}")
        return summary

    def _stop_early(
        self, records: Sequence[RequestRecord], oldest_in_flight: float | None, engine: Sequence[EngineSample]
    ) -> str | None:
        """A step ends early when it certainly fails its SLOs; with no latency SLO to judge, also when it certainly
        saturates the engine (with one, a saturated step may still meet it, and the SLO knee needs its verdict)."""
        failing = certainly_failing(judged_so_far(records, oldest_in_flight), self.slos)
        if failing is not None or self.slos.ttft_seconds is not None or self.slos.itl_seconds is not None:
            return failing
        return certainly_saturated(engine, round(self.settings.step_seconds / SAMPLE_INTERVAL_SECONDS))

    def warmup_for(self, load: float) -> float:
        """At least the configured warm-up, and at least the p99 lifetime of a request at the nearest load below,
        times the load's growth where that level queued (its requests waited, so they will wait longer here)."""
        below = [s for s in self.summaries if s.load <= load and s.e2e_p99_seconds is not None]
        if not below:
            return max(self.settings.warmup_seconds, min(self.lifetime_alone, self.settings.request_timeout_seconds))
        nearest = max(below, key=lambda s: s.load)
        assert nearest.e2e_p99_seconds is not None
        growth = load / nearest.load if "queue" in nearest.engine_signals else 1.0
        lifetime = min(nearest.e2e_p99_seconds * growth, self.settings.request_timeout_seconds)
        return max(self.settings.warmup_seconds, lifetime)


def _refuse_a_dead_server(step: StepRun) -> None:
    """Most of a step's requests failing to connect, or running out of time in a step that streamed not one token,
    means the server is gone: the run ends (exit 1) rather than judging a dead or hung server as a slow one and
    writing thresholds from it. (Its last requests all so end the step as they end: `runner.server_gone`.) An
    overloaded server streams tokens for the requests it runs, so its timeouts never count here."""
    lost = [record.error for record in step.requests if record.error in CONNECTION_FAILURES]
    silent = all(record.ttft_seconds is None for record in step.requests)
    unanswered = [record.error for record in step.requests if runner.unanswered(record)] if silent else []
    for failed, how in ((lost, "failed to connect"), (unanswered, "got not one token in their time")):
        if len(failed) * 2 > len(step.requests):
            raise runner.LoadtestError(
                f"the server stopped answering at {step.load_text}: {len(failed)} of {len(step.requests)} "
                f"requests {how} ({failed[-1]}); nothing was written"
            )


def _traffic_notes(step: StepSummary, baseline: float | None) -> list[str]:
    notes = []
    busiest = max((sample.requests_in_engine for sample in step.engine), default=None)
    if busiest is not None and busiest > step.concurrency + (baseline or 0.0):  # an open loop's cap bounds it too
        notes.append(
            f"{step.load_text}: the engine held {busiest:g} requests, more than this run sent: other "
            "traffic shares the engine, so this step's numbers are not this load's alone"
        )
    return notes


def _client_notes(step: StepRun) -> list[str]:
    failed = [record.error for record in step.requests if record.error and record.error.startswith(runner.CLIENT_ERROR)]
    if not failed:
        return []
    return [
        f"{step.load_text}: the load generator itself failed {len(failed)} requests ({failed[0]}); they "
        "count as misses, and each ended its worker: report it, it is a bug in Plimsoll"
    ]


def _step_notes(steps: Sequence[StepSummary]) -> list[str]:
    notes = []
    for step in steps:
        if step.verdict == "unsure" and not step.interrupted:
            notes.append(
                f"{step.load_text} stayed unsure after extending the step "
                f"({step.requests} requests): the point estimate decided ({'pass' if step.passed else 'fail'})"
            )
        if step.engine_error is not None:
            notes.append(f"{step.load_text}: {step.engine_error}")
    return notes


def _without_usage(step_runs: Sequence[StepRun]) -> bool:
    """Requests completed, and not one with the server's count of its output tokens."""
    completed = [record for run in step_runs for record in run.requests if record.error is None]
    return bool(completed) and all(record.output_tokens is None for record in completed)


def _footprint(search: Search, step_runs: Sequence[StepRun]) -> float:
    point = search.operating_point
    chosen = [run for run in step_runs if point is None or run.load == point.load]
    return mean_footprint_tokens([record for run in chosen for record in run.requests])
