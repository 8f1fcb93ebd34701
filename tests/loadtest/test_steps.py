"""How a run treats each step's requests as a whole: a server gone mid-run ends the run instead of being judged."""

import pytest

from exporter.loadtest.measure import RequestRecord, StepRun
from exporter.loadtest.runner import LoadtestError
from exporter.loadtest.steps import _refuse_a_dead_server


def _step(errors: list[str | None], concurrency: int = 4) -> StepRun:
    """A step whose requests were sent a millisecond apart, each good or failed with its error."""
    requests = tuple(
        RequestRecord(
            sent_at=index / 1000,
            ttft_seconds=None if error else 0.1,
            e2e_seconds=None if error else 0.2,
            prompt_tokens=None if error else 8,
            output_tokens=None if error else 4,
            error=error,
            gap_count=0 if error else 3,
            gap_total_seconds=0.0 if error else 0.1,
        )
        for index, error in enumerate(errors)
    )
    return StepRun(concurrency, 10.0, requests, (), None, 0.001, None, 10.0, len(requests), 4 * len(requests))


def test_a_server_refusing_most_of_a_steps_requests_ends_the_run() -> None:
    with pytest.raises(LoadtestError, match="the server stopped answering at concurrency 4: 60 of 100 requests"):
        _refuse_a_dead_server(_step([None] * 40 + ["connection refused"] * 60))


def test_a_server_that_died_late_in_a_step_ends_the_run_though_most_of_its_requests_were_answered() -> None:
    # Its last request of each of the four workers found nothing listening: judged, it would be a slow server.
    with pytest.raises(LoadtestError, match="the server stopped answering at concurrency 4: 5 of 100 requests"):
        _refuse_a_dead_server(_step([None] * 95 + ["connection refused"] * 5))


@pytest.mark.parametrize(
    "tail",
    [
        ["connection refused"] * 3 + [None],  # one of the last answered: something still listens
        ["connection lost"] * 4,  # connections dropped mid-answer: a failing server, not an absent one
    ],
)
def test_a_server_still_there_at_the_end_of_a_step_is_judged_not_given_up_on(tail: list[str | None]) -> None:
    _refuse_a_dead_server(_step([None] * 96 + tail))
