"""What the status page and `plimsoll status` show, as text: one row per engine instance, per GPU and per
autoscaled model (its scale-up lag), from the daemon's /api/v1/state document (the page renders the same document
the command fetches, so both show the same words). Pure: values in, strings out.

The page's script keeps a small copy of these rules for its live updates (exporter/data/status.html); change both.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# KV usage this far below the saturation threshold is "near" it: coloured before it is reached.
NEAR_THRESHOLD_RATIO = 0.1
GIB = 2**30
# Past any count of tokens, requests or seconds an engine or a forecast reports: a value beyond it, like NaN or an
# infinity, is shown as missing (or, as a time to saturation, as never).
MAX_SHOWN = 1e15


@dataclass(frozen=True)
class Cell:
    """A value as text, or, where there is none, the reason (`missing` is True)."""

    text: str
    missing: bool = False


@dataclass(frozen=True)
class InstanceRow:
    target: str
    engine: str  # with the dp rank where the target has several instances: "vllm 1"
    model: Cell
    kv_usage: Cell
    kv_usage_ratio: float | None  # the bar's length
    kv_level: str  # "ok", "near" (within NEAR_THRESHOLD_RATIO of the threshold), "at" (at or past it), "none"
    headroom_tokens: Cell
    headroom_requests_p95: Cell
    running_waiting: Cell
    preemptions: Cell
    saturation_in: Cell
    model_drift: Cell
    kv_usage_history: tuple[tuple[float, float], ...]  # (unix seconds, ratio), oldest first
    down: str | None = None  # why the target has no values at all; None when it was read


@dataclass(frozen=True)
class GpuProcessRow:
    pid: str
    memory: str
    target: str  # the engine target it belongs to, or "unattributed"


@dataclass(frozen=True)
class GpuRow:
    gpu: str
    name: str
    memory: str  # "65.2 / 79.6 GiB"
    unexplained: Cell
    processes: tuple[GpuProcessRow, ...]


@dataclass(frozen=True)
class ScaleUpRow:
    """One autoscaled model's scale-up lag beside the start-up `plimsoll autoscale replay` assumes for it."""

    model: str
    workload: str
    replicas: str  # ready replicas
    demand: str  # "40 / 30": requests running + waiting / ready replicas x knee_concurrency
    last_lag: Cell
    median_lag: Cell  # "4m 10s of 7": the median of the kept lags, and how many were measured
    pending: str  # how long a crossing has waited for a replica: "2m 5s", or "none"
    assumed: str  # the workload's startup


def duration(seconds: float | str | None) -> str:
    """Time to saturation: "now", "45s", "4m", "2h 5m", "3d"; "+Inf" (JSON's infinity) is "never"."""
    if seconds is None:
        return "-"
    if seconds == "+Inf" or (isinstance(seconds, float) and math.isinf(seconds)):
        return "never"
    value = float(seconds)
    if value <= 0:
        return "now"
    if value < 60:
        return f"{math.ceil(value)}s" if value <= 59 else "1m"
    if value < 3600:
        return f"{math.floor(value / 60)}m"
    if value < 86400:
        hours, minutes = divmod(math.floor(value / 60), 60)
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    return f"{math.floor(value / 86400)}d"


def seconds_text(seconds: float) -> str:
    """A scale-up lag or a start-up time, to the second (rounded down) under an hour: "45s", "4m 30s", "5m",
    "1h 2m"."""
    rounded = math.floor(seconds)
    if rounded < 60:
        return f"{rounded}s"
    if rounded < 3600:
        minutes, rest = divmod(rounded, 60)
        return f"{minutes}m {rest}s" if rest else f"{minutes}m"
    hours, minutes = divmod(rounded // 60, 60)
    return f"{hours}h {minutes}m" if minutes else f"{hours}h"


def percent(ratio: float, signed: bool = False) -> str:
    return f"{ratio * 100:+.0f}%" if signed else f"{ratio * 100:.0f}%"


def whole(value: float) -> str:
    """Tokens and requests that still fit, rounded down: a part of a request does not fit."""
    return f"{math.floor(value):,}"


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def kv_level(usage: float | None, threshold: float) -> str:
    if usage is None:
        return "none"
    if usage >= threshold:
        return "at"
    return "near" if usage >= threshold - NEAR_THRESHOLD_RATIO else "ok"


# A snapshot older than the longest poll_interval a config accepts (366 days) is not a daemon's last poll but a
# wrong clock or a bad document; so is one ahead of the daemon's clock by more than a Date header's rounding and a
# little skew (`now` is the local clock when the daemon sends no Date).
_MAX_PLAUSIBLE_AGE_SECONDS = 366 * 86400.0
_MAX_FUTURE_SECONDS = 60.0


def age(taken_at: float, now: float) -> str:
    """How old the snapshot is, by the daemon's clock (`now` should be the daemon's Date header where there is one)."""
    if taken_at <= 0:
        return "no poll yet"
    if taken_at - now > _MAX_FUTURE_SECONDS:
        return "time not plausible: in the future (check the daemon's clock)"
    if now - taken_at > _MAX_PLAUSIBLE_AGE_SECONDS:
        return "time not plausible: over a year ago (check the daemon's clock)"
    return f"{max(0, round(now - taken_at))}s ago"


def taken_at_text(taken_at: float) -> str:
    if taken_at <= 0:
        return "no poll yet"
    return datetime.fromtimestamp(taken_at, UTC).strftime("%H:%M:%S UTC")


def _cell(instance: Mapping[str, Any], field: str, text: str | None) -> Cell:
    if text is not None:
        return Cell(text)
    return Cell(instance.get("reasons", {}).get(field, "-"), missing=True)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and -MAX_SHOWN <= value <= MAX_SHOWN:
        return float(value)
    return None


def _saturation_in(value: Any) -> str | None:
    """The time to saturation in duration()'s words; None for anything but seconds or "+Inf"."""
    if value == "+Inf" or (isinstance(value, (int, float)) and value > MAX_SHOWN):
        return "never"
    seconds = _number(value)
    return None if seconds is None else duration(seconds)


def _down(target: Mapping[str, Any]) -> str:
    """A target without values: "down (refused): connection refused", as the poll failure's class and words."""
    if target["up"]:
        return "no engine instance on its page"
    failure, error = target["last_failure"], target["last_error"]
    return f"down ({failure}): {error}" if failure and error else f"down: {failure or error or 'not polled yet'}"


def instance_rows(state: Mapping[str, Any]) -> tuple[InstanceRow, ...]:
    threshold = float(state["saturation_kv_usage"])
    rows: list[InstanceRow] = []
    for target in state["targets"]:
        name = target["target"]
        if not target["up"] or not target["instances"]:
            none = Cell("", missing=True)
            rows.append(
                InstanceRow(
                    name,
                    target["engine"] or "-",
                    none,
                    none,
                    None,
                    "none",
                    none,
                    none,
                    none,
                    none,
                    none,
                    none,
                    (),
                    down=_down(target),
                )
            )
            continue
        several = len(target["instances"]) > 1
        for instance in target["instances"]:
            usage = _number(instance["kv_cache_usage_ratio"])
            tokens = _number(instance["kv_cache_headroom_tokens"])
            requests = _number(instance["headroom_requests_p95"])
            running = _number(instance["requests_running"])
            waiting = _number(instance["requests_waiting"])
            preemptions = _number(instance["preemptions_total"])
            drift = _number(instance["model_capacity_error_ratio"])
            eta = _saturation_in(instance["saturation_eta_seconds"])
            if running is None and waiting is None:
                load = None
            else:
                load = f"{'-' if running is None else whole(running)} / {'-' if waiting is None else whole(waiting)}"
            rows.append(
                InstanceRow(
                    target=name,
                    engine=f"{instance['engine']} {instance['dp_rank']}" if several else instance["engine"],
                    model=_cell(instance, "model", instance["model"]),
                    kv_usage=_cell(instance, "kv_cache_usage_ratio", None if usage is None else percent(usage)),
                    kv_usage_ratio=usage,
                    kv_level=kv_level(usage, threshold),
                    headroom_tokens=_cell(
                        instance, "kv_cache_headroom_tokens", None if tokens is None else whole(tokens)
                    ),
                    headroom_requests_p95=_cell(
                        instance, "headroom_requests_p95", None if requests is None else whole(requests)
                    ),
                    running_waiting=_cell(instance, "requests_running", load),
                    preemptions=_cell(
                        instance, "preemptions_total", None if preemptions is None else whole(preemptions)
                    ),
                    saturation_in=_cell(instance, "saturation_eta_seconds", eta),
                    model_drift=_cell(
                        instance, "model_capacity_error_ratio", None if drift is None else percent(drift, signed=True)
                    ),
                    kv_usage_history=tuple((float(t), float(v)) for t, v in instance.get("kv_usage_history", ())),
                )
            )
    return tuple(rows)


def gpu_rows(state: Mapping[str, Any]) -> tuple[GpuRow, ...]:
    rows = []
    for gpu in state["nvml"]["gpus"]:
        unexplained = _number(gpu["unexplained_bytes"])
        processes: Sequence[Mapping[str, Any]] = gpu["processes"]
        rows.append(
            GpuRow(
                gpu=str(gpu["gpu"]),
                name=gpu["name"],
                memory=f"{gpu['used_bytes'] / GIB:.1f} / {gib(gpu['total_bytes'])}",
                unexplained=Cell(gib(unexplained))
                if unexplained is not None
                else Cell("needs a model for every target on it", missing=True),
                processes=tuple(
                    GpuProcessRow(
                        str(p["pid"]),
                        "-" if p["used_bytes"] is None else gib(p["used_bytes"]),
                        p.get("target") or "unattributed",
                    )
                    for p in processes
                ),
            )
        )
    return tuple(rows)


NO_LAG_YET = "none measured yet"


def _lag_cell(seconds: float | None, text: str = "{}") -> Cell:
    return Cell(text.format(seconds_text(seconds))) if seconds is not None else Cell(NO_LAG_YET, missing=True)


def scale_up_rows(state: Mapping[str, Any]) -> tuple[ScaleUpRow, ...]:
    """One row per autoscaled model the daemon measures; none from a daemon whose state has no `scale_up`."""
    rows = []
    for model in state.get("scale_up", ()):
        demand, capacity = _number(model["demand_requests"]), _number(model["capacity_requests"])
        pending = _number(model["pending_seconds"])
        startup = _number(model["startup_seconds"])
        rows.append(
            ScaleUpRow(
                model=model["model"],
                workload=model["workload"],
                replicas=str(model["ready_replicas"]),
                demand=f"{'-' if demand is None else whole(demand)} / {'-' if capacity is None else whole(capacity)}",
                last_lag=_lag_cell(_number(model["last_lag_seconds"])),
                median_lag=_lag_cell(_number(model["lag_median_seconds"]), f"{{}} of {model['lags_count']}"),
                pending=seconds_text(pending) if pending else "none",
                assumed="-" if startup is None else seconds_text(startup),
            )
        )
    return tuple(rows)


def nvml_line(state: Mapping[str, Any]) -> str:
    """What NVML said, leaving out a field the state holds null (it read "driver None")."""
    nvml = state["nvml"]
    if nvml["up"]:
        return f"NVML up, driver {nvml['driver_version']}" if nvml["driver_version"] else "NVML up"
    return f"NVML down: {nvml['error']}" if nvml["error"] else "NVML down"
