"""The scale-up lag's state machine (exporter/core/scale_up.py), one model's fleet fed reading by reading."""

import math
from collections.abc import Iterable

import pytest

from exporter.core.scale_up import KEPT_LAGS, LAG_BUCKETS, FleetReading, Lags, ScaleUp

KNEE = 10.0  # requests one replica holds
SETTLE = 15.0


def _fed(readings: Iterable[tuple[float, float, int]], state: ScaleUp | None = None) -> ScaleUp:
    state = state or ScaleUp(KNEE, SETTLE)
    for time, demand, ready in readings:
        state = state.observe(FleetReading(time, demand, ready))
    return state


def test_demand_crossing_capacity_opens_an_episode_that_ages_until_answered() -> None:
    state = _fed([(0, 15, 2), (5, 25, 2)])
    assert state.episode is not None and state.episode.started == 5 and state.episode.baseline == 2
    assert state.pending_seconds(65) == 60
    assert state.lags.count == 0


def test_a_new_replica_ready_answers_the_episode_with_its_lag() -> None:
    state = _fed([(0, 15, 2), (5, 25, 2), (100, 30, 2), (245, 30, 3)])
    assert state.episode is None and state.pending_seconds(300) == 0
    assert (state.lags.count, state.lags.sum_seconds, state.lags.last_seconds) == (1, 240, 240)
    # Cumulative buckets: 240 s is over every bound up to 180 s and within 300 s and all above.
    assert state.lags.buckets == tuple(int(bound >= 240) for bound in LAG_BUCKETS)


def test_demand_falling_back_to_capacity_abandons_the_episode_unmeasured() -> None:
    state = _fed([(0, 15, 2), (5, 25, 2), (30, 20, 2), (40, 5, 3)])
    assert state.episode is None and state.lags.count == 0


def test_demand_over_capacity_at_the_first_reading_is_no_crossing() -> None:
    state = _fed([(0, 50, 2), (60, 50, 3)])
    assert state.episode is None and state.lags.count == 0
    # Once demand has been under capacity, the next rise over it is a crossing.
    state = _fed([(70, 20, 3), (80, 40, 3), (200, 40, 4)], state)
    assert state.lags.recent == (120,)


def test_demand_over_capacity_after_a_reading_with_no_replica_ready_is_no_crossing() -> None:
    """A daemon that reached no replica (starting before its pod list, or cut off from every engine) read no demand:
    demand over capacity once they answer may have crossed at any time in between."""
    assert _fed([(0, 0, 0), (10, 15, 1), (100, 15, 2)]).lags.count == 0
    assert _fed([(0, 5, 1), (10, 0, 0), (20, 15, 1), (100, 15, 2)]).lags.count == 0
    # Back under capacity, the next rise over it is a crossing again.
    assert _fed([(0, 0, 0), (10, 5, 1), (20, 15, 1), (100, 15, 2)]).lags.recent == (80,)


def test_the_rest_of_one_scale_up_is_not_timed_from_the_first_replicas_arrival() -> None:
    """Demand for five replicas at once: the first arrives after 300 s, the others seconds later. Only the first
    answers the crossing; another needs demand to fall to capacity and rise again."""
    state = _fed([(0, 10, 1), (10, 50, 1), (310, 50, 2), (315, 50, 3), (320, 50, 5)])
    assert state.lags.recent == (300,) and state.episode is None
    state = _fed([(400, 40, 5), (500, 60, 5), (800, 60, 6)], state)
    assert state.lags.recent == (300, 300)


def test_a_replica_whose_poll_failed_is_no_new_replica_when_it_returns() -> None:
    """Two replicas, one missing from a reading for a failed poll while the other is over its knee: the episode's
    baseline is the two ready a moment ago, so the second's return answers nothing."""
    state = _fed([(0, 15, 2), (5, 12, 1), (10, 25, 2)])
    assert state.episode is not None and state.episode.baseline == 2 and state.lags.count == 0
    assert _fed([(400, 25, 3)], state).lags.recent == (395,)


def test_a_replica_gone_longer_than_the_settle_time_is_not_in_the_baseline() -> None:
    state = _fed([(0, 8, 2), (5, 8, 1), (60, 15, 1), (200, 15, 2)])
    assert state.lags.recent == (140,)


def test_the_replicas_remembered_for_the_baseline_are_one_entry_per_change_not_per_reading() -> None:
    """Readings four times a second over a long settle time: a steady count is one entry, however many readings."""
    state = _fed(((t / 4, 5.0, 2) for t in range(4000)), ScaleUp(KNEE, 3600.0))
    assert state.seen == ((999.75, 2),)
    state = _fed([(1000, 5, 1), (1001, 5, 1), (1002, 25, 2)], state)
    assert state.seen == ((999.75, 2), (1001, 1), (1002, 2))
    assert state.episode is not None and state.episode.baseline == 2


def test_replicas_going_down_during_an_episode_leave_it_open_until_more_than_at_its_start_are_ready() -> None:
    state = _fed([(0, 20, 3), (10, 40, 3), (20, 40, 2), (200, 40, 3)])
    assert state.episode is not None and state.pending_seconds(200) == 190
    state = _fed([(260, 40, 4)], state)
    assert state.lags.recent == (250,)


def test_every_replica_gone_ends_the_episode_unmeasured() -> None:
    """Demand is read from ready replicas: with none left there is none, so the episode is abandoned."""
    state = _fed([(0, 5, 1), (10, 15, 1), (20, 0, 0), (300, 15, 2)])
    assert state.lags.count == 0


def test_several_models_keep_states_of_their_own() -> None:
    models = {"a": ScaleUp(KNEE, SETTLE), "b": ScaleUp(4.0, SETTLE)}
    for time, readings in (
        (0, {"a": (5, 1), "b": (3, 1)}),
        (10, {"a": (15, 1), "b": (3, 1)}),
        (20, {"a": (15, 1), "b": (6, 1)}),
        (80, {"a": (15, 2), "b": (6, 1)}),
    ):
        models = {m: models[m].observe(FleetReading(time, *readings[m])) for m in models}
    assert models["a"].lags.recent == (70,) and models["a"].episode is None
    assert models["b"].lags.count == 0 and models["b"].pending_seconds(80) == 60


def test_a_clock_stepping_back_forgets_the_episode() -> None:
    state = _fed([(100, 5, 1), (110, 15, 1), (50, 15, 1), (400, 15, 2)])
    assert state.episode is None and state.lags.count == 0


def test_a_reading_that_is_not_a_number_is_ignored() -> None:
    state = _fed([(0, 5, 1), (10, math.nan, 1), (math.inf, 15, 1), (20, 15, 1), (50, 15, 2)])
    assert state.lags.recent == (30,)


def test_the_median_is_over_the_last_kept_lags_and_the_count_over_all() -> None:
    lags = Lags()
    for seconds in [1000.0] * 10 + [60.0] * KEPT_LAGS:
        lags = lags.add(seconds)
    assert lags.count == KEPT_LAGS + 10 and lags.median_seconds == 60.0
    assert Lags().median_seconds is None and Lags().last_seconds is None


@pytest.mark.parametrize("seconds", [15.0, 15.5, 1800.0, 4000.0])
def test_a_lag_on_a_bound_is_in_that_bucket(seconds: float) -> None:
    buckets = Lags().add(seconds).buckets
    assert buckets == tuple(int(seconds <= bound) for bound in LAG_BUCKETS)
