"""GPU processes to targets: /proc parsing on a fake tree in real file formats, the attribution rule, and the real
/proc of this machine."""

import os
import shutil
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.config import Target
from exporter.sources.nvml import GpuProcess, GpuReading, NvmlSnapshot
from exporter.sources.processes import (
    Attributor,
    _Pass,
    attribute_processes,
    listening_pids,
    read_listeners,
    read_local_addresses,
)

HOST = "net:[4026531840]"  # the daemon's own network namespace in every fake tree
POD_A = "net:[4026533001]"
POD_B = "net:[4026533002]"
CONTAINER_A = "4c01db0b339c0e4e18ac5b5d0d2c4d31c9ba3d35b5d6a2c2e8a1f3f4b5c6d7e8"
CONTAINER_B = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"
HOST_CGROUP = "0::/system.slice/vllm.service\n"

# Lines as the kernel writes them (x86, little-endian words): 0100007F:1F40 is 127.0.0.1:8000.
TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
TCP6_HEADER = (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr "
    "tm->when retrnsmt   uid  timeout inode\n"
)
V4_ANY, V4_LOOPBACK = "00000000", "0100007F"
V6_ANY, V6_LOOPBACK = "0" * 32, "00000000000000000000000001000000"
V6_MAPPED_LOOPBACK = "0000000000000000FFFF00000100007F"  # ::ffff:127.0.0.1

FIB_TRIE = """\
Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- {net}.0/24 2 0 2
        +-- {net}.0/30 2 0 2
           |-- {net}.0
              /24 link UNICAST
           |-- {address}
              /32 host LOCAL
        |-- {net}.255
           /32 link BROADCAST
"""
IF_INET6 = (
    "00000000000000000000000000000001 01 80 10 80       lo\nfe8000000000000000fc00fffe000001 04 40 20 80     eth0\n"
)


def tcp_line(slot: int, local: str, port: int, inode: int, state: str = "0A", remote: str = "00000000:0000") -> str:
    return (
        f"{slot:4d}: {local}:{port:04X} {remote} {state} 00000000:00000000 00:00000000 00000000  1000        0 "
        f"{inode} 1 0000000000000000 100 0 0 10 0\n"
    )


def tcp6_line(slot: int, local: str, port: int, inode: int) -> str:
    return (
        f"{slot:4d}: {local}:{port:04X} {'0' * 32}:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 "
        f"{inode} 1 0000000000000000 100 0 0 10 0\n"
    )


def stat_line(pid: int, comm: str, ppid: int, start: int) -> str:
    # /proc/<pid>/stat as this machine writes it, starttime being field 22.
    return (
        f"{pid} ({comm}) S {ppid} {pid} {ppid} 0 -1 4194560 1520 0 0 0 31 7 0 0 20 0 12 0 {start} 3133440 411 "
        "18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 3 0 0 0 0 0\n"
    )


def fib_trie(address: str) -> str:
    return FIB_TRIE.format(net=address.rsplit(".", 1)[0], address=address)


class FakeProc:
    """A /proc tree: per-process stat, fd links, ns/net and cgroup, and net/ linked to its namespace's tables (as
    /proc/net links to self/net)."""

    def __init__(self, root: Path):
        self.root = root
        (root / "self" / "ns").mkdir(parents=True)
        (root / "self" / "ns" / "net").symlink_to(HOST)
        self.namespace(HOST, address="192.0.2.2")
        (root / "net").symlink_to(self._tables(HOST))

    def _tables(self, netns: str) -> Path:
        return self.root / "netns" / netns.strip("net:[]")

    def namespace(self, name: str, tcp: Iterable[str] = (), tcp6: Iterable[str] = (), address: str = "") -> None:
        tables = self._tables(name)
        tables.mkdir(parents=True, exist_ok=True)
        (tables / "tcp").write_text(TCP_HEADER + "".join(tcp))
        (tables / "tcp6").write_text(TCP6_HEADER + "".join(tcp6))
        (tables / "fib_trie").write_text(fib_trie(address) if address else "")
        (tables / "if_inet6").write_text(IF_INET6)

    def process(
        self,
        pid: int,
        ppid: int,
        comm: str = "python3",
        *,
        sockets: Iterable[int] = (),
        netns: str = HOST,
        cgroup: str = HOST_CGROUP,
        start: int = 344941,
    ) -> None:
        base = self.root / str(pid)
        if base.exists():
            shutil.rmtree(base)
        (base / "fd").mkdir(parents=True)
        (base / "ns").mkdir()
        (base / "stat").write_text(stat_line(pid, comm, ppid, start))
        (base / "cgroup").write_text(cgroup)
        (base / "ns" / "net").symlink_to(netns)
        (base / "net").symlink_to(self._tables(netns))
        (base / "fd" / "0").symlink_to("/dev/null")
        (base / "fd" / "1").symlink_to("pipe:[77001]")
        (base / "fd" / "2").symlink_to("anon_inode:[eventfd]")
        for fd, inode in enumerate(sockets, start=3):
            (base / "fd" / str(fd)).symlink_to(f"socket:[{inode}]")

    def set_start(self, pid: int, start: int) -> None:
        stat = self.root / str(pid) / "stat"
        fields = stat.read_text().split(") ", 1)
        rest = fields[1].split()
        rest[19] = str(start)
        stat.write_text(f"{fields[0]}) {' '.join(rest)}\n")


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def nvml(*pids: int) -> NvmlSnapshot:
    """One GPU per process, in order: GPU 0 holds pids[0], and so on."""
    gpus = tuple(
        GpuReading(str(i), f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80 << 30, 70 << 30, 0, 10 << 30, (GpuProcess(pid, 1),))
        for i, pid in enumerate(pids)
    )
    return NvmlSnapshot(up=True, driver_version="580.95.05", gpus=gpus, error=None)


def vllm_tree(proc: FakeProc, api: int = 100, port: int = 8000, inode: int = 5001, **kw) -> tuple[int, int]:
    """`vllm serve` as v1 runs it: the API server listens, forks EngineCore, which forks the TP workers that hold
    the GPU memory. Returns the two workers' PIDs."""
    proc.process(api, 1, "vllm", sockets=[inode, inode + 1], **kw)
    proc.process(api + 1, api, "VLLM::EngineCor", **kw)
    proc.process(api + 2, api + 1, "VLLM::Worker_TP", **kw)
    proc.process(api + 3, api + 1, "VLLM::Worker_TP", **kw)
    return api + 2, api + 3


# --- reading /proc ---


def test_listening_pids_are_the_holders_of_listen_sockets_on_the_port(proc: FakeProc) -> None:
    proc.namespace(
        HOST,
        tcp=[
            tcp_line(0, V4_ANY, 8000, 5001),
            tcp_line(1, V4_LOOPBACK, 8000, 5002, state="01", remote="0100007F:D2F0"),  # a client's connection
            tcp_line(2, V4_LOOPBACK, 9000, 5003),
        ],
        tcp6=[tcp6_line(0, V6_ANY, 8000, 5004)],
    )
    proc.process(100, 1, sockets=[5001])
    proc.process(101, 100, sockets=[5001])  # a forked worker inherits the listening socket
    proc.process(102, 1, sockets=[5002])
    proc.process(103, 1, sockets=[5003])
    proc.process(104, 1, sockets=[5004])

    assert listening_pids(8000, proc.root) == {100, 101, 104}
    assert listening_pids(9000, proc.root) == {103}
    assert listening_pids(8001, proc.root) == set()


def test_listening_pids_skip_what_cannot_be_read(proc: FakeProc) -> None:
    proc.namespace(
        HOST,
        tcp=[
            tcp_line(0, V4_ANY, 8000, 5001),
            "garbage\n",
            tcp_line(9, V4_LOOPBACK, 8000, 77).replace(":1F40", ":XYZ0"),
        ],
    )
    proc.process(100, 1, sockets=[5001])
    (proc.root / "200").mkdir()  # a process that exited between the listing and the read: no fd/
    (proc.root / "300" / "fd").mkdir(parents=True)
    (proc.root / "300" / "fd" / "3").write_text("not a link")
    (proc.root / "400" / "fd").mkdir(parents=True)
    (proc.root / "400" / "fd" / "3").symlink_to("socket:[not-a-number]")
    (proc.root / "sys").mkdir()

    assert listening_pids(8000, proc.root) == {100}
    assert listening_pids(8000, proc.root / "missing") == set()


def test_listeners_read_ipv4_ipv6_and_dual_stack_addresses(proc: FakeProc) -> None:
    proc.namespace(
        HOST,
        tcp=[tcp_line(0, V4_LOOPBACK, 8000, 1)],
        tcp6=[
            tcp6_line(0, V6_LOOPBACK, 30000, 2),
            tcp6_line(1, V6_MAPPED_LOOPBACK, 8080, 3),
            tcp6_line(2, V6_ANY, 80, 4),
        ],
    )
    found = {(str(x.address), x.port, x.inode) for x in read_listeners(proc.root / "net")}
    assert found == {("127.0.0.1", 8000, 1), ("::1", 30000, 2), ("127.0.0.1", 8080, 3), ("::", 80, 4)}


def test_local_addresses_come_from_fib_trie_and_if_inet6(proc: FakeProc) -> None:
    addresses = {str(a) for a in read_local_addresses(proc.root / "net")}
    assert addresses == {"127.0.0.1", "192.0.2.2", "::1", "fe80::fc:ff:fe00:1"}  # not the broadcast or the /8


def ancestors(pid: int, root: Path) -> tuple[int, ...]:
    """The parent chain an attribution pass walks from `pid`, nearest first, without `pid` itself."""
    return tuple(_Pass(root, ()).chain(pid))[1:]


def test_ancestors_follow_field_4_past_command_names_with_spaces_and_parentheses(proc: FakeProc) -> None:
    proc.process(1, 0, "systemd")
    proc.process(100, 1, "vllm (engine) core")
    proc.process(101, 100, "a) R 7 (b")  # a name built to fool a split on the first ')'
    proc.process(102, 101, "VLLM::Worker_TP")

    assert ancestors(102, proc.root) == (101, 100, 1)
    assert ancestors(1, proc.root) == ()
    assert ancestors(999, proc.root) == ()


def test_ancestors_stop_where_a_parent_has_exited_or_pids_loop(proc: FakeProc) -> None:
    proc.process(200, 150, "orphaned")  # 150 is gone
    proc.process(300, 301)
    proc.process(301, 300)  # impossible in a live tree, possible when PIDs are reused mid-walk
    assert ancestors(200, proc.root) == (150,)
    assert ancestors(300, proc.root) == (301,)


@given(st.text())
def test_ancestors_never_raise_on_any_stat_content(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    root = tmp_path_factory.mktemp("proc")
    (root / "5").mkdir()
    (root / "5" / "stat").write_text(text)
    assert isinstance(ancestors(5, root), tuple)


# --- the rule ---


def test_the_nearest_listening_ancestor_decides() -> None:
    chains = {102: (102, 101, 100, 1), 202: (202, 200, 1)}
    listeners = {"llama": {100}, "mistral": {200}, "socket-activated": {1}}
    assert attribute_processes([102, 202], listeners, chains, {}) == {102: "llama", 202: "mistral"}


def test_a_process_without_a_listening_ancestor_takes_its_containers_target() -> None:
    chains = {310: (310, 305, 9), 410: (410, 9)}
    containers = {300: CONTAINER_A, 310: CONTAINER_A, 400: CONTAINER_B, 410: None}
    result = attribute_processes([310, 410], {"ray-llama": {300}, "other": {400}}, chains, containers)
    assert result == {310: "ray-llama", 410: ""}


def test_a_process_two_targets_claim_is_unattributed() -> None:
    chains = {102: (102, 100), 310: (310, 9)}
    containers = {310: CONTAINER_A, 300: CONTAINER_A, 301: CONTAINER_A}
    listeners = {"a": {100, 300}, "b": {100, 301}}  # one server behind two target names; two in one container
    assert attribute_processes([102, 310], listeners, chains, containers) == {102: "", 310: ""}


def test_a_process_with_nothing_known_is_unattributed() -> None:
    assert attribute_processes([7], {}, {}, {}) == {7: ""}


# --- the daemon's pass over a fake /proc ---


def test_vllm_workers_belong_to_the_target_their_api_server_listens_for(proc: FakeProc) -> None:
    proc.namespace(HOST, tcp=[tcp_line(0, V4_ANY, 8000, 5001), tcp_line(1, V4_LOOPBACK, 8001, 6001)])
    workers = vllm_tree(proc, api=100, port=8000, inode=5001)
    others = vllm_tree(proc, api=200, port=8001, inode=6001)
    proc.process(900, 1, "python3")  # a notebook on a GPU: no engine above it
    targets = [Target("llama", "http://localhost:8000/metrics"), Target("mistral", "http://127.0.0.1:8001/metrics")]

    result = Attributor(proc.root).attribute(nvml(*workers, *others, 900), targets)

    assert result == {workers[0]: "llama", workers[1]: "llama", others[0]: "mistral", others[1]: "mistral", 900: ""}


def test_a_target_on_this_hosts_address_reaches_a_wildcard_listener(proc: FakeProc) -> None:
    proc.namespace(HOST, tcp=[tcp_line(0, V4_ANY, 8000, 5001)], address="192.0.2.2")
    workers = vllm_tree(proc)
    targets = [Target("llama", "http://192.0.2.2:8000/metrics"), Target("elsewhere", "http://192.0.2.99:8000/metrics")]
    assert Attributor(proc.root).attribute(nvml(*workers), targets) == dict.fromkeys(workers, "llama")


def test_engines_in_pod_namespaces_on_the_same_port_are_told_apart_by_address(proc: FakeProc) -> None:
    proc.namespace(POD_A, tcp=[tcp_line(0, V4_ANY, 8000, 5001)], address="10.1.0.5")
    proc.namespace(POD_B, tcp=[tcp_line(0, V4_ANY, 8000, 6001)], address="10.1.0.6")
    a = vllm_tree(proc, api=100, inode=5001, netns=POD_A)
    b = vllm_tree(proc, api=200, inode=6001, netns=POD_B)
    targets = [
        Target("a", "http://10.1.0.5:8000/metrics"),
        Target("b", "http://10.1.0.6:8000/metrics"),
        Target("local", "http://127.0.0.1:8000/metrics"),  # loopback reaches only the daemon's own namespace
    ]
    result = Attributor(proc.root).attribute(nvml(*a, *b), targets)
    assert result == {a[0]: "a", a[1]: "a", b[0]: "b", b[1]: "b"}


def test_a_loopback_target_does_not_reach_a_listener_in_another_namespace(proc: FakeProc) -> None:
    proc.namespace(POD_A, tcp=[tcp_line(0, V4_LOOPBACK, 8000, 5001)], address="10.1.0.5")
    workers = vllm_tree(proc, netns=POD_A)
    targets = [Target("local", "http://127.0.0.1:8000/metrics"), Target("other", "http://127.0.0.1:9/metrics")]
    assert Attributor(proc.root).attribute(nvml(*workers), targets) == dict.fromkeys(workers, "")


def test_ray_workers_outside_the_servers_tree_belong_to_it_by_container(proc: FakeProc) -> None:
    proc.namespace(HOST, tcp=[tcp_line(0, V4_ANY, 8000, 5001)])
    in_a = f"0::/system.slice/docker-{CONTAINER_A}.scope\n"
    proc.process(300, 1, "vllm", sockets=[5001], cgroup=in_a)
    proc.process(305, 1, "raylet", cgroup=in_a)
    proc.process(310, 305, "ray::RayWorkerWrapper", cgroup=in_a)
    proc.process(410, 1, "python3", cgroup=f"0::/system.slice/docker-{CONTAINER_B}.scope\n")
    targets = [Target("llama", "http://127.0.0.1:8000/metrics"), Target("other", "http://127.0.0.1:9/metrics")]

    assert Attributor(proc.root).attribute(nvml(310, 410), targets) == {310: "llama", 410: ""}


def test_an_answer_is_kept_until_the_pid_is_reused(proc: FakeProc) -> None:
    proc.namespace(HOST, tcp=[tcp_line(0, V4_ANY, 8000, 5001)])
    workers = vllm_tree(proc)
    targets = [Target("llama", "http://127.0.0.1:8000/metrics"), Target("other", "http://127.0.0.1:9/metrics")]
    attributor = Attributor(proc.root)
    assert attributor.attribute(nvml(*workers), targets)[workers[0]] == "llama"

    proc.process(100, 1)  # the API server no longer holds the socket: only the cache still says llama
    assert attributor.attribute(nvml(*workers), targets)[workers[0]] == "llama"

    proc.set_start(workers[0], 999999)  # the PID now names another process, which nothing explains
    assert attributor.attribute(nvml(*workers), targets) == {workers[0]: "", workers[1]: "llama"}


def test_an_unattributed_process_is_examined_again_after_the_retry_interval(proc: FakeProc) -> None:
    now = [0.0]
    proc.process(100, 1, "vllm")  # still loading the model: no listening socket yet
    proc.process(101, 100, "VLLM::EngineCor")
    targets = [Target("llama", "http://127.0.0.1:8000/metrics"), Target("other", "http://127.0.0.1:9/metrics")]
    attributor = Attributor(proc.root, retry_seconds=30.0, clock=lambda: now[0])
    assert attributor.attribute(nvml(101), targets) == {101: ""}

    proc.namespace(HOST, tcp=[tcp_line(0, V4_ANY, 8000, 5001)])
    proc.process(100, 1, "vllm", sockets=[5001])
    now[0] = 29.0
    assert attributor.attribute(nvml(101), targets) == {101: ""}
    now[0] = 30.0
    assert attributor.attribute(nvml(101), targets) == {101: "llama"}


def test_new_targets_are_matched_at_once(proc: FakeProc) -> None:
    proc.namespace(HOST, tcp=[tcp_line(0, V4_ANY, 8000, 5001)])
    workers = vllm_tree(proc)
    attributor = Attributor(proc.root)
    before = [Target("other", "http://127.0.0.1:9/metrics")]
    after = [*before, Target("llama", "http://127.0.0.1:8000/metrics")]
    assert attributor.attribute(nvml(*workers), before) == dict.fromkeys(workers, "")
    assert attributor.attribute(nvml(*workers), after) == dict.fromkeys(workers, "llama")


def test_nothing_to_attribute_without_processes_targets_or_nvml(proc: FakeProc) -> None:
    targets = [Target("llama", "http://127.0.0.1:8000/metrics")]
    attributor = Attributor(proc.root)
    assert attributor.attribute(None, targets) == {}
    assert attributor.attribute(NvmlSnapshot(up=False, driver_version=None, gpus=(), error="x"), targets) == {}
    assert attributor.attribute(nvml(), targets) == {}
    assert attributor.attribute(nvml(100), []) == {}


def test_processes_not_in_our_pid_namespace_and_unparseable_urls_are_unattributed(proc: FakeProc) -> None:
    targets = [Target("named", "http://vllm.internal:8000/metrics"), Target("bad", "http://127.0.0.1:99999/")]
    proc.process(100, 1, "vllm")
    assert Attributor(proc.root).attribute(nvml(100, 4_000_000), targets) == {100: "", 4_000_000: ""}


# --- the real /proc ---


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_listening_pids_finds_this_process_in_the_real_proc(listening: int) -> None:
    assert os.getpid() in listening_pids(listening)


def test_this_process_is_attributed_to_the_target_it_listens_for(listening: int) -> None:
    targets = [Target("me", f"http://127.0.0.1:{listening}/metrics"), Target("other", "http://127.0.0.1:9/")]
    result = Attributor().attribute(nvml(os.getpid()), targets)
    assert result == {os.getpid(): "me"}


def test_ancestors_of_this_process_reach_its_parent() -> None:
    assert ancestors(os.getpid(), Path("/proc"))[0] == os.getppid()
