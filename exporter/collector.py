"""Renders the current snapshot in Plimsoll's metric vocabulary; no I/O, never waits on an engine.

Engine series carry `target`, `engine`, `model` and `dp_rank` (the engine's own data-parallel index; "" when the
engine runs one). GPU series carry `gpu` (NVML index) and `uuid`. Names follow the Prometheus guide: base units,
`_ratio` in 0..1, `_total` only on counters, no timestamps. README "Metrics" lists them all.
"""

import math
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.snapshot import FAILURE_REASONS, InstanceState, Snapshot, TargetState, process_owner

ENGINE_LABELS = ["target", "engine", "model", "dp_rank"]


def _model(state: TargetState, served: str | None) -> str:
    """The `model` label: what the engine says it serves, else the target's configured model."""
    return served or state.target.model or ""


def _labels(state: TargetState, instance: InstanceState) -> list[str]:
    reading = instance.reading
    return [state.target.name, reading.engine, _model(state, reading.model), reading.instance]


class _EngineFamilies:
    """Families of per-instance series, filled target by target."""

    def __init__(self) -> None:
        self.families: list[GaugeMetricFamily | CounterMetricFamily] = []

    def gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=[*ENGINE_LABELS, *extra])
        self.families.append(family)
        return family

    def counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=[*ENGINE_LABELS, *extra])
        self.families.append(family)
        return family


def _put(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None and not (isinstance(value, float) and math.isnan(value)):
        family.add_metric(labels, value)


def _engine_families(snapshot: Snapshot) -> list[GaugeMetricFamily | CounterMetricFamily]:
    f = _EngineFamilies()
    usage = f.gauge("plimsoll_kv_cache_usage_ratio", "KV-cache usage the engine reports, 0..1.")
    capacity = f.gauge(
        "plimsoll_kv_cache_capacity_tokens",
        "KV-cache capacity in tokens: what the engine allocated (source=engine) and what the capacity model "
        "predicts for the configured deployment (source=model).",
        ("source",),
    )
    used = f.gauge("plimsoll_kv_cache_used_tokens", "KV-cache tokens in use (usage x capacity).")
    free = f.gauge("plimsoll_kv_cache_headroom_tokens", "KV-cache tokens that still fit.")
    requests = f.gauge(
        "plimsoll_headroom_requests",
        "Requests of the observed footprint (mean or p95 prompt+output tokens) that still fit in the KV cache.",
        ("footprint",),
    )
    footprint = f.gauge(
        "plimsoll_request_footprint_tokens", "Tokens one request holds at its end: prompt plus output.", ("footprint",)
    )
    running = f.gauge("plimsoll_requests_running", "Requests the engine is running.")
    waiting = f.gauge("plimsoll_requests_waiting", "Requests queued in the engine.")
    preemptions = f.counter("plimsoll_preemptions", "Requests the engine preempted (SGLang: retracted).")
    prompt = f.counter("plimsoll_prompt_tokens", "Prompt tokens the engine processed.")
    generation = f.counter("plimsoll_generation_tokens", "Tokens the engine generated.")
    eta = f.gauge(
        "plimsoll_saturation_eta_seconds",
        "Seconds until KV usage reaches the saturation threshold at the current trend; +Inf when flat or falling.",
    )
    slo_total = f.counter("plimsoll_slo_requests", "Requests observed for each latency SLI.", ("slo",))
    slo_good = f.counter("plimsoll_slo_good_requests", "Requests within the SLO's latency threshold.", ("slo",))
    weights = f.gauge("plimsoll_model_weights_bytes", "Model weights per GPU, as the capacity model computes them.")
    per_token = f.gauge("plimsoll_model_kv_bytes_per_token", "KV-cache bytes one token costs on one GPU.")
    activation = f.gauge("plimsoll_model_activation_bytes", "Activation peak the model expects per GPU.")
    overhead = f.gauge("plimsoll_model_overhead_bytes", "Non-torch and CUDA-graph memory the model expects per GPU.")
    drift = f.gauge(
        "plimsoll_model_capacity_error_ratio",
        "(engine KV capacity - model KV capacity) / model KV capacity: the model's miss, or a misconfiguration.",
    )
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
    up = GaugeMetricFamily("plimsoll_target_up", "1 when the last poll of the target succeeded.", labels=["target"])
    failures = CounterMetricFamily(
        "plimsoll_target_poll_failures",
        f"Failed polls of the target by reason ({', '.join(FAILURE_REASONS)}).",
        labels=["target", "reason"],
    )
    success = GaugeMetricFamily(
        "plimsoll_target_last_success_timestamp_seconds",
        "Unix time of the target's last successful poll.",
        labels=["target"],
    )
    duration = GaugeMetricFamily(
        "plimsoll_target_scrape_duration_seconds", "How long the last poll of the target took.", labels=["target"]
    )
    cost = GaugeMetricFamily(
        "plimsoll_target_gpu_hourly_cost",
        "What the GPUs the target runs on cost per hour, in the currency of pricing.gpu_hour; absent where any of "
        "them has no price.",
        labels=["target", "model"],
    )
    for state in snapshot.targets:
        name = state.target.name
        up.add_metric([name], 1.0 if state.up else 0.0)
        served = state.instances[0].reading.model if state.instances else None
        _put(cost, [name, _model(state, served)], state.gpu_hourly_cost)
        for reason in FAILURE_REASONS:
            failures.add_metric([name, reason], state.failures_total.get(reason, 0))
        if state.last_success_timestamp is not None:
            success.add_metric([name], state.last_success_timestamp)
        if state.scrape_duration_seconds is not None:
            duration.add_metric([name], state.scrape_duration_seconds)
    yield from (up, failures, success, duration, cost)


def _gpu_families(snapshot: Snapshot) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
    nvml = snapshot.nvml
    if nvml is None:
        return  # NVML switched off (`nvml: false`, CPU-only hosts): no GPU series at all, and no alert on them
    yield GaugeMetricFamily("plimsoll_nvml_up", "1 when the last NVML read succeeded.", value=1.0 if nvml.up else 0.0)
    if not nvml.up:
        return
    info = InfoMetricFamily("plimsoll_gpu", "GPU identity.", labels=["gpu", "uuid", "name", "driver_version"])
    memory: dict[str, tuple[str, Callable[..., float | None]]] = {
        "total": ("Total GPU memory (NVML memory info v2).", lambda g: g.total_bytes),
        "used": ("GPU memory in use, driver reserve excluded.", lambda g: g.used_bytes),
        "reserved": ("GPU memory the driver reserves.", lambda g: g.reserved_bytes),
        "free": ("GPU memory free.", lambda g: g.free_bytes),
    }
    families = {
        key: GaugeMetricFamily(f"plimsoll_gpu_memory_{key}_bytes", doc, labels=["gpu", "uuid"])
        for key, (doc, _) in memory.items()
    }
    process = GaugeMetricFamily(
        "plimsoll_gpu_process_memory_bytes",
        'GPU memory per process, with the engine target it is attributed to ("" when unknown).',
        labels=["gpu", "pid", "target"],
    )
    unexplained = GaugeMetricFamily(
        "plimsoll_vram_unexplained_bytes",
        "GPU memory used beyond what the capacity models of its targets explain (leak, co-tenant, fragmentation).",
        labels=["gpu"],
    )
    for gpu in nvml.gpus:
        info.add_metric([gpu.index, gpu.uuid, gpu.name, nvml.driver_version or ""], {})
        for key, (_, value) in memory.items():
            _put(families[key], [gpu.index, gpu.uuid], value(gpu))
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

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily]:
        snapshot = self._current()
        build = InfoMetricFamily("plimsoll_build", "Plimsoll's version.", labels=["version"])
        build.add_metric([__version__], {})
        yield build
        yield GaugeMetricFamily(
            "plimsoll_poll_duration_seconds",
            "How long the last cycle of discovery and NVML took. Targets are read on their own schedules: see "
            "plimsoll_target_scrape_duration_seconds.",
            value=snapshot.poll_duration_seconds,
        )
        yield GaugeMetricFamily(
            "plimsoll_saturation_threshold_ratio",
            "KV usage counted as saturated (configured, or calibrated by plimsoll loadtest).",
            value=snapshot.saturation_kv_usage,
        )
        objective = GaugeMetricFamily("plimsoll_slo_objective_ratio", "The SLO's objective.", labels=["slo"])
        threshold = GaugeMetricFamily("plimsoll_slo_threshold_seconds", "The SLO's latency threshold.", labels=["slo"])
        for name, seconds, ratio in self._slo_objectives():
            objective.add_metric([name], ratio)
            threshold.add_metric([name], seconds)
        yield objective
        yield threshold
        yield from _target_families(snapshot)
        yield from _gpu_families(snapshot)
        yield from _engine_families(snapshot)
