"""A running, mergeable summary of durations that answers quantiles without keeping the durations themselves.

It is DDSketch's idea (Masson, Rim and Lee, VLDB 2019) written plainly: a duration v is counted in bucket
i = ceil(log(v) / log(GAMMA)), which holds (GAMMA^(i-1), GAMMA^i], with GAMMA = (1 + a) / (1 - a) for the relative
accuracy a = RELATIVE_ACCURACY. A quantile is answered as its bucket's midpoint in that sense, 2 GAMMA^i / (GAMMA + 1),
which is within a of every value in the bucket; so `quantile(q)` of n durations is within 1% of the one at rank
floor(q (n - 1)) in ascending order: the value `exporter.loadtest.judge.percentile` gives when that rank is whole,
and the lower of the two it interpolates between when it is not.

Durations under TINY_SECONDS (zero included) share one bottom bucket, answered as the smallest duration added, so
there the answer is off by under a microsecond, not 1%. Each bucket is a dict entry, so memory grows with the
number of distinct buckets reached, not the number of durations: a bucket per 2% of range, 1,100 from 1 us to an
hour, 806 from 1 us to 10 s; whatever a server sends, a float can reach no more than about 36,000.
"""

import math
from dataclasses import dataclass, field

RELATIVE_ACCURACY = 0.01
GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(GAMMA)
# Below this a gap between chunks is one read of the socket, not a latency worth telling apart.
TINY_SECONDS = 1e-6


@dataclass(eq=False)
class DurationSummary:
    """Count, sum, extremes and quantiles of the durations added (seconds, never negative). Mutable while it runs:
    a stream adds its gaps as they arrive, a step merges the summaries of its completed requests."""

    count: int = 0
    total_seconds: float = 0.0
    minimum_seconds: float = math.inf
    maximum_seconds: float = 0.0
    tiny: int = 0  # durations under TINY_SECONDS
    buckets: dict[int, int] = field(default_factory=dict)  # bucket index -> durations counted in it

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_seconds += seconds
        self.minimum_seconds = min(self.minimum_seconds, seconds)
        self.maximum_seconds = max(self.maximum_seconds, seconds)
        if seconds < TINY_SECONDS:
            self.tiny += 1
        else:
            index = math.ceil(math.log(seconds) / _LOG_GAMMA)
            self.buckets[index] = self.buckets.get(index, 0) + 1

    def merge(self, other: "DurationSummary") -> None:
        """Count `other`'s durations here too, as if each had been added."""
        self.count += other.count
        self.total_seconds += other.total_seconds
        self.minimum_seconds = min(self.minimum_seconds, other.minimum_seconds)
        self.maximum_seconds = max(self.maximum_seconds, other.maximum_seconds)
        self.tiny += other.tiny
        for index, count in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + count

    def quantile(self, q: float) -> float | None:
        """The duration at rank q (count - 1), within RELATIVE_ACCURACY (see the module); None when empty."""
        if not self.count:
            return None
        rank = q * (self.count - 1)
        seen = self.tiny
        if rank < seen:
            return self.minimum_seconds
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if rank < seen:
                midpoint = 2 * GAMMA**index / (GAMMA + 1)
                # The extremes are exact: a midpoint past them is only further from the truth.
                return min(max(midpoint, self.minimum_seconds), self.maximum_seconds)
        return self.maximum_seconds
