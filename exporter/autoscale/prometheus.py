"""The demand trace `plimsoll autoscale replay --prometheus URL` reads: the history of the recording rules Plimsoll
ships, from Prometheus' range queries, as the same DemandPoints the demand CSV gives.

Two queries per model, on the same steps: `sum(model:plimsoll_demand_requests:sum{model="M"})` (the demand) and
`sum(plimsoll_requests_waiting{model="M"})` (the trace's queue_sum). The span is cut into chunks of at most
MAX_POINTS_PER_QUERY steps, Prometheus' limit per series (a week at 15 s is 40,320 steps). Each answer is read through
the one bounded fetch (exporter/sources/http.py: a deadline and a size cap) and checked: a successful matrix of at
most one series, every value a finite number of at least 0.

Gaps: a step without a demand sample is dropped from the trace, never filled. Prometheus already carries a sample
forward for its lookback delta (5 min by default), so a missed scrape or rule evaluation never leaves a gap; what
does is a real outage of the readings (the daemon or the engines down, the rules not evaluated), where the demand
is unknown. Inventing a value there (a zero, or the last one carried on) would put points in the trace that claim
a reading nobody made; dropped, the trace holds only what Prometheus recorded. The replay holds each point until
the next, so across a gap the scaler sees the last reading before it, as an HPA whose metric went missing keeps its
last decision; a long gap shows in the trace as two points far apart. A step with demand but no queue sample (an
engine silent about its queue) keeps its demand, with no queue_sum: the replay models the queue only where it was
recorded.

Every failure is a DemandError (the CSV's error, so the command handles both alike) naming the URL, never a
credential, and what to do.
"""

import asyncio
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from yarl import URL

from exporter.autoscale.demand import MAX_DEMAND_ROWS, DemandError, DemandPoint
from exporter.config import redact_url
from exporter.core.units import duration
from exporter.scaling import DEMAND_RECORD, promql_string
from exporter.sources.http import fetch

# Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS_PER_QUERY = 11_000
QUERY_TIMEOUT_SECONDS = 60.0
# 11,000 points of one series is about 300 kB of JSON; anything far larger is not the answer asked for.
MAX_ANSWER_BYTES = 8 << 20
QUEUE_METRIC = "plimsoll_requests_waiting"


@dataclass(frozen=True)
class _Query:
    expr: str
    where: str  # the redacted URL, for errors


def demand_query(model: str) -> str:
    return f"sum({DEMAND_RECORD}{{model={promql_string(model)}}})"


def queue_query(model: str) -> str:
    return f"sum({QUEUE_METRIC}{{model={promql_string(model)}}})"


def _moment(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _steps(since_seconds: float, step_seconds: float, now: float) -> tuple[float, int]:
    """The first step's time and the number of steps after it; steps fall on multiples of the step, so the two
    queries, and every chunk, share them."""
    if not (math.isfinite(step_seconds) and step_seconds > 0):
        raise DemandError(f"the step must be a positive number of seconds, not {step_seconds!r}")
    if not (math.isfinite(since_seconds) and since_seconds >= step_seconds):
        raise DemandError(f"the span ({since_seconds!r} s) must be at least one step ({step_seconds:g} s)")
    count = math.floor(since_seconds / step_seconds)
    if count + 1 > MAX_DEMAND_ROWS:
        raise DemandError(
            f"{count + 1:,} steps of {step_seconds:g} s is over {MAX_DEMAND_ROWS:,}: replay a shorter span or a "
            "coarser step"
        )
    end = math.floor(now / step_seconds) * step_seconds
    return end - count * step_seconds, count


def _chunks(first: float, count: int, step_seconds: float) -> list[tuple[float, float]]:
    """(start, end) of each range query: at most MAX_POINTS_PER_QUERY steps each, none shared, none skipped."""
    return [
        (first + k * step_seconds, first + min(k + MAX_POINTS_PER_QUERY - 1, count) * step_seconds)
        for k in range(0, count + 1, MAX_POINTS_PER_QUERY)
    ]


def _value(query: _Query, pair: Any) -> tuple[float, float]:
    if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int | float)):
        raise DemandError(f"{query.where}: {query.expr}: a sample is not [time, value]: is this a Prometheus?")
    seconds, text = float(pair[0]), pair[1]
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise DemandError(f"{query.where}: {query.expr} at {_moment(seconds)}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise DemandError(
            f"{query.where}: {query.expr} at {_moment(seconds)}: {text!r} is not a finite number of at least 0; "
            "check the series in Prometheus"
        )
    return seconds, value


def _samples(query: _Query, text: str) -> dict[float, float]:
    """time -> value of a range query's answer, checked."""
    try:
        answer = json.loads(text)
    except ValueError:
        raise DemandError(f"{query.where}: the answer to {query.expr} is not JSON: is this a Prometheus?") from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        reason = str(error)[:200] if error else "no status success"
        raise DemandError(f"{query.where}: {query.expr} failed: {reason}")
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise DemandError(
            f"{query.where}: {query.expr} answered {str(data.get('resultType'))[:40]!r}, not a matrix: "
            "is this Prometheus' query_range API?"
        )
    series = data["result"]
    if len(series) > 1:
        raise DemandError(f"{query.where}: {query.expr} answered {len(series)} series where sum() gives one")
    values = series[0].get("values") if series and isinstance(series[0], dict) else []
    if not isinstance(values, list):
        raise DemandError(f"{query.where}: {query.expr}: the series has no list of values: is this a Prometheus?")
    return dict(_value(query, pair) for pair in values)


async def _range(
    session: aiohttp.ClientSession,
    base: URL,
    query: _Query,
    span: tuple[float, float],
    step_seconds: float,
    headers: Mapping[str, str] | None,
) -> dict[float, float]:
    params = {"query": query.expr, "start": f"{span[0]:.3f}", "end": f"{span[1]:.3f}", "step": f"{step_seconds:g}"}
    url = base.joinpath("api/v1/query_range").with_query(params)
    fetched = await fetch(session, str(url), QUERY_TIMEOUT_SECONDS, MAX_ANSWER_BYTES, headers)
    if fetched.text is None:
        raise DemandError(
            f"{query.where}: {query.expr} from {_moment(span[0])}: {fetched.detail}; check --prometheus (the "
            "Prometheus base URL) and that it answers"
        )
    return _samples(query, fetched.text)


async def demand_from_prometheus(
    url: str,
    model: str,
    since_seconds: float,
    step_seconds: float,
    *,
    headers: Mapping[str, str] | None = None,
    now: float | None = None,
) -> tuple[DemandPoint, ...]:
    """The demand trace of `model` over the `since_seconds` before `now` (default: the clock), one point per step
    that has a demand sample; DemandError on the first failure."""
    where = redact_url(url)
    first, count = _steps(since_seconds, step_seconds, time.time() if now is None else now)
    demand, queue = _Query(demand_query(model), where), _Query(queue_query(model), where)
    base = URL(url.rstrip("/") + "/")
    demands: dict[float, float] = {}
    queues: dict[float, float] = {}
    async with aiohttp.ClientSession() as session:
        for span in _chunks(first, count, step_seconds):
            got_demand, got_queue = await asyncio.gather(
                _range(session, base, demand, span, step_seconds, headers),
                _range(session, base, queue, span, step_seconds, headers),
            )
            demands.update(got_demand)
            queues.update(got_queue)
    if len(demands) < 2:
        raise DemandError(
            f"{where}: {len(demands)} sample(s) of {DEMAND_RECORD}{{model={promql_string(model)}}} in the last "
            f"{duration(since_seconds)}: the recording rules are not recorded for this model yet. Load "
            "rules/plimsoll.rules.yaml (plimsoll generate) into this Prometheus and let it record, or check the "
            "model name against the config's autoscaling workloads"
        )
    return tuple(DemandPoint(at, demands[at], None, queues.get(at)) for at in sorted(demands))
