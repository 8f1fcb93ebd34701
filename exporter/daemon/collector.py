"""Renders the current snapshot in Plimsoll's metric vocabulary; no I/O, never waits on an engine.

Engine series carry `target`, `engine`, `model` and `dp_rank` (the engine's own data-parallel index; "" when the
engine runs one). GPU series carry `gpu` (NVML index) and `uuid`. Names follow the Prometheus guide: base units,
`_ratio` in 0..1, `_total` only on counters, no timestamps. Each family's name, help and labels come from
exporter/metrics_list.py, which lists them all (rendered into docs/metrics.md).
"""

import math
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.core.scale_up import LAG_BUCKETS
from exporter.daemon.snapshot import (
    FAILURE_REASONS,
    InstanceState,
    Snapshot,
    TargetState,
    model_label,
    process_owner,
)
from exporter.metrics_list import BY_NAME
from exporter.sources.nvml import GpuReading


def _gauge(name: str, value: float | None = None) -> GaugeMetricFamily:
    """The listed gauge `name`; with `value`, its one unlabelled sample."""
    spec = BY_NAME[name]
    family = GaugeMetricFamily(name, spec.help, labels=spec.labels)
    if value is not None:
        family.add_metric([], value)
    return family


def _counter(name: str) -> CounterMetricFamily:
    spec = BY_NAME[name]
    return CounterMetricFamily(name, spec.help, labels=spec.labels)  # takes `_total` off the family name itself


def _info(name: str) -> InfoMetricFamily:
    spec = BY_NAME[name]
    # InfoMetricFamily adds `_info` to its samples' names, so the family is named without it.
    return InfoMetricFamily(name.removesuffix("_info"), spec.help, labels=spec.labels)


def _labels(state: TargetState, instance: InstanceState) -> list[str]:
    reading = instance.reading
    return [state.target.name, reading.engine, model_label(state, reading.model), reading.instance]


class _EngineFamilies:
    """Families of per-instance series, filled target by target."""

    def __init__(self) -> None:
        self.families: list[GaugeMetricFamily | CounterMetricFamily] = []

    def gauge(self, name: str) -> GaugeMetricFamily:
        family = _gauge(name)
        self.families.append(family)
        return family

    def counter(self, name: str) -> CounterMetricFamily:
        family = _counter(name)
        self.families.append(family)
        return family


def _put(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None and not (isinstance(value, float) and math.isnan(value)):
        family.add_metric(labels, value)


def _engine_families(snapshot: Snapshot) -> list[GaugeMetricFamily | CounterMetricFamily]:
    f = _EngineFamilies()
    usage = f.gauge("plimsoll_kv_cache_usage_ratio")
    capacity = f.gauge("plimsoll_kv_cache_capacity_tokens")
    used = f.gauge("plimsoll_kv_cache_used_tokens")
    free = f.gauge("plimsoll_kv_cache_headroom_tokens")
    requests = f.gauge("plimsoll_headroom_requests")
    footprint = f.gauge("plimsoll_request_footprint_tokens")
    running = f.gauge("plimsoll_requests_running")
    waiting = f.gauge("plimsoll_requests_waiting")
    preemptions = f.counter("plimsoll_preemptions_total")
    prompt = f.counter("plimsoll_prompt_tokens_total")
    generation = f.counter("plimsoll_generation_tokens_total")
    eta = f.gauge("plimsoll_saturation_eta_seconds")
    slo_total = f.counter("plimsoll_slo_requests_total")
    slo_good = f.counter("plimsoll_slo_good_requests_total")
    weights = f.gauge("plimsoll_model_weights_bytes")
    per_token = f.gauge("plimsoll_model_kv_bytes_per_token")
    activation = f.gauge("plimsoll_model_activation_bytes")
    overhead = f.gauge("plimsoll_model_overhead_bytes")
    drift = f.gauge("plimsoll_model_capacity_error_ratio")
    for state in snapshot.targets:
        for instance in state.instances:
            labels = _labels(state, instance)
            reading, room, plan = instance.reading, instance.headroom, instance.model_plan
            _put(usage, labels, reading.kv_cache_usage_ratio)
            _put(capacity, [*labels, "engine"], reading.kv_cache_capacity_tokens)
            _put(capacity, [*labels, "model"], plan.pool.tokens if plan else None)
            _put(used, labels, room.kv_cache_used_tokens)
            _put(free, labels, room.kv_cache_headroom_tokens)
            _put(requests, [*labels, "mean"], room.headroom_requests_mean)
            _put(requests, [*labels, "p95"], room.headroom_requests_p95)
            _put(footprint, [*labels, "mean"], room.footprint_mean_tokens)
            _put(footprint, [*labels, "p95"], room.footprint_p95_tokens)
            _put(running, labels, reading.requests_running)
            _put(waiting, labels, reading.requests_waiting)
            _put(preemptions, labels, reading.preemptions_total)
            _put(prompt, labels, reading.prompt_tokens_total)
            _put(generation, labels, reading.generation_tokens_total)
            _put(eta, labels, instance.saturation_eta_seconds)
            for slo in instance.slos:
                _put(slo_total, [*labels, slo.slo.name], slo.counter.total)
                _put(slo_good, [*labels, slo.slo.name], slo.counter.good)
            if plan is not None:
                _put(weights, labels, plan.weights.per_gpu_bytes)
                _put(per_token, labels, plan.layout.bytes_per_token)
                _put(activation, labels, plan.activation_bytes)
                _put(overhead, labels, plan.overhead_bytes)
            _put(drift, labels, instance.model_capacity_error_ratio)
    return f.families


def _target_families(snapshot: Snapshot) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    up = _gauge("plimsoll_target_up")
    failures = _counter("plimsoll_target_poll_failures_total")
    success = _gauge("plimsoll_target_last_success_timestamp_seconds")
    duration = _gauge("plimsoll_target_scrape_duration_seconds")
    cost = _gauge("plimsoll_target_gpu_hourly_cost")
    for state in snapshot.targets:
        name = state.target.name
        up.add_metric([name], 1.0 if state.up else 0.0)
        served = state.instances[0].reading.model if state.instances else None
        _put(cost, [name, model_label(state, served)], state.gpu_hourly_cost)
        for reason in FAILURE_REASONS:
            failures.add_metric([name, reason], state.failures_total.get(reason, 0))
        if state.last_success_timestamp is not None:
            success.add_metric([name], state.last_success_timestamp)
        if state.scrape_duration_seconds is not None:
            duration.add_metric([name], state.scrape_duration_seconds)
    yield from (up, failures, success, duration, cost)


def _scale_up_families(snapshot: Snapshot) -> Iterator[HistogramMetricFamily | GaugeMetricFamily]:
    spec = BY_NAME["plimsoll_scale_up_lag_seconds"]
    lag = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels)
    pending = _gauge("plimsoll_scale_up_pending_seconds")
    for model in snapshot.scale_up:
        lags = model.lags
        # `le` written as prometheus_client's own histograms write it ("15.0"), so the bucket series match theirs.
        buckets = [(f"{bound:.1f}", count) for bound, count in zip(LAG_BUCKETS, lags.buckets, strict=True)]
        lag.add_metric([model.model], [*buckets, ("+Inf", lags.count)], lags.sum_seconds)
        pending.add_metric([model.model], model.pending_seconds)
    yield lag
    yield pending


def _gpu_families(snapshot: Snapshot) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
    nvml = snapshot.nvml
    if nvml is None:
        return  # NVML switched off (`nvml: false`, CPU-only hosts): no GPU series at all, and no alert on them
    yield _gauge("plimsoll_nvml_up", 1.0 if nvml.up else 0.0)
    if not nvml.up:
        return
    info = _info("plimsoll_gpu_info")
    memory: dict[str, Callable[[GpuReading], float | None]] = {
        "plimsoll_gpu_memory_total_bytes": lambda g: g.total_bytes,
        "plimsoll_gpu_memory_used_bytes": lambda g: g.used_bytes,
        "plimsoll_gpu_memory_reserved_bytes": lambda g: g.reserved_bytes,
        "plimsoll_gpu_memory_free_bytes": lambda g: g.free_bytes,
    }
    families = {name: _gauge(name) for name in memory}
    process = _gauge("plimsoll_gpu_process_memory_bytes")
    unexplained = _gauge("plimsoll_vram_unexplained_bytes")
    for gpu in nvml.gpus:
        info.add_metric([gpu.index, gpu.uuid, gpu.name, nvml.driver_version or ""], {})
        for name, value in memory.items():
            _put(families[name], [gpu.index, gpu.uuid], value(gpu))
        for proc in gpu.processes:
            owner = process_owner(snapshot, gpu.index, proc.pid) or ""
            _put(process, [gpu.index, str(proc.pid), owner], proc.used_bytes)
        _put(unexplained, [gpu.index], snapshot.vram_unexplained_bytes.get(gpu.index))
    yield info
    yield from families.values()
    yield process
    yield unexplained


class SnapshotCollector(Collector):
    """A prometheus_client collector over whatever snapshot `current()` returns at scrape time."""

    def __init__(self, current: Callable[[], Snapshot], slo_objectives: Callable[[], list[tuple[str, float, float]]]):
        self._current = current
        self._slo_objectives = slo_objectives

    def collect(
        self,
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily | HistogramMetricFamily]:
        snapshot = self._current()
        build = _info("plimsoll_build_info")
        build.add_metric([__version__], {})
        yield build
        yield _gauge("plimsoll_poll_duration_seconds", snapshot.poll_duration_seconds)
        yield _gauge("plimsoll_saturation_threshold_ratio", snapshot.saturation_kv_usage)
        objective = _gauge("plimsoll_slo_objective_ratio")
        threshold = _gauge("plimsoll_slo_threshold_seconds")
        for name, seconds, ratio in self._slo_objectives():
            objective.add_metric([name], ratio)
            threshold.add_metric([name], seconds)
        yield objective
        yield threshold
        yield from _target_families(snapshot)
        yield from _scale_up_families(snapshot)
        yield from _gpu_families(snapshot)
        yield from _engine_families(snapshot)
