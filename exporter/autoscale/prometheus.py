"""The demand trace `plimsoll autoscale replay --prometheus URL` reads: the history of the recording rules Plimsoll
ships, from Prometheus' range queries, as the same DemandPoints the demand CSV gives.

Two queries per model, on the same steps: `sum(model:plimsoll_demand_requests:sum{model="M"})` (the demand) and
`sum(plimsoll_requests_waiting{model="M"})` (the trace's queue_sum). The span is cut into chunks of at most
MAX_POINTS_PER_QUERY steps, Prometheus' limit per series (a week at 15 s is 40,320 steps). Each answer is read through
the one bounded fetch (exporter/sources/http.py: a deadline and a size cap) and checked: a successful matrix of at
most one series, at most one sample a step, every time within the range asked, every value a number from 0 to
MAX_DEMAND. The whole read, every model's every chunk, has a budget too (--prometheus-timeout): a slow server
answering each query just within its deadline would otherwise hold the command for as long as it likes.

Gaps: a step without a demand sample is dropped from the trace, never filled. Prometheus already carries a sample
forward for its lookback delta (5 min by default), so a missed scrape or rule evaluation never leaves a gap; what
does is a real outage of the readings (the daemon or the engines down, the rules not evaluated), where the demand
is unknown. Inventing a value there (a zero, or the last one carried on) would put points in the trace that claim
a reading nobody made; dropped, the trace holds only what Prometheus recorded. The replay's figures hold each point
until the next, so the demand across a gap is the last reading before it; the scaler's peak signal sees that
reading while it is within the demand window and 0 after it (the generated query's `or vector(0)`, as the HPA reads
it through such an outage). A long gap shows in the trace as two points far apart. A step with demand but no queue
sample (an engine silent about its queue) keeps its demand, with no queue_sum: the replay models the queue only
where it was recorded.

Access: a Prometheus behind authentication takes a bearer token or a basic-auth user and password, each secret
read from a file (as Prometheus' own http client config reads bearer_token_file and basic_auth.password_file), and
one behind TLS from a private CA takes that CA's certificate. The secret goes in the Authorization header only: it
is never in an error (an error names the file that holds it), in `Access`' repr, or in what the command writes. A
401 or 403 says the credentials were refused, or that Prometheus asks for some where none were given.

Every failure is a DemandError (the CSV's error, so the command handles both alike) naming the URL, never a
credential, and what to do.
"""

import asyncio
import json
import math
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from exporter.autoscale.demand import MAX_DEMAND, MAX_DEMAND_ROWS, DemandError, DemandPoint, cut
from exporter.config import redact_url, validate_url
from exporter.core.units import duration
from exporter.display import shown
from exporter.files import ca_context, read_secret
from exporter.scaling import DEMAND_RECORD, promql_string
from exporter.sources.http import TLS_FAILED, basic_authorization, fetch

# Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS_PER_QUERY = 11_000
QUERY_TIMEOUT_SECONDS = 60.0
# The whole read, every model's every chunk: a week is 8 range queries per model, each seconds on a healthy server,
# while a slow one at up to QUERY_TIMEOUT_SECONDS each would hold the command for many minutes.
DEFAULT_BUDGET_SECONDS = 600.0
# 11,000 points of one series is about 300 kB of JSON; anything far larger is not the answer asked for.
MAX_ANSWER_BYTES = 8 << 20
QUEUE_METRIC = "plimsoll_requests_waiting"
# A token or a password is a line: a file far larger is not the one meant.
MAX_SECRET_BYTES = 64 << 10
# What the bounded fetch says of an answer that refused the request: Prometheus behind an authenticating proxy.
_REFUSED = frozenset(("HTTP 401", "HTTP 403"))
# Prometheus' answers to a query it would not run, each with its JSON error: 400 bad parameters, 422 a query it
# cannot execute (too many samples), 503 one timed out or cancelled.
_QUERY_REFUSED = frozenset(("HTTP 400", "HTTP 422", "HTTP 503"))
_SENT_PRECISION = 0.001  # seconds: a query's start and end are sent to the millisecond
_CREDENTIAL_FLAGS = (
    "--prometheus-bearer-token-file FILE, or --prometheus-basic-auth-user USER with --prometheus-password-file FILE"
)


@dataclass(frozen=True)
class Access:
    """What reaching Prometheus takes besides its URL."""

    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # the Authorization header: never shown
    tls: ssl.SSLContext | None = None  # the CAs to trust; None: the system's


NO_ACCESS = Access()


@dataclass(frozen=True)
class _Query:
    expr: str
    where: str  # the redacted URL, for errors


def demand_query(model: str) -> str:
    return f"sum({DEMAND_RECORD}{{model={promql_string(model)}}})"


def queue_query(model: str) -> str:
    return f"sum({QUEUE_METRIC}{{model={promql_string(model)}}})"


def prometheus_url(text: str) -> str:
    """--prometheus: an http(s) base URL without credentials, which would show in the output and result.json, and
    without a query or fragment, which each request replaces with its own (a token in it would be dropped, and
    shown)."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return validate_url(text)  # it says what is wrong with it
    if "@" in parts.netloc:
        raise ValueError(f"credentials in the URL would show in the output; give them with {_CREDENTIAL_FLAGS}")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError(
            "a ?query or #fragment would be dropped from every request (each sets its own query): give the base URL "
            "alone, such as http://prometheus:9090 or https://host/prometheus"
        )
    return validate_url(text)


def _read_secret(path: str, flag: str) -> str:
    """The token or password in the file `flag` names, surrounding whitespace stripped; an error names the file,
    never its content."""
    try:
        secret = read_secret(path, MAX_SECRET_BYTES, flag)
    except ValueError as error:
        raise DemandError(str(error)) from None
    if not secret:
        raise DemandError(f"{flag} {path}: the file is empty; put the secret in it")
    return secret


def _authorization(bearer_token_file: str | None, basic_auth_user: str | None, password_file: str | None) -> str | None:
    if bearer_token_file is not None and basic_auth_user is not None:
        raise DemandError(
            "--prometheus-bearer-token-file and --prometheus-basic-auth-user: give one, not both (one Authorization "
            "header)"
        )
    if basic_auth_user is None:
        if password_file is not None:
            raise DemandError("--prometheus-password-file: needs --prometheus-basic-auth-user USER")
        if bearer_token_file is None:
            return None
        return f"Bearer {_read_secret(bearer_token_file, '--prometheus-bearer-token-file')}"
    if password_file is None:
        raise DemandError("--prometheus-basic-auth-user: needs --prometheus-password-file FILE (the password's file)")
    if ":" in basic_auth_user or not basic_auth_user.isprintable():
        raise DemandError("--prometheus-basic-auth-user: a user name holds no ':' and no control character")
    return basic_authorization(basic_auth_user, _read_secret(password_file, "--prometheus-password-file"))


def _tls(ca_file: str | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    try:
        return ca_context(ca_file, "--prometheus-ca-file")
    except ValueError as error:
        raise DemandError(str(error)) from None


def prometheus_access(
    bearer_token_file: str | None, basic_auth_user: str | None, password_file: str | None, ca_file: str | None
) -> Access:
    """The Access the command's flags describe, each file read once, now; DemandError naming the flag and the file
    where one cannot be used."""
    authorization = _authorization(bearer_token_file, basic_auth_user, password_file)
    headers = {} if authorization is None else {"Authorization": authorization}
    return Access(headers, _tls(ca_file))


def _moment(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _steps(since_seconds: float, step_seconds: float, now: float) -> tuple[float, int]:
    """The first step's time and the number of steps after it; steps fall on multiples of the step, so the two
    queries, and every chunk, share them."""
    if not (math.isfinite(step_seconds) and step_seconds > 0):
        raise DemandError(f"the step must be a positive number of seconds, not {step_seconds!r}")
    if not (math.isfinite(since_seconds) and since_seconds >= step_seconds):
        raise DemandError(
            f"--since {since_seconds:g}s: the span must be at least one step ({step_seconds:g} s); give a longer one"
        )
    count = math.floor(since_seconds / step_seconds)
    if count + 1 > MAX_DEMAND_ROWS:
        raise DemandError(
            f"--since {duration(since_seconds)}: {count + 1:,} steps of {step_seconds:g} s is over "
            f"{MAX_DEMAND_ROWS:,}: replay a shorter span"
        )
    end = math.floor(now / step_seconds) * step_seconds
    return end - count * step_seconds, count


def _chunks(first: float, count: int, step_seconds: float) -> list[tuple[float, float]]:
    """(start, end) of each range query: at most MAX_POINTS_PER_QUERY steps each, none shared, none skipped."""
    return [
        (first + k * step_seconds, first + min(k + MAX_POINTS_PER_QUERY - 1, count) * step_seconds)
        for k in range(0, count + 1, MAX_POINTS_PER_QUERY)
    ]


def _value(query: _Query, pair: Any, span: tuple[float, float]) -> tuple[float, float]:
    # Prometheus writes a value as a string ("1.5", "NaN"): one that is not is not its answer.
    shaped = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int | float)
    if not (shaped and isinstance(pair[1], str)):
        raise DemandError(f'{query.where}: {query.expr}: a sample is not [time, "value"]: is this a Prometheus?')
    text = pair[1]
    try:
        seconds = float(pair[0])
    except OverflowError:  # an integer hundreds of digits long: as far outside the range asked as a time can be
        seconds = math.inf
    # A time outside the range asked (or NaN) is no answer to it, and one far out would have the replay step
    # through years of syncs.
    if not span[0] - _SENT_PRECISION <= seconds <= span[1] + _SENT_PRECISION:
        raise DemandError(
            f"{query.where}: {query.expr}: a sample at {seconds!r} s, outside the range asked ({_moment(span[0])} "
            f"to {_moment(span[1])}): is this a Prometheus?"
        )
    try:
        value = float(text)
    except ValueError:
        raise DemandError(f"{query.where}: {query.expr} at {_moment(seconds)}: {cut(text)} is not a number") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_DEMAND):
        raise DemandError(
            f"{query.where}: {query.expr} at {_moment(seconds)}: {cut(text)} is not a number from 0 to "
            f"{MAX_DEMAND:g}; check the series in Prometheus"
        )
    return seconds, value


def _samples(query: _Query, text: str, span: tuple[float, float], step_seconds: float) -> dict[float, float]:
    """time -> value of a range query's answer over `span` at `step_seconds`, checked."""
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep, which no answer holds
        raise DemandError(f"{query.where}: the answer to {query.expr} is not JSON: is this a Prometheus?") from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        # Prometheus' own words, on the one line of the error: a line break in them is shown, never broken on.
        reason = shown(str(error)[:200]) if error else "no status success"
        raise DemandError(f"{query.where}: {query.expr} failed: {reason}")
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise DemandError(
            f"{query.where}: {query.expr} answered {str(data.get('resultType'))[:40]!r}, not a matrix: "
            "is this Prometheus' query_range API?"
        )
    series = data["result"]
    if len(series) > 1:
        raise DemandError(f"{query.where}: {query.expr} answered {len(series)} series where sum() gives one")
    values = (series[0].get("values") if isinstance(series[0], dict) else None) if series else []
    if not isinstance(values, list):
        raise DemandError(f"{query.where}: {query.expr}: the series has no list of values: is this a Prometheus?")
    # One sample a step at most: more, kept, would grow the trace past the rows a replay takes.
    steps = round((span[1] - span[0]) / step_seconds) + 1
    if len(values) > steps:
        raise DemandError(
            f"{query.where}: {query.expr} answered {len(values):,} samples for {steps:,} steps: is this a Prometheus?"
        )
    return dict(_value(query, pair, span) for pair in values)


def _prometheus_reason(refusal: str | None) -> str | None:
    """Prometheus' own reason in an error answer (`{"status": "error", "errorType": ..., "error": ...}`), cut short
    and escaped onto one line; None where the body is not that (a proxy's page, say), which is then not shown."""
    try:
        answer = json.loads(refusal or "")
    except (ValueError, RecursionError):
        return None
    if not isinstance(answer, dict) or answer.get("status") != "error" or not isinstance(answer.get("error"), str):
        return None
    kind = answer.get("errorType")
    prefix = f"{shown(kind[:40])}: " if isinstance(kind, str) and kind else ""
    return prefix + shown(answer["error"][:200])


def _unanswered(query: _Query, start: float, access: Access, detail: str, refusal: str | None) -> DemandError:
    """Why a range query got no answer, and what to do."""
    if detail in _REFUSED and access.headers:
        return DemandError(
            f"{query.where} refused the credentials ({detail}): check the secret in the file given, and that it may "
            "read the query API"
        )
    if detail in _REFUSED:
        return DemandError(f"{query.where} refused a request without credentials ({detail}): give {_CREDENTIAL_FLAGS}")
    reason = _prometheus_reason(refusal) if detail in _QUERY_REFUSED else None
    if reason is not None:
        return DemandError(
            f"{query.where}: {query.expr} from {_moment(start)}: Prometheus answered {detail}: {reason}; a shorter "
            "--since asks less of it, and its own limits (--query.max-samples, --query.timeout) say how much it answers"
        )
    if detail.startswith(TLS_FAILED):
        return DemandError(
            f"{query.where}: {detail}; where a private CA signed Prometheus' certificate, give its certificate with "
            "--prometheus-ca-file FILE"
        )
    return DemandError(
        f"{query.where}: {query.expr} from {_moment(start)}: {detail}; check --prometheus (the Prometheus base URL) "
        "and that it answers"
    )


async def _range(
    session: aiohttp.ClientSession,
    base: URL,
    query: _Query,
    span: tuple[float, float],
    step_seconds: float,
    access: Access,
) -> dict[float, float]:
    params = {"query": query.expr, "start": f"{span[0]:.3f}", "end": f"{span[1]:.3f}", "step": f"{step_seconds:g}"}
    url = base.joinpath("api/v1/query_range").with_query(params)
    fetched = await fetch(session, str(url), QUERY_TIMEOUT_SECONDS, MAX_ANSWER_BYTES, access.headers)
    if fetched.text is None:
        raise _unanswered(query, span[0], access, fetched.detail or "no answer", fetched.refusal)
    return _samples(query, fetched.text, span, step_seconds)


async def demand_from_prometheus(
    url: str,
    model: str,
    since_seconds: float,
    step_seconds: float,
    *,
    access: Access = NO_ACCESS,
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
    connector = aiohttp.TCPConnector(ssl=True if access.tls is None else access.tls)
    async with aiohttp.ClientSession(connector=connector) as session:
        for span in _chunks(first, count, step_seconds):
            got_demand, got_queue = await asyncio.gather(
                _range(session, base, demand, span, step_seconds, access),
                _range(session, base, queue, span, step_seconds, access),
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
    return tuple(DemandPoint(at, demands[at], queues.get(at)) for at in sorted(demands))


async def demands_from_prometheus(
    url: str,
    models: Sequence[str],
    since_seconds: float,
    step_seconds: float,
    *,
    budget_seconds: float = DEFAULT_BUDGET_SECONDS,
    access: Access = NO_ACCESS,
    now: float | None = None,
) -> list[tuple[DemandPoint, ...]]:
    """Each of `models`' demand traces (`demand_from_prometheus`), all read within `budget_seconds`; DemandError on
    the first failure, or where the budget runs out first."""
    budget = asyncio.timeout(budget_seconds)
    try:
        async with budget:
            return [
                await demand_from_prometheus(url, model, since_seconds, step_seconds, access=access, now=now)
                for model in models
            ]
    except TimeoutError:
        if not budget.expired():  # raised by something else: not the budget's to explain
            raise
        raise DemandError(
            f"{redact_url(url)}: the range queries took longer than --prometheus-timeout {duration(budget_seconds)} "
            "in all: give a longer --prometheus-timeout, replay a shorter --since or one --workload, or check why "
            "Prometheus answers slowly"
        ) from None
