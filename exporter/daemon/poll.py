"""The poll loop: every target on its own schedule, NVML and discovery once a cycle, one immutable snapshot.

Each target is read by a task of its own, so a target that never answers costs only its own timeout and every
other target keeps its interval. Whatever goes wrong in one target's read (a dead server, a hostile page, a bug)
becomes that target's failure reason, never an exception out of the loop. Pages are parsed in a worker thread so
the event loop keeps answering /metrics, /healthz and SIGTERM while a large page is read. Every change is
published as a new snapshot, swapped whole. The daemon owns time and I/O; what it derives comes from the pure
modules.
"""

import asyncio
import glob
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.deployment import Deployment
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import CapacityPlan
from exporter.config import (
    Config,
    ConfigError,
    Target,
    parse_target_file,
    read_config_text,
    scan_targets,
)
from exporter.core.headroom import capacity_error_ratio, headroom
from exporter.core.scale_up import ScaleUp
from exporter.core.slo import SloCounter, advance
from exporter.core.trend import History, Point, eta_seconds
from exporter.core.units import counted
from exporter.cost import GpuHourPrices, gpus_hourly_cost, unpriced_gpus
from exporter.daemon import scale_up
from exporter.daemon.snapshot import EMPTY, InstanceState, SloState, Snapshot, TargetState
from exporter.display import shown
from exporter.sources.engines import read_page
from exporter.sources.engines.base import EngineReading, Histogram, PageLimits
from exporter.sources.engines.llamacpp import capacity_from_slots
from exporter.sources.http import CredentialsError, credential_headers, described, fetch
from exporter.sources.kubernetes import PodDiscovery
from exporter.sources.nvml import GpuReading, NvmlReader, NvmlSnapshot
from exporter.sources.processes import Attributor
from exporter.target_model import TargetCatalog, model_plan, resolve

log = logging.getLogger("plimsoll.daemon")

HISTORY_SECONDS = 600.0
HISTORY_POINTS = 60  # Theil-Sen is O(n^2): 60 points cost ~0.5 ms an instance per poll
# With no config, the engines' usual ports are probed this often; only those that accept a connection are polled.
SCAN_INTERVAL_SECONDS = 60.0
SCAN_CONNECT_TIMEOUT_SECONDS = 0.5
# A target's new reading reaches the snapshot within this; reads in between are published together.
PUBLISH_DELAY_SECONDS = 0.25
# A page up to this size is read on the event loop (a 53 KB vLLM page takes ~2 ms); a larger one in a worker thread,
# so the loop keeps answering. A thread hop per page costs more CPU than the read of a usual page: measured with
# 200 targets, reading every page in a thread took 18% of a core against 15% inline.
INLINE_PAGE_CHARS = 256 * 1024  # a file_sd file; a bigger one is refused like one that does not parse
# A replica missing from this many poll intervals (a failed poll) still counts as ready when a scale-up lag episode
# starts, so its return is no new replica. The slowest target's interval: a failed poll keeps a target down until
# its own next poll.
SCALE_UP_SETTLE_POLLS = 3


# What a model's plan is computed from: the model, the configured deployment, the engine, its settings, the GPU.
_PlanInputs = tuple[ModelArchitecture, Deployment, str, tuple[tuple[str, str], ...], GpuSpec | None]


@dataclass(frozen=True)
class TargetMemory:
    """What the daemon remembers about a target between polls. What is kept per engine instance is kept for the
    instances on its latest page only, so it is bounded by max_instances_per_target whatever the labels do."""

    failures_total: Mapping[str, int] = field(default_factory=dict)
    last_success: float | None = None
    # Histories and SLO counters are kept per series (instance, engine, served model): a counter carried across an
    # engine or model change would add one model's requests to another's series when the page changes back, and a
    # history would read the step from one model's KV usage to the other's as a trend.
    histories: Mapping[tuple[str, str, str | None], History] = field(default_factory=dict)
    slo_counters: Mapping[tuple[str, str, str | None, str], SloCounter] = field(default_factory=dict)
    # The model's plan changes only when its inputs do: computed once per change, not at every poll.
    plans: Mapping[str, tuple[_PlanInputs, CapacityPlan | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class TargetFile:
    """One file_sd file: re-read only when `stamp` changes; a version that does not parse keeps the last good
    targets (an editor's half-saved file is common)."""

    stamp: tuple[int, int, int]  # inode, size, mtime in ns
    targets: tuple[Target, ...]


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


def _gpu_count(state: TargetState) -> int | None:
    """The GPUs a target uses by its config: its `gpus`, else TP x PP of the capacity plan of each engine instance
    on its page; None when neither says. Each data-parallel engine the page shows is counted once, whether the
    config names data_parallel or not, and one rank behind its own port is one engine, not the whole replica."""
    if state.target.gpus is not None:
        return len(state.target.gpus)
    plans = [instance.model_plan for instance in state.instances]
    if not plans or any(plan is None for plan in plans):
        return None
    return sum(p.deployment.tensor_parallel * p.deployment.pipeline_parallel for p in plans if p is not None)


def _priced_gpus(state: TargetState, gpus: tuple[GpuReading, ...]) -> tuple[str, ...]:
    """The names a target's GPUs are priced by, one a GPU: NVML's where NVML attributes GPUs to the target, else
    its gpu_type for each GPU its config says it uses; () when that is unknown."""
    if gpus:
        return tuple(g.name for g in gpus)
    if state.target.gpu_type is not None:
        return (state.target.gpu_type,) * (_gpu_count(state) or 0)
    return ()


def _pod_discovery(config: Config) -> PodDiscovery | None:
    return PodDiscovery(config.kubernetes, config.timeout_seconds) if config.kubernetes else None


def _cluster_wide(config: Config) -> bool:
    return config.kubernetes is not None and config.kubernetes.scope == "cluster"


def _names_targets(config: Config) -> bool:
    """Whether the config says where targets are; without, the daemon scans this host's usual engine ports."""
    return bool(config.targets or config.target_files or config.kubernetes)


def _model_name(name: str) -> str:
    return name.lower().rstrip("/").rsplit("/", 1)[-1]


def _serves(served: str, configured: str, arch: ModelArchitecture) -> bool:
    """Whether the engine's own model name is the configured model. vLLM names it by the repository id or the
    local path it loaded (unless --served-model-name says otherwise), so names are compared without case, by their
    last path part, one containing the other."""
    engine_name = _model_name(served)
    return any(
        name and (name in engine_name or engine_name in name)
        for name in (_model_name(configured), _model_name(arch.name))
    )


async def _accepts_connections(target: Target) -> bool:
    url = urlsplit(target.url)
    try:
        async with asyncio.timeout(SCAN_CONNECT_TIMEOUT_SECONDS):
            _, writer = await asyncio.open_connection(url.hostname, url.port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


class Daemon:
    """Owns the config, the per-target memory and the current snapshot.

    `poll_once` reads every target once, concurrently, and publishes: the first snapshot (readiness) comes from
    it. `run` then keeps one task per target and a cycle at the poll interval for discovery and NVML."""

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
        self._states: dict[str, TargetState] = {}
        self._catalogs: dict[tuple[str | None, str | None], TargetCatalog] = {}
        self._files: dict[str, TargetFile] = {}
        self._pods = _pod_discovery(config)
        self._scanned: tuple[Target, ...] = ()
        self._next_scan = -math.inf
        self._targets: tuple[Target, ...] = ()
        self._gpus: tuple[NvmlSnapshot | None, Mapping[int, str]] = (None, MappingProxyType({}))
        self._cycle_seconds = 0.0
        self._publish_pending: asyncio.TimerHandle | None = None
        # Per target and topic, the problems last logged: each is logged when it appears, not again while it lasts.
        self._reported: dict[tuple[str, str], tuple[str, ...]] = {}
        # Pricing a GPU by its name matches it against every preset (~30 us): done once per set of GPUs and prices,
        # not for every target at every publish. A reload empties it: the prices it was keyed by may be gone.
        self._costs: dict[tuple[GpuHourPrices, tuple[str, ...]], tuple[float | None, tuple[str, ...]]] = {}
        self._scale_ups: Mapping[str, ScaleUp] = MappingProxyType({})  # per autoscaled model, replaced each publish
        self.snapshot: Snapshot = EMPTY
        self.config = config

    def _report(self, target: str, topic: str, problems: tuple[str, ...]) -> None:
        """Log each of the target's current problems on `topic` that was not logged last time. Only the latest are
        remembered, so text that changes every poll (an engine's model name) cannot grow the daemon's memory."""
        key = (target, topic)
        before = self._reported.get(key, ())
        for problem in problems:
            if problem not in before:
                log.warning("%s", problem)
        if problems:
            self._reported[key] = problems
        else:
            self._reported.pop(key, None)

    def _catalog(self, target: Target) -> TargetCatalog:
        """The target's model and GPU preset, loaded on first sight (static and file_sd targets alike); a bad name
        disables its model metrics, not the target, and is logged once."""
        key = (target.model, target.gpu_type)
        if key not in self._catalogs:
            self._catalogs[key] = resolve(target)
            for field_name, problem in self._catalogs[key].problems:
                log.warning("target %s: %s: %s", target.name, field_name, problem)
        return self._catalogs[key]

    def apply(self, config: Config) -> None:
        """Run with a new config from the next cycle on (a reload: built and validated by the caller)."""
        self._catalogs.clear()
        self._costs.clear()
        if config.kubernetes != self.config.kubernetes or config.timeout_seconds != self.config.timeout_seconds:
            self._pods = _pod_discovery(config)
        self.config = config
        log.info("config applied from %s: %s", config.source, counted(len(config.targets), "static target"))

    def targets(self) -> tuple[Target, ...]:
        """Static, file_sd and pod targets (with no config at all: the scanned ports that answered), one per name:
        a name given twice keeps its first definition and the other is logged, never polled twice."""
        config = self.config
        if _names_targets(config):
            found = (
                config.targets
                + tuple(t for f in self._files.values() for t in f.targets)
                + (self._pods.targets if self._pods else ())
            )
        else:
            found = self._scanned if config.scan_local_ports else ()
        unique: dict[str, Target] = {}
        shadowed: dict[str, list[str]] = {}
        for target in found:
            first = unique.setdefault(target.name, target)
            if first is not target and first != target:
                shadowed.setdefault(target.name, []).append(
                    f"target {target.name!r} from {target.source} is not polled: {first.source} already defines a "
                    "target of that name (names label every series: keep them unique)"
                )
        for name in unique:
            self._report(name, "duplicate", tuple(shadowed.get(name, ())))
        return tuple(unique.values())

    def refresh_target_files(self) -> None:
        """Re-read the file_sd files that changed since the last look (globs allowed, as in Prometheus)."""
        current: dict[str, TargetFile] = {}
        for path in sorted({p for pattern in self.config.target_files for p in glob.glob(pattern)}):
            try:
                stat = os.stat(path)
            except OSError:
                continue  # removed between the glob and now
            stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            known = self._files.get(path)
            if known is not None and known.stamp == stamp:
                current[path] = known
                continue
            try:
                current[path] = TargetFile(stamp, parse_target_file(read_config_text(path, "target file"), path))
            except (OSError, ConfigError) as error:
                kept = known.targets if known is not None else ()
                log.warning(
                    "target file %s not used, keeping its last good %s: %s", path, counted(len(kept), "target"), error
                )
                current[path] = TargetFile(stamp, kept)
        self._files = current

    async def _scan(self) -> None:
        """With no config: the engines' usual ports on this host that accept a connection, re-probed now and then,
        so a port with nothing behind it is no target (a permanent target_up 0 raises tickets for nothing)."""
        now = time.monotonic()
        if now < self._next_scan:
            return
        self._next_scan = now + SCAN_INTERVAL_SECONDS
        candidates = scan_targets()
        answered = await asyncio.gather(*(_accepts_connections(t) for t in candidates))
        found = tuple(t for t, ok in zip(candidates, answered, strict=True) if ok)
        if {t.name for t in found} != {t.name for t in self._scanned}:
            log.info("port scan: engines answering on %s", ", ".join(t.name for t in found) or "no port")
        self._scanned = found

    async def _discover(self, session: aiohttp.ClientSession) -> tuple[Target, ...]:
        if self.config.target_files:
            await asyncio.to_thread(self.refresh_target_files)
        if self._pods:
            await self._pods.refresh(session)
        if self.config.scan_local_ports and not _names_targets(self.config):
            await self._scan()
        self._targets = self.targets()
        return self._targets

    def _forget_gone(self) -> None:
        """Drop all that is kept for targets no longer listed (pods come and go under new names), so what the daemon
        holds is bounded by the targets it has now."""
        live = {t.name for t in self._targets}
        for gone in [name for name in self._memory.keys() | self._states.keys() if name not in live]:
            self._states.pop(gone, None)
            self._memory.pop(gone, None)
        for key in [key for key in self._reported if key[0] not in live]:
            del self._reported[key]
        used = {(t.model, t.gpu_type) for t in self._targets}
        for catalog in [key for key in self._catalogs if key not in used]:
            del self._catalogs[catalog]

    async def _read_gpus(self, targets: tuple[Target, ...]) -> None:
        """NVML sees this node's GPUs alone: a daemon listing every node's pods reads none, rather than give its
        node's GPUs to a pod on another (the sole target gets every GPU; a `gpus: auto` target, those of its
        processes)."""
        if self._nvml is None or _cluster_wide(self.config):
            self._gpus = (None, MappingProxyType({}))
        else:
            self._gpus = await asyncio.to_thread(self._read_gpus_blocking, targets)

    def _read_gpus_blocking(self, targets: tuple[Target, ...]) -> tuple[NvmlSnapshot | None, Mapping[int, str]]:
        """NVML, then the target of each GPU process (/proc reads): both block, so both run in a thread."""
        nvml = self._nvml.read() if self._nvml else None
        return nvml, MappingProxyType(dict(self._attributor.attribute(nvml, targets)))

    async def poll_once(self, session: aiohttp.ClientSession) -> Snapshot:
        """Discover, read NVML, read every target concurrently (each bounded by its timeout), publish."""
        started = time.monotonic()
        targets = await self._discover(session)
        self._forget_gone()
        await self._read_gpus(targets)
        states = await asyncio.gather(*(self._poll_target(session, t) for t in targets))
        for target, state in zip(targets, states, strict=True):
            self._record(target, state)
        self._cycle_seconds = time.monotonic() - started
        return self._publish()

    async def run(self, session: aiohttp.ClientSession) -> None:
        workers: dict[str, tuple[Target, asyncio.Task[None]]] = {}
        try:
            await self._guarded(self.poll_once(session))
            while True:
                self._sync_workers(session, workers)
                await asyncio.sleep(self.next_delay())
                await self._guarded(self._cycle(session))
        finally:
            for _, task in workers.values():
                task.cancel()
            await asyncio.gather(*(task for _, task in workers.values()), return_exceptions=True)

    @staticmethod
    async def _guarded(step: Awaitable[object]) -> None:
        try:
            await step
        except Exception:  # the loop must outlive any bug in one cycle; the next cycle starts clean
            log.exception("poll cycle failed")

    async def _cycle(self, session: aiohttp.ClientSession) -> None:
        started = time.monotonic()
        targets = await self._discover(session)
        await self._read_gpus(targets)
        self._cycle_seconds = time.monotonic() - started
        self._publish()

    def _sync_workers(
        self, session: aiohttp.ClientSession, workers: dict[str, tuple[Target, asyncio.Task[None]]]
    ) -> None:
        """One task per target: started when it appears (at once if it was never read), cancelled when it goes or
        its definition changes. No await in here: a cancelled worker never records after its target is gone."""
        wanted = {t.name: t for t in self._targets}
        for name, (target, task) in list(workers.items()):
            if wanted.get(name) != target:
                task.cancel()
                del workers[name]
                if name in wanted:
                    self._memory.pop(name, None)  # another URL or engine: its history is not this one's
                    self._states.pop(name, None)
        self._forget_gone()
        for name, target in wanted.items():
            if name not in workers:
                first = self._delay(target) if name in self._states else 0.0
                task = asyncio.create_task(self._worker(session, target, first), name=f"plimsoll-target-{name}")
                workers[name] = (target, task)

    async def _worker(self, session: aiohttp.ClientSession, target: Target, delay: float) -> None:
        while True:
            await asyncio.sleep(delay)
            self._record(target, await self._poll_target(session, target))
            self._publish_soon()
            delay = self._delay(target)

    def _publish_soon(self) -> None:
        """Publish within PUBLISH_DELAY_SECONDS, once for every target read in that time: 200 targets would
        otherwise rebuild the snapshot 40 times a second."""
        if self._publish_pending is None:
            self._publish_pending = asyncio.get_running_loop().call_later(PUBLISH_DELAY_SECONDS, self._publish)

    def _jittered(self, interval: float) -> float:
        """±10%, so many daemons do not hit shared engines in lock-step."""
        return interval * (0.9 + 0.2 * self._rng.random())

    def _delay(self, target: Target) -> float:
        return self._jittered(self._poll_interval(target))

    def _poll_interval(self, target: Target) -> float:
        return target.poll_interval_seconds or self.config.poll_interval_seconds

    def next_delay(self) -> float:
        return self._jittered(self.config.poll_interval_seconds)

    def _record(self, target: Target, state: TargetState) -> None:
        """Keep the target's latest state; a change between up and down (or of the reason) is logged once."""
        previous = self._states.get(target.name)
        if not state.up and (previous is None or previous.up or previous.last_failure != state.last_failure):
            # The words may hold an engine's own text (a Content-Type): escaped, so it cannot act on a terminal.
            log.warning("target %s down: %s", target.name, shown(state.last_error or ""))
        elif state.up and previous is not None and not previous.up:
            log.info("target %s up again", target.name)
        self._states[target.name] = state

    def _publish(self) -> Snapshot:
        if self._publish_pending is not None:
            self._publish_pending.cancel()
            self._publish_pending = None
        nvml, process_targets = self._gpus
        targets = self._targets
        states = tuple(
            self._placed(state, _gpus_of(t, targets, nvml, process_targets))
            for t in targets
            if (state := self._states.get(t.name)) is not None
        )
        now = self._clock()
        slowest = max((self._poll_interval(t) for t in targets), default=self.config.poll_interval_seconds)
        settle = SCALE_UP_SETTLE_POLLS * slowest
        scale_ups, scale_up_states = scale_up.advance(self._scale_ups, self.config.autoscaling, states, now, settle)
        self._scale_ups = MappingProxyType(scale_ups)
        self.snapshot = Snapshot(
            taken_at=now,
            ready=True,
            nvml=nvml,
            targets=states,
            vram_unexplained_bytes=MappingProxyType(_unexplained(states, nvml)),
            process_targets=process_targets,
            poll_duration_seconds=self._cycle_seconds,
            saturation_kv_usage=self.config.saturation_kv_usage,
            scale_up=scale_up_states,
        )
        return self.snapshot

    def _placed(self, state: TargetState, gpus: tuple[GpuReading, ...]) -> TargetState:
        """The state with the GPUs it runs on and, while it is up, what they cost per hour. A down target has no
        engine series to take its `model` label from: the configured name in its place would add a second series
        per target, and a model of its own to every sum by model. Where prices are given but the target cannot be
        priced, the log says why once: a series that never appears is otherwise silent."""
        prices, names = key = (self.config.gpu_hour_prices, _priced_gpus(state, gpus))
        if key not in self._costs:
            self._costs[key] = (gpus_hourly_cost(*key), unpriced_gpus(*key))
        cost, unpriced = self._costs[key]
        problem = None
        if prices and unpriced:
            problem = (
                f"target {state.target.name}: pricing.gpu_hour prices no GPU named {', '.join(map(repr, unpriced))}"
                " (give a preset or the NVML product name): its plimsoll_target_gpu_hourly_cost is left out"
            )
        elif prices and not names and state.up:
            problem = (
                f"target {state.target.name}: its GPUs are unknown (NVML attributes none to it; give gpu_type with "
                "gpus, or with a model and deployment.tensor_parallel): its plimsoll_target_gpu_hourly_cost is left out"
            )
        if state.up or problem:  # a down target's GPUs are unknown for now: what was logged stands until it is read
            self._report(state.target.name, "pricing", (problem,) if problem else ())
        return replace(state, gpus=tuple(g.index for g in gpus), gpu_hourly_cost=cost if state.up else None)

    async def _poll_target(self, session: aiohttp.ClientSession, target: Target) -> TargetState:
        started = time.monotonic()
        try:
            return await self._read_target(session, target)
        except Exception as error:  # a surprise in one target's read is that target's failure, never the loop's
            log.debug("target %s: unexpected failure", target.name, exc_info=True)
            return self._failed(target, "error", described(error), time.monotonic() - started)

    async def _read_target(self, session: aiohttp.ClientSession, target: Target) -> TargetState:
        if target.problem is not None:
            return self._failed(target, "invalid_target", target.problem, 0.0)
        try:
            headers = credential_headers(target)
        except CredentialsError as error:
            return self._failed(target, "error", str(error), 0.0)
        timeout = target.timeout_seconds or self.config.timeout_seconds
        page = await fetch(session, target.url, timeout, self.config.max_response_bytes, headers)
        if page.text is None:
            return self._failed(target, page.failure or "error", page.detail, page.seconds)
        limits = PageLimits(self.config.max_series_per_target, self.config.max_instances_per_target)
        if len(page.text) > INLINE_PAGE_CHARS:
            read = await asyncio.to_thread(read_page, page.text, target.engine, limits)
        else:
            read = read_page(page.text, target.engine, limits)
        if read.failure is not None or read.engine is None:
            return self._failed(target, read.failure or "unknown_engine", read.detail, page.seconds)
        readings = list(read.readings)
        if read.engine == "llamacpp":
            slots = await self._llamacpp_slots(session, target, headers, timeout)
            readings = [
                r
                if r.kv_cache_capacity_tokens is not None or slots is None
                else replace(r, kv_cache_capacity_tokens=slots)
                for r in readings
            ]
        return self._succeeded(target, read.engine, readings, page.seconds)

    async def _llamacpp_slots(
        self, session: aiohttp.ClientSession, target: Target, headers: Mapping[str, str], timeout: float
    ) -> int | None:
        """llama.cpp's /metrics has no KV capacity; its /slots has each slot's context. None when unreachable
        (the server runs without --slots)."""
        url = urlsplit(target.url)
        slots_url = urlunsplit((url.scheme, url.netloc, "/slots", "", ""))
        fetched = await fetch(session, slots_url, timeout, 1 << 20, headers)
        return capacity_from_slots(fetched.text) if fetched.text is not None else None

    def _failed(self, target: Target, failure: str, detail: str | None, seconds: float) -> TargetState:
        memory = self._memory.get(target.name, TargetMemory())
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
            scrape_duration_seconds=seconds,
            last_error=detail or failure,
        )

    def _succeeded(self, target: Target, engine: str, readings: list[EngineReading], seconds: float) -> TargetState:
        memory = self._memory.get(target.name, TargetMemory())
        now = self._clock()
        nvml, process_targets = self._gpus
        gpus = _gpus_of(target, self._targets, nvml, process_targets)
        catalog = self._catalog(target)
        gpu = catalog.gpu or (GpuSpec(gpus[0].name, gpus[0].total_bytes) if gpus else None)
        histories = dict(memory.histories)
        counters = dict(memory.slo_counters)
        plans = dict(memory.plans)
        instances = tuple(self._instance(target, r, gpu, histories, counters, plans, now) for r in readings)
        # Only this page's instances and the configured SLOs are kept: an engine whose instance label changes every
        # poll would otherwise grow them without bound.
        live = {r.instance for r in readings}
        series = {(r.instance, r.engine, r.model) for r in readings}
        slos = {slo.name for slo in self.config.slos}
        self._memory[target.name] = TargetMemory(
            failures_total=memory.failures_total,
            last_success=now,
            histories=MappingProxyType({k: h for k, h in histories.items() if k in series}),
            slo_counters=MappingProxyType({k: c for k, c in counters.items() if k[:3] in series and k[3] in slos}),
            plans=MappingProxyType({i: p for i, p in plans.items() if i in live}),
        )
        return TargetState(
            target=target,
            up=True,
            engine=engine,
            last_failure=None,
            failures_total=memory.failures_total,
            last_success_timestamp=now,
            scrape_duration_seconds=seconds,
            instances=instances,
            warnings=self._model_warnings(target, catalog, readings),
        )

    def _model_warnings(self, target: Target, catalog: TargetCatalog, readings: list[EngineReading]) -> tuple[str, ...]:
        """A configured model that is not the one the engine serves makes every model metric wrong (a 255x
        'drift' that is only a typo): say so, once in the log and always in the state."""
        model, arch = target.model, catalog.arch
        warnings: tuple[str, ...] = ()
        if model is not None and arch is not None:
            warnings = tuple(
                f"the engine serves {served!r} but the config names model {model!r}: model metrics compare "
                "against the configured model"
                for served in dict.fromkeys(r.model for r in readings if r.model)
                if not _serves(served, model, arch)
            )
        self._report(target.name, "model", tuple(f"target {target.name}: {warning}" for warning in warnings))
        return warnings

    def _instance(
        self,
        target: Target,
        reading: EngineReading,
        gpu: GpuSpec | None,
        histories: dict[tuple[str, str, str | None], History],
        counters: dict[tuple[str, str, str | None, str], SloCounter],
        plans: dict[str, tuple[_PlanInputs, CapacityPlan | None]],
        now: float,
    ) -> InstanceState:
        predicted = self._model_plan(target, reading, gpu, plans)
        capacity = reading.kv_cache_capacity_tokens
        if capacity is None and predicted is not None:
            capacity = predicted.pool.tokens
        room = headroom(
            reading.kv_cache_usage_ratio, capacity, reading.request_prompt_tokens, reading.request_generation_tokens
        )
        series = (reading.instance, reading.engine, reading.model)
        history = histories.get(series, History(HISTORY_SECONDS, HISTORY_POINTS))
        if reading.kv_cache_usage_ratio is not None:
            history = history.add(Point(now, reading.kv_cache_usage_ratio))
        histories[series] = history
        interval = self._poll_interval(target)
        eta = eta_seconds(history.points, self.config.saturation_kv_usage, now, min_span_seconds=3 * interval)
        slos = []
        for slo in self.config.slos:
            histogram = _histogram_for(reading, slo.name)
            if histogram is None:
                continue
            key = (*series, slo.name)
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
            kv_usage_history=history.points,
        )

    def _model_plan(
        self,
        target: Target,
        reading: EngineReading,
        gpu: GpuSpec | None,
        plans: dict[str, tuple[_PlanInputs, CapacityPlan | None]],
    ) -> CapacityPlan | None:
        arch = self._catalog(target).arch
        if arch is None:
            return None
        inputs = (arch, target.deployment, reading.engine, tuple(sorted(reading.engine_config.items())), gpu)
        held = plans.get(reading.instance)
        if held is None or held[0] != inputs:
            held = (inputs, model_plan(arch, target.deployment, reading.engine, reading.engine_config, gpu))
            plans[reading.instance] = held
        return held[1]


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
