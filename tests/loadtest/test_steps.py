"""How a run treats each step's requests as a whole: a server gone or hung mid-run ends the run instead of being
judged, and an overloaded one is judged."""

from collections.abc import Sequence

import pytest

from exporter.loadtest.measure import RequestRecord, StepRun
from exporter.loadtest.runner import LoadtestError, server_gone
from exporter.loadtest.steps import _refuse_a_dead_server


def _records(errors: Sequence[str | None], tokens: bool = False) -> tuple[RequestRecord, ...]:
    """Requests sent a millisecond apart, each good or failed with its error; a failed one streamed a token first
    where `tokens`."""
    return tuple(
        RequestRecord(
            sent_at=index / 1000,
            ttft_seconds=0.1 if tokens or not error else None,
            e2e_seconds=None if error else 0.2,
            prompt_tokens=None if error else 8,
            output_tokens=None if error else 4,
            error=error,
            gap_count=0 if error else 3,
            gap_total_seconds=0.0 if error else 0.1,
        )
        for index, error in enumerate(errors)
    )


def _step(errors: Sequence[str | None], concurrency: int = 4, tokens: bool = False) -> StepRun:
    requests = _records(errors, tokens)
    return StepRun(concurrency, 10.0, requests, (), None, 0.001, None, 10.0, len(requests), 4 * len(requests))


def test_a_server_refusing_most_of_a_steps_requests_ends_the_run() -> None:
    with pytest.raises(LoadtestError, match="the server stopped answering at concurrency 4: 60 of 100 requests"):
        _refuse_a_dead_server(_step([None] * 40 + ["connection refused"] * 60))


def test_a_step_that_streamed_not_one_token_and_mostly_timed_out_ends_the_run() -> None:
    # A hung engine: some requests answered an error at once, most waited out their timeout.
    with pytest.raises(LoadtestError, match="at concurrency 4: 6 of 10 requests got not one token in their time"):
        _refuse_a_dead_server(_step(["http 500"] * 4 + ["timeout"] * 6))


def test_an_overloaded_step_whose_requests_streamed_tokens_before_timing_out_is_judged() -> None:
    _refuse_a_dead_server(_step(["timeout"] * 6 + ["stalled"] * 4, tokens=True))
    _refuse_a_dead_server(_step([None] + ["timeout"] * 9))  # one answer: the server runs requests


@pytest.mark.parametrize(
    "tail",
    [
        ["connection refused"] * 4,
        ["timeout"] * 4,  # taken, never answered: an engine stuck behind a live API server
        ["connection refused", "timeout", "timeout", "connection refused"],
    ],
)
def test_a_server_whose_last_requests_one_per_slot_got_nothing_is_gone(tail: list[str | None]) -> None:
    # Most of the step was answered: judged, it would be a slow server.
    assert server_gone(_records([*[None] * 96, *tail]), 4) is not None


@pytest.mark.parametrize(
    ("tail", "tokens"),
    [
        (["connection refused"] * 3 + [None], False),  # one of the last answered: something still listens
        (["connection lost"] * 4, False),  # connections dropped mid-answer: a failing server, not an absent one
        (["timeout"] * 4, True),  # each streamed a token first: an overloaded server, slower than the timeout
        (["http 503"] * 4, False),  # the server answers, if with an error
        (["timeout"] * 3, False),  # fewer than one per slot ended so far
    ],
)
def test_a_server_still_there_at_the_end_of_a_step_is_judged_not_given_up_on(
    tail: list[str | None], tokens: bool
) -> None:
    assert server_gone(_records(tail, tokens), 4) is None
