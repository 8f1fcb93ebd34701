"""GPU memory through NVML (pynvml from nvidia-ml-py), and the cgroup parsing that ties a GPU process to a container.

Memory comes from memory info v2, whose `used` leaves out what the driver and firmware reserve; v1 counts that
reserve as used, so a GPU running nothing looks a few hundred MiB full. Where v2 is missing (old drivers, some
vGPUs) the reader falls back to v1 and reports `reserved_bytes=None`.

A GPU in MIG mode is not reported itself: each of its MIG devices is, with `parent_uuid` set and an index
`"<gpu>/<gpu instance>/<compute instance>"` (the GPU, GI and CI columns of `nvidia-smi`). An engine can only use
the memory of its instance, and reporting the parent as well would count every byte twice in a sum (so a MIG GPU
with no instances configured yet has no reading).

`NvmlReader.read()` never raises. Any failure makes that snapshot `up=False` with no readings; the reader then
shuts NVML down and re-initialises on a later read, at most once every `retry_interval_s`, because a lost GPU or a
reloaded driver leaves the old session's handles useless. A query one device does not support (per-process memory
on some vGPUs, MIG on most GPUs) only leaves that field empty.
"""

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

_LOG = logging.getLogger("plimsoll.nvml")

# A 64-hex container ID as a cgroup path component: `/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`,
# `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`, and the
# `...slice:cri-containerd:<id>` form containerd writes under cgroup v1 with the systemd driver.
_CONTAINER_ID = re.compile(
    r"(?:/|docker-|cri-containerd-|crio-|libpod-|:cri-containerd:)([0-9a-f]{64})(?:\.scope)?(?=/|$)"
)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None where NVML cannot say (WDDM, some MIG and vGPU set-ups)


@dataclass(frozen=True)
class GpuReading:
    index: str  # NVML index ("0"), or "<gpu>/<gi>/<ci>" for a MIG device
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    reserved_bytes: int | None  # None when only memory info v1 answered, whose used_bytes includes the reserve
    free_bytes: int
    processes: tuple[GpuProcess, ...]
    parent_uuid: str | None = None


@dataclass(frozen=True)
class NvmlSnapshot:
    up: bool
    driver_version: str | None
    gpus: tuple[GpuReading, ...]
    error: str | None


def _down(error: str) -> NvmlSnapshot:
    return NvmlSnapshot(up=False, driver_version=None, gpus=(), error=error)


class NvmlReader:
    """Reads every GPU through NVML, one snapshot per `read()`; owns the NVML session and its recovery.

    `nvml` is the pynvml module, injected so tests can pass a fake. `read()` blocks on NVML calls; the daemon runs
    it in a thread, and a read that starts while the previous one is still stuck in the driver returns `up=False`
    at once instead of queueing behind it.
    """

    def __init__(
        self,
        nvml: ModuleType | None = None,
        *,
        retry_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if nvml is None:
            import pynvml  # on first use, so subcommands that never read a GPU never load the bindings

            nvml = pynvml
        self._nvml = nvml
        self._retry_interval_s = retry_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._initialised = False
        self._retry_at = float("-inf")
        self._last_error: str | None = None
        self._logged_failures: set[str] = set()
        self._logged_notes: set[str] = set()

    def read(self) -> NvmlSnapshot:
        if not self._lock.acquire(blocking=False):
            return _down("the previous NVML read has not returned yet")
        try:
            return self._read()
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._shutdown()

    def _read(self) -> NvmlSnapshot:
        nvml = self._nvml
        if not self._initialised:
            if self._clock() < self._retry_at and self._last_error is not None:
                return _down(self._last_error)
            try:
                nvml.nvmlInit()
            except Exception as error:
                return self._fail("NVML init", error)
            self._initialised = True
        where = "NVML"
        try:
            driver_version = nvml.nvmlSystemGetDriverVersion()
            gpus: list[GpuReading] = []
            for index in range(nvml.nvmlDeviceGetCount()):
                where = f"GPU {index}"
                gpus.extend(self._read_device(index))
        except Exception as error:
            self._shutdown()
            return self._fail(where, error)
        if self._last_error is not None:
            _LOG.info("NVML is readable again after: %s", self._last_error)
            self._last_error = None
            self._logged_failures.clear()
        return NvmlSnapshot(up=True, driver_version=driver_version, gpus=tuple(gpus), error=None)

    def _fail(self, where: str, error: Exception) -> NvmlSnapshot:
        message = f"{where}: {type(error).__name__}: {error}"
        self._retry_at = self._clock() + self._retry_interval_s
        self._last_error = message
        if message not in self._logged_failures:
            self._logged_failures.add(message)
            # NVML's own errors say all there is to say; anything else is a surprise worth a traceback.
            expected = isinstance(error, self._nvml.NVMLError)
            _LOG.warning(
                "NVML down, retrying every %gs: %s",
                self._retry_interval_s,
                message,
                exc_info=None if expected else error,
            )
        return _down(message)

    def _note(self, message: str) -> None:
        if message not in self._logged_notes:
            self._logged_notes.add(message)
            _LOG.info("%s", message)

    def _shutdown(self) -> None:
        if not self._initialised:
            return
        self._initialised = False
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            # A lost GPU can make shutdown fail too; the next init starts a fresh session either way.
            _LOG.debug("nvmlShutdown failed: %s", error)

    def _read_device(self, index: int) -> list[GpuReading]:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        if not self._mig_enabled(handle):
            return [self._reading(str(index), handle, parent_uuid=None)]
        parent_uuid = nvml.nvmlDeviceGetUUID(handle)
        readings: list[GpuReading] = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_NotFound:
                continue  # a slot with no MIG device configured in it
            mig_index = f"{index}/{nvml.nvmlDeviceGetGpuInstanceId(mig)}/{nvml.nvmlDeviceGetComputeInstanceId(mig)}"
            readings.append(self._reading(mig_index, mig, parent_uuid=parent_uuid))
        return readings

    def _mig_enabled(self, handle: object) -> bool:
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._nvml.NVMLError_NotSupported:
            return False  # what every GPU without MIG answers
        return bool(current == self._nvml.NVML_DEVICE_MIG_ENABLE)

    def _reading(self, index: str, handle: object, parent_uuid: str | None) -> GpuReading:
        nvml = self._nvml
        uuid = nvml.nvmlDeviceGetUUID(handle)
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            reserved = memory.reserved
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound) as error:
            self._note(f"GPU {index} ({uuid}): memory info v2 unavailable ({error}); v1 used bytes include reserved")
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            reserved = None
        return GpuReading(
            index=index,
            uuid=uuid,
            name=nvml.nvmlDeviceGetName(handle),
            total_bytes=memory.total,
            used_bytes=memory.used,
            reserved_bytes=reserved,
            free_bytes=memory.free,
            processes=self._processes(index, uuid, handle),
            parent_uuid=parent_uuid,
        )

    def _processes(self, index: str, uuid: str, handle: object) -> tuple[GpuProcess, ...]:
        nvml = self._nvml
        try:
            infos = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission, nvml.NVMLLibraryMismatchError) as error:
            # NoPermission: unprivileged containers on some MIG and vGPU set-ups; LibraryMismatch: a driver too old
            # for the v3 process query pynvml calls.
            self._note(f"GPU {index} ({uuid}): per-process memory unavailable ({type(error).__name__}: {error})")
            return ()
        # pynvml already turns NVML_VALUE_NOT_AVAILABLE into None.
        return tuple(GpuProcess(pid=info.pid, used_bytes=info.usedGpuMemory) for info in infos)


def container_id_from_cgroup(text: str) -> str | None:
    """The 64-hex container ID in /proc/<pid>/cgroup content (v1 or v2), innermost when containers nest."""
    for line in text.splitlines():
        ids: list[str] = _CONTAINER_ID.findall(_cgroup_path(line))
        if ids:
            return ids[-1]
    return None


def _cgroup_path(line: str) -> str:
    # "hierarchy-ID:controllers:path"; the path itself may contain ':' (containerd under the systemd driver).
    parts = line.split(":", 2)
    return parts[2] if len(parts) == 3 else ""


def read_cgroup(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """/proc/<pid>/cgroup, or None when the process is gone or not ours to read."""
    try:
        return (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
