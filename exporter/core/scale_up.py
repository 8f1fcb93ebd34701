"""Scale-up lag: the time from a model's demand crossing its ready capacity to a new replica ready, from what the
daemon sees at each poll (the model's ready replicas and its requests in flight). `plimsoll autoscale replay`
assumes a start-up time (the workload's `startup`); this is what the fleet shows, to check it against.

Capacity is ready replicas x the requests one replica holds (the workload's `knee_concurrency`, the number the
replay uses). An episode starts when demand crosses from at or under capacity to over it. It is answered, with a
measured lag, when more replicas are ready than at its start; it is abandoned, with none, when demand falls back to
capacity first. The next episode needs a fresh crossing: the second and third replicas of one scale-up arrive
seconds after the first, and counting each from the first's arrival would read as lags of seconds.

"At its start" is the most replicas ready over the last `settle_seconds`: a replica whose poll failed once is
missing from the count, and its return is no new replica. Demand already over capacity at the first reading is no
crossing (when it crossed is unknown), so it starts no episode; nor is demand over it after a reading with no replica
ready (a daemon that reached none of them read no demand, and it may have crossed at any time since).

The caller owns the clock and passes each reading's time; only differences matter.
"""

import math
from dataclasses import dataclass, field, replace
from statistics import median

# Histogram upper bounds: 15 s (a small model from a warm image cache) to 30 minutes (a large one pulled cold onto
# a node that had to be provisioned first).
LAG_BUCKETS = (15.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0, 900.0, 1200.0, 1800.0)
# The lags the median is taken over: a scale-up is a few an hour at most, so 100 is days of them.
KEPT_LAGS = 100


@dataclass(frozen=True)
class FleetReading:
    """One model's fleet at one moment."""

    time: float  # seconds
    demand: float  # requests running + waiting, summed over the model's ready replicas
    ready: int  # replicas serving the model


@dataclass(frozen=True)
class Episode:
    started: float  # when demand crossed capacity
    baseline: int  # the replicas ready then: one more than this answers it


@dataclass(frozen=True)
class Lags:
    """The measured lags: a histogram's counts and sum, and the last KEPT_LAGS, oldest first."""

    count: int = 0
    sum_seconds: float = 0.0
    # Lags at or under each of LAG_BUCKETS (cumulative, as a histogram's `le` buckets are).
    buckets: tuple[int, ...] = (0,) * len(LAG_BUCKETS)
    recent: tuple[float, ...] = ()

    def add(self, seconds: float) -> "Lags":
        return Lags(
            count=self.count + 1,
            sum_seconds=self.sum_seconds + seconds,
            buckets=tuple(n + (seconds <= bound) for n, bound in zip(self.buckets, LAG_BUCKETS, strict=True)),
            recent=(*self.recent, seconds)[-KEPT_LAGS:],
        )

    @property
    def last_seconds(self) -> float | None:
        return self.recent[-1] if self.recent else None

    @property
    def median_seconds(self) -> float | None:
        return median(self.recent) if self.recent else None


@dataclass(frozen=True)
class ScaleUp:
    """One model's lag state; `observe` returns the next one."""

    capacity_per_replica: float  # requests one replica holds
    settle_seconds: float  # how far back a ready replica still counts at an episode's start
    lags: Lags = field(default_factory=Lags)
    episode: Episode | None = None
    armed: bool = False  # the last reading had replicas ready, with demand at or under capacity: over it next crosses
    seen: tuple[tuple[float, int], ...] = ()  # (last time seen, ready) over the last settle_seconds, oldest first

    def observe(self, reading: FleetReading) -> "ScaleUp":
        """The state after `reading`. A reading with a NaN or infinite time or demand is ignored; one earlier than
        the last (the wall clock stepped back) forgets the episode, since its age would be wrong."""
        if not (math.isfinite(reading.time) and math.isfinite(reading.demand)):
            return self
        state = self
        if state.seen and reading.time < state.seen[-1][0]:
            state = replace(state, episode=None, armed=False, seen=())
        horizon = reading.time - state.settle_seconds
        kept = tuple(s for s in state.seen if s[0] >= horizon)
        # A run of one count keeps its latest time alone: as many entries as changes, not as publishes, in the window.
        if kept and kept[-1][1] == reading.ready:
            kept = kept[:-1]
        seen = (*kept, (reading.time, reading.ready))
        over = reading.demand > reading.ready * state.capacity_per_replica
        armed = reading.ready > 0 and not over
        episode, lags = state.episode, state.lags
        if episode is not None and reading.ready > episode.baseline:
            lags = lags.add(reading.time - episode.started)
            return replace(state, lags=lags, episode=None, armed=armed, seen=seen)
        if episode is not None:
            return replace(state, episode=episode if over else None, armed=armed, seen=seen)
        if over and state.armed:
            episode = Episode(reading.time, max(ready for _, ready in seen))
        return replace(state, episode=episode, armed=armed, seen=seen)

    def pending_seconds(self, now: float) -> float:
        """How long the open episode has waited for a replica at `now`; 0 when there is none."""
        return max(0.0, now - self.episode.started) if self.episode is not None else 0.0
