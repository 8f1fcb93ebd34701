"""Which target a GPU process belongs to (exporter.snapshot.process_owner), the one rule /metrics, /api/v1/state and
the status page all show."""

from exporter.config import Target
from exporter.daemon.snapshot import Snapshot, TargetState, process_owner


def _state(name: str, gpus: tuple[str, ...], configured: tuple[str, ...] | None) -> TargetState:
    target = Target(name, "http://127.0.0.1:9/metrics", gpus=configured)
    return TargetState(target, True, "vllm", None, {}, None, None, gpus=gpus)


def _snapshot(*states: TargetState, attributed: dict[int, str] | None = None) -> Snapshot:
    return Snapshot(taken_at=1.0, ready=True, nvml=None, targets=states, process_targets=attributed or {})


def test_an_attributed_pid_names_its_target_whatever_is_configured_on_the_gpu():
    snapshot = _snapshot(_state("a", ("0",), ("0",)), _state("b", ("0",), ("0",)), attributed={7: "b"})
    assert process_owner(snapshot, "0", 7) == "b"


def test_the_sole_target_owns_every_unattributed_process_on_its_gpus():
    snapshot = _snapshot(_state("only", ("0",), None), attributed={7: ""})
    assert process_owner(snapshot, "0", 7) == "only"
    assert process_owner(snapshot, "1", 8) is None  # not one of its GPUs


def test_two_targets_configured_on_one_gpu_leave_an_unattributed_process_to_neither():
    snapshot = _snapshot(_state("a", ("0",), ("0",)), _state("b", ("0",), ("GPU-0",)))
    assert process_owner(snapshot, "0", 7) is None
