"""Prompt and output lengths: fixed, drawn, or read from a trace."""

import json
import math
import os
import random
import re
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.loadtest.workload import (
    MAX_TOKENS,
    Lengths,
    SyntheticWorkload,
    TraceWorkload,
    WorkloadError,
    WorkRequest,
    check_lengths,
    describe,
    load_trace,
    requests,
    run_marker,
)


def test_fixed_lengths_give_prompts_of_that_many_words_and_that_many_output_tokens() -> None:
    drawn = list(islice(requests(SyntheticWorkload(Lengths(12), Lengths(5))), 20))
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 12 for r in drawn)
    assert {r.max_tokens for r in drawn} == {5}


def test_prompts_differ_so_the_engine_cannot_serve_them_from_its_prefix_cache() -> None:
    drawn = [r.prompt for r in islice(requests(SyntheticWorkload(Lengths(30), Lengths(5))), 50)]
    assert len({str(p)[:40] for p in drawn}) == 50


def test_a_marker_opens_every_prompt_with_the_run_and_the_requests_number() -> None:
    # One-word prompts: unmarked, they can only be the few dozen words of the list, so they repeat.
    workload = SyntheticWorkload(Lengths(1), Lengths(5))
    drawn = list(islice(requests(workload, "cafe0123"), 1000))
    unmarked = list(islice(requests(workload), 1000))
    assert len({r.prompt for r in unmarked}) < 100
    assert [r.prompt for r in drawn] == [f"cafe0123-{n}: {r.prompt}" for n, r in enumerate(unmarked)]
    assert [r.max_tokens for r in drawn] == [r.max_tokens for r in unmarked]
    assert len({str(r.prompt)[:20] for r in drawn}) == 1000


def test_a_marker_opens_the_first_message_of_a_chat_prompt_and_every_repeat_of_a_trace() -> None:
    system = {"role": "system", "content": "You are terse."}
    trace = TraceWorkload((WorkRequest((system, {"role": "user", "content": "hi"}), 4),), "t.jsonl")
    drawn = [r.prompt for r in islice(requests(trace, "beef"), 1000)]
    assert drawn[0] == ({"role": "system", "content": "beef-0: You are terse."}, {"role": "user", "content": "hi"})
    assert drawn[999] == ({"role": "system", "content": "beef-999: You are terse."}, {"role": "user", "content": "hi"})
    firsts = [prompt[0]["content"] for prompt in drawn if isinstance(prompt, tuple)]
    assert len(firsts) == 1000 and len({content[:20] for content in firsts}) == 1000
    assert trace.requests[0].prompt == (system, {"role": "user", "content": "hi"})  # the trace is left as read
    assert system["content"] == "You are terse."


def test_every_run_has_a_marker_of_its_own() -> None:
    assert len({run_marker() for _ in range(100)}) == 100


def test_the_same_seed_sends_the_same_sequence_and_another_seed_another() -> None:
    workload = SyntheticWorkload(Lengths(20, spread=5), Lengths(10, spread=3), seed=7)
    first = list(islice(requests(workload), 10))
    assert first == list(islice(requests(workload), 10))
    assert first != list(islice(requests(SyntheticWorkload(workload.prompt_tokens, workload.output_tokens, 8)), 10))


@given(st.integers(1, 500), st.floats(0, 300), st.integers(1, 50), st.integers(0, 600), st.integers(0, 2**32))
def test_drawn_lengths_stay_within_their_bounds(mean: int, spread: float, low: int, extra: int, seed: int) -> None:
    lengths = Lengths(mean, spread, low, low + extra)
    workload = SyntheticWorkload(lengths, lengths, seed)
    for request in islice(requests(workload), 20):
        assert low <= request.max_tokens <= low + extra


def test_a_length_drawn_with_no_maximum_stays_within_any_models_context() -> None:
    lengths = Lengths(MAX_TOKENS, spread=MAX_TOKENS)
    rng = random.Random(1)
    assert max(lengths.draw(rng) for _ in range(100)) == MAX_TOKENS


def test_a_spread_scatters_lengths_around_the_mean() -> None:
    drawn = [r.max_tokens for r in islice(requests(SyntheticWorkload(Lengths(5), Lengths(100, 20, 1, 1000))), 400)]
    assert 95 <= sum(drawn) / len(drawn) <= 105
    assert min(drawn) < 80 and max(drawn) > 120


@pytest.mark.parametrize(
    ("lengths", "problem"),
    [
        (Lengths(0), "is not a length"),
        (Lengths(5, -1), "a spread of -1 is not one"),
        (Lengths(5, math.nan), "a spread of nan is not one"),
        (Lengths(5, math.inf), "a spread of inf is not one"),
        (Lengths(5, 1, 10, 3), "do not bound"),
        # Drawn, a length of 10^11 words builds a prompt of hundreds of gigabytes before anything is sent.
        (Lengths(10**11), "longer than a model's context"),
        (Lengths(5, 1, 1, 10**11), "longer than a model's context"),
    ],
)
def test_bad_lengths_name_the_flag(lengths: Lengths, problem: str) -> None:
    with pytest.raises(WorkloadError, match=f"--prompt-tokens: .*{problem}"):
        check_lengths("--prompt-tokens", lengths)


def test_a_trace_is_read_and_replayed_in_order(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    records = [
        {"prompt": "hello there", "max_tokens": 3},
        {"messages": [{"role": "user", "content": "hi"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    trace = load_trace(path, default_max_tokens=64)
    assert trace.has_messages
    sent = list(islice(requests(trace), 4))
    assert [r.max_tokens for r in sent] == [3, 64, 3, 64]
    assert sent[1].prompt == ({"role": "user", "content": "hi"},)
    assert describe(trace) == {"kind": "trace", "source": str(path), "requests": 2}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"max_tokens": 3}', "neither prompt nor messages"),
        ('{"prompt": "x", "max_tokens": 0}', "max_tokens 0 is not a whole number"),
        ('{"prompt": "x", "max_tokens": 100000000000}', "max_tokens 100000000000 is not a whole number from 1 to"),
        ('{"prompt": ""}', "prompt must be a non-empty string"),
        ('{"messages": [{"role": "user"}]}', r"messages\[0\] needs a string role and a string content"),
        ("[" * 100_000, "nested too deeply to read"),
        ('{"prompt": ' * 100_000, "nested too deeply to read"),
    ],
)
def test_a_bad_trace_record_names_the_file_and_line(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=f"{re.escape(str(path))}:2: {problem}"):
        load_trace(path, 16)


def test_a_missing_or_empty_trace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"--dataset .*: cannot read it"):
        load_trace(tmp_path / "absent.jsonl", 16)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(WorkloadError, match="no records"):
        load_trace(tmp_path / "empty.jsonl", 16)


def test_a_trace_written_on_windows_with_a_byte_order_mark_and_crlf_is_read(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "one"}\r\n{"prompt": "two"}\r\n')
    assert [request.prompt for request in load_trace(path, 4).requests] == ["one", "two"]


def test_a_synthetic_workload_is_described_for_the_result() -> None:
    described = describe(SyntheticWorkload(Lengths(512), Lengths(128), seed=3))
    assert described["kind"] == "synthetic"
    assert described["prompt_tokens"]["mean"] == 512 and described["seed"] == 3


def test_a_fifo_or_a_directory_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    # Opening a FIFO no one writes to waits for a writer; a device such as /dev/zero reads without end.
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(
        WorkloadError, match=f"^--dataset {re.escape(str(fifo))}: cannot read it \\(not a regular file\\)"
    ):
        load_trace(fifo, 16)
    with pytest.raises(WorkloadError, match=f"^--dataset {re.escape(str(tmp_path))}: cannot read it"):
        load_trace(tmp_path, 16)


def test_a_trace_over_its_size_limit_is_refused_naming_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("exporter.loadtest.workload.MAX_TRACE_BYTES", 1 << 20)
    path = tmp_path / "trace.jsonl"
    path.write_text('{"prompt": "hello"}\n' * 60_000)
    with pytest.raises(WorkloadError, match="over 1 MiB; use a sample of the trace"):
        load_trace(path, 16)


def test_a_bad_max_tokens_is_named_in_a_few_characters_however_long_it_is(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "max_tokens": "z" * 100_000}) + "\n")
    with pytest.raises(WorkloadError) as refused:
        load_trace(path, 16)
    assert "max_tokens 'zzz" in str(refused.value) and len(str(refused.value)) < len(str(path)) + 120


def test_a_prompt_holding_a_unicode_line_separator_as_written_is_one_record(tmp_path: Path) -> None:
    # JSON allows U+2028, U+2029 and U+0085 unescaped in a string; only \n ends a line of JSON Lines.
    path = tmp_path / "trace.jsonl"
    prompts = ["one\u2028two", "three\u0085four\u2029", "crlf"]
    path.write_text("\r\n".join(json.dumps({"prompt": p}, ensure_ascii=False) for p in prompts) + "\r\n")
    assert [request.prompt for request in load_trace(path, 4).requests] == prompts
