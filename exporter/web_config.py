"""TLS and basic auth on the daemon's port, from a web config file in Prometheus' exporter-toolkit format, so the
file that secures node_exporter secures Plimsoll too:

    tls_server_config: {cert_file: server.crt, key_file: server.key}
    basic_auth_users: {prometheus: $2y$10$...}      # bcrypt hashes: htpasswd -nBC 10 "" | tr -d ':\\n'

Every problem is collected in one pass and raised as one ConfigError naming the file and the field. Keys of the
format that Plimsoll cannot honour (inline certificates, cipher suites, curves, SAN allow-lists, rate_limit) are
refused by name: a security setting is never silently dropped. Relative paths are relative to the web config file,
as exporter-toolkit resolves them.
"""

import asyncio
import binascii
import collections
import hashlib
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import bcrypt

from exporter.config import ConfigError, load_yaml, read_config_text

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
_BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}$")
_HASH_HINT = "is not a bcrypt hash (make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')"


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
    name = _string(value, path, problems)
    if name is None:
        return None
    resolved = base / name
    try:
        with resolved.open("rb"):
            pass
    except OSError as error:
        problems.add(path, f"cannot read {resolved}: {error.strerror}")
        return None
    return str(resolved)


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


def _users(raw: Any, problems: _Problems) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for name, hashed in _mapping(raw, "basic_auth_users", problems).items():
        if not isinstance(name, str) or not name:
            problems.add("basic_auth_users", f"user name {name!r} is not a string: quote it")
        elif ":" in name:
            problems.add(f"basic_auth_users.{name}", "a user name cannot contain ':' (basic auth splits on it)")
        elif not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            problems.add(f"basic_auth_users.{name}", _HASH_HINT)  # the value is never echoed
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


_CACHE_SIZE = 100


def _cache_key(user: str, hashed: bytes, password: str) -> bytes:
    return hashlib.sha256(b"\0".join((user.encode(), hashed, password.encode()))).digest()


class BasicAuthCheck:
    """Verifies an Authorization header against the bcrypt hashes.

    bcrypt costs 50-250 ms a check by design, so each answer is cached under a SHA-256 of (user, hash, password),
    as exporter-toolkit does: a scraper presenting the same credentials every 15 s pays once, and the password is
    never kept in memory. Checks run in a worker thread, one at a time: the event loop keeps serving, and a storm of
    wrong passwords costs one core at most (the daemon's request cap bounds how many wait)."""

    def __init__(self, users: Mapping[str, bytes]):
        self._users = users
        # An unknown user is checked against the hash of a random password at the users' highest cost, as
        # exporter-toolkit does, so the time a refusal takes does not say which users exist.
        cost = max((int(hashed[4:6]) for hashed in users.values()), default=10)
        self._decoy = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=cost))
        self._cache: collections.OrderedDict[bytes, bool] = collections.OrderedDict()
        self._lock = asyncio.Lock()

    async def allows(self, authorization: str | None) -> bool:
        credentials = _credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        known = self._users.get(user)
        hashed = known if known is not None else self._decoy
        key = _cache_key(user, hashed, password)
        async with self._lock:
            allowed = self._cache.get(key)
            if allowed is None:
                # bcrypt compares in constant time.
                matched = await asyncio.to_thread(bcrypt.checkpw, password.encode(), hashed)
                allowed = known is not None and matched
                self._cache[key] = allowed
                if len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
        return allowed


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
