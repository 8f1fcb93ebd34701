"""The duration summary answers quantiles within its stated accuracy, merges exactly, and stays small."""

import random
from collections.abc import Callable

import pytest

from exporter.loadtest.judge import percentile
from exporter.loadtest.sketch import RELATIVE_ACCURACY, DurationSummary

# 10,001 values: q (n - 1) is a whole rank for every q below, so `percentile` gives an order statistic.
SIZE = 10_001
QUANTILES = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0)


def _uniform(rng: random.Random) -> float:
    return rng.uniform(0.001, 0.2)


def _lognormal(rng: random.Random) -> float:
    return rng.lognormvariate(-4.0, 1.5)  # ITL-like: median 18 ms, a long tail to seconds


def _with_zeros(rng: random.Random) -> float:
    # Chunks read in one go are 0 or a few hundred nanoseconds apart; the rest are token gaps.
    roll = rng.random()
    return 0.0 if roll < 0.3 else rng.uniform(0.0, 5e-7) if roll < 0.4 else rng.expovariate(50.0)


def _summary(values: list[float]) -> DurationSummary:
    summary = DurationSummary()
    for value in values:
        summary.add(value)
    return summary


@pytest.mark.parametrize("draw", [_uniform, _lognormal, _with_zeros])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_quantiles_are_within_the_stated_relative_accuracy_of_the_exact_percentile(
    draw: Callable[[random.Random], float], seed: int
) -> None:
    rng = random.Random(seed)
    values = [draw(rng) for _ in range(SIZE)]
    summary = _summary(values)
    ordered = sorted(values)
    for q in QUANTILES:
        exact = percentile(ordered, q)
        estimate = summary.quantile(q)
        assert exact is not None and estimate is not None
        if exact < 1e-6:  # the bottom bucket: within a microsecond, not 1%
            assert abs(estimate - exact) < 1e-6, (q, exact, estimate)
        else:
            assert abs(estimate - exact) <= RELATIVE_ACCURACY * exact, (q, exact, estimate)
    assert summary.total_seconds == pytest.approx(sum(values))


def test_between_two_ranks_the_quantile_is_the_lower_order_statistic_within_the_accuracy() -> None:
    values = [0.01] * 5 + [1.0] * 5  # p50 interpolates halfway: 0.505, which no duration here is near
    summary = _summary(values)
    assert summary.quantile(0.5) == pytest.approx(0.01, rel=RELATIVE_ACCURACY)


def test_zeros_alone_are_answered_exactly() -> None:
    summary = _summary([0.0] * 100)
    assert summary.quantile(0.5) == 0.0 and summary.quantile(0.99) == 0.0
    assert not summary.buckets


def test_an_empty_summary_has_no_quantile() -> None:
    assert DurationSummary().quantile(0.5) is None


def test_merging_summaries_is_adding_every_value_to_one() -> None:
    rng = random.Random(7)
    parts = [[_with_zeros(rng) for _ in range(rng.randrange(0, 500))] for _ in range(20)]
    merged = DurationSummary()
    for part in parts:
        merged.merge(_summary(part))
    whole = _summary([value for part in parts for value in part])
    assert merged.buckets == whole.buckets
    assert (merged.count, merged.tiny) == (whole.count, whole.tiny)
    assert (merged.minimum_seconds, merged.maximum_seconds) == (whole.minimum_seconds, whole.maximum_seconds)
    assert merged.total_seconds == pytest.approx(whole.total_seconds)
    assert [merged.quantile(q) for q in QUANTILES] == [whole.quantile(q) for q in QUANTILES]


def test_a_million_durations_from_a_microsecond_to_ten_seconds_fill_a_bounded_number_of_buckets() -> None:
    rng = random.Random(11)
    summary = DurationSummary()
    for _ in range(1_000_000):
        summary.add(10 ** rng.uniform(-6, 1))
    assert summary.count == 1_000_000
    # ln(10 s / 1 us) / ln((1 + a) / (1 - a)) = 806 for a = 1%, however many durations there are.
    assert len(summary.buckets) <= 807
