"""The largest value in a window over a sequence whose two ends only move forward, as the replay's demand window
and the oracle's look-ahead both walk a trace: each index enters and leaves the window once, so a walk costs the
trace's length, however many samples the window holds."""

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

Number = TypeVar("Number", int, float)


class WindowPeak(Generic[Number]):
    """max(values[low:high]) for successive windows whose `low` and `high` never decrease."""

    def __init__(self, values: Sequence[Number]) -> None:
        self._values: Sequence[Number] = values
        # The indices in the window that no later one in it matches, by index: the first holds the window's peak.
        self._kept: deque[int] = deque()
        self._entered = 0  # the indices below it have entered the window

    def over(self, low: int, high: int) -> Number | None:
        """The largest of values[low:high]; None for an empty window."""
        values, kept = self._values, self._kept
        for index in range(self._entered, high):
            while kept and values[kept[-1]] <= values[index]:
                kept.pop()
            kept.append(index)
        self._entered = max(self._entered, high)
        while kept and kept[0] < low:
            kept.popleft()
        return values[kept[0]] if kept else None
