"""The demand CSV `plimsoll autoscale replay --demand` reads: one row per sample, columns `time` (seconds, or an RFC
3339 timestamp with its offset), `demand` (requests in flight, summed over the replicas), and optionally `queue_max`
(the longest queue of any replica) and `queue_sum` (the queues summed over the replicas). `queue_max` is checked
and not replayed: the generated scaler reads the summed queue, no longer the longest one (exporter/scaling.py), and a
trace written for the old trigger still loads.

Parsed from text (the command reads the file, at most MAX_DEMAND_BYTES); each bad row is one error naming the file,
the line and the column.
"""

import csv
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from exporter.autoscale.hpa import SYNC_PERIOD_SECONDS

# A week at one sample a second; a larger trace is refused rather than held in memory whole.
MAX_DEMAND_BYTES = 64 << 20
MAX_DEMAND_ROWS = 7 * 86400
# The replay reads the trace at every HPA sync from its first sample to its last, however few rows lie between: the
# span is bounded as the rows are, to as many syncs as rows (105 days), the most --prometheus reads.
MAX_SPAN_SECONDS = MAX_DEMAND_ROWS * SYNC_PERIOD_SECONDS
# A trillion requests is beyond any fleet; the bound keeps every figure (a demand times a span) a finite number.
MAX_DEMAND = 1e12
# 9999-12-31T23:59:59Z, the latest time RFC 3339 writes: far below where a float can no longer add a sync's 15 s.
MAX_TIME_SECONDS = 253_402_300_799.0

REQUIRED = ("time", "demand")
OPTIONAL = ("queue_max", "queue_sum")


class DemandError(ValueError):
    """A demand trace that cannot be replayed; the message names the file, the line and the column."""


@dataclass(frozen=True)
class DemandPoint:
    """One sample; it holds until the next one."""

    time: float  # seconds (Unix time where the file gave RFC 3339)
    demand: float
    queue_sum: float | None = None


def cut(text: str) -> str:
    """Text from a file or a server as an error quotes it: its repr, at most 40 characters of it."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _number(path: str, line: int, column: str, text: str, most: float = MAX_DEMAND) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DemandError(f"{path}:{line}: {column}: {cut(text)} is not a number") from None
    if not (math.isfinite(value) and 0 <= value <= most):
        raise DemandError(f"{path}:{line}: {column}: {cut(text)} is not a number from 0 to {most:g}")
    return value


def _time(path: str, line: int, text: str) -> tuple[float, bool]:
    """The time in seconds, and whether it was written as RFC 3339."""
    try:
        float(text)
    except ValueError:
        pass  # not seconds: an RFC 3339 timestamp, or neither
    else:
        return _number(path, line, "time", text, MAX_TIME_SECONDS), False
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise DemandError(
            f"{path}:{line}: time: {cut(text)} is neither seconds nor an RFC 3339 timestamp (e.g. 2026-03-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        raise DemandError(f"{path}:{line}: time: {cut(text)} has no UTC offset: add Z or +HH:MM")
    return moment.timestamp(), True


def _header(path: str, row: list[str]) -> dict[str, int]:
    names = [name.strip() for name in row]
    unknown = [name for name in names if name not in REQUIRED + OPTIONAL]
    if unknown:
        raise DemandError(
            f"{path}:1: column {cut(unknown[0])} is not one of {', '.join(REQUIRED + OPTIONAL)}: rename or drop it"
        )
    repeated = [name for name in names if names.count(name) > 1]
    if repeated:
        raise DemandError(f"{path}:1: column {repeated[0]!r} appears twice")
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise DemandError(f"{path}:1: no {missing[0]!r} column (the header needs time and demand)")
    return {name: index for index, name in enumerate(names)}


def _point(path: str, line: int, columns: dict[str, int], row: list[str]) -> tuple[DemandPoint, bool]:
    if len(row) != len(columns):
        raise DemandError(f"{path}:{line}: {len(row)} fields where the header names {len(columns)}")
    optional = {name: _number(path, line, name, row[columns[name]]) if name in columns else None for name in OPTIONAL}
    seconds, rfc3339 = _time(path, line, row[columns["time"]])
    demand = _number(path, line, "demand", row[columns["demand"]])
    return DemandPoint(seconds, demand, optional["queue_sum"]), rfc3339


def parse_demand(text: str, path: str) -> tuple[DemandPoint, ...]:
    """The samples of a demand CSV, times strictly increasing; DemandError on the first bad row."""
    if len(text) > MAX_DEMAND_BYTES:
        raise DemandError(f"{path}: over {MAX_DEMAND_BYTES >> 20} MiB; replay a shorter span or a coarser step")
    # Universal newlines: a file saved with bare CR line ends (classic Mac, some spreadsheets) reads as lines too.
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=None))
    try:
        points = _points(path, ((reader.line_num, row) for row in reader if row))
    except csv.Error as error:  # a field over the csv module's 128 KiB: no number or time is that long
        raise DemandError(f"{path}:{reader.line_num}: not a CSV row of numbers ({error})") from None
    if len(points) < 2:
        raise DemandError(f"{path}: {len(points)} row(s) of samples; a replay needs at least two to span any time")
    if points[-1].time - points[0].time > MAX_SPAN_SECONDS:
        raise DemandError(
            f"{path}: spans {(points[-1].time - points[0].time) / 86400:,.1f} days, over the "
            f"{MAX_SPAN_SECONDS / 86400:g} days a replay steps through; replay a shorter span"
        )
    return tuple(points)


def _points(path: str, rows: Iterator[tuple[int, list[str]]]) -> list[DemandPoint]:
    """The samples of the rows (line number, fields) after the header, in order; DemandError on the first bad one."""
    first = next(rows, None)
    if first is None:
        raise DemandError(f"{path}: empty; the first line names the columns (time,demand[,queue_max,queue_sum])")
    columns = _header(path, first[1])
    points: list[DemandPoint] = []
    forms: set[bool] = set()
    for line, row in rows:
        if len(points) == MAX_DEMAND_ROWS:
            raise DemandError(f"{path}:{line}: over {MAX_DEMAND_ROWS} rows; replay a shorter span or a coarser step")
        point, rfc3339 = _point(path, line, columns, row)
        forms.add(rfc3339)
        if len(forms) > 1:
            raise DemandError(f"{path}:{line}: time: seconds and RFC 3339 timestamps mixed; use one form")
        if points and point.time <= points[-1].time:
            raise DemandError(f"{path}:{line}: time: not after the row before (times must strictly increase)")
        points.append(point)
    return points
