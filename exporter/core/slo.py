"""Engine-agnostic SLI counters from latency histograms, and the burn-rate table the alert rules are built from.

An SLI here is two counters per objective: requests seen, and requests that met the latency threshold. Engines
expose latency only as cumulative histograms whose bucket bounds rarely match the operator's threshold, so
`good_count` estimates how many observations were at or under it:

- up to a bucket bound, the good requests are that bucket's cumulative count, exactly;
- inside a bucket, observations are assumed spread uniformly between its lower and upper bound (the assumption
  of Prometheus' `histogram_quantile`), so the count is interpolated linearly between the two cumulative counts.
  The first bucket's lower bound is 0 when its upper bound is positive, as latencies are never negative (a first
  bound at or below 0 holds observations taken to sit exactly at it);
- above the largest finite bound, only the finite buckets count: an observation in the `+Inf` bucket has no upper
  bound, so it is never known to be good.

Engine histograms are counters that reset when the engine restarts. `advance` turns successive scrapes into
cumulative totals that only ever increase, with the reset handling of Prometheus' `increase()`.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

SLO_NAMES = ("ttft", "itl", "e2e")

Severity = Literal["page", "ticket"]

_HOUR = 3600.0
_DAY = 24 * _HOUR

# The Google SRE workbook's multiwindow, multi-burn-rate alerts ("Alerting on SLOs", table 5-8):
# (severity, share of the period's error budget, long window, short window). The short window is 1/12 of the long
# one so an alert stops soon after the burn does. The burn factors are derived from these and the period.
_BURN_POLICY: tuple[tuple[Severity, float, float, float], ...] = (
    ("page", 0.02, _HOUR, 5 * 60.0),
    ("page", 0.05, 6 * _HOUR, 30 * 60.0),
    ("ticket", 0.10, _DAY, 2 * _HOUR),
    ("ticket", 0.10, 3 * _DAY, 6 * _HOUR),
)
# The slowest burn-rate alert looks back this far: an SLO period shorter than it has no budget for it to measure.
LONGEST_BURN_WINDOW_SECONDS = max(long_window for _, _, long_window, _ in _BURN_POLICY)


class CumulativeHistogram(Protocol):
    """What `good_count` reads: (upper bound, cumulative count) pairs sorted by bound, +Inf last, and the count.

    `exporter.sources.engines.base.Histogram` fits; the core does not import it, so data flows one way.
    """

    @property
    def buckets(self) -> Sequence[tuple[float, float]]: ...

    @property
    def count(self) -> float: ...


@dataclass(frozen=True)
class SloSpec:
    name: str  # one of SLO_NAMES for the daemon's histograms
    threshold_seconds: float
    objective: float  # the ratio of good requests to aim for, e.g. 0.99

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold_seconds) and self.threshold_seconds > 0):
            raise ValueError(f"slo {self.name}: threshold {self.threshold_seconds!r} is not a positive duration")
        if not 0 < self.objective < 1:
            raise ValueError(f"slo {self.name}: objective {self.objective!r} is not a ratio between 0 and 1")


def good_count(histogram: CumulativeHistogram, threshold_seconds: float) -> float:
    """Estimated observations at or under the threshold (see the module docstring for the interpolation)."""
    if math.isnan(threshold_seconds):
        raise ValueError("threshold is NaN")
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, raw_count in histogram.buckets:
        # A scrape is not atomic in every client library (vLLM's multiprocess mode sums files as it reads them),
        # so a bucket can read lower than the one before; like histogram_quantile, treat it as equal.
        upper_count = max(raw_count, lower_count)
        if math.isinf(upper_bound):
            break
        if threshold_seconds == upper_bound:
            return _within_count(upper_count, histogram)
        if threshold_seconds < upper_bound:
            if threshold_seconds <= lower_bound:
                return _within_count(lower_count, histogram)
            fraction = (threshold_seconds - lower_bound) / (upper_bound - lower_bound)
            # Rounding must not step past the bucket's own count, or the estimate would not be monotone.
            return _within_count(min(upper_count, lower_count + (upper_count - lower_count) * fraction), histogram)
        lower_bound, lower_count = upper_bound, upper_count
    return _within_count(lower_count, histogram)


def _within_count(good: float, histogram: CumulativeHistogram) -> float:
    # A torn scrape can also show buckets above the count; good must never exceed total.
    return min(good, max(histogram.count, 0.0))


@dataclass(frozen=True)
class SloCounter:
    """Cumulative SLI counters across polls, and the raw values of the last scrape (None before the first)."""

    total: float = 0.0
    good: float = 0.0
    last_total: float | None = None
    last_good: float | None = None


def advance(counter: SloCounter, histogram: CumulativeHistogram, threshold_seconds: float) -> SloCounter:
    """Add what happened since the last scrape; `total` and `good` never decrease.

    The first scrape counts in full: the engine's history since it started becomes the first increase, so a
    freshly started daemon reports what the engine has served, and Prometheus' rate() over the new series reads
    it as the series' start rather than as a burst. Until the engine restarts, `total` therefore equals the
    engine's own count, and a restarted daemon continues its series where it left off. After a reset (the
    count, or the good count, went down) the new raw values are the increase since the engine restarted, as in
    Prometheus' increase().
    """
    raw_total = max(histogram.count, 0.0)
    raw_good = good_count(histogram, threshold_seconds)
    # The first scrape and a reset both start the series over: the raw values are the increase.
    last_total, last_good = counter.last_total, counter.last_good
    if last_total is None or last_good is None or raw_total < last_total or raw_good < last_good:
        total_increase, good_increase = raw_total, raw_good
    else:
        total_increase, good_increase = raw_total - last_total, raw_good - last_good
    return SloCounter(
        total=counter.total + total_increase,
        # Interpolation across torn scrapes could credit more good than seen; the SLI ratio must stay <= 1.
        good=counter.good + min(good_increase, total_increase),
        last_total=raw_total,
        last_good=raw_good,
    )


@dataclass(frozen=True)
class BurnWindow:
    """One multiwindow burn-rate alert: fire when both windows burn the error budget at `factor` times or more."""

    severity: Severity
    long_window_seconds: float
    short_window_seconds: float
    factor: float  # burn rate: budget_fraction of the period's budget spent within the long window
    budget_fraction: float
    error_ratio: float  # factor * (1 - objective): bad/total over both windows that fires; above 1 it never can


def burn_rate_factors(objective: float, period_days: float = 30) -> list[BurnWindow]:
    """The SRE workbook's burn-rate table for an objective over an SLO period of `period_days`.

    A burn rate of 1 spends the budget exactly over the period, so spending `budget_fraction` of it within a long
    window takes a rate of budget_fraction * period / long window: 0.02 * 30 d / 1 h = 14.4 for a 30-day period.
    """
    if not 0 < objective < 1:
        raise ValueError(f"objective {objective!r} is not a ratio between 0 and 1")
    if not (math.isfinite(period_days) and period_days > 0):
        raise ValueError(f"period {period_days!r} days is not positive")
    period_seconds = period_days * _DAY
    windows = []
    for severity, budget_fraction, long_window, short_window in _BURN_POLICY:
        factor = budget_fraction * period_seconds / long_window
        windows.append(
            BurnWindow(
                severity=severity,
                long_window_seconds=long_window,
                short_window_seconds=short_window,
                factor=factor,
                budget_fraction=budget_fraction,
                error_ratio=factor * (1 - objective),
            )
        )
    return windows
