"""The NVML reader against a fake pynvml (the one boundary faked) and the real bindings, and the cgroup parsers."""

import ctypes
import importlib.util
import inspect
import logging
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.sources.nvml import (
    GpuProcess,
    NvmlReader,
    container_id_from_cgroup,
    read_cgroup,
)

GIB = 1024**3
MIB = 1024**2
RETRY_S = 30.0

# --- a fake pynvml, mirroring nvidia-ml-py 13.x (see the mirror tests below) ---


class NVMLError(Exception):
    """As pynvml.NVMLError: NVMLError(code) is an instance of that code's subclass, and str() is NVML's text."""

    value = 999
    text = "Unknown Error"

    def __new__(cls, value: int | None = None) -> "NVMLError":
        if cls is NVMLError and value is not None:
            cls = next((sub for sub in NVMLError.__subclasses__() if sub.value == value), NVMLError)
        error = Exception.__new__(cls)
        if value is not None:
            error.value = value
        return error

    def __str__(self) -> str:
        return self.text


class NVMLError_Uninitialized(NVMLError):
    value, text = 1, "Uninitialized"


class NVMLError_NotSupported(NVMLError):
    value, text = 3, "Not Supported"


class NVMLError_NoPermission(NVMLError):
    value, text = 4, "Insufficient Permissions"


class NVMLError_NotFound(NVMLError):
    value, text = 6, "Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    value, text = 9, "Driver Not Loaded"


class NVMLError_LibraryNotFound(NVMLError):
    value, text = 12, "NVML Shared Library Not Found"


class NVMLError_FunctionNotFound(NVMLError):
    value, text = 13, "Function Not Found"


class NVMLError_GpuIsLost(NVMLError):
    value, text = 15, "GPU is lost"


class NVMLLibraryMismatchError(Exception):
    """pynvml raises this (not an NVMLError) when an unversioned call finds no matching function in the driver."""


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None  # pynvml's field name


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GIB
    reserved: int = 512 * MIB
    used: int = 10 * GIB
    processes: list[FakeProcess] = field(default_factory=list)
    process_error: Exception | None = None
    memory_v2_error: Exception | None = None
    mig_mode: int | None = None  # None: the GPU has no MIG and answers NOT_SUPPORTED
    mig_slots: list["FakeDevice | None"] = field(default_factory=list)
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    lost: bool = False


@dataclass
class FakeMemory:
    total: int
    free: int
    used: int
    reserved: int | None = None


class FakeNvml(ModuleType):
    """Handles are the FakeDevice objects themselves; the real ones are opaque pointers."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    nvmlMemory_v2 = 0x02000028
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, devices: list[FakeDevice], driver_version: str = "570.124.06") -> None:
        super().__init__("pynvml")
        self.devices = devices
        self.driver_version = driver_version
        self.init_error: Exception | None = None
        self.initialised = False
        self.init_calls = 0
        self.shutdown_calls = 0

    def _device(self, handle: FakeDevice) -> FakeDevice:
        if not self.initialised:
            raise NVMLError_Uninitialized()
        if handle.lost:
            raise NVMLError_GpuIsLost()
        return handle

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def nvmlShutdown(self) -> None:
        if not self.initialised:
            raise NVMLError_Uninitialized()
        self.shutdown_calls += 1
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        if not self.initialised:
            raise NVMLError_Uninitialized()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            raise NVMLError_Uninitialized()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if not self.initialised:
            raise NVMLError_Uninitialized()
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return self._device(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str:
        return self._device(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice, version: int | None = None) -> FakeMemory:
        device = self._device(handle)
        free = device.total - device.reserved - device.used
        if not version:
            # v1 has no reserve field: the driver's reserve is counted as used.
            return FakeMemory(total=device.total, free=free, used=device.used + device.reserved)
        if device.memory_v2_error is not None:
            raise device.memory_v2_error
        return FakeMemory(total=device.total, free=free, used=device.used, reserved=device.reserved)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[FakeProcess]:
        device = self._device(handle)
        if device.process_error is not None:
            raise device.process_error
        return device.processes

    def nvmlDeviceGetMigMode(self, device: FakeDevice) -> list[int]:
        if self._device(device).mig_mode is None:
            raise NVMLError_NotSupported()
        return [device.mig_mode, device.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeDevice) -> int:
        return len(self._device(device).mig_slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeDevice, index: int) -> FakeDevice:
        slot = self._device(device).mig_slots[index]
        if slot is None:
            raise NVMLError_NotFound()
        return slot

    def nvmlDeviceGetGpuInstanceId(self, device: FakeDevice) -> int:
        return self._device(device).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: FakeDevice) -> int:
        return self._device(device).compute_instance_id


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_reader(*devices: FakeDevice) -> tuple[NvmlReader, FakeNvml, FakeClock]:
    nvml = FakeNvml(list(devices))
    clock = FakeClock()
    return NvmlReader(nvml, retry_interval_s=RETRY_S, clock=clock), nvml, clock


H100_UUID = "GPU-5f0b2b3e-8c1d-4a57-9b1e-2f6d3c7a9e01"

# --- the fake mirrors the real bindings ---


FAKE_ERRORS = [
    NVMLError_Uninitialized,
    NVMLError_NotSupported,
    NVMLError_NoPermission,
    NVMLError_NotFound,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_FunctionNotFound,
    NVMLError_GpuIsLost,
]


@pytest.mark.parametrize("fake", FAKE_ERRORS, ids=lambda error: error.__name__)
def test_fake_errors_have_the_real_codes_texts_and_classes(fake: type[NVMLError]) -> None:
    real = getattr(pynvml, fake.__name__)
    assert issubclass(real, pynvml.NVMLError)
    assert real().value == fake().value
    assert str(real()) == str(fake())
    assert type(pynvml.NVMLError(fake.value)) is real
    assert type(NVMLError(fake.value)) is fake


def test_fake_library_mismatch_error_is_outside_the_nvml_error_tree_as_in_pynvml() -> None:
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
    assert not issubclass(NVMLLibraryMismatchError, NVMLError)


def test_fake_constants_match_pynvml() -> None:
    for name in ("nvmlMemory_v2", "NVML_DEVICE_MIG_DISABLE", "NVML_DEVICE_MIG_ENABLE"):
        assert getattr(FakeNvml, name) == getattr(pynvml, name), name


def test_fake_functions_take_the_parameters_pynvml_takes() -> None:
    fake = FakeNvml([])
    names = [name for name in dir(FakeNvml) if name.startswith("nvml") and callable(getattr(fake, name))]
    assert len(names) == 14
    for name in names:
        real_parameters = list(inspect.signature(getattr(pynvml, name)).parameters)
        assert list(inspect.signature(getattr(fake, name)).parameters) == real_parameters, name


# --- memory ---


def test_v2_memory_reports_the_driver_reserve_apart_from_used() -> None:
    reader, _, _ = make_reader(FakeDevice(uuid=H100_UUID, reserved=512 * MIB, used=10 * GIB))

    snapshot = reader.read()

    assert snapshot.up and snapshot.error is None
    assert snapshot.driver_version == "570.124.06"
    [gpu] = snapshot.gpus
    assert (gpu.index, gpu.uuid, gpu.name) == ("0", H100_UUID, "NVIDIA H100 80GB HBM3")
    assert gpu.used_bytes == 10 * GIB
    assert gpu.reserved_bytes == 512 * MIB
    assert gpu.total_bytes == gpu.used_bytes + gpu.reserved_bytes + gpu.free_bytes
    assert gpu.parent_uuid is None


@pytest.mark.parametrize("error", [NVMLError_NotSupported(), NVMLError_FunctionNotFound()], ids=str)
def test_v1_memory_is_read_when_v2_is_missing_and_the_reserve_is_unknown(error: NVMLError) -> None:
    reader, _, _ = make_reader(FakeDevice(uuid=H100_UUID, reserved=512 * MIB, used=10 * GIB, memory_v2_error=error))

    [gpu] = reader.read().gpus

    assert gpu.reserved_bytes is None
    assert gpu.used_bytes == 10 * GIB + 512 * MIB
    assert gpu.total_bytes == gpu.used_bytes + gpu.free_bytes


# --- processes ---


def test_processes_carry_pid_and_memory_and_unavailable_memory_is_none() -> None:
    # pynvml hands back None where NVML says NVML_VALUE_NOT_AVAILABLE.
    processes = [FakeProcess(pid=4242, usedGpuMemory=70 * GIB), FakeProcess(pid=4343, usedGpuMemory=None)]
    reader, _, _ = make_reader(FakeDevice(uuid=H100_UUID, processes=processes))

    [gpu] = reader.read().gpus

    assert gpu.processes == (GpuProcess(pid=4242, used_bytes=70 * GIB), GpuProcess(pid=4343, used_bytes=None))


@pytest.mark.parametrize(
    "error",
    [NVMLError_NotSupported(), NVMLError_NoPermission(), NVMLLibraryMismatchError("use a versioned function")],
    ids=lambda error: type(error).__name__,
)
def test_an_unsupported_process_query_leaves_processes_empty_and_the_gpu_up(error: Exception) -> None:
    reader, _, _ = make_reader(FakeDevice(uuid=H100_UUID, process_error=error))

    snapshot = reader.read()

    assert snapshot.up
    [gpu] = snapshot.gpus
    assert gpu.processes == ()
    assert gpu.used_bytes == 10 * GIB


# --- MIG ---


def test_mig_devices_are_reported_separately_with_their_parent_uuid() -> None:
    small = FakeDevice(
        uuid="MIG-1b2c3d4e-0000-5a6b-8c9d-0e1f2a3b4c5d",
        name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        total=10 * GIB,
        reserved=0,
        used=2 * GIB,
        gpu_instance_id=9,
        processes=[FakeProcess(pid=77, usedGpuMemory=2 * GIB)],
    )
    large = FakeDevice(
        uuid="MIG-9a8b7c6d-1111-5e4f-a3b2-c1d0e9f8a7b6",
        name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        total=40 * GIB,
        reserved=0,
        used=30 * GIB,
        gpu_instance_id=2,
    )
    parent = FakeDevice(uuid=H100_UUID, mig_mode=FakeNvml.NVML_DEVICE_MIG_ENABLE, mig_slots=[large, None, small])
    plain = FakeDevice(uuid="GPU-00000000-1111-2222-3333-444444444444")
    reader, _, _ = make_reader(parent, plain)

    snapshot = reader.read()

    assert snapshot.up
    assert [(gpu.index, gpu.uuid, gpu.parent_uuid) for gpu in snapshot.gpus] == [
        ("0/2/0", large.uuid, H100_UUID),
        ("0/9/0", small.uuid, H100_UUID),
        ("1", plain.uuid, None),
    ]
    assert snapshot.gpus[1].total_bytes == 10 * GIB
    assert snapshot.gpus[1].processes == (GpuProcess(pid=77, used_bytes=2 * GIB),)


def test_a_mig_capable_gpu_with_mig_disabled_is_one_gpu() -> None:
    reader, _, _ = make_reader(FakeDevice(uuid=H100_UUID, mig_mode=FakeNvml.NVML_DEVICE_MIG_DISABLE))

    [gpu] = reader.read().gpus

    assert (gpu.index, gpu.uuid, gpu.parent_uuid) == ("0", H100_UUID, None)


# --- failures ---


@pytest.mark.parametrize(
    "error", [NVMLError_LibraryNotFound(), NVMLError_DriverNotLoaded()], ids=lambda error: type(error).__name__
)
def test_no_library_or_driver_gives_a_down_snapshot_without_raising(error: NVMLError) -> None:
    reader, nvml, _ = make_reader(FakeDevice(uuid=H100_UUID))
    nvml.init_error = error

    snapshot = reader.read()

    assert not snapshot.up
    assert snapshot.gpus == () and snapshot.driver_version is None
    assert snapshot.error == f"NVML init: {type(error).__name__}: {error}"


def test_a_lost_gpu_makes_the_read_down_and_shuts_nvml_down() -> None:
    reader, nvml, _ = make_reader(FakeDevice(uuid=H100_UUID), FakeDevice(uuid="GPU-lost", lost=True))

    snapshot = reader.read()

    assert not snapshot.up and snapshot.gpus == ()
    assert snapshot.error == "GPU 1: NVMLError_GpuIsLost: GPU is lost"
    assert nvml.shutdown_calls == 1 and not nvml.initialised


def test_after_a_lost_gpu_the_reader_reinitialises_only_once_the_back_off_has_passed() -> None:
    lost = FakeDevice(uuid=H100_UUID, lost=True)
    reader, nvml, clock = make_reader(lost)
    assert not reader.read().up

    clock.now += RETRY_S - 1
    lost.lost = False  # the GPU is back, but the reader must not touch NVML before the back-off ends
    waiting = reader.read()
    assert not waiting.up
    assert waiting.error == "GPU 0: NVMLError_GpuIsLost: GPU is lost"
    assert nvml.init_calls == 1

    clock.now += 1
    recovered = reader.read()
    assert recovered.up and recovered.error is None
    assert [gpu.uuid for gpu in recovered.gpus] == [H100_UUID]
    assert nvml.init_calls == 2


def test_init_is_retried_after_the_back_off_and_not_on_every_read() -> None:
    reader, nvml, clock = make_reader(FakeDevice(uuid=H100_UUID))
    nvml.init_error = NVMLError_DriverNotLoaded()
    for _ in range(5):
        reader.read()
        clock.now += 1
    assert nvml.init_calls == 1

    nvml.init_error = None
    clock.now += RETRY_S
    assert reader.read().up
    assert nvml.init_calls == 2


def test_an_unexpected_exception_is_a_down_read_not_a_crash() -> None:
    broken = FakeDevice(uuid=H100_UUID, process_error=ValueError("bindings returned garbage"))
    reader, nvml, _ = make_reader(broken)

    snapshot = reader.read()

    assert not snapshot.up
    assert snapshot.error == "GPU 0: ValueError: bindings returned garbage"
    assert not nvml.initialised


def test_each_failure_is_logged_once_and_recovery_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plimsoll.nvml")
    device = FakeDevice(uuid=H100_UUID, lost=True)
    reader, nvml, clock = make_reader(device)

    for _ in range(4):  # the same failure, across retries
        reader.read()
        clock.now += RETRY_S
    nvml.init_error = NVMLError_DriverNotLoaded()
    for _ in range(3):
        reader.read()
        clock.now += RETRY_S
    nvml.init_error = None
    device.lost = False
    reader.read()
    reader.read()

    records = [(record.name, record.levelno, record.getMessage()) for record in caplog.records]
    assert records == [
        ("plimsoll.nvml", logging.WARNING, "NVML down, retrying every 30s: GPU 0: NVMLError_GpuIsLost: GPU is lost"),
        (
            "plimsoll.nvml",
            logging.WARNING,
            "NVML down, retrying every 30s: NVML init: NVMLError_DriverNotLoaded: Driver Not Loaded",
        ),
        (
            "plimsoll.nvml",
            logging.INFO,
            "NVML is readable again after: NVML init: NVMLError_DriverNotLoaded: Driver Not Loaded",
        ),
    ]


def test_a_failure_seen_again_after_recovery_is_logged_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plimsoll.nvml")
    device = FakeDevice(uuid=H100_UUID, lost=True)
    reader, _, clock = make_reader(device)
    reader.read()
    clock.now += RETRY_S
    device.lost = False
    reader.read()
    device.lost = True
    reader.read()

    assert [record.levelno for record in caplog.records if record.name == "plimsoll.nvml"] == [
        logging.WARNING,
        logging.INFO,
        logging.WARNING,
    ]


def test_an_unsupported_field_is_noted_once_not_every_poll(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plimsoll.nvml")
    reader, _, _ = make_reader(
        FakeDevice(uuid=H100_UUID, process_error=NVMLError_NotSupported(), memory_v2_error=NVMLError_NotSupported())
    )
    for _ in range(3):
        assert reader.read().up

    assert [record.getMessage() for record in caplog.records] == [
        f"GPU 0 ({H100_UUID}): memory info v2 unavailable (Not Supported); v1 used bytes include reserved",
        f"GPU 0 ({H100_UUID}): per-process memory unavailable (NVMLError_NotSupported: Not Supported)",
    ]


def test_a_read_while_the_previous_one_is_stuck_returns_down_at_once() -> None:
    entered, release = threading.Event(), threading.Event()

    class StuckNvml(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            entered.set()
            release.wait(timeout=10)
            return super().nvmlDeviceGetCount()

    reader = NvmlReader(StuckNvml([FakeDevice(uuid=H100_UUID)]), retry_interval_s=RETRY_S, clock=FakeClock())
    stuck = threading.Thread(target=reader.read)
    stuck.start()
    try:
        assert entered.wait(timeout=10)
        snapshot = reader.read()
    finally:
        release.set()
        stuck.join(timeout=10)

    assert not snapshot.up
    assert snapshot.error == "the previous NVML read has not returned yet"
    assert reader.read().up


def test_close_shuts_nvml_down_and_the_next_read_starts_again() -> None:
    reader, nvml, _ = make_reader(FakeDevice(uuid=H100_UUID))
    reader.read()

    reader.close()
    reader.close()

    assert nvml.shutdown_calls == 1 and not nvml.initialised
    assert reader.read().up
    assert nvml.init_calls == 2


# --- the real bindings ---


def _nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_the_real_pynvml_reads_without_raising() -> None:
    """On a machine without an NVIDIA driver this is up=False with the reason; on a GPU machine, real readings."""
    reader = NvmlReader()
    try:
        snapshot = reader.read()
    finally:
        reader.close()

    if _nvml_library_loads():
        assert snapshot.up, snapshot.error
        assert snapshot.driver_version and snapshot.gpus
        assert all(gpu.total_bytes > 0 for gpu in snapshot.gpus)
    else:
        assert not snapshot.up
        assert snapshot.error == "NVML init: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
        assert snapshot.gpus == ()


ON_A_GPU = pytest.mark.skipif(
    not _nvml_library_loads() or shutil.which("nvidia-smi") is None,
    reason="needs an NVIDIA driver and nvidia-smi, which this machine does not have",
)


def _nvidia_smi_memory_mib() -> dict[str, tuple[int, int]]:
    """uuid -> (total, used) in MiB, as nvidia-smi prints them."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,memory.total,memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    memory: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        uuid, total, used = (part.strip() for part in line.split(","))
        memory[uuid] = (int(total), int(used))
    return memory


@ON_A_GPU
def test_on_a_real_gpu_total_and_used_agree_with_nvidia_smi() -> None:
    reader = NvmlReader()
    try:
        snapshot = reader.read()
    finally:
        reader.close()
    smi = _nvidia_smi_memory_mib()

    assert snapshot.up, snapshot.error
    whole_gpus = [gpu for gpu in snapshot.gpus if gpu.parent_uuid is None]
    assert {gpu.uuid for gpu in whole_gpus} == set(smi)
    for gpu in whole_gpus:
        total_mib, used_mib = smi[gpu.uuid]
        assert gpu.total_bytes // MIB == total_mib
        # nvidia-smi's "used" leaves the driver's reserve out, as memory info v2 does; other processes may
        # allocate between the two reads, hence the slack.
        assert abs(gpu.used_bytes // MIB - used_mib) <= 256, (gpu, smi[gpu.uuid])
        assert gpu.used_bytes + gpu.free_bytes + (gpu.reserved_bytes or 0) == gpu.total_bytes


_HOLD_ONE_GIB = """
import sys, torch
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", flush=True)
sys.stdin.read()
"""


@ON_A_GPU
def test_on_a_real_gpu_a_process_holding_a_gib_shows_in_used_and_in_the_process_list() -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch with CUDA to allocate GPU memory; this interpreter has none")
    reader = NvmlReader()
    before = reader.read()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_ONE_GIB, "--"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding", "the holder did not get its GiB"
        after = reader.read()
    finally:
        holder.kill()
        holder.wait(timeout=60)
        reader.close()

    assert before.up and after.up, (before.error, after.error)
    grown = sum(gpu.used_bytes for gpu in after.gpus) - sum(gpu.used_bytes for gpu in before.gpus)
    assert grown >= GIB, f"used grew by {grown / MIB:.0f} MiB while a process held 1024 MiB"
    holding = [process for gpu in after.gpus for process in gpu.processes if (process.used_bytes or 0) >= GIB]
    assert holding, f"no process entry holds >= 1 GiB: {[gpu.processes for gpu in after.gpus]}"


# --- cgroups ---

CONTAINER = "50a5c1cf18044cb8d373645fffdfb42bda8092320dac32b3fe6f4c0047b3f6d1"
OTHER = "882f7a9a344c51373c8dac7e799cdd13a2d4d304fee45713d192a54039f099c4"
POD = "b7d2cf1a-ba34-401f-a1d7-b50f6d4c7110"
POD_SYSTEMD = POD.replace("-", "_")

DOCKER_V1 = f"""\
12:hugetlb:/docker/{CONTAINER}
11:memory:/docker/{CONTAINER}
10:cpu,cpuacct:/docker/{CONTAINER}
9:devices:/docker/{CONTAINER}
4:pids:/docker/{CONTAINER}
1:name=systemd:/docker/{CONTAINER}
0::/system.slice/containerd.service
"""

KUBEPODS_V1_CGROUPFS = f"""\
12:memory:/kubepods/burstable/pod{POD}/{CONTAINER}
11:devices:/kubepods/burstable/pod{POD}/{CONTAINER}
1:name=systemd:/kubepods/burstable/pod{POD}/{CONTAINER}
"""

KUBEPODS_V1_SYSTEMD_CONTAINERD = f"""\
11:memory:/system.slice/containerd.service/kubepods-burstable-pod{POD_SYSTEMD}.slice:cri-containerd:{CONTAINER}
1:name=systemd:/system.slice/containerd.service/kubepods-burstable-pod{POD_SYSTEMD}.slice:cri-containerd:{CONTAINER}
"""


@pytest.mark.parametrize(
    ("text", "container"),
    [
        pytest.param(DOCKER_V1, CONTAINER, id="docker-v1"),
        pytest.param(f"0::/system.slice/docker-{CONTAINER}.scope\n", CONTAINER, id="docker-v2-systemd"),
        pytest.param(f"0::/docker/{CONTAINER}\n", CONTAINER, id="docker-v2-cgroupfs"),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SYSTEMD}.slice/"
            f"cri-containerd-{CONTAINER}.scope\n",
            CONTAINER,
            id="kubepods-v2-containerd",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SYSTEMD}.slice/"
            f"crio-{CONTAINER}.scope\n",
            CONTAINER,
            id="kubepods-v2-crio",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/cri-containerd-{CONTAINER}.scope\n",
            CONTAINER,
            id="kubepods-v2-guaranteed",
        ),
        pytest.param(KUBEPODS_V1_CGROUPFS, CONTAINER, id="kubepods-v1-cgroupfs"),
        pytest.param(KUBEPODS_V1_SYSTEMD_CONTAINERD, CONTAINER, id="kubepods-v1-systemd-containerd"),
        pytest.param(
            f"0::/kubepods/besteffort/pod8ac1b0d784ab7ceb152fb4052cdbfb9b/{CONTAINER}\n",
            CONTAINER,
            id="kubepods-static-pod",
        ),
        pytest.param(
            f"0::/../../kubepods-burstable-pod{POD_SYSTEMD}.slice/cri-containerd-{CONTAINER}.scope\n",
            CONTAINER,
            id="seen-from-another-cgroup-namespace",
        ),
        pytest.param(f"0::/machine.slice/libpod-{CONTAINER}.scope/container\n", CONTAINER, id="podman"),
        pytest.param(
            f"0::/system.slice/docker-{OTHER}.scope/kubepods/besteffort/pod{POD}/{CONTAINER}\n",
            CONTAINER,
            id="kind-node-nested-in-docker",
        ),
    ],
)
def test_cgroup_names_the_container(text: str, container: str) -> None:
    assert container_id_from_cgroup(text) == container


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", id="host-session"),
        pytest.param("0::/\n", id="own-cgroup-namespace"),
        pytest.param("4:memory:/process_api/40a8edae9e55ae83fc87a326ae3ea1bd\n0::/\n", id="sandbox-32-hex"),
        pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/crio-conmon-{CONTAINER}.scope\n", id="conmon"),
        pytest.param("", id="empty"),
    ],
)
def test_cgroup_outside_a_container_names_none(text: str) -> None:
    assert container_id_from_cgroup(text) is None


@given(st.text())
def test_cgroup_parsers_never_raise_and_return_only_well_formed_ids(text: str) -> None:
    container = container_id_from_cgroup(text)
    assert container is None or (len(container) == 64 and set(container) <= set("0123456789abcdef"))


def test_read_cgroup_reads_the_file_under_the_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(DOCKER_V1)

    assert read_cgroup(4242, proc_root=tmp_path) == DOCKER_V1
    assert read_cgroup(4343, proc_root=tmp_path) is None


def test_read_cgroup_reads_this_process_from_the_real_proc() -> None:
    text = read_cgroup(os.getpid())
    assert text is not None and "::" in text
