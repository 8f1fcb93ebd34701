"""SLI counters from latency histograms, pinned to hand-computed interpolation, and the burn-rate table."""

import math
from dataclasses import dataclass
from itertools import accumulate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.slo import SloCounter, SloSpec, advance, burn_rate_factors, good_count

INF = math.inf


@dataclass(frozen=True)
class Histogram:
    """The shape of exporter.sources.engines.base.Histogram, which the pure core reads without importing."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float = 0.0


def histogram(*buckets: tuple[float, float]) -> Histogram:
    return Histogram(buckets=buckets, count=buckets[-1][1] if buckets else 0.0)


# 100 requests: 10 under 100 ms, 30 more under 250 ms, 30 under 500 ms, 20 under 1 s, 10 slower than 1 s.
TTFT = histogram((0.1, 10), (0.25, 40), (0.5, 70), (1.0, 90), (INF, 100))


def test_threshold_on_a_bucket_bound_counts_that_bucket_exactly():
    assert good_count(TTFT, 0.25) == 40


def test_threshold_inside_a_bucket_interpolates_linearly():
    # 0.4 is 0.15 / 0.25 = 60% into the (0.25, 0.5] bucket of 30 requests: 40 + 18.
    assert good_count(TTFT, 0.4) == pytest.approx(58)


def test_threshold_below_the_first_bound_interpolates_from_zero():
    assert good_count(TTFT, 0.05) == pytest.approx(5)


def test_threshold_above_the_largest_finite_bound_never_counts_the_inf_bucket():
    assert good_count(TTFT, 2.0) == 90
    assert good_count(TTFT, INF) == 90


def test_zero_and_negative_thresholds_count_nothing():
    assert good_count(TTFT, 0.0) == 0
    assert good_count(TTFT, -1.0) == 0


def test_a_first_bucket_at_zero_holds_observations_at_zero():
    zero_first = histogram((0.0, 3), (1.0, 5), (INF, 5))
    assert good_count(zero_first, 0.0) == 3
    assert good_count(zero_first, 0.5) == pytest.approx(4)


def test_an_empty_histogram_has_no_good_requests():
    assert good_count(Histogram(buckets=(), count=0), 0.5) == 0
    assert good_count(histogram((0.1, 0), (INF, 0)), 0.5) == 0


def test_a_torn_scrape_never_reports_more_good_than_total():
    # Buckets read while requests completed: a later bucket below an earlier one, the count below the buckets.
    torn = Histogram(buckets=((0.1, 10), (0.25, 8), (INF, 12)), count=9)
    assert good_count(torn, 0.2) == 9
    assert good_count(Histogram(buckets=((0.1, 10), (0.25, 8), (INF, 12)), count=20), 0.2) == 10


def test_a_nan_threshold_is_rejected():
    with pytest.raises(ValueError):
        good_count(TTFT, math.nan)


def test_first_scrape_counts_the_engines_history():
    counter = advance(SloCounter(), TTFT, 0.4)
    assert (counter.total, counter.good) == (100, pytest.approx(58))
    assert (counter.last_total, counter.last_good) == (100, pytest.approx(58))


def test_later_scrapes_add_the_increase():
    later = histogram((0.1, 10), (0.25, 50), (0.5, 80), (1.0, 100), (INF, 120))
    counter = advance(advance(SloCounter(), TTFT, 0.25), later, 0.25)
    assert (counter.total, counter.good) == (120, 50)


def test_a_counter_reset_takes_the_new_raw_values_as_the_increase():
    restarted = histogram((0.1, 3), (0.25, 5), (INF, 7))
    counter = advance(advance(SloCounter(), TTFT, 0.25), restarted, 0.25)
    assert (counter.total, counter.good) == (100 + 7, 40 + 5)
    assert (counter.last_total, counter.last_good) == (7, 5)


def test_good_going_down_while_the_count_grows_is_a_reset():
    # The engine restarted and served more requests than before the restart between two polls.
    restarted = histogram((0.1, 5), (0.25, 20), (INF, 130))
    counter = advance(advance(SloCounter(), TTFT, 0.25), restarted, 0.25)
    assert (counter.total, counter.good) == (100 + 130, 40 + 20)


def test_cumulative_counters_never_decrease_across_resets():
    scrapes = [TTFT, histogram((0.25, 2), (INF, 4)), histogram((0.25, 2), (INF, 4)), histogram((0.25, 30), (INF, 50))]
    counter, seen = SloCounter(), []
    for scrape in scrapes:
        counter = advance(counter, scrape, 0.25)
        seen.append((counter.total, counter.good))
    assert seen == [(100, 40), (104, 42), (104, 42), (150, 70)]


def test_slo_spec_rejects_an_objective_given_as_a_percentage():
    with pytest.raises(ValueError, match="between 0 and 1"):
        SloSpec("ttft", 0.5, 99)
    with pytest.raises(ValueError, match="positive"):
        SloSpec("itl", 0.0, 0.99)


def test_burn_factors_for_a_30_day_period_match_the_sre_workbook():
    windows = burn_rate_factors(0.999)
    assert [w.factor for w in windows] == pytest.approx([14.4, 6, 3, 1])
    assert [w.severity for w in windows] == ["page", "page", "ticket", "ticket"]
    assert [(w.long_window_seconds, w.short_window_seconds) for w in windows] == [
        (3600, 300),
        (6 * 3600, 1800),
        (86400, 2 * 3600),
        (3 * 86400, 6 * 3600),
    ]
    assert [w.budget_fraction for w in windows] == [0.02, 0.05, 0.10, 0.10]
    assert [w.error_ratio for w in windows] == pytest.approx([0.0144, 0.006, 0.003, 0.001])


def test_burn_factors_scale_with_the_slo_period():
    week = burn_rate_factors(0.999, period_days=7)
    assert [w.factor for w in week] == pytest.approx([3.36, 1.4, 0.7, 0.7 / 3])


def test_a_low_objective_makes_the_fastest_page_unreachable():
    # 14.4 * 10% budget is an error ratio above 1: no window can burn that fast.
    assert burn_rate_factors(0.9)[0].error_ratio > 1


def test_burn_factors_reject_an_objective_outside_0_1():
    with pytest.raises(ValueError):
        burn_rate_factors(1.0)
    with pytest.raises(ValueError):
        burn_rate_factors(0.99, period_days=0)


@st.composite
def histograms(draw: st.DrawFn) -> Histogram:
    bounds = sorted(draw(st.lists(st.floats(min_value=1e-4, max_value=100), unique=True, max_size=12)))
    per_bucket = draw(st.lists(st.integers(0, 10_000), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
    cumulative = [float(c) for c in accumulate(per_bucket)]
    return Histogram(buckets=(*zip(bounds, cumulative, strict=False), (INF, cumulative[-1])), count=cumulative[-1])


thresholds = st.floats(min_value=-1, max_value=200, allow_nan=False)


@given(histograms(), thresholds)
def test_good_count_stays_between_zero_and_the_count(hist: Histogram, threshold: float):
    assert 0 <= good_count(hist, threshold) <= hist.count


@given(histograms(), thresholds, thresholds)
def test_good_count_is_monotone_in_the_threshold(hist: Histogram, a: float, b: float):
    low, high = sorted((a, b))
    assert good_count(hist, low) <= good_count(hist, high)


@given(st.lists(histograms(), min_size=1, max_size=8), thresholds)
def test_advanced_counters_only_increase_and_good_never_exceeds_total(scrapes: list[Histogram], threshold: float):
    counter = SloCounter()
    for scrape in scrapes:
        advanced = advance(counter, scrape, threshold)
        assert advanced.total >= counter.total
        assert advanced.good >= counter.good
        assert advanced.good <= advanced.total
        counter = advanced
