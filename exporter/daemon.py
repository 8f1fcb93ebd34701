"""The poll loop: read NVML and every target concurrently, derive headroom, publish one immutable snapshot.

One slow or broken target never delays the others: each has its own timeout and response-size cap, and every
failure becomes a reason on that target (down, counted), never an exception out of the loop. The daemon owns
time and I/O; everything it derives comes from the pure modules.
"""

import asyncio
import glob
import json
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from exporter import __version__
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import CapacityPlan
from exporter.config import Config, ConfigError, Target, load_config, parse_target_file, scan_targets
from exporter.headroom import capacity_error_ratio, headroom
from exporter.slo import SloCounter, advance
from exporter.snapshot import EMPTY, InstanceState, SloState, Snapshot, TargetState
from exporter.sources.engines import read_page
from exporter.sources.engines.base import EngineReading, Histogram
from exporter.sources.engines.llamacpp import capacity_from_slots
from exporter.sources.kubernetes import PodDiscovery
from exporter.sources.nvml import GpuReading, NvmlReader, NvmlSnapshot
from exporter.sources.processes import Attributor
from exporter.target_model import TargetCatalog, model_plan, resolve
from exporter.trend import History, Point, eta_seconds

log = logging.getLogger("plimsoll.daemon")

HISTORY_SECONDS = 600.0
HISTORY_POINTS = 60  # Theil-Sen is O(n^2): 60 points cost ~0.5 ms an instance per poll
USER_AGENT = f"plimsoll/{__version__}"
LLAMACPP_PREFIX = "llamacpp:"


@dataclass(frozen=True)
class Fetched:
    text: str | None
    failure: str | None
    seconds: float


async def fetch(session: aiohttp.ClientSession, url: str, timeout: float, max_bytes: int) -> Fetched:
    """GET a metrics page with a deadline and a size cap; failures come back as a reason, never raised."""
    started = time.monotonic()

    def done(text: str | None, failure: str | None) -> Fetched:
        return Fetched(text, failure, time.monotonic() - started)

    try:
        async with asyncio.timeout(timeout), session.get(url, headers={"User-Agent": USER_AGENT}) as response:
            if response.status != 200:
                return done(None, "http_status")
            if "html" in response.headers.get("Content-Type", ""):
                return done(None, "not_metrics")
            body = bytearray()
            async for chunk in response.content.iter_chunked(65536):
                body += chunk
                if len(body) > max_bytes:
                    return done(None, "too_large")
            return done(body.decode("utf-8", errors="replace"), None)
    except TimeoutError:
        return done(None, "timeout")
    except aiohttp.ClientConnectorError:
        return done(None, "refused")
    except (aiohttp.ClientError, OSError, ValueError):
        return done(None, "error")


@dataclass(frozen=True)
class TargetMemory:
    """What the daemon remembers about a target between polls."""

    failures_total: Mapping[str, int] = field(default_factory=dict)
    last_success: float | None = None
    histories: Mapping[str, History] = field(default_factory=dict)
    slo_counters: Mapping[tuple[str, str], SloCounter] = field(default_factory=dict)


def _histogram_for(reading: EngineReading, slo_name: str) -> Histogram | None:
    return {"ttft": reading.ttft_seconds, "itl": reading.itl_seconds, "e2e": reading.e2e_seconds}.get(slo_name)


def _gpus_of(
    target: Target, targets: tuple[Target, ...], nvml: NvmlSnapshot | None, process_targets: Mapping[int, str]
) -> tuple[GpuReading, ...]:
    if nvml is None or not nvml.up:
        return ()
    if target.gpus is None:
        if len(targets) == 1:
            return nvml.gpus
        return tuple(g for g in nvml.gpus if any(process_targets.get(p.pid) == target.name for p in g.processes))
    wanted = set(target.gpus)
    return tuple(g for g in nvml.gpus if g.index in wanted or g.uuid in wanted)


def _pod_discovery(config: Config) -> PodDiscovery | None:
    return PodDiscovery(config.kubernetes, config.timeout_seconds) if config.kubernetes else None


class Daemon:
    """Owns the config, the per-target memory and the current snapshot. `poll_once` is the whole cycle."""

    def __init__(
        self,
        config: Config,
        *,
        nvml: NvmlReader | None = None,
        attributor: Attributor | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ):
        self._clock = clock
        self._rng = rng or random.Random()
        self._nvml = nvml
        self._attributor = attributor or Attributor()
        self._memory: dict[str, TargetMemory] = {}
        self._catalogs: dict[tuple[str | None, str | None], TargetCatalog] = {}
        self._file_targets: tuple[Target, ...] = ()
        self._pods = _pod_discovery(config)
        # The model's plan changes only when the engine's configuration does: computed once per configuration.
        self._plans: dict[tuple[str, str, tuple[tuple[str, str], ...], GpuSpec | None], CapacityPlan | None] = {}
        self.snapshot: Snapshot = EMPTY
        self.config = config

    def _catalog(self, target: Target) -> TargetCatalog:
        """The target's model and GPU preset, loaded on first sight (static and file_sd targets alike); a bad name
        disables its model metrics, not the target, and is logged once."""
        key = (target.model, target.gpu_type)
        if key not in self._catalogs:
            self._catalogs[key] = resolve(target)
            for field_name, problem in self._catalogs[key].problems:
                log.warning("target %s: %s: %s", target.name, field_name, problem)
        return self._catalogs[key]

    def reload(self, path: str) -> bool:
        """Swap in a new config; a bad one is rejected (logged) and the running one stays."""
        try:
            new = load_config(path)
        except ConfigError as error:
            log.error("config reload rejected, keeping the running config:\n%s", error)
            return False
        self._catalogs.clear()
        self._plans.clear()
        if new.kubernetes != self.config.kubernetes or new.timeout_seconds != self.config.timeout_seconds:
            self._pods = _pod_discovery(new)
        self.config = new
        log.info("config reloaded from %s: %d static targets", path, len(new.targets))
        return True

    def targets(self) -> tuple[Target, ...]:
        config = self.config
        if config.targets or config.target_files or config.kubernetes:
            return config.targets + self._file_targets + (self._pods.targets if self._pods else ())
        return scan_targets() if config.scan_local_ports else ()

    def refresh_target_files(self) -> None:
        """Re-read file_sd files (globs allowed, as in Prometheus); a broken file keeps the targets it had (an
        editor's half-saved file is common)."""
        found: list[Target] = []
        paths = sorted({p for pattern in self.config.target_files for p in glob.glob(pattern)})
        for path in paths:
            try:
                with open(path) as handle:
                    found.extend(parse_target_file(handle.read(), path))
            except (OSError, ConfigError) as error:
                log.warning("target file %s not used this poll: %s", path, error)
                return
        self._file_targets = tuple(found)

    async def poll_once(self, session: aiohttp.ClientSession) -> Snapshot:
        started = time.monotonic()
        self.refresh_target_files()
        if self._pods:
            await self._pods.refresh(session)
        targets = self.targets()
        nvml_read = asyncio.to_thread(self._read_gpus, targets) if self._nvml else asyncio.sleep(0, result=(None, {}))
        fetches = [
            fetch(session, t.url, t.timeout_seconds or self.config.timeout_seconds, self.config.max_response_bytes)
            for t in targets
        ]
        (nvml, process_targets), *pages = await asyncio.gather(nvml_read, *fetches)
        slots = await asyncio.gather(
            *(self._llamacpp_slots(session, t, page) for t, page in zip(targets, pages, strict=True))
        )
        now = self._clock()
        states = tuple(
            self._observe(t, page, targets, nvml, process_targets, now, capacity)
            for t, page, capacity in zip(targets, pages, slots, strict=True)
        )
        live = {t.name for t in targets}
        self._memory = {name: memory for name, memory in self._memory.items() if name in live}
        self.snapshot = Snapshot(
            taken_at=now,
            ready=True,
            nvml=nvml,
            targets=states,
            vram_unexplained_bytes=MappingProxyType(_unexplained(states, nvml)),
            process_targets=MappingProxyType(process_targets),
            poll_duration_seconds=time.monotonic() - started,
            saturation_kv_usage=self.config.saturation_kv_usage,
        )
        return self.snapshot

    def _read_gpus(self, targets: tuple[Target, ...]) -> tuple[NvmlSnapshot | None, Mapping[int, str]]:
        """NVML, then the target of each GPU process (/proc reads): both block, so both run in the poll's thread."""
        nvml = self._nvml.read() if self._nvml else None
        return nvml, self._attributor.attribute(nvml, targets)

    async def _llamacpp_slots(self, session: aiohttp.ClientSession, target: Target, page: Fetched) -> int | None:
        """llama.cpp's /metrics has no KV capacity; its /slots has each slot's context. None when unreachable
        (the server runs without --slots, or the page is not llama.cpp's)."""
        if page.text is None or LLAMACPP_PREFIX not in page.text:
            return None
        url = urlsplit(target.url)
        slots_url = urlunsplit((url.scheme, url.netloc, "/slots", "", ""))
        fetched = await fetch(session, slots_url, target.timeout_seconds or self.config.timeout_seconds, 1 << 20)
        try:
            slots = json.loads(fetched.text) if fetched.text is not None else None
        except ValueError:
            return None
        return capacity_from_slots(slots) if isinstance(slots, list) else None

    def _observe(
        self,
        target: Target,
        page: Fetched,
        targets: tuple[Target, ...],
        nvml: NvmlSnapshot | None,
        process_targets: Mapping[int, str],
        now: float,
        slots_capacity: int | None = None,
    ) -> TargetState:
        memory = self._memory.get(target.name, TargetMemory())
        engine, readings, failure = None, [], page.failure
        if page.text is not None:
            engine, readings = read_page(page.text, target.engine)
            if engine is None:
                failure = "unknown_engine" if "# TYPE" in page.text or "_total" in page.text else "not_metrics"
            if slots_capacity is not None:
                readings = [
                    r if r.kv_cache_capacity_tokens is not None else replace(r, kv_cache_capacity_tokens=slots_capacity)
                    for r in readings
                ]
        gpus = _gpus_of(target, targets, nvml, process_targets)
        gpu_indices = tuple(g.index for g in gpus)
        if failure is not None:
            counts = dict(memory.failures_total)
            counts[failure] = counts.get(failure, 0) + 1
            self._memory[target.name] = replace(memory, failures_total=MappingProxyType(counts))
            return TargetState(
                target=target,
                up=False,
                engine=None,
                last_failure=failure,
                failures_total=self._memory[target.name].failures_total,
                last_success_timestamp=memory.last_success,
                scrape_duration_seconds=page.seconds,
                gpus=gpu_indices,
            )
        histories = dict(memory.histories)
        counters = dict(memory.slo_counters)
        gpu = self._catalog(target).gpu or (GpuSpec(gpus[0].name, gpus[0].total_bytes) if gpus else None)
        instances = []
        for reading in readings:
            instances.append(self._instance(target, reading, gpu, histories, counters, now))
        self._memory[target.name] = TargetMemory(
            failures_total=memory.failures_total,
            last_success=now,
            histories=MappingProxyType(histories),
            slo_counters=MappingProxyType(counters),
        )
        return TargetState(
            target=target,
            up=True,
            engine=engine,
            last_failure=None,
            failures_total=memory.failures_total,
            last_success_timestamp=now,
            scrape_duration_seconds=page.seconds,
            instances=tuple(instances),
            gpus=gpu_indices,
        )

    def _instance(
        self,
        target: Target,
        reading: EngineReading,
        gpu: GpuSpec | None,
        histories: dict[str, History],
        counters: dict[tuple[str, str], SloCounter],
        now: float,
    ) -> InstanceState:
        predicted = self._model_plan(target, reading, gpu)
        capacity = reading.kv_cache_capacity_tokens
        if capacity is None and predicted is not None:
            capacity = predicted.pool.tokens
        room = headroom(
            reading.kv_cache_usage_ratio, capacity, reading.request_prompt_tokens, reading.request_generation_tokens
        )
        history = histories.get(reading.instance, History(HISTORY_SECONDS, HISTORY_POINTS))
        if reading.kv_cache_usage_ratio is not None:
            history = history.add(Point(now, reading.kv_cache_usage_ratio))
        histories[reading.instance] = history
        eta = eta_seconds(
            history.points,
            self.config.saturation_kv_usage,
            now,
            min_span_seconds=3 * self.config.poll_interval_seconds,
        )
        slos = []
        for slo in self.config.slos:
            histogram = _histogram_for(reading, slo.name)
            if histogram is None:
                continue
            key = (reading.instance, slo.name)
            counters[key] = advance(counters.get(key, SloCounter()), histogram, slo.threshold_seconds)
            slos.append(SloState(slo, counters[key]))
        return InstanceState(
            reading=reading,
            headroom=room,
            saturation_eta_seconds=eta if reading.kv_cache_usage_ratio is not None else math.nan,
            model_plan=predicted,
            model_capacity_error_ratio=capacity_error_ratio(
                reading.kv_cache_capacity_tokens, predicted.pool.tokens if predicted else None
            ),
            slos=tuple(slos),
        )

    def _model_plan(self, target: Target, reading: EngineReading, gpu: GpuSpec | None) -> CapacityPlan | None:
        arch = self._catalog(target).arch
        if arch is None:
            return None
        key = (target.name, reading.engine, tuple(sorted(reading.engine_config.items())), gpu)
        if key not in self._plans:
            self._plans[key] = model_plan(arch, target.deployment, reading.engine, reading.engine_config, gpu)
        return self._plans[key]

    def next_delay(self) -> float:
        """The poll interval with ±10% jitter, so many daemons do not hit shared engines in lock-step."""
        interval = self.config.poll_interval_seconds
        return interval * (0.9 + 0.2 * self._rng.random())

    async def run(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                await self.poll_once(session)
            except Exception:  # the loop must outlive any bug in one cycle; the next poll starts clean
                log.exception("poll failed")
            await asyncio.sleep(self.next_delay())


def _unexplained(states: tuple[TargetState, ...], nvml: NvmlSnapshot | None) -> dict[str, float]:
    """Per GPU: memory used minus what the models of the targets on it explain. Only where every target on the
    GPU has a model: a GPU with an unmodelled tenant would report that tenant as a leak."""
    if nvml is None or not nvml.up:
        return {}
    explained: dict[str, float] = {}
    unmodelled: set[str] = set()
    for state in states:
        for index in state.gpus:
            plans = [i.model_plan for i in state.instances]
            if not plans or any(p is None for p in plans):
                unmodelled.add(index)
                continue
            explained[index] = explained.get(index, 0.0) + sum(_modelled_bytes(p) for p in plans if p is not None)
    return {
        gpu.index: gpu.used_bytes - explained[gpu.index]
        for gpu in nvml.gpus
        if gpu.index in explained and gpu.index not in unmodelled
    }


def _modelled_bytes(result: CapacityPlan) -> float:
    return (
        result.weights.per_gpu_bytes
        + result.pool.pool_bytes
        + result.activation_bytes
        + result.non_torch_bytes
        + result.cuda_graph_bytes
    )
