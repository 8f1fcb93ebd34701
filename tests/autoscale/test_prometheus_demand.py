"""The demand trace read from Prometheus: a real one holding a known history (backfilled with promtool), and a local
aiohttp server standing in for one that answers badly. The history here is the recording rule's output written in
directly, to place gaps and chunk edges exactly; test_prometheus_replay.py has Prometheus compute it from the
generated rules over a real daemon's series.

The history is written 5.5 s after each 15 s step (never a whole second, so no step is exactly one lookback delta
after a sample) and the expected trace is computed as Prometheus evaluates a range query: at each step, the latest
sample at most 5 minutes (its default lookback delta) old, or nothing.
"""

import asyncio
import itertools
import math
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.autoscale.demand import DemandError, DemandPoint
from exporter.autoscale.prometheus import (
    MAX_ANSWER_BYTES,
    MAX_POINTS_PER_QUERY,
    demand_from_prometheus,
    demand_query,
    queue_query,
)
from exporter.scaling import DEMAND_RECORD
from exporter.sources.http import MAX_REFUSAL_BYTES
from tests.generate import conftest as generate_conftest
from tests.support.prometheus import Prometheus, free_port, prometheus_config, running_prometheus

# The generate tests' fixture: the real Prometheus, fetched once per session.
prometheus_tools = generate_conftest.prometheus_tools

LOOKBACK_S = 300.0  # Prometheus' default --query.lookback-delta
INTERVAL_S = 15.0
OFFSET_S = 5.5
HISTORY_S = 3.5 * 3600
# A whole number of steps before now, so the steps fall on multiples of 15 s (and of 1 s).
NOW = float(int(time.time()) // 900 * 900 - 900)
FIRST = NOW - HISTORY_S + OFFSET_S
MODEL = "m"
OTHER = 'the "other" \\ model'  # quotes and a backslash: the selector must quote it as one PromQL string
GAP = range(300, 340)  # no reading at all for 10 minutes: longer than the lookback, so some steps have none
QUIET_QUEUE = range(500, 530)  # demand read, the queue not: 7.5 minutes

Series = dict[float, float]


def _history() -> dict[str, Series]:
    count = int(HISTORY_S // INTERVAL_S)
    times = [FIRST + k * INTERVAL_S for k in range(count)]
    return {
        "demand": {t: (k * 7 % 50) / 2 for k, t in enumerate(times) if k not in GAP},
        "queue_a": {t: float(k % 4) for k, t in enumerate(times) if k not in GAP and k not in QUIET_QUEUE},
        "queue_b": {t: 0.5 for k, t in enumerate(times) if k not in GAP and k not in QUIET_QUEUE},
        "other": {t: 1000.0 + k for k, t in enumerate(times)},
    }


def _openmetrics_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _openmetrics(history: Mapping[str, Series]) -> str:
    demand = [f'{DEMAND_RECORD}{{model="{MODEL}"}} {v} {t}' for t, v in history["demand"].items()]
    demand += [f'{DEMAND_RECORD}{{model="{_openmetrics_label(OTHER)}"}} {v} {t}' for t, v in history["other"].items()]
    waiting = [
        f'plimsoll_requests_waiting{{model="{MODEL}",target="a"}} {v} {t}' for t, v in history["queue_a"].items()
    ]
    waiting += [
        f'plimsoll_requests_waiting{{model="{MODEL}",target="b"}} {v} {t}' for t, v in history["queue_b"].items()
    ]
    return "\n".join(
        [f"# TYPE {DEMAND_RECORD} gauge", *demand, "# TYPE plimsoll_requests_waiting gauge", *waiting, "# EOF", ""]
    )


def _at(series: Series, step: float) -> float | None:
    """What a range query reads at `step`: the latest sample within the lookback delta."""
    seen = [t for t in series if t <= step and step - t <= LOOKBACK_S]
    return series[max(seen)] if seen else None


def _expected(series: Mapping[str, Series], demand: str, queues: tuple[str, ...], since: float, step: float):
    count = math.floor(since / step)
    points = []
    for k in range(count + 1):
        at = NOW - (count - k) * step
        value = _at(series[demand], at)
        if value is None:
            continue
        waiting = [q for q in (_at(series[name], at) for name in queues) if q is not None]
        points.append(DemandPoint(at, value, sum(waiting) if waiting else None))
    return tuple(points)


@pytest.fixture(scope="module")
def recorded(prometheus_tools, tmp_path_factory) -> Iterator[tuple[Prometheus, dict[str, Series]]]:
    """A real Prometheus whose TSDB holds the history, backfilled by promtool before it starts. Prometheus' docs
    warn against backfilling the last 3 hours into a running server (its head block may overlap); started after
    the backfill, its head is empty, and the default retention (15 days) keeps the blocks."""
    workdir = tmp_path_factory.mktemp("prometheus")
    history = _history()
    (workdir / "history.om").write_text(_openmetrics(history))
    result = subprocess.run(
        [prometheus_tools["promtool"], "tsdb", "create-blocks-from", "openmetrics", "history.om", "data"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with running_prometheus(prometheus_tools["prometheus"], workdir, prometheus_config([], [])) as prometheus:
        yield prometheus, history


def _read(url: str, model: str, since: float, step: float, **options) -> tuple[DemandPoint, ...]:
    return asyncio.run(demand_from_prometheus(url, model, since, step, now=NOW, **options))


def test_the_trace_is_what_prometheus_recorded_at_each_step_and_a_gap_is_dropped_not_filled(recorded):
    prometheus, history = recorded
    trace = _read(prometheus.url, MODEL, 3 * 3600, INTERVAL_S)

    assert trace == _expected(history, "demand", ("queue_a", "queue_b"), 3 * 3600, INTERVAL_S)
    steps = [b.time - a.time for a, b in itertools.pairwise(trace)]
    # The gap: 615 s between the samples around it, the first read up to 5 minutes after (the lookback delta),
    # the steps between dropped: one jump of 330 s (22 steps), every other step 15 s.
    assert sorted(set(steps)) == [INTERVAL_S, 330.0]
    assert steps.count(330.0) == 1
    # The queue silent for 7.5 minutes while demand was read: those steps keep their demand, with no queue_sum.
    assert any(point.queue_sum is None for point in trace)
    assert all(point.queue_sum is not None for point in trace[:10])


def test_a_span_over_11000_steps_is_read_in_chunks_that_join_without_a_seam(recorded):
    prometheus, history = recorded
    since = 3.25 * 3600  # 11,701 steps of 1 s: one query would be refused
    assert since + 1 > MAX_POINTS_PER_QUERY

    trace = _read(prometheus.url, MODEL, since, 1.0)

    assert trace == _expected(history, "demand", ("queue_a", "queue_b"), since, 1.0)
    assert len({point.time for point in trace}) == len(trace)


def test_the_model_selector_quotes_a_hostile_name_and_reads_only_its_series(recorded):
    prometheus, history = recorded
    trace = _read(prometheus.url, OTHER, 3600, INTERVAL_S)

    assert trace == _expected(history, "other", (), 3600, INTERVAL_S)
    assert all(point.demand >= 1000 and point.queue_sum is None for point in trace)


def test_a_model_prometheus_has_no_demand_for_says_the_rules_are_not_recorded(recorded):
    prometheus, _ = recorded
    with pytest.raises(DemandError) as error:
        _read(prometheus.url, "absent", 3600, INTERVAL_S)
    message = str(error.value)
    assert prometheus.url in message
    assert f'{DEMAND_RECORD}{{model="absent"}}' in message
    assert "not recorded" in message and "rules/plimsoll.rules.yaml" in message


# --- a local server standing in for a Prometheus that answers badly -----------------------------------------------


def _matrix(values: list[list[object]], series: int = 1) -> dict[str, object]:
    result = [{"metric": {}, "values": values} for _ in range(series)]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _answering(respond: Callable[[web.Request], Awaitable[web.StreamResponse]], check, url_prefix: str = ""):
    app = web.Application()
    app.router.add_get("/api/v1/query_range", respond)

    async def go():
        async with TestServer(app, host="127.0.0.1") as server:
            return await check(f"http://{url_prefix}127.0.0.1:{server.port}")

    return asyncio.run(go())


def _error_from(respond: Callable[[web.Request], Awaitable[web.StreamResponse]], url_prefix: str = "") -> str:
    async def check(url: str) -> str:
        with pytest.raises(DemandError) as error:
            await demand_from_prometheus(url, MODEL, 600, INTERVAL_S, now=NOW)
        return str(error.value)

    return _answering(respond, check, url_prefix)


def _json(body: object, status: int = 200) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)

    return respond


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-1", "1e308"])
def test_a_value_out_of_bounds_names_the_query_and_the_time(bad):
    at = NOW - 300
    message = _error_from(_json(_matrix([[at - 15, "1"], [at, bad]])))
    assert demand_query(MODEL) in message
    assert time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) in message
    assert repr(bad) in message and "not a number from 0 to 1e+12" in message


@pytest.mark.parametrize("when", [NOW + 365 * 86400, 1e300, math.nan])
def test_a_sample_outside_the_range_asked_is_refused(when):
    # Taken, a year away would have the replay step through two million syncs, and 1e300 through them forever.
    message = _error_from(_json(_matrix([[NOW - 15, "1"], [when, "1"]])))
    assert demand_query(MODEL) in message and f"a sample at {when!r} s, outside the range asked" in message


def test_integers_too_large_for_a_float_are_refused_not_raised():
    huge = 10**400  # JSON holds integers of any length; float() of this one raises OverflowError
    message = _error_from(_json(_matrix([[NOW - 15, "1"], [huge, "1"]])))
    assert "a sample at inf s, outside the range asked" in message
    message = _error_from(_json(_matrix([[NOW - 15, "1"], [NOW, huge]])))
    assert 'a sample is not [time, "value"]' in message


def test_more_samples_than_steps_are_refused():
    """41 steps in the 600 s asked at 15 s; a server answering more would grow the trace without bound."""
    values = [[NOW - 600 + k * 0.5, "1"] for k in range(1201)]
    assert "answered 1,201 samples for 41 steps: is this a Prometheus?" in _error_from(_json(_matrix(values)))


def test_a_long_value_is_cut_in_the_message():
    message = _error_from(_json(_matrix([[NOW - 15, "1"], [NOW, "9x" * 100_000]])))
    assert "is not a number" in message and len(message) < 300


def test_an_instant_vector_instead_of_a_matrix_is_refused():
    vector = {"status": "success", "data": {"resultType": "vector", "result": []}}
    message = _error_from(_json(vector))
    assert "'vector', not a matrix" in message and "query_range" in message


def test_two_series_where_sum_gives_one_are_refused():
    assert "2 series where sum() gives one" in _error_from(_json(_matrix([[NOW, "1"]], series=2)))


def test_a_prometheus_error_shows_its_reason():
    failed = {"status": "error", "errorType": "bad_data", "error": "parse error: unexpected character"}
    assert "failed: parse error: unexpected character" in _error_from(_json(failed))


def test_a_prometheus_error_of_several_lines_is_shown_on_one():
    failed = {"status": "error", "error": "first\nsecond \x1b[31m"}
    message = _error_from(_json(failed))
    assert "\n" not in message and "failed: first\\nsecond \\x1b[31m" in message


@pytest.mark.parametrize(("status", "kind"), [(400, "bad_data"), (422, "execution"), (503, "timeout")])
def test_a_query_prometheus_refuses_shows_its_own_reason_on_one_line(status, kind):
    failed = {"status": "error", "errorType": kind, "error": "query processing would load too many samples\n\x1b[31m"}
    message = _error_from(_json(failed, status=status))
    assert f"Prometheus answered HTTP {status}: {kind}: query processing would load too many samples" in message
    assert "\n" not in message and "\\x1b[31m" in message and demand_query(MODEL) in message


def test_a_refusal_s_long_reason_is_cut_and_one_past_the_read_cap_shows_only_the_status():
    failed = {"status": "error", "errorType": "bad_data", "error": "x" * 1000}
    message = _error_from(_json(failed, status=400))
    assert "x" * 200 in message and "x" * 201 not in message and len(message) < 600
    failed["error"] = "x" * (MAX_REFUSAL_BYTES + 1)  # only its start is read: not JSON, so not shown
    message = _error_from(_json(failed, status=400))
    assert "HTTP 400; check --prometheus" in message and "xxx" not in message


def test_a_refusal_that_is_not_prometheus_json_shows_only_the_status():
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(text="<html>Authorization: Bearer s3cret</html>", status=400, content_type="text/html")

    message = _error_from(respond)
    assert "HTTP 400" in message and "s3cret" not in message and "html" not in message


def test_a_series_that_is_not_an_object_is_refused():
    message = _error_from(_json({"status": "success", "data": {"resultType": "matrix", "result": ["x"]}}))
    assert "the series has no list of values: is this a Prometheus?" in message


def test_an_answer_not_json_is_refused():
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(text="<<not json>>", content_type="text/plain")

    assert "is not JSON" in _error_from(respond)


def test_an_answer_nested_past_the_json_parser_s_depth_is_refused():
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(text="[" * 100_000 + "]" * 100_000, content_type="application/json")

    assert "is not JSON" in _error_from(respond)


def test_an_http_500_names_the_url_and_what_to_do():
    message = _error_from(_json({"status": "error"}, status=500))
    assert "http://127.0.0.1:" in message and "HTTP 500" in message and "check --prometheus" in message


def test_a_huge_answer_is_cut_off_at_the_size_cap():
    async def respond(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        chunk = b" " * (1 << 20)
        for _ in range((MAX_ANSWER_BYTES >> 20) + 2):
            await response.write(chunk)
        return response

    assert f"over {MAX_ANSWER_BYTES:,} bytes" in _error_from(respond)


def test_a_credential_in_the_url_never_shows():
    message = _error_from(_json({"status": "error"}, status=500), url_prefix="reader:s3cret@")
    assert "s3cret" not in message and "***@127.0.0.1" in message


def test_a_prometheus_not_listening_is_one_error_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(DemandError, match="connection refused") as error:
        asyncio.run(demand_from_prometheus(url, MODEL, 600, INTERVAL_S, now=NOW))
    assert url in str(error.value)


def test_both_queries_ask_for_the_same_steps_in_chunks_under_the_limit():
    asked: list[tuple[str, float, float, float]] = []

    async def respond(request: web.Request) -> web.StreamResponse:
        query = request.query
        start, end, step = float(query["start"]), float(query["end"]), float(query["step"])
        asked.append((query["query"], start, end, step))
        values = [[start + k * step, "1"] for k in range(round((end - start) / step) + 1)]
        return web.json_response(_matrix(values))

    async def check(url: str) -> tuple[DemandPoint, ...]:
        return await demand_from_prometheus(url, MODEL, 2 * MAX_POINTS_PER_QUERY + 5, 1.0, now=NOW + 0.7)

    trace = _answering(respond, check)
    assert [point.time for point in trace] == [NOW - 2 * MAX_POINTS_PER_QUERY - 5 + k for k in range(len(trace))]
    assert len(trace) == 2 * MAX_POINTS_PER_QUERY + 6 and trace[-1].time == NOW
    for expr in (demand_query(MODEL), queue_query(MODEL)):
        spans = sorted((start, end) for query, start, end, _ in asked if query == expr)
        assert len(spans) == 3
        assert all(end - start + 1 <= MAX_POINTS_PER_QUERY for start, end in spans)
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize(
    ("since", "step", "words"),
    [
        (600, 0, "positive number of seconds"),
        (10, 15, "^--since 10s: the span must be at least one step"),
        (8 * 86400, 1, "^--since 8d: 691,201 steps of 1 s is over 604,800: replay a shorter span"),
    ],
)
def test_a_span_or_step_that_cannot_be_read_is_refused_before_asking(since, step, words):
    with pytest.raises(DemandError, match=words):
        asyncio.run(demand_from_prometheus(f"http://127.0.0.1:{free_port()}", MODEL, since, step, now=NOW))
