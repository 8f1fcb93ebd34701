"""The client's measurements and error reasons, against the fake server over loopback; and its event-stream reader
against every way a stream's reads may cut it."""

import asyncio
import itertools
import time

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.loadtest.client import Endpoint, Failure, Limits, _EventReader, send
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
        (b'data: [{"text": "a"}]\n\ndata: [DONE]\n\n', "bad response: a chunk is not a JSON object"),
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


_TOKEN = b'data: {"choices": [{"text": "a"}]}'
_USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}'


def _one_token_answer(line_end: bytes = b"\n") -> bytes:
    return b"".join(line + line_end * 2 for line in (_TOKEN, _USAGE, b"data: [DONE]"))


def _send_one_token(raw: bytes, *parts: bytes) -> RequestRecord:
    """One request answered with `raw` (then `parts`, each read apart), the connection held open after it: only the
    answer's own end can end the request."""
    behaviour = Behaviour(raw_stream=raw, raw_stream_parts=parts, raw_stream_held_open=True)
    return _send(behaviour, max_tokens=1, limits=Limits(total_seconds=2.0, stall_seconds=1.0))


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_an_event_stream_is_read_whichever_line_end_it_uses(line_end: bytes) -> None:
    # With CR line ends the answer's last byte is a CR: the event it ends is read without waiting for an LF.
    record = _send_one_token(_one_token_answer(line_end))
    assert (record.error, record.output_tokens) == (None, 1)
    assert record.ttft_seconds is not None and record.e2e_seconds is not None


@pytest.mark.parametrize("cut", [3, 1], ids=["whole", "split across reads"])
def test_a_byte_order_mark_opening_the_stream_is_dropped(cut: int) -> None:
    mark = b"\xef\xbb\xbf"
    record = _send_one_token(mark[:cut], mark[cut:] + _one_token_answer())
    assert (record.error, record.output_tokens) == (None, 1)


def test_an_events_data_lines_are_joined_with_line_feeds() -> None:
    # The chunk's JSON spread over three data lines, an empty one ("data" alone) among them, and a comment.
    raw = b'data: {"choices":\n: a comment\ndata\ndata:[{"text": "a"}]}\n\n' + _USAGE + b"\n\ndata: [DONE]\n\n"
    record = _send_one_token(raw)
    assert (record.error, record.output_tokens) == (None, 1)
    assert record.ttft_seconds is not None


def test_a_crlf_split_across_two_reads_is_one_line_end() -> None:
    # Read as two line ends, the CR and the LF would make a blank line, ending the event after half its JSON.
    rest = b'\ndata: [{"text": "a"}]}\r\n\r\n' + _USAGE + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    record = _send_one_token(b'data: {"choices":\r', rest)
    assert (record.error, record.output_tokens) == (None, 1)


_LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])
_DATA_LINE = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=8)


@given(st.lists(st.lists(_DATA_LINE, min_size=1, max_size=3), max_size=4), st.booleans(), st.data())
def test_the_events_read_do_not_depend_on_line_ends_or_where_the_reads_cut_the_stream(
    events: list[list[str]], mark: bool, draw: st.DataObject
) -> None:
    stream = b"\xef\xbb\xbf" if mark else b""
    for event in events:
        for value in event:
            line_end = draw.draw(_LINE_ENDS)
            stream += b"data: " + value.encode() + line_end
        # The blank line ends as the line before it did: after a lone CR, an LF would be that CR's own (a CRLF).
        stream += line_end
    # A read is never empty: the cuts fall inside the stream.
    cuts = sorted(
        {cut for cut in draw.draw(st.lists(st.integers(0, len(stream)), max_size=8)) if 0 < cut < len(stream)}
    )
    reader, read = _EventReader(), []
    for start, end in itertools.pairwise([0, *cuts, len(stream)]):
        lines = reader.lines(stream[start:end])
        assert lines is not None
        for line in lines:
            taken = reader.take(line)
            assert not isinstance(taken, Failure)
            if taken is not None:
                read.append(taken)
    assert read == ["\n".join(event) for event in events]


def _read_event(data_lines: list[bytes]) -> str | Failure | None:
    reader = _EventReader()
    for line in data_lines:
        taken = reader.take(b"data:" + line)
        if taken is not None:
            return taken
    return reader.take(b"")


def test_an_events_data_may_be_1_mib_with_the_line_feeds_that_join_it_and_no_more() -> None:
    line = b"x" * 1023
    almost = [line] * 1024  # 1,023 bytes each and 1,023 line feeds between them: 1 MiB less one byte
    assert _read_event([*almost, b""]) == "\n".join(["x" * 1023] * 1024 + [""])
    assert _read_event([*almost, b"x"]) == Failure("bad response: an event over 1 MiB")


def _seconds_to_read_a_line_in_small_pieces(length: int) -> float:
    """The least of five tries: the time to read one line of `length` bytes in reads of 256 bytes."""
    piece = b"x" * 256
    tries = []
    for _ in range(5):
        reader = _EventReader()
        started = time.perf_counter()
        for _ in range(length // len(piece)):
            assert reader.lines(piece) == []
        assert reader.lines(b"\n") == [b"x" * length]
        tries.append(time.perf_counter() - started)
    return min(tries)


def test_a_long_line_read_in_small_pieces_costs_its_length_not_its_length_squared() -> None:
    # A slow server's line comes in many small reads. Sixteen times as long takes about sixteen times as long to
    # read; were each read to copy the line so far, it would take about 256 times as long.
    short, long = (_seconds_to_read_a_line_in_small_pieces(length) for length in (1 << 16, 1 << 20))
    assert long < 64 * short


@pytest.mark.parametrize(
    "raw",
    [
        b'data:{"choices": [{"text": "a"}]}\n\ndata:[DONE]\n\n',
        b'id: 1\nretry: 10\nevent: message\ndata: {"choices": [{"text": "a"}]}\n\n:\n\n\ndata:  [DONE] \n\n',
        b'data: {"choices": [{"text": "a"}]}\n\nx-trace: 7f\ndata: {"choices": [{"text": "b"}]}\n\ndata: [DONE]\n\n',
    ],
    ids=["no space after data:", "fields, an empty comment and blank lines", "a field it does not know after data"],
)
def test_the_forms_of_an_event_the_standard_allows_are_read(raw: bytes) -> None:
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
