"""TLS and basic auth on the daemon's port, from a web config file in Prometheus' exporter-toolkit format, so the
file that secures node_exporter secures Plimsoll too:

    tls_server_config: {cert_file: server.crt, key_file: server.key}
    basic_auth_users: {prometheus: $2y$10$...}      # bcrypt hashes: htpasswd -nBC 10 "" | tr -d ':\\n'

Every problem is collected in one pass and raised as one ConfigError naming the file and the field. Keys of the
format that Plimsoll cannot honour (inline certificates, cipher suites, curves, SAN allow-lists, rate_limit) are
refused by name: a security setting is never silently dropped. Relative paths are relative to the web config file,
as exporter-toolkit resolves them. A hash is checked at load by the bcrypt library's own rules, and its cost is
capped: one that bcrypt refuses, or that would take seconds a check, is refused naming the user.
"""

import asyncio
import binascii
import hashlib
import hmac
import os
import re
import secrets
import ssl
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import bcrypt

from exporter.config import ConfigError, load_yaml, read_config_text, readable_file

_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_VERIFY_MODES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go's crypto/tls can ask for a client certificate and accept it unverified; Python's ssl module verifies every
# certificate it asks for, so these two cannot be honoured as written.
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
_TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
)
_REFUSED_TLS_KEYS = {
    "cert": "an inline certificate is not supported: put it in a file and name it in cert_file",
    "key": "an inline key is not supported: put it in a file and name it in key_file",
    "client_ca": "an inline client CA is not supported: put it in a file and name it in client_ca_file",
    "cipher_suites": "not supported (Go cipher suite names): remove it to use OpenSSL's defaults for TLS 1.2, or "
    "set min_version: TLS13",
    "curve_preferences": "not supported: remove it to use OpenSSL's default curves",
    "client_allowed_sans": "not supported: restrict clients through the CA in client_ca_file instead",
}
_REFUSED_TOP_KEYS = {
    "rate_limit": "not supported: remove it (the Plimsoll config's max_concurrent_requests bounds the load)",
}
# exporter-toolkit's allowed response headers, and the values it accepts where it checks them.
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
_BCRYPT_HASH = re.compile(r"^\$2[a-z]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_MAKE_HASH = "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"
# bcrypt's own bounds on the cost (log2 of its rounds). exporter-toolkit accepts all of them, but every step doubles
# a check's time: cost 16 takes seconds a check, and a cost-31 check would outlast the daemon.
_BCRYPT_COSTS = range(4, 32)
MAX_BCRYPT_COST = 16
# bcrypt reads at most this much of a password; the bcrypt library refuses more rather than ignoring it, Go's
# (exporter-toolkit's) ignores it.
_BCRYPT_PASSWORD_BYTES = 72
# A certificate chain, a key or a CA bundle is kilobytes (Mozilla's whole bundle is ~220 KB); OpenSSL reads what
# it is given.
MAX_TLS_FILE_BYTES = 1024 * 1024
# Basic-auth users a web config may list: the Prometheus servers and tools that scrape this port.
MAX_USERS = 1000


@dataclass(frozen=True)
class WebConfig:
    source: str
    tls: ssl.SSLContext | None  # None: plain HTTP
    users: Mapping[str, bytes]  # username -> bcrypt hash; empty: no basic auth
    headers: Mapping[str, str]  # added to every response


class _Problems:
    def __init__(self, source: str):
        self.source = source
        self.lines: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.lines.append(f"{self.source}: {path}: {message}")


def _mapping(value: Any, path: str, problems: _Problems) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(path, f"expected a mapping, got {type(value).__name__}")
        return {}
    return value


def _string(value: Any, path: str, problems: _Problems) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        problems.add(path, f"expected a string, got {type(value).__name__}")
        return None
    return value


def _readable_file(value: Any, path: str, base: Path, problems: _Problems) -> str | None:
    """The file's path, checked without opening it: OpenSSL will, and opening a FIFO waits for a writer forever."""
    name = _string(value, path, problems)
    if name is None:
        return None
    try:
        resolved = readable_file(base, path)(name)
        size = os.stat(resolved).st_size
    except ValueError as error:
        problems.add(path, str(error))
        return None
    except OSError as error:  # gone since the check above
        problems.add(path, f"cannot read {base / name}: {error.strerror}")
        return None
    if size > MAX_TLS_FILE_BYTES:
        problems.add(path, f"{resolved} is over 1 MiB: a certificate, key or CA bundle is kilobytes")
        return None
    return resolved


def _tls_version(value: Any, path: str, default: str, problems: _Problems) -> ssl.TLSVersion:
    name = _string(value, path, problems) or default
    if name in ("TLS10", "TLS11"):
        problems.add(path, f"{name} is not supported: TLS 1.0 and 1.1 are deprecated (RFC 8996); use TLS12 or TLS13")
    elif name not in _TLS_VERSIONS:
        problems.add(path, f"{name!r} is not a TLS version (expected TLS12 or TLS13)")
    return _TLS_VERSIONS.get(name, _TLS_VERSIONS[default])


def _unknown_keys(section: dict[Any, Any], known: tuple[str, ...], path: str, problems: _Problems) -> None:
    for key in section:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            problems.add(where, f"unknown key (expected one of {', '.join(known)})")


def _tls_context(raw: Any, base: Path, problems: _Problems) -> ssl.SSLContext | None:
    section = _mapping(raw, "tls_server_config", problems)
    for key, reason in _REFUSED_TLS_KEYS.items():
        if key in section:
            problems.add(f"tls_server_config.{key}", reason)
    _unknown_keys(
        {k: v for k, v in section.items() if k not in _REFUSED_TLS_KEYS}, _TLS_KEYS, "tls_server_config", problems
    )
    where = "tls_server_config."
    if not any(section.get(key) for key in ("cert_file", "key_file", "client_auth_type", "client_ca_file")):
        if any(key in _TLS_KEYS for key in section):
            # exporter-toolkit serves plain HTTP here; a TLS setting with no certificate is more likely a mistake.
            problems.add("tls_server_config", "TLS settings without cert_file and key_file (set both for HTTPS)")
        return None
    before = len(problems.lines)
    cert_file = _readable_file(section.get("cert_file"), where + "cert_file", base, problems)
    key_file = _readable_file(section.get("key_file"), where + "key_file", base, problems)
    for key in ("cert_file", "key_file"):
        if section.get(key) in (None, ""):
            problems.add(where + key, "missing: TLS needs both cert_file and key_file")
    client_ca_file = _readable_file(section.get("client_ca_file"), where + "client_ca_file", base, problems)
    auth_type = _string(section.get("client_auth_type"), where + "client_auth_type", problems) or "NoClientCert"
    if auth_type in _UNVERIFIED_CLIENT_AUTH:
        problems.add(
            where + "client_auth_type",
            f"{auth_type} accepts client certificates without verifying them, which Plimsoll cannot do: use "
            "RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file",
        )
    elif auth_type not in _VERIFY_MODES:
        problems.add(where + "client_auth_type", f"{auth_type!r} is not one of {', '.join(_VERIFY_MODES)}")
    elif auth_type == "NoClientCert" and section.get("client_ca_file"):
        problems.add(
            where + "client_ca_file", "set without a client_auth_type: set client_auth_type: RequireAndVerifyClientCert"
        )
    elif auth_type != "NoClientCert" and not section.get("client_ca_file"):
        problems.add(where + "client_auth_type", f"{auth_type} needs client_ca_file, the CA of the client certificates")
    minimum = _tls_version(section.get("min_version"), where + "min_version", "TLS12", problems)
    maximum = _tls_version(section.get("max_version"), where + "max_version", "TLS13", problems)
    if minimum > maximum:
        problems.add(where + "min_version", "is above max_version")
    prefer_server = section.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer_server, bool):
        problems.add(where + "prefer_server_cipher_suites", f"expected true or false, got {prefer_server!r}")
    if len(problems.lines) > before or cert_file is None or key_file is None:
        return None

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version, context.maximum_version = minimum, maximum
    if prefer_server is False:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        # An empty password: an encrypted key fails here instead of OpenSSL prompting on the terminal.
        context.load_cert_chain(cert_file, key_file, password=b"")
    except ssl.SSLError as error:
        problems.add(where + "cert_file", f"cannot load {cert_file} with key_file {key_file}: {error.reason or error}")
        return None
    if client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=client_ca_file)
        except ssl.SSLError as error:
            problems.add(where + "client_ca_file", f"cannot load {client_ca_file}: {error.reason or error}")
            return None
    context.verify_mode = _VERIFY_MODES[auth_type]
    return context


def _hash_problem(hashed: Any) -> str | None:
    """Why bcrypt cannot check passwords against `hashed` in reasonable time; None when it can. The value is never
    echoed: it is a secret's hash."""
    shape = _BCRYPT_HASH.match(hashed) if isinstance(hashed, str) else None
    if shape is None:
        return f"is not a bcrypt hash ({_MAKE_HASH})"
    cost = int(shape.group(1))
    if cost not in _BCRYPT_COSTS:
        return f"bcrypt cost {cost} is outside bcrypt's {_BCRYPT_COSTS[0]} to {_BCRYPT_COSTS[-1]} ({_MAKE_HASH})"
    if cost > MAX_BCRYPT_COST:
        return (
            f"bcrypt cost {cost} is above {MAX_BCRYPT_COST}, the most Plimsoll accepts (each step doubles the time "
            f"of a check, and {MAX_BCRYPT_COST} already takes seconds): {_MAKE_HASH}"
        )
    try:
        # The library's own rules on the version and the salt, checked at cost 4: a millisecond, whatever the cost.
        bcrypt.checkpw(b"", _with_cost(hashed.encode(), 4))
    except ValueError:
        return f"bcrypt refuses it: an unknown version or a malformed salt ({_MAKE_HASH})"
    return None


def _with_cost(hashed: bytes, cost: int) -> bytes:
    """The hash as if made at `cost` (the same version, salt and digest)."""
    empty, version, _, rest = hashed.split(b"$")
    return b"$".join((empty, version, b"%02d" % cost, rest))


def _users(raw: Any, problems: _Problems) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    section = _mapping(raw, "basic_auth_users", problems)
    if len(section) > MAX_USERS:
        # Checking a hash takes about a millisecond: a file of thousands would hold up every start and reload.
        problems.add("basic_auth_users", f"{len(section):,} users, more than {MAX_USERS:,}: scrapers, not people")
        return users
    for name, hashed in section.items():
        if not isinstance(name, str) or not name:
            problems.add("basic_auth_users", f"user name {name!r} is not a string: quote it")
        elif ":" in name:
            problems.add(f"basic_auth_users.{name}", "a user name cannot contain ':' (basic auth splits on it)")
        elif (problem := _hash_problem(hashed)) is not None:
            problems.add(f"basic_auth_users.{name}", problem)
        else:
            users[name] = hashed.encode()
    return users


def _headers(raw: Any, problems: _Problems) -> dict[str, str]:
    section = _mapping(raw, "http_server_config", problems)
    _unknown_keys(section, ("http2", "headers"), "http_server_config", problems)
    # HTTP/2 is an optimisation, not a security setting: Plimsoll speaks HTTP/1.1, which every scraper falls back to.
    if not isinstance(section.get("http2", True), bool):
        problems.add("http_server_config.http2", f"expected true or false, got {section['http2']!r}")
    headers: dict[str, str] = {}
    for name, value in _mapping(section.get("headers"), "http_server_config.headers", problems).items():
        path = f"http_server_config.headers.{name}"
        if name not in _HEADERS:
            problems.add(path, f"not a header exporter-toolkit allows (expected one of {', '.join(_HEADERS)})")
            continue
        text = _string(value, path, problems)
        allowed = _HEADERS[name]
        if text is not None and allowed is not None and text.lower() not in allowed:
            problems.add(path, f"{text!r} is not one of {', '.join(allowed)}")
        elif text is not None:
            headers[name] = text
    return headers


def load_web_config(path: str) -> WebConfig:
    """Read and validate the file; raise ConfigError with every problem, each naming the file and the field."""
    problems = _Problems(path)
    document = load_yaml(read_config_text(path, "web config"), path)
    top = _mapping(document, "(top level)", problems)
    for key, reason in _REFUSED_TOP_KEYS.items():
        if key in top:
            problems.add(key, reason)
    _unknown_keys(
        {k: v for k, v in top.items() if k not in _REFUSED_TOP_KEYS},
        ("tls_server_config", "http_server_config", "basic_auth_users"),
        "",
        problems,
    )
    base = Path(path).parent
    tls = _tls_context(top.get("tls_server_config"), base, problems)
    users = _users(top.get("basic_auth_users"), problems)
    headers = _headers(top.get("http_server_config"), problems)
    if problems.lines:
        raise ConfigError(problems.lines)
    return WebConfig(path, tls, MappingProxyType(users), MappingProxyType(headers))


# bcrypt checks run in this many threads of their own: a storm of wrong passwords costs at most this many cores,
# and the event loop and the default executor (reloads) never wait behind it.
HASH_THREADS = 2
# Checks running or waiting for a thread, at most; past it a login is answered 429 at once. A waiting check waits at
# most two checks' time, so a scraper's first login still answers within its scrape timeout.
MAX_PENDING_CHECKS = 2 * HASH_THREADS
BUSY_RETRY_SECONDS = 1.0  # the Retry-After past it: a thread is free within a check's time
# Failed logins a client address may make at once, and how often it may make one more after that: a scraper with a
# wrong password fails once a scrape, never this often; a password guesser is slowed to one guess a second.
FAILURE_BURST = 10
FAILURE_INTERVAL_SECONDS = 1.0
# Addresses whose failures are remembered; past it the one that failed longest ago is forgotten (memory stays
# bounded, whoever sends from however many addresses: MAX_PENDING_CHECKS bounds the work).
MAX_TRACKED_ADDRESSES = 10_000


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: float | None = None  # refused without a check: seconds until this client may try again


class FailureBudget:
    """The failed logins each client address may still make: FAILURE_BURST at once, then one every
    FAILURE_INTERVAL_SECONDS (a generic cell rate algorithm: one number an address, when its budget is whole)."""

    def __init__(self) -> None:
        self._whole_at: dict[str, float] = {}  # in the order of their last attempt, oldest first

    def take(self, client: str) -> float:
        """Spend one attempt of `client`'s and return 0.0; or, where none is left, the seconds until one is."""
        now = time.monotonic()
        whole_at = max(self._whole_at.pop(client, now), now)
        wait = whole_at - now - (FAILURE_BURST - 1) * FAILURE_INTERVAL_SECONDS
        self._whole_at[client] = whole_at if wait > 0 else whole_at + FAILURE_INTERVAL_SECONDS
        if len(self._whole_at) > MAX_TRACKED_ADDRESSES:
            del self._whole_at[next(iter(self._whole_at))]
        return max(wait, 0.0)

    def give_back(self, client: str) -> None:
        """The attempt succeeded: it does not count against the address."""
        if client in self._whole_at:
            self._whole_at[client] -= FAILURE_INTERVAL_SECONDS


def _cache_key(user: str, hashed: bytes, password: str) -> bytes:
    return hashlib.sha256(b"\0".join((user.encode(), hashed, password.encode()))).digest()


def _decoy(cost: int) -> bytes:
    """A hash at `cost` that no password matches, to check unknown users against, as exporter-toolkit does, so the
    time a refusal takes does not say which users exist. A random digest, not the hash of a random password: making
    that at cost 16 would take seconds."""
    return bcrypt.gensalt(rounds=cost) + "".join(secrets.choice(_BCRYPT_ALPHABET) for _ in range(31)).encode()


class BasicAuth:
    """Verifies Authorization headers against the bcrypt hashes, whoever sends them and however often.

    bcrypt costs 50-250 ms a check by design. A password that once verified is remembered per user as a SHA-256 of
    (user, hash, password), never the password, and answered at once from the event loop: a scraper presenting it
    every 15 s pays once, and never waits behind anyone's failing checks. Other checks run in HASH_THREADS threads
    with no lock between them, at most MAX_PENDING_CHECKS at a time, and each client address has a FailureBudget;
    past either, 429 at once without hashing. Only successes are remembered, so wrong passwords cannot evict them.
    `use` swaps the users on a reload and forgets every verified password. `close` drops the waiting checks, so a
    shutdown waits for the running ones at most."""

    def __init__(self, users: Mapping[str, bytes]):
        self._pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="plimsoll-bcrypt")
        self._pending = 0
        self._closed = False  # a request on a kept-alive connection may still come during the shutdown
        self._budget = FailureBudget()
        self.use(users)

    def use(self, users: Mapping[str, bytes]) -> None:
        self._users = users
        self._decoy = _decoy(max((_cost(hashed) for hashed in users.values()), default=10))
        self._verified: dict[str, bytes] = {}

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def check(self, authorization: str | None, client: str) -> Verdict:
        credentials = _credentials(authorization)
        if credentials is None:
            return Verdict(False)
        user, password = credentials
        known = self._users.get(user)
        hashed = known if known is not None else self._decoy
        key = _cache_key(user, hashed, password)
        if hmac.compare_digest(self._verified.get(user, b""), key):
            return Verdict(True)
        if self._pending >= MAX_PENDING_CHECKS or self._closed:
            return Verdict(False, retry_after=BUSY_RETRY_SECONDS)
        wait = self._budget.take(client)
        if wait > 0:
            return Verdict(False, retry_after=wait)
        # Compared on the bytes bcrypt reads, as exporter-toolkit's Go bcrypt does; bcrypt compares in constant time.
        matched = await self._matches(password.encode()[:_BCRYPT_PASSWORD_BYTES], hashed)
        # A reload during the check decides: a password of the replaced hash is not let in.
        if matched and known is not None and self._users.get(user) == known:
            self._verified[user] = key
            self._budget.give_back(client)
            return Verdict(True)
        return Verdict(False)

    async def _matches(self, password: bytes, hashed: bytes) -> bool:
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, bcrypt.checkpw, password, hashed)
        finally:
            self._pending -= 1


def _cost(hashed: bytes) -> int:
    return int(hashed.split(b"$")[2])


def _credentials(authorization: str | None) -> tuple[str, str] | None:
    """(user, password) from a `Basic` Authorization header; None when absent or malformed."""
    if not authorization:
        return None
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = binascii.a2b_base64(encoded.strip(), strict_mode=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, separator, password = decoded.partition(":")
    return (user, password) if separator else None
