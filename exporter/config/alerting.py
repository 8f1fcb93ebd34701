"""The `alerting` section: the knobs the generated rules and dashboards both read."""

import re
from typing import Any
from urllib.parse import urlsplit

from exporter.capacity.plan import MAX_GPU_MEMORY_BYTES, MAX_GPU_TIB
from exporter.config.model import AlertingConfig
from exporter.config.reader import Reader
from exporter.config.validators import (
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
# other than (?P<name>...) and the flags i, m and s (lookarounds, atomic, conditional, comments, (?x)), and a
# possessive quantifier (*+, ++, ?+, {n}+).
_NOT_RE2 = re.compile(r"\(\?(?!P<|[ims-]*[:)])|[*+?}]\+")


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


def _job_regex(value: Any) -> str:
    """A regex written inside a PromQL string (job=~"...") and a comment of the monitors: it must compile and hold
    no quote, backslash, line break or other control character."""
    text = text_value("a regex on the scrape job name, such as .*plimsoll.*")(value)
    if not text or any(c in text for c in '"\\') or not text.isprintable():
        raise ValueError(
            f"{shown(text)} must be a non-empty regex without quotes or backslashes, on one line of printable text"
        )
    try:
        re.compile(text)
    except re.error as error:
        raise ValueError(f"{shown(text)} is not a regex ({error})") from None
    if _NOT_RE2.search(text):
        raise ValueError(
            f"{shown(text)} uses regex syntax Prometheus lacks (lookarounds, atomic or conditional groups, "
            "possessive quantifiers, flags other than i, m and s)"
        )
    if "{{" in text:  # quoted in PlimsollExporterAbsent's description, which Prometheus expands as a Go template
        raise ValueError(f"{shown(text)} holds {{{{: Prometheus would read it as a template; write [{{][{{]")
    return text


def _rule_labels(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a map of label names to text values, got {value_kind(value)}")
    problems = []
    for name, label in value.items():
        if not isinstance(name, str) or not _LABEL_NAME.match(name):
            problems.append(f"{shown(name)} is not a Kubernetes label name")
        elif not isinstance(label, str):
            problems.append(f"{name}: {shown(label)} is {value_kind(label)}, not text (quote it)")
        elif not _LABEL_VALUE.match(label):
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
            data, "saturation_trend_window", p, validate_duration, default.saturation_trend_window_seconds
        ),
    )
