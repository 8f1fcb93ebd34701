"""The client's measurements and error reasons, against the fake server over loopback."""

import asyncio

import aiohttp
import pytest

from exporter.loadtest.client import Endpoint, Limits, send
from exporter.loadtest.measure import RequestRecord
from exporter.loadtest.sketch import DurationSummary
from tests.loadtest.fake_openai import Behaviour, closed_port, serving

LIMITS = Limits(total_seconds=10.0, stall_seconds=2.0)


def _send(
    behaviour: Behaviour,
    kind: str = "completions",
    limits: Limits = LIMITS,
    max_tokens: int = 5,
    allow_short: bool = False,
    itl_gaps: DurationSummary | None = None,
) -> RequestRecord:
    async def go() -> RequestRecord:
        async with serving(behaviour) as fake, aiohttp.ClientSession() as session:
            endpoint = Endpoint.at(fake.url, kind)
            prompt = "one two three"
            record, _ = await send(
                session, endpoint, "fake-model", prompt, max_tokens, limits, allow_short=allow_short, itl_gaps=itl_gaps
            )
            return record

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_ttft_itl_and_e2e_match_what_the_server_was_told(kind: str) -> None:
    record = _send(Behaviour(ttft_seconds=0.2, itl_seconds=0.05), kind, max_tokens=6)
    assert record.error is None
    assert record.ttft_seconds == pytest.approx(0.2, abs=0.08)
    assert record.gap_count == 5
    assert record.mean_itl_seconds == pytest.approx(0.05, abs=0.02)
    assert record.e2e_seconds == pytest.approx(0.2 + 5 * 0.05, abs=0.1)


def test_tokens_are_counted_from_the_servers_usage() -> None:
    record = _send(Behaviour(), max_tokens=7)
    assert (record.prompt_tokens, record.output_tokens) == (3, 7)


def test_a_server_without_usage_leaves_the_counts_unknown() -> None:
    record = _send(Behaviour(usage=False))
    assert record.error is None
    assert (record.prompt_tokens, record.output_tokens) == (None, None)


def test_a_stalled_stream_is_cut_at_the_stall_timeout() -> None:
    limits = Limits(total_seconds=30.0, stall_seconds=0.3)
    record = _send(Behaviour(stall_after_tokens=2), limits=limits)
    assert record.error == "stalled"
    assert record.e2e_seconds is None
    assert record.ttft_seconds is not None


def test_a_request_longer_than_its_timeout_is_a_timeout() -> None:
    record = _send(Behaviour(ttft_seconds=5.0), limits=Limits(total_seconds=0.3, stall_seconds=0.2))
    assert record.error == "timeout"
    assert record.ttft_seconds is None


def test_http_errors_are_recorded_with_their_status() -> None:
    assert _send(Behaviour(error_status=503)).error == "http 503"


def test_a_json_answer_to_a_streaming_request_is_not_streaming() -> None:
    assert _send(Behaviour(stream=False)).error == "not streaming"


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b'data: {"choices": [{"text": "a"}]}\n\n', "bad response: stream ended before [DONE]"),
        (b"data: {oops\n\ndata: [DONE]\n\n", "bad response: a chunk is not JSON"),
        (b'data: {"error": {"message": "engine died"}}\n\n', "bad response: error in stream"),
        (b"hello, not events\n", "not streaming"),
    ],
)
def test_malformed_streams_are_bad_responses(raw: bytes, error: str) -> None:
    assert _send(Behaviour(raw_stream=raw)).error == error


def test_a_chunk_nested_too_deeply_to_read_is_a_bad_response_not_an_exception() -> None:
    record = _send(Behaviour(raw_stream=b"data: " + b"[" * 100_000 + b"\n\ndata: [DONE]\n\n"))
    assert record.error == "bad response: a chunk nested too deeply to read"


@pytest.mark.parametrize("status", [200, 500])
def test_a_json_body_nested_too_deeply_to_read_is_a_failure_not_an_exception(status: int) -> None:
    record = _send(Behaviour(json_body=b"[" * 4000, error_status=status if status != 200 else None))
    assert record.error == ("not streaming" if status == 200 else "http 500")


def test_an_error_answered_with_status_200_is_the_servers_error_not_a_missing_stream() -> None:
    async def go() -> tuple[str, str]:
        body = b'{"error": {"message": "model is overloaded"}}'
        async with serving(Behaviour(json_body=body)) as fake, aiohttp.ClientSession() as session:
            _, failure = await send(session, Endpoint.at(fake.url, "completions"), "fake-model", "hi", 5, LIMITS)
            assert failure is not None
            return failure.reason, failure.detail

    assert asyncio.run(go()) == ("bad response: error in body", "model is overloaded")


def test_an_answer_ends_at_done_though_the_server_keeps_the_connection_open() -> None:
    raw = (
        b'data: {"choices": [{"text": "a"}]}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'
        b"data: [DONE]\n\n"
    )
    record = _send(Behaviour(raw_stream=raw, raw_stream_held_open=True), max_tokens=1)
    assert record.error is None and record.e2e_seconds is not None and record.e2e_seconds < LIMITS.stall_seconds


def test_a_chunk_with_a_null_error_is_no_error() -> None:
    raw = (
        b'data: {"choices": [{"text": "a"}], "error": null}\r\n\r\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    record = _send(Behaviour(raw_stream=raw), max_tokens=1)
    assert (record.error, record.output_tokens) == (None, 1)


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_an_answer_with_no_text_is_an_empty_answer(kind: str) -> None:
    record = _send(Behaviour(answer_tokens=0), kind)
    assert record.error == "empty answer"
    assert record.ttft_seconds is None and record.e2e_seconds is None
    # Without usage the server's count cannot say so: no text streamed is enough.
    assert _send(Behaviour(answer_tokens=0, usage=False), kind).error == "empty answer"


def test_an_answer_shorter_than_max_tokens_is_a_short_answer() -> None:
    record = _send(Behaviour(answer_tokens=2), max_tokens=5)
    assert record.error == "short answer"
    assert record.output_tokens == 2 and record.e2e_seconds is None


def test_only_a_completed_request_adds_its_gaps_to_its_steps_summary() -> None:
    step_gaps = DurationSummary()
    completed = _send(Behaviour(itl_seconds=0.02), max_tokens=6, itl_gaps=step_gaps)
    short = _send(Behaviour(answer_tokens=3, itl_seconds=0.02), max_tokens=6, itl_gaps=step_gaps)
    assert completed.error is None and short.error == "short answer" and short.gap_count == 2
    assert step_gaps.count == completed.gap_count == 5
    assert step_gaps.total_seconds == pytest.approx(completed.gap_total_seconds)
    assert completed.mean_itl_seconds == pytest.approx(0.02, abs=0.01)


def test_a_short_answer_is_good_where_early_stops_are_allowed() -> None:
    record = _send(Behaviour(answer_tokens=2), max_tokens=5, allow_short=True)
    assert record.error is None
    assert record.output_tokens == 2 and record.e2e_seconds is not None
    # An empty answer is never good: there is nothing to time.
    assert _send(Behaviour(answer_tokens=0), allow_short=True).error == "empty answer"


def test_an_answer_of_every_token_asked_for_is_not_short() -> None:
    assert _send(Behaviour(answer_tokens=5), max_tokens=5).error is None


def test_sse_comments_and_event_fields_are_skipped() -> None:
    raw = b': keep-alive\nevent: message\ndata: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n'
    record = _send(Behaviour(raw_stream=raw))
    assert record.error is None and record.ttft_seconds is not None


def test_a_closed_port_is_connection_refused() -> None:
    async def go() -> RequestRecord:
        async with aiohttp.ClientSession() as session:
            endpoint = Endpoint.at(f"http://127.0.0.1:{closed_port()}", "completions")
            record, _ = await send(session, endpoint, "m", "p", 3, LIMITS)
            return record

    assert asyncio.run(go()).error == "connection refused"


def test_the_request_asks_for_usage_and_ignores_eos_only_when_told() -> None:
    async def go(ignore_eos: bool) -> dict:
        async with serving(Behaviour()) as fake, aiohttp.ClientSession() as session:
            endpoint = Endpoint.at(fake.url, "completions")
            await send(session, endpoint, "fake-model", "a b", 2, LIMITS, ignore_eos=ignore_eos)
            return fake.observed.bodies[0]

    plain, forced = asyncio.run(go(False)), asyncio.run(go(True))
    assert plain["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in plain
    assert forced["ignore_eos"] is True


@pytest.mark.parametrize("count", [-5, "5", 5.0, True, float("nan"), [5]])
def test_a_usage_count_that_is_no_count_is_a_bad_response_not_an_unknown_count(count: object) -> None:
    # Taken as unknown, it would skip the short-answer check: a server could stop early and still pass.
    record = _send(Behaviour(completion_tokens=count), max_tokens=5)
    assert record.error == "bad response: implausible usage"
    assert record.output_tokens is None and record.e2e_seconds is None


def test_a_usage_count_given_as_null_is_unknown() -> None:
    raw = (
        b'data: {"choices": [{"text": "a"}]}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": null, "completion_tokens": null}}\n\ndata: [DONE]\n\n'
    )
    record = _send(Behaviour(raw_stream=raw))
    assert record.error is None and (record.prompt_tokens, record.output_tokens) == (None, None)
