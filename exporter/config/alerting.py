"""The `alerting` section: the knobs the generated rules and dashboards both read."""

import re
import warnings
from typing import Any
from urllib.parse import urlsplit

from exporter.capacity.plan import MAX_GPU_MEMORY_BYTES, MAX_GPU_TIB
from exporter.config.model import AlertingConfig
from exporter.config.reader import Reader
from exporter.config.validators import (
    duration_at_least,
    redact_url,
    shown,
    text_value,
    validate_duration,
    validate_ratio,
    validate_request_count,
)
from exporter.core.units import parse_size, value_kind

_ALERTING_FIELDS = (
    "runbook_url",
    "exporter_job",
    "rule_labels",
    "fleet_headroom_min_requests",
    "capacity_drift_ratio",
    "vram_growth_per_hour",
    "saturation_gate_fraction",
    "saturation_ahead_for",
    "saturation_trend_window",
)

# A Kubernetes label name: an optional DNS-subdomain prefix and "/", then 63 characters at most of [A-Za-z0-9-_.],
# starting and ending alphanumeric. Values are the same without the prefix, and may be empty.
_LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# What Python's regex engine takes and Prometheus' (RE2) refuses, making it refuse the whole rule file: a "(?" group
# other than (?P<name>...) with an ASCII name and the flags i, m and s (lookarounds, atomic, conditional, comments,
# (?x)), and a possessive quantifier (*+, ++, ?+, {n}+). Searched outside character classes, where these characters
# are literals.
_NOT_RE2 = re.compile(r"\(\?(?!P<[A-Za-z0-9_]+>|[ims-]*[:)])|[*+?}]\+")
# What Grafana expands as a dashboard variable in the "Daemons reporting" query that holds the regex, with no escape:
# $name, ${...}, [[name]]. In RE2 nothing can follow the end-of-text "$", and [[name]] is a class then a "]".
_GRAFANA_VARIABLE = re.compile(r"\$[\w{]|\[\[\s*\w+\s*(?::\w+)?\]\]")
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_MAX_REPEAT = 1000  # RE2's "invalid repeat count" above it
# The names RE2 takes in [[:name:]] and [[:^name:]], a set Python reads as nested and does not check (Go's posixGroup).
_POSIX_CLASSES = frozenset(
    ("alnum", "alpha", "ascii", "blank", "cntrl", "digit", "graph", "lower", "print", "punct", "space", "upper", "word")
)


def _runbook_url(value: Any) -> str:
    """An http(s) page; anchors are appended, so the URL must not carry its own. It becomes each alert's
    runbook_url annotation, which Prometheus expands as a Go template."""
    text = text_value("the URL of the runbook, such as https://example.com/RUNBOOK.md")(value)
    not_a_url = ValueError(
        f"{shown(redact_url(text))} is not an http(s) URL on one line (expected e.g. https://example.com/RUNBOOK.md)"
    )
    try:
        parts = urlsplit(text)
    except ValueError:  # an unclosed [ of an IPv6 host
        raise not_a_url from None
    if parts.scheme not in ("http", "https") or not parts.netloc or not text.isprintable():
        raise not_a_url
    if "@" in parts.netloc:
        raise ValueError("credentials in the runbook URL would show in every alert: give the page's own URL")
    if "{{" in text or "}}" in text:
        raise ValueError(f"{shown(text)} holds {{{{ or }}}}: Prometheus would read it as a template; write %7B or %7D")
    if parts.fragment or text.endswith("#"):
        raise ValueError(f"{shown(text)} has a #fragment; give the page: each alert adds #<its name, lowercased>")
    return text


def _class_end(text: str, start: int) -> int:
    """The index past the character class that opens at text[start], read as RE2 reads one (backslashes are refused
    before this): a "]" first is a literal, and "[:name:]" is a POSIX class. ValueError for what RE2 refuses in it."""
    i = start + 1 + text.startswith("^", start + 1)
    first = True
    while first or text[i] != "]":
        first = False
        if text.startswith("[:", i) and (end := text.find(":]", i + 2)) >= 0:
            if text[i + 2 : end].removeprefix("^") not in _POSIX_CLASSES:
                raise ValueError(f"{text[i : end + 2]} is not a POSIX class RE2 knows, such as [:alpha:]")
            i = end + 2
        elif text[i + 1 : i + 2] == "-" and text[i + 2 : i + 3] not in ("", "]"):
            if text[i + 2] < text[i]:
                raise ValueError(f"{text[i : i + 3]} is a range running backwards")
            i += 3
        else:
            i += 1
        if i >= len(text):
            raise ValueError(f"the [ at position {start} is never closed")
    return i + 1


def _re2_problem(text: str) -> str | None:
    """Why Prometheus (RE2) would refuse a regex that Python compiles, or None."""
    outside, i = [], 0
    try:
        while (start := text.find("[", i)) >= 0:
            outside.append(text[i:start] + "x")  # one atom, so a quantifier after the class still applies to one
            i = _class_end(text, start)
    except ValueError as error:
        return f"is not a regex Prometheus takes ({error})"
    rest = "".join(outside) + text[i:]
    if _NOT_RE2.search(rest):
        return (
            "uses regex syntax Prometheus lacks (lookarounds, atomic or conditional groups, possessive quantifiers, "
            "flags other than i, m and s, group names not of A-Z a-z 0-9 _)"
        )
    if any(int(count or 0) > _MAX_REPEAT for repeat in _REPEAT.finditer(rest) for count in repeat.groups()):
        return f"repeats more than {_MAX_REPEAT} times, which Prometheus refuses"
    return None


def _job_regex(value: Any) -> str:
    """A regex written inside a PromQL string (job=~"...") and a comment of the monitors: it must compile and hold
    no quote, backslash, line break or other control character."""
    text = text_value("a regex on the scrape job name, such as .*plimsoll.*")(value)
    if not text or any(c in text for c in '"\\') or not text.isprintable():
        raise ValueError(
            f"{shown(text)} must be a non-empty regex without quotes or backslashes, on one line of printable text"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "possible nested set": RE2's [[:alpha:]] is checked below
            re.compile(text)
    except re.error as error:
        raise ValueError(f"{shown(text)} is not a regex ({error})") from None
    if problem := _re2_problem(text):
        raise ValueError(f"{shown(text)} {problem}")
    if _GRAFANA_VARIABLE.search(text):
        raise ValueError(
            f"{shown(text)} holds $name, ${{...}} or [[name]], which Grafana would replace with a dashboard variable "
            "(a $ matches only at the end, so nothing may follow it)"
        )
    if "{{" in text:  # quoted in PlimsollExporterAbsent's description, which Prometheus expands as a Go template
        raise ValueError(f"{shown(text)} holds {{{{: Prometheus would read it as a template; write [{{][{{]")
    return text


def _rule_labels(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a map of label names to text values, got {value_kind(value)}")
    problems = []
    for name, label in value.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name):  # match(): "$" takes a trailing "\n"
            problems.append(f"{shown(name)} is not a Kubernetes label name")
        elif not isinstance(label, str):
            problems.append(f"{name}: {shown(label)} is {value_kind(label)}, not text (quote it)")
        elif not _LABEL_VALUE.fullmatch(label):
            problems.append(f"{name}: {shown(label)} is not a Kubernetes label value (63 of A-Z a-z 0-9 - _ .)")
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(sorted(value.items()))


def _growth_per_hour(value: Any) -> int:
    size = parse_size(value)
    if size <= 0:
        raise ValueError(f"{shown(value)} must be more than zero bytes per hour (e.g. 2GiB)")
    if size > MAX_GPU_MEMORY_BYTES:  # more than a GPU holds, each hour: the alert could never fire
        raise ValueError(f"{shown(value)} is out of range: Plimsoll accepts up to {MAX_GPU_TIB} TiB an hour")
    return size


# predict_linear fits a line through the samples in its window; the generated monitors scrape every 15s, so a
# shorter window than a minute holds too few (under 30s, fewer than the two a line needs) and the alert never fires.
_TREND_WINDOW = duration_at_least(60.0, "predict_linear needs several scrapes (every 15s) in its window")


def parse_alerting(r: Reader, raw: Any) -> AlertingConfig:
    data = r.mapping(raw, "alerting")
    r.unknown(data, "alerting", _ALERTING_FIELDS)
    p = "alerting."
    default = AlertingConfig()
    return AlertingConfig(
        runbook_url=r.convert(data, "runbook_url", p, _runbook_url, default.runbook_url),
        exporter_job=r.convert(data, "exporter_job", p, _job_regex, default.exporter_job),
        rule_labels=r.convert(data, "rule_labels", p, _rule_labels, default.rule_labels),
        fleet_headroom_min_requests=r.convert(
            data, "fleet_headroom_min_requests", p, validate_request_count, default.fleet_headroom_min_requests
        ),
        capacity_drift_ratio=r.convert(data, "capacity_drift_ratio", p, validate_ratio, default.capacity_drift_ratio),
        vram_growth_bytes_per_hour=r.convert(
            data, "vram_growth_per_hour", p, _growth_per_hour, default.vram_growth_bytes_per_hour
        ),
        saturation_gate_fraction=r.convert(
            data, "saturation_gate_fraction", p, validate_ratio, default.saturation_gate_fraction
        ),
        saturation_ahead_for_seconds=r.convert(
            data, "saturation_ahead_for", p, validate_duration, default.saturation_ahead_for_seconds
        ),
        saturation_trend_window_seconds=r.convert(
            data, "saturation_trend_window", p, _TREND_WINDOW, default.saturation_trend_window_seconds
        ),
    )
