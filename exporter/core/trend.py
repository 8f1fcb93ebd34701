"""Time to saturation from a short history of one reading (KV-cache usage, in the daemon).

The trend is a Theil-Sen line: its slope is the median of the slopes between every pair of points, and its level
at a moment is the median of the points carried along that slope to it. Medians are why: a poll that catches a
burst, or an engine that misreports once, moves a least-squares fit and the last raw value a lot, and a median
hardly at all, so the ETA does not page anyone over one spike. Up to 29% of the points can be outliers before
the slope breaks down.

The daemon owns the clock: it passes the time of each reading and the current time in. Times are seconds on any
clock; only differences matter.
"""

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import median

MIN_POINTS = 3


@dataclass(frozen=True)
class Point:
    t: float  # seconds
    value: float


def slope(points: Sequence[Point], min_span_seconds: float = 60.0) -> float | None:
    """The Theil-Sen slope in value per second; None with fewer than 3 points or less than `min_span_seconds`.

    The span floor keeps a few seconds of jitter right after start-up from reading as a trend.
    """
    if len(points) < MIN_POINTS:
        return None
    times = [p.t for p in points]
    if max(times) - min(times) < min_span_seconds:
        return None
    values = [p.value for p in points]
    # Pairs are walked by lag so each pass is one zip over the lists: the ~7,000 pairs of a 120-point window and
    # the sort inside the median take a millisecond or two, which a poll every few seconds affords.
    slopes = [
        (later_value - value) / (later_t - t)
        for lag in range(1, len(points))
        for t, later_t, value, later_value in zip(times, times[lag:], values, values[lag:], strict=False)
        if later_t != t
    ]
    return median(slopes) if slopes else None


RECENT_POINTS = 12  # one minute at the default 5 s poll: what "now" means for a turn in the trend
# One-sided 95% for the Mann-Kendall statistic: a fall this clear in the recent points is not noise.
_FALLING_Z = 1.645


def _level(points: Sequence[Point], now: float, slope_per_second: float) -> float:
    """The trend line's value at `now`."""
    return median(p.value + slope_per_second * (now - p.t) for p in points)


def _falling(points: Sequence[Point]) -> bool:
    """Whether the points fall, beyond what noise explains (Mann-Kendall: the sign of every later-minus-earlier
    difference, summed, against its spread under no trend)."""
    n = len(points)
    if n < 4:
        return False
    s = sum(
        (later.value > p.value) - (later.value < p.value) for i, p in enumerate(points) for later in points[i + 1 :]
    )
    spread = math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    return s < -_FALLING_Z * spread


def eta_seconds(
    points: Sequence[Point],
    threshold: float,
    now: float,
    *,
    min_span_seconds: float = 60.0,
    min_slope: float = 1e-9,
) -> float:
    """Seconds from `now` until the trend reaches `threshold`: 0 while the usage is there, `math.inf` when there
    is no rising trend (too little history, flat, falling, or a slope under `min_slope` per second).

    "The usage" is the median of the last three readings, so one spike does not report saturation, and usage that
    has fallen below the threshold stops reading as saturated within two polls. A window's slope turns slowly (a
    long plateau holds its median near zero for minutes), so a clear fall in the last `RECENT_POINTS` readings
    gives `math.inf` at once: the alert that reads this must not see "saturated" or "soon" while usage drains.
    The ETA runs along the window's Theil-Sen line, not from the last reading, so one spike does not shorten it.
    `min_slope` keeps rounding noise in a flat series (0.30000000000000004 after 0.3) from turning "never" into an
    ETA of centuries.
    """
    if not points:
        return math.inf
    usage = median(p.value for p in points[-3:])
    if usage >= threshold:
        return 0.0
    rate = slope(points, min_span_seconds)
    if rate is None or rate <= 0.0 or rate < min_slope or _falling(points[-RECENT_POINTS:]):
        return math.inf
    # The line can sit above the threshold while the readings have not got there yet (a ramp that just slowed):
    # then the readings, not the line, say how far there is still to go.
    level = _level(points, now, rate)
    return (threshold - (level if level < threshold else usage)) / rate


@dataclass(frozen=True)
class History:
    """The last `max_age_seconds` (and at most `max_points`) of readings, oldest first; `add` returns a new one.

    A point earlier than the last one means the clock stepped back (an NTP correction of the wall clock): the
    history restarts from that point, because dropping points until the clock catches up would freeze the window
    for as long as the step, and keeping both sides would bend the slope. A point at the same time as the last one
    replaces it. Points with a NaN or infinite time or value are ignored: one would poison every median.
    """

    max_age_seconds: float
    max_points: int
    points: tuple[Point, ...] = ()

    def __post_init__(self) -> None:
        if not self.max_age_seconds > 0:
            raise ValueError(f"max_age_seconds {self.max_age_seconds!r} is not positive")
        if self.max_points < 1:
            raise ValueError(f"max_points {self.max_points!r} is below 1")

    def add(self, point: Point) -> "History":
        if not (math.isfinite(point.t) and math.isfinite(point.value)):
            return self
        kept = self.points
        if kept and point.t < kept[-1].t:
            kept = ()
        elif kept and point.t == kept[-1].t:
            kept = kept[:-1]
        first = bisect.bisect_left(kept, point.t - self.max_age_seconds, key=lambda p: p.t)
        window = (*kept[first:], point)
        return replace(self, points=window[-self.max_points :])
