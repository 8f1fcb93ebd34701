"""Time to saturation: a robust trend that sees ramps, ignores spikes and stays cheap for a recorded hour."""

import math
import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.trend import History, Point, eta_seconds, slope

POLL = 5.0
WINDOW = 120  # ten minutes of polls, what the daemon keeps


def series(values: list[float], start: float = 1_700_000_000.0) -> list[Point]:
    """Readings one poll apart on a wall clock, as the daemon records them."""
    return [Point(start + i * POLL, v) for i, v in enumerate(values)]


def ramp(start: float, per_second: float, n: int = WINDOW, noise: float = 0.0, seed: int = 0) -> list[Point]:
    jitter = random.Random(seed)
    return series([start + per_second * POLL * i + jitter.gauss(0, noise) for i in range(n)])


def test_a_linear_ramp_reaches_the_threshold_when_the_line_says():
    points = ramp(0.30, 0.0002)  # 0.30 → 0.419 over ten minutes
    now = points[-1].t
    expected = (0.90 - points[-1].value) / 0.0002
    assert eta_seconds(points, 0.90, now) == pytest.approx(expected, rel=0.01)


def test_a_noisy_ramp_still_finds_its_slope():
    points = ramp(0.30, 0.0002, noise=0.002)
    assert slope(points) == pytest.approx(0.0002, rel=0.05)


def test_the_eta_counts_from_now_along_the_trend():
    points = ramp(0.30, 0.0002)
    at_last = eta_seconds(points, 0.90, points[-1].t)
    assert eta_seconds(points, 0.90, points[-1].t + 60) == pytest.approx(at_last - 60)


def test_a_flat_series_never_saturates():
    assert eta_seconds(series([0.5] * WINDOW), 0.9, 1_700_000_000.0 + WINDOW * POLL) == math.inf


def test_a_falling_series_never_saturates():
    points = ramp(0.8, -0.0002)
    assert eta_seconds(points, 0.9, points[-1].t) == math.inf


def test_one_spike_in_a_flat_series_does_not_panic():
    values = [0.5] * WINDOW
    values[-1] = 0.99  # the last poll caught a burst above the threshold
    points = series(values)
    assert eta_seconds(points, 0.9, points[-1].t) == math.inf


def test_one_spike_in_a_slow_ramp_barely_moves_the_eta():
    points = ramp(0.30, 0.0002, noise=0.002)
    spiked = [*points[:-1], Point(points[-1].t, 0.99)]
    now = points[-1].t
    assert eta_seconds(spiked, 0.9, now) == pytest.approx(eta_seconds(points, 0.9, now), rel=0.01)


def test_already_at_the_threshold_is_zero():
    points = ramp(0.92, 0.0001)
    assert eta_seconds(points, 0.9, points[-1].t) == 0
    falling_but_above = ramp(0.99, -0.0001)
    assert eta_seconds(falling_but_above, 0.9, falling_but_above[-1].t) == 0


def test_too_little_history_has_no_trend():
    assert slope(series([0.1, 0.2])) is None
    assert slope(series([0.1, 0.2, 0.3])) is None  # ten seconds is under the one-minute span floor
    assert slope(series([0.1, 0.2, 0.3]), min_span_seconds=10) == pytest.approx(0.02)
    assert eta_seconds(series([0.1, 0.2]), 0.9, 1_700_000_010.0) == math.inf
    assert eta_seconds([], 0.9, 0.0) == math.inf


def test_without_a_trend_a_saturated_level_is_still_reported():
    assert eta_seconds(series([0.95, 0.96]), 0.9, 1_700_000_005.0) == 0


def test_rounding_noise_in_a_flat_series_is_not_a_trend():
    points = series([0.1 + 0.2 if i % 2 else 0.3 for i in range(WINDOW)])  # 0.30000000000000004 and 0.3
    assert eta_seconds(points, 0.9, points[-1].t) == math.inf


def test_history_keeps_only_the_window():
    history = History(max_age_seconds=600, max_points=WINDOW)
    for point in ramp(0.1, 0.0001, n=720):
        history = history.add(point)
    assert len(history.points) == WINDOW
    assert history.points[-1].t - history.points[0].t <= 600


def test_history_drops_points_older_than_the_max_age():
    history = History(max_age_seconds=60, max_points=1000)
    for point in ramp(0.1, 0.0001, n=100):
        history = history.add(point)
    assert len(history.points) == 13  # 60 s at 5 s, both ends included
    assert history.points[-1].t - history.points[0].t == 60


def test_history_add_returns_a_new_history_and_keeps_the_old_one():
    empty = History(max_age_seconds=60, max_points=10)
    one = empty.add(Point(0.0, 0.5))
    assert empty.points == ()
    assert one.points == (Point(0.0, 0.5),)


def test_a_clock_stepping_back_restarts_the_history():
    history = History(max_age_seconds=600, max_points=WINDOW)
    for point in ramp(0.1, 0.0001, n=10):
        history = history.add(point)
    stepped_back = history.add(Point(history.points[0].t - 3600, 0.4))
    assert stepped_back.points == (Point(history.points[0].t - 3600, 0.4),)


def test_a_point_at_the_same_time_replaces_the_last():
    history = History(max_age_seconds=600, max_points=WINDOW).add(Point(0.0, 0.1)).add(Point(5.0, 0.2))
    assert history.add(Point(5.0, 0.3)).points == (Point(0.0, 0.1), Point(5.0, 0.3))


def test_non_finite_readings_are_ignored():
    history = History(max_age_seconds=600, max_points=WINDOW).add(Point(0.0, 0.1))
    assert history.add(Point(5.0, math.nan)) == history
    assert history.add(Point(math.inf, 0.2)) == history


def test_history_rejects_an_empty_window():
    with pytest.raises(ValueError):
        History(max_age_seconds=0, max_points=10)
    with pytest.raises(ValueError):
        History(max_age_seconds=60, max_points=0)


def test_a_recorded_hour_at_five_seconds_replays_in_milliseconds_per_poll():
    readings = ramp(0.2, 0.0001, n=720, noise=0.005)
    history = History(max_age_seconds=600, max_points=WINDOW)
    started = time.perf_counter()
    for point in readings:
        history = history.add(point)
        eta = eta_seconds(history.points, 0.9, point.t)
    per_poll = (time.perf_counter() - started) / len(readings)
    # A full ten-minute window is ~7,000 pairwise slopes: about 2 ms on a laptop; a 5 s poll affords far more.
    assert per_poll < 0.02
    assert eta == pytest.approx((0.9 - (0.2 + 0.0001 * 719 * POLL)) / 0.0001, rel=0.05)


times = st.floats(min_value=0, max_value=1e5, allow_nan=False)
values = st.floats(min_value=-10, max_value=10, allow_nan=False)


@given(st.lists(st.tuples(times, values), max_size=40), values, times)
def test_the_eta_is_never_negative(readings: list[tuple[float, float]], threshold: float, now: float):
    points = [Point(t, v) for t, v in sorted(readings)]
    eta = eta_seconds(points, threshold, now, min_span_seconds=0)
    assert eta >= 0
    assert not math.isnan(eta)


# The daemon's window: 60 readings, 5 s apart, and a trend only over at least three polls.
DAEMON_POINTS = 60
DAEMON_MIN_SPAN = 3 * POLL
THRESHOLD = 0.9


def test_the_eta_turns_to_never_within_two_polls_of_usage_falling_below_the_threshold():
    rise = [0.5 + 0.49 * i / 9 for i in range(10)]  # 0.50 -> 0.99 in ten polls
    plateau = [0.99] * 50
    fall = [0.99 - 0.39 * k / 16 for k in range(1, 17)]  # 0.99 -> 0.60 over 16 polls
    readings = series(rise + plateau + fall)
    polls_below = 0
    etas = []
    for end in range(len(rise) + len(plateau) + 1, len(readings) + 1):
        window = readings[max(0, end - DAEMON_POINTS) : end]
        now = window[-1].t
        eta = eta_seconds(window, THRESHOLD, now, min_span_seconds=DAEMON_MIN_SPAN)
        etas.append((round(window[-1].value, 3), eta))
        polls_below += window[-1].value < THRESHOLD
        assert eta == 0 or eta == math.inf, f"a finite ETA while usage falls: {etas}"
        if polls_below >= 2:
            assert eta == math.inf, f"still saturated after {polls_below} polls below the threshold: {etas}"
    assert polls_below == 13


@pytest.mark.parametrize("at", [1, 2, 3, 10, 30])
def test_one_spike_over_the_threshold_in_a_flat_series_is_not_saturation(at: int):
    values = [0.5] * DAEMON_POINTS
    values[-at] = 0.99
    points = series(values)
    assert eta_seconds(points, THRESHOLD, points[-1].t, min_span_seconds=DAEMON_MIN_SPAN) == math.inf


def test_a_steady_rise_below_the_threshold_gives_the_linear_eta():
    per_second = 0.001  # 0.30 -> 0.595 over the window
    points = ramp(0.30, per_second, n=DAEMON_POINTS)
    now = points[-1].t
    expected = (THRESHOLD - points[-1].value) / per_second
    assert eta_seconds(points, THRESHOLD, now, min_span_seconds=DAEMON_MIN_SPAN) == pytest.approx(expected, rel=0.02)
