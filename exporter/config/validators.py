"""Checks of one field's value: each takes what YAML gave and returns the value to use, or raises ValueError
saying what was expected (the Reader adds the file and the field path)."""

import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from exporter.config.model import DEFAULT_PORT
from exporter.core.units import duration, parse_duration, quoted, value_kind

shown = quoted  # the name every config module quotes a bad value by
_SHOWN_KEY_CHARS = 40  # of a key named in a field path, which a message may repeat more than once
_SHOWN_PATH_CHARS = 200  # of a file's path: past any real one, and a mistyped value can be a megabyte
_MAX_LABEL_VALUE_CHARS = 256
_LABEL_VALUE_RULE = (
    f"a label value is printable text of 1 to {_MAX_LABEL_VALUE_CHARS} characters, without line breaks, tabs or other "
    "control characters, and without << or >> (prometheus-adapter's template delimiters)"
)


def redact_url(url: str) -> str:
    """The URL fit to show: everything between the scheme and the last "@" masked. That is the userinfo, and also
    a password holding an unescaped "/" or "#", which a URL parser reads as the start of the path."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    else:
        scheme += separator
    if "@" not in rest:
        return url
    return f"{scheme}***@{rest.rpartition('@')[2]}"


def shown_key(key: Any) -> str:
    """A key as a field path names it: as written when it is printable text, else its repr; cut short either way."""
    text = key if isinstance(key, str) and key.isprintable() else repr(key)
    return text if len(text) <= _SHOWN_KEY_CHARS else f"{text[:_SHOWN_KEY_CHARS]}..."


def validate_number(value: Any, what: str) -> float:
    """A finite number, written as a number or as text; `what` names it in the message."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected {what}, got {value_kind(value)}")
    try:
        number = float(value)
    except (ValueError, OverflowError):  # OverflowError: an integer of hundreds of digits, which YAML reads whole
        raise ValueError(f"{shown(value)} is not {what}") from None
    if not math.isfinite(number):
        raise ValueError(f"{shown(value)} is not {what}")
    return number


def validate_ratio(value: Any) -> float:
    """More than 0 and at most 1; 99 is a mistake for 0.99, and the message says so."""
    number = validate_number(value, "a ratio between 0 and 1")
    if not 0 < number <= 1:
        hint = f" (did you mean {number / 100:g}?)" if 1 < number <= 100 else ""
        raise ValueError(f"{shown(value)} is not a ratio between 0 and 1{hint}")
    return number


# Past the requests any fleet queues or has room for: 1e308 is finite, yet in a rule or a dashboard threshold it is
# a typo that no alert would ever cross.
MAX_REQUEST_COUNT = 1_000_000


def validate_request_count(value: Any) -> float:
    """A number of requests, from 0 to MAX_REQUEST_COUNT."""
    number = validate_number(value, "a number of requests")
    if number < 0:
        raise ValueError(f"{shown(value)} is not a number of requests (0 or more)")
    if number > MAX_REQUEST_COUNT:
        raise ValueError(f"{shown(value)} is out of range: Plimsoll accepts up to {MAX_REQUEST_COUNT:,} requests")
    return number


def validate_positive_int(value: Any) -> int:
    """A whole number of 1 or more; 2.0 is fine, 2.5 is not."""
    number = validate_number(value, "a positive integer")
    if number != int(number) or number < 1:
        raise ValueError(f"{shown(value)} is not a positive integer")
    return int(number)


def positive_int_at_most(most: int) -> Callable[[Any], int]:
    """A whole number from 1 to `most`."""

    def check(value: Any) -> int:
        number = validate_positive_int(value)
        if number > most:
            raise ValueError(f"{shown(value)} is out of range: Plimsoll accepts 1 to {most:,}")
        return number

    return check


# Past any period, interval or timeout Plimsoll takes, and within what a sleep can wait (time.sleep overflows at
# about 292 years, aborting the command with a traceback).
MAX_DURATION_SECONDS = 366 * 86400.0
# Prometheus durations count whole milliseconds: the generated rules could not say a shorter period or threshold.
MIN_DURATION_SECONDS = 0.001


def validate_duration(value: Any) -> float:
    """A duration from a millisecond to a year, with its unit (5s, 500ms, 1h30m)."""
    if isinstance(value, float) and not math.isfinite(value):  # YAML's .nan and .inf: no number of seconds
        raise ValueError(f"{shown(value)} is not a duration (expected e.g. 500ms, 5s, 15m, 1h30m)")
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{shown(value)} must be longer than zero")
    if seconds < MIN_DURATION_SECONDS:
        raise ValueError(f"{shown(value)} is shorter than a millisecond, the shortest duration a rule can say")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{shown(value)} is out of range: Plimsoll accepts durations up to 366d")
    return seconds


def duration_at_least(least: float, why: str) -> Callable[[Any], float]:
    """A duration (validate_duration) of at least `least` seconds; `why` says what needs that long."""

    def check(value: Any) -> float:
        seconds = validate_duration(value)
        if seconds < least:
            raise ValueError(f"{shown(value)} is shorter than {duration(least)}: {why}")
        return seconds

    return check


_BOOLEAN_WORDS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}


def validate_boolean(value: Any) -> bool:
    """YAML's true/false, and the words people quote ("off"): a quoted string must not count as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLEAN_WORDS:
        return _BOOLEAN_WORDS[value.strip().lower()]
    raise ValueError(f"expected true or false (or on/off, yes/no), got {shown(value)}")


def text_value(what: str) -> Callable[[Any], str]:
    """A scalar written as text; numbers are fine (a name of 7), collections and booleans are a mistake."""

    def check(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"expected {what}, got {value_kind(value)}")
        return str(value)

    return check


def label_value(what: str) -> Callable[[Any], str]:
    """A check of text that becomes a label value (a model name, a target name). Such a value is written into YAML,
    comments, PromQL strings and prometheus-adapter's query templates: a line break or control character (NEL and
    U+2028 included) ends a comment or a YAML scalar, NUL makes a YAML file unreadable, and << starts a template."""

    def check(value: Any) -> str:
        text = text_value(what)(value)
        if not 0 < len(text) <= _MAX_LABEL_VALUE_CHARS or not text.isprintable() or "<<" in text or ">>" in text:
            raise ValueError(f"{shown(text)} is not a usable label value ({_LABEL_VALUE_RULE})")
        return text

    return check


# A Kubernetes namespace (a DNS-1123 label), as the API takes it: it is written into API paths and manifests.
KUBERNETES_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

# What a host may hold: a DNS name, an IPv4 address, or an IPv6 one (the brackets already taken off, a zone after
# %). A target without a name is named by its host:port, which must then be a usable label value.
_HOST_PUNCTUATION = frozenset("-._~%:")


def validate_url(value: Any) -> str:
    """An http(s) URL without credentials, spaces or control characters; a message about a bad one never repeats a
    password."""
    text = text_value("a URL such as http://127.0.0.1:8000/metrics")(value)
    not_a_url = ValueError(f"{shown(redact_url(text))} is not a URL (expected http://host:port/path)")
    if not text.isprintable() or any(c.isspace() for c in text):
        raise ValueError(
            f"{shown(redact_url(text))} is not a URL: it holds a space or a control character (write a space as %20)"
        )
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError:
        raise not_a_url from None
    if "@" in parts.netloc:
        raise ValueError(
            "credentials in the URL would show in labels and logs; use basic_auth.password_file or bearer_token_file"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise not_a_url
    if not all(c.isalnum() or c in _HOST_PUNCTUATION for c in parts.hostname):
        raise not_a_url
    return text


def validate_listen(value: Any) -> str:
    """host:port (or a bare port: every interface) to serve on."""
    text = text_value(f"host:port such as 0.0.0.0:{DEFAULT_PORT}")(value)
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/@ "):
        raise ValueError(f"{shown(text)} is not host:port (e.g. 0.0.0.0:{DEFAULT_PORT})")
    return text if host else f"0.0.0.0:{port}"


def one_of(options: tuple[str, ...]) -> Callable[[Any], str]:
    """A check that the value is one of `options`, exactly."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError(f"{shown(value)} is not one of {', '.join(options)}")
        return value

    return check


def readable_file(base: Path, what: str) -> Callable[[Any], str]:
    """A path relative to the config file's directory, checked now so a typo is named at load, not at the first
    poll. Only the path is ever shown: the file holds a secret."""

    def check(value: Any) -> str:
        text = text_value(f"the path of {what}")(value)
        if not text.isprintable():  # NUL is os.stat's ValueError; a line break would split the message
            raise ValueError(f"{shown(text)} is not the path of {what}: it holds a control character")
        path = base / text
        named = str(path) if len(str(path)) <= _SHOWN_PATH_CHARS else f"{str(path)[:_SHOWN_PATH_CHARS]}..."
        try:
            mode = os.stat(path).st_mode
        except OSError as error:
            raise ValueError(f"cannot read {named}: {error.strerror}") from None
        if not stat.S_ISREG(mode):
            raise ValueError(f"{named} is not a regular file")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{named} is not readable by this user")
        return str(path)

    return check
