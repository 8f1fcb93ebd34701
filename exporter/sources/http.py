"""One bounded HTTP read of a page, the fetch every reader uses: the daemon's poll of a target, `plimsoll probe`,
the load test's engine watch and `plimsoll status`.

It owns the GET and its limits: a deadline for the whole answer, a cap on the body's size, redirects followed only
within the same origin, and the Authorization header from a target's credential files, whose secrets never appear
in a failure's words (a URL is shown redacted). A failure comes back as a reason (one of snapshot.FAILURE_REASONS)
and a detail, never raised.

It may import the config and the package's version, never exporter.daemon or the commands: they import it.
"""

import asyncio
import base64
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from yarl import URL

from exporter import __version__
from exporter.config import Target, redact_url
from exporter.files import read_secret

USER_AGENT = f"plimsoll/{__version__}"
MAX_REDIRECTS = 5
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
TLS_FAILED = "TLS failed"  # how a fetch's detail begins where the TLS handshake failed
# aiohttp quotes what a server sent in some errors (a status line it cannot read quotes its whole buffer: 50 KB of
# page), and the detail goes to every log line, /api/v1/state and the status page.
MAX_DETAIL_CHARS = 300
# The start of an answer other than 200, kept for a caller whose API explains a refusal in its body (Prometheus' JSON
# error): enough for the reason, never a page.
MAX_REFUSAL_BYTES = 4096
# A password or a token is a line: a far larger file, or a FIFO or device put in the file's place, is not the one
# meant (the poll loop reads a target's at every poll, where a read without end would stall every target).
MAX_SECRET_BYTES = 64 << 10


@dataclass(frozen=True)
class Fetched:
    text: str | None
    failure: str | None  # one of snapshot.FAILURE_REASONS
    detail: str | None  # the failure in words, for logs and /api/v1/state
    seconds: float
    date: str | None = None  # the response's Date header: the answering server's clock
    refusal: str | None = None  # an answer other than 200: its body's first MAX_REFUSAL_BYTES, never in `detail`


def _origin(url: URL) -> tuple[str, str | None, int | None]:
    return url.scheme, url.host, url.port


def _parsed(url: str) -> URL:
    """A ValueError naming `url` (its password masked) where it is not one: the one thing fetch raises, since a
    URL that is not one is the caller's mistake, not the server's."""
    try:
        return URL(url)
    except ValueError as error:
        raise ValueError(f"{redact_url(url)} is not a URL: {error}") from None


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    timeout: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
) -> Fetched:
    """GET a metrics page with a deadline and a size cap; failures come back as a reason, never raised (a `url`
    that is not one raises ValueError).

    Redirects are followed only within the same origin (scheme, host and port): an engine that points elsewhere
    would otherwise get the daemon, and the target's credentials, to request any address it names."""
    started = time.monotonic()

    def done(
        text: str | None,
        failure: str | None,
        detail: str | None = None,
        date: str | None = None,
        refusal: str | None = None,
    ) -> Fetched:
        return Fetched(text, failure, detail, time.monotonic() - started, date, refusal)

    current = _parsed(url)
    sent = {"User-Agent": USER_AGENT, **(headers or {})}
    try:
        async with asyncio.timeout(timeout):
            for _ in range(MAX_REDIRECTS + 1):
                async with session.get(current, headers=sent, allow_redirects=False) as response:
                    if response.status in _REDIRECTS:
                        location = response.headers.get("Location")
                        if not location:
                            return done(None, "http_status", f"HTTP {response.status} without a Location")
                        target = current.join(URL(location))
                        if _origin(target) != _origin(current):
                            where = redact_url(str(target))
                            return done(
                                None, "redirect", f"HTTP {response.status} to another origin ({where}): not followed"
                            )
                        current = target
                        continue
                    if response.status != 200:
                        refusal = (await _read_start(response, MAX_REFUSAL_BYTES)).decode("utf-8", errors="replace")
                        return done(None, "http_status", f"HTTP {response.status}", refusal=refusal)
                    content_type = response.headers.get("Content-Type", "")
                    if "html" in content_type.lower():  # media types are case-insensitive
                        return done(None, "not_metrics", f"answered {content_type.split(';')[0]}, not a metrics page")
                    body = await _read_start(response, max_bytes + 1)
                    if len(body) > max_bytes:
                        return done(None, "too_large", f"the page is over {max_bytes:,} bytes (max_response_size)")
                    return done(body.decode("utf-8", errors="replace"), None, date=response.headers.get("Date"))
            return done(None, "redirect", f"more than {MAX_REDIRECTS} redirects")
    except TimeoutError:
        return done(None, "timeout", f"timeout after {timeout:g}s")
    except aiohttp.ClientSSLError as error:
        return done(None, "refused", f"{TLS_FAILED}: {error.os_error}")
    except aiohttp.ClientConnectorError as error:
        refused = isinstance(error.os_error, ConnectionRefusedError)
        return done(None, "refused", "connection refused" if refused else f"cannot connect: {error.os_error}")
    except (aiohttp.ClientError, OSError, ValueError) as error:
        return done(None, "error", described(error))


async def _read_start(response: aiohttp.ClientResponse, limit: int) -> bytearray:
    """The body's first `limit` bytes at most (all of it, where shorter), however the server cuts it into reads."""
    body = bytearray()
    while len(body) < limit:
        chunk = await response.content.read(limit - len(body))
        if not chunk:
            break
        body += chunk
    return body


def described(error: BaseException) -> str:
    """An unexpected error as a failure's detail: its type and message, cut short."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_DETAIL_CHARS else f"{text[:MAX_DETAIL_CHARS]}..."


class CredentialsError(Exception):
    """A target's password or token file could not be read."""


def _read_secret(path: str, field_name: str) -> str:
    try:
        return read_secret(path, MAX_SECRET_BYTES, field_name)
    except ValueError as error:
        raise CredentialsError(str(error)) from None


def basic_authorization(user: str, password: str) -> str:
    """The Authorization header's value for HTTP basic auth (RFC 7617); the caller has checked the user name."""
    return f"Basic {base64.b64encode(f'{user}:{password}'.encode()).decode('ascii')}"


def credential_headers(target: Target) -> dict[str, str]:
    """The Authorization header from the target's basic_auth or bearer_token_file, read at every poll (as
    Prometheus does) so a rotated secret is picked up without a reload."""
    if target.basic_auth is not None:
        password = _read_secret(target.basic_auth.password_file, "basic_auth.password_file")
        if not password:  # as with a token: a file truncated mid-rotation, or never filled
            raise CredentialsError(
                f"basic_auth.password_file {target.basic_auth.password_file}: empty (no password to send)"
            )
        return {"Authorization": basic_authorization(target.basic_auth.username, password)}
    if target.bearer_token_file is not None:
        token = _read_secret(target.bearer_token_file, "bearer_token_file")
        if not token:  # "Bearer " with nothing after it: a token file truncated mid-rotation, or never filled
            raise CredentialsError(f"bearer_token_file {target.bearer_token_file}: empty (no token to send)")
        return {"Authorization": f"Bearer {token}"}
    return {}
