"""Which engine target each GPU process belongs to, read from /proc.

NVML names the processes that hold GPU memory; a target is a URL. What joins them is the listening socket the URL
reaches. A GPU process belongs to a target when it, or its nearest ancestor holding such a socket, listens for that
target: vLLM's API server forks the EngineCore and the workers that hold the memory, SGLang's launcher its
schedulers. A process whose chain holds no such socket (Ray workers started by a separate raylet, MPI ranks under
mpirun) belongs to the target whose listener runs in the same container (cgroup), when exactly one does. Anything
else, or a process two targets claim, is unattributed: "".

A listening socket reaches a target when the ports match and the URL's address is bound there: the socket's own
address, or, for a wildcard bind, an address of the socket's network namespace (`net/fib_trie`, `net/if_inet6`);
loopback reaches only the daemon's own namespace. The tables are read per namespace through `/proc/<pid>/net`, so
an engine in a pod's namespace is found by a DaemonSet that shares only the host's PID namespace. Host names other
than `localhost` are not resolved (a DNS lookup would stall the poll); a target named by one is left to the
collector's fallback. NVML reports host PIDs, so the daemon needs the host's PID namespace to read them at all.

Cost: `Attributor.attribute` runs once per poll. A GPU process is examined when first seen: its parent chain
(`stat`), nearest first up to the first listener; the TCP tables of a namespace once per pass, and only when a
process in it holds a socket (~2 ms a table however few sockets: the kernel walks its whole connection hash); the
fds of chain members where those tables list a listener; and, only for a process in a container its chain does
not explain, one scan of every process's fds per new listening socket (45 ms for 370 processes and 7,000 fds on
the build machine). The answer is kept until the PID exits or is reused (its start time changes) or the targets
change; an unattributed process is re-examined every `retry_seconds`. A steady poll reads one `stat` per GPU
process. `bench/attribution_bench.py` measures each.

Every read tolerates a process that vanished or is not ours to read (no CAP_SYS_PTRACE): the fact is missing,
never an exception.
"""

import contextlib
import functools
import ipaddress
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from urllib.parse import urlsplit

from exporter.config import Target
from exporter.sources.nvml import NvmlSnapshot, container_id_from_cgroup, read_cgroup

IPAddress = IPv4Address | IPv6Address

PROC = Path("/proc")
_LISTEN = "0A"  # TCP_LISTEN in the `st` column of net/tcp
_MAX_DEPTH = 64  # deeper than any real process tree; stops a walk that PID reuse turned into a loop
# Listening sockets whose holders a full scan found, kept across polls (a socket's inode is not reused while it
# lives); past this many, only those of the current pass stay.
_MAX_HOLDERS = 4096
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK: frozenset[IPAddress] = frozenset({IPv4Address("127.0.0.1"), IPv6Address("::1")})


@dataclass(frozen=True)
class Listener:
    inode: int
    address: IPAddress
    port: int


def read_listeners(net: Path) -> tuple[Listener, ...]:
    """TCP sockets in LISTEN state in `net`: `/proc/<pid>/net`, the tables of that process's network namespace."""
    found: list[Listener] = []
    for name in ("tcp", "tcp6"):
        try:
            text = (net / name).read_text()
        except OSError:
            continue
        found.extend(_parse_tcp(text))
    return tuple(found)


def _parse_tcp(text: str) -> Iterator[Listener]:
    # "  sl  local_address rem_address   st ... uid  timeout inode", then
    # "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000  0 48213 1 ..."
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        address, _, port = fields[1].partition(":")
        try:
            yield Listener(inode=int(fields[9]), address=_hex_address(address), port=int(port, 16))
        except ValueError:
            continue


def _hex_address(text: str) -> IPAddress:
    """net/tcp's address: the network-order bytes printed as 32-bit words in the host's byte order."""
    if len(text) not in (8, 32):
        raise ValueError(f"not a net/tcp address: {text!r}")
    words = [int(text[i : i + 8], 16) for i in range(0, len(text), 8)]
    return _plain(ipaddress.ip_address(struct.pack(f"={len(words)}I", *words)))


def _plain(address: IPAddress) -> IPAddress:
    """::ffff:a.b.c.d as a.b.c.d: how a dual-stack socket shows an IPv4 address."""
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def read_local_addresses(net: Path) -> frozenset[IPAddress]:
    """The addresses of a network namespace: `/32 host LOCAL` entries of net/fib_trie, and net/if_inet6."""
    found: set[IPAddress] = set()
    try:
        trie = (net / "fib_trie").read_text()
    except OSError:
        trie = ""
    last = ""
    for line in trie.splitlines():
        entry = line.strip()
        if entry.startswith("|-- "):
            last = entry[4:]
        elif entry.startswith("/32 host LOCAL"):
            with contextlib.suppress(ValueError):
                found.add(IPv4Address(last))
    try:
        inet6 = (net / "if_inet6").read_text()
    except OSError:
        inet6 = ""
    for line in inet6.splitlines():
        fields = line.split()
        try:
            found.add(IPv6Address(bytes.fromhex(fields[0])))
        except (IndexError, ValueError):
            continue
    return frozenset(found)


def socket_inodes(pid: int, proc_root: Path = PROC) -> frozenset[int]:
    """Inodes of the sockets process `pid` holds (`fd/*` links `socket:[inode]`); empty when gone or not ours."""
    found: set[int] = set()
    try:
        with os.scandir(f"{proc_root}/{pid}/fd") as entries:
            for entry in entries:
                try:
                    link = os.readlink(entry.path)
                except OSError:
                    continue
                if link.startswith("socket:[") and link.endswith("]"):
                    try:
                        found.add(int(link[8:-1]))
                    except ValueError:
                        continue
    except OSError:
        pass
    return frozenset(found)


def socket_holders(inodes: Collection[int], proc_root: Path = PROC) -> dict[int, frozenset[int]]:
    """The PIDs holding each of `inodes`, from every process's fds: the expensive read (one readlink per fd)."""
    wanted = set(inodes)
    if not wanted:
        return {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return {}
    holders: dict[int, set[int]] = {}
    for name in names:
        if name.isdigit():
            for inode in socket_inodes(int(name), proc_root) & wanted:
                holders.setdefault(inode, set()).add(int(name))
    return {inode: frozenset(pids) for inode, pids in holders.items()}


def listening_pids(port: int, proc_root: Path = PROC) -> set[int]:
    """PIDs holding a socket that listens on TCP `port` in the daemon's own network namespace."""
    inodes = {listener.inode for listener in read_listeners(proc_root / "net") if listener.port == port}
    return {pid for pids in socket_holders(inodes, proc_root).values() for pid in pids}


def _read_stat(pid: int, proc_root: Path) -> tuple[int, int] | None:
    """(parent PID, start time in clock ticks) from /proc/<pid>/stat. The command name, field 2, is in parentheses
    and may itself hold spaces and parentheses ("(vllm (engine) core)"): the fields after it follow the last ')'."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    end = text.rfind(")")
    fields = text[end + 2 :].split() if end >= 0 else []
    try:
        return int(fields[1]), int(fields[19])  # field 4 (ppid) and field 22 (starttime)
    except (IndexError, ValueError):
        return None


def _walk(pid: int, stat: Callable[[int], tuple[int, int] | None]) -> Iterator[int]:
    """`pid`, then its parent, grandparent... up to the root of the PID namespace; lazily, nearest first."""
    seen: set[int] = set()
    while pid > 0 and pid not in seen and len(seen) < _MAX_DEPTH:
        yield pid
        seen.add(pid)
        read = stat(pid)
        if read is None:
            return
        pid = read[0]


def attribute_processes(
    gpu_pids: Iterable[int],
    listeners: Mapping[str, Collection[int]],
    chains: Mapping[int, Sequence[int]],
    containers: Mapping[int, str | None],
) -> dict[int, str]:
    """{GPU PID: target name, or "" when unattributed}: the rule, with no I/O.

    `listeners`: target name -> PIDs holding its listening socket. `chains`: GPU PID -> the PID and its ancestors,
    nearest first. `containers`: PID -> container ID (None outside a container). The nearest process in the chain
    that listens for any target decides; a chain with no listener falls back to the target whose listener shares
    the GPU process's container. Either way, more than one candidate target means none.
    """
    serving: dict[int, set[str]] = {}
    for name, pids in listeners.items():
        for pid in pids:
            serving.setdefault(pid, set()).add(name)
    in_container: dict[str, set[str]] = {}
    for pid, names in serving.items():
        container = containers.get(pid)
        if container:
            in_container.setdefault(container, set()).update(names)
    result: dict[int, str] = {}
    for pid in gpu_pids:
        found = next((serving[p] for p in chains.get(pid, (pid,)) if p in serving), None)
        if found is not None:
            names = found
        else:
            container = containers.get(pid)
            names = in_container.get(container, set()) if container else set()
        result[pid] = next(iter(names)) if len(names) == 1 else ""
    return result


@dataclass(frozen=True)
class _Endpoint:
    name: str
    addresses: frozenset[IPAddress]
    port: int


def _endpoint(target: Target) -> _Endpoint | None:
    """The addresses and port a target's URL connects to; None for a host name other than localhost."""
    try:
        url = urlsplit(target.url)
        port = url.port or _DEFAULT_PORTS.get(url.scheme)
        host = url.hostname
        if host is None or port is None:
            return None
        addresses = _LOOPBACK if host == "localhost" else frozenset({_plain(ipaddress.ip_address(host))})
    except ValueError:
        return None
    return _Endpoint(target.name, addresses, port)


def _reaches(listener: Listener, endpoint: _Endpoint, own: bool, local: Callable[[], frozenset[IPAddress]]) -> bool:
    """Whether connecting to `endpoint` from the daemon lands on `listener` (`own`: it is in the daemon's network
    namespace; `local`: its namespace's addresses, read only when a wildcard bind needs them)."""
    if listener.port != endpoint.port:
        return False
    bound = listener.address
    for address in endpoint.addresses:
        # A wildcard bind accepts its own family; an IPv6 one IPv4 too (dual stack, unless IPV6_V6ONLY).
        wildcard = bound.is_unspecified and bound.version in (address.version, 6)
        if address.is_loopback:
            if own and (bound == address or wildcard):
                return True
        elif bound == address or (wildcard and address in local()):
            return True
    return False


class _Pass:
    """What one attribution pass has read from /proc, each fact read at most once."""

    def __init__(self, proc_root: Path, endpoints: Sequence[_Endpoint]):
        self._proc = proc_root
        self._endpoints = endpoints
        self._stats: dict[int, tuple[int, int] | None] = {}
        self._namespaces: dict[int, str | None] = {}
        self._served: dict[str, dict[int, frozenset[str]]] = {}  # namespace -> listening inode -> targets
        self._containers: dict[int, str | None] = {}
        self._own = self._readlink("self/ns/net")

    def _readlink(self, path: str) -> str | None:
        try:
            return os.readlink(f"{self._proc}/{path}")
        except OSError:
            return None

    def stat(self, pid: int) -> tuple[int, int] | None:
        if pid not in self._stats:
            self._stats[pid] = _read_stat(pid, self._proc)
        return self._stats[pid]

    def chain(self, pid: int) -> Iterator[int]:
        return _walk(pid, self.stat)

    def listening_for(self, pid: int) -> frozenset[str]:
        """The targets whose listening socket `pid` holds. Reading a namespace's TCP tables costs ~2 ms each however
        few sockets it has (the kernel walks the whole connection hash), its fds ~1 us each: the tables are read
        once per pass and only for a process that holds sockets, its fds only where the tables list a listener."""
        namespace = self._namespace(pid)
        if namespace is None or self._served.get(namespace) == {}:
            return frozenset()
        inodes = socket_inodes(pid, self._proc)
        if not inodes:
            return frozenset()
        served = self._serving(namespace, pid)
        return frozenset(name for inode in inodes & served.keys() for name in served[inode])

    def served(self, pids: Iterable[int]) -> dict[int, frozenset[str]]:
        """Listening inode -> targets, in the namespaces of `pids` and every other namespace this pass has read."""
        for pid in pids:
            namespace = self._namespace(pid)
            if namespace is not None:
                self._serving(namespace, pid)
        return {inode: names for served in self._served.values() for inode, names in served.items()}

    def _namespace(self, pid: int) -> str | None:
        if pid not in self._namespaces:
            self._namespaces[pid] = self._readlink(f"{pid}/ns/net")
        return self._namespaces[pid]

    def _serving(self, namespace: str, pid: int) -> dict[int, frozenset[str]]:
        """The namespace's listening inodes that targets reach, read through a process in it."""
        if namespace not in self._served:
            net = self._proc / str(pid) / "net"
            own = namespace == self._own
            local = functools.cache(lambda: read_local_addresses(net))
            serving = {}
            for listener in read_listeners(net):
                names = frozenset(e.name for e in self._endpoints if _reaches(listener, e, own, local))
                if names:
                    serving[listener.inode] = names
            self._served[namespace] = serving
        return self._served[namespace]

    def container(self, pid: int) -> str | None:
        if pid not in self._containers:
            text = read_cgroup(pid, self._proc)
            self._containers[pid] = container_id_from_cgroup(text) if text else None
        return self._containers[pid]


@dataclass(frozen=True)
class _Known:
    start: int  # the process's start time: a reused PID is a new process
    target: str
    until: float  # when to examine it again: never once attributed


class Attributor:
    """GPU PID -> target, once per poll (`attribute`), keeping what earlier polls found. `proc_root` is injectable
    for tests (a fake tree needs `self/ns/net` for loopback targets). A call that starts while another is still
    running (a poll thread stuck behind a hung NVML read) attributes nothing rather than share the caches."""

    def __init__(
        self,
        proc_root: Path = PROC,
        *,
        retry_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._proc = proc_root
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._targets: tuple[tuple[str, str], ...] = ()
        self._known: dict[int, _Known] = {}
        self._holders: dict[int, frozenset[int]] = {}  # listening inode -> PIDs holding it, from full fd scans
        self._lock = threading.Lock()

    def attribute(self, nvml: NvmlSnapshot | None, targets: Sequence[Target]) -> dict[int, str]:
        """{PID: target name or ""} for every process on the snapshot's GPUs; {} with no processes or targets."""
        if nvml is None or not nvml.up or not targets or not self._lock.acquire(blocking=False):
            return {}
        try:
            return self._attribute(nvml, targets)
        finally:
            self._lock.release()

    def _attribute(self, nvml: NvmlSnapshot, targets: Sequence[Target]) -> dict[int, str]:
        pids = {process.pid for gpu in nvml.gpus for process in gpu.processes}
        key = tuple((t.name, t.url) for t in targets)
        if key != self._targets:
            self._targets, self._known = key, {}
        self._known = {pid: known for pid, known in self._known.items() if pid in pids}
        now = self._clock()
        facts = _Pass(self._proc, [e for e in map(_endpoint, targets) if e is not None])
        pending: dict[int, int] = {}  # PID -> start time
        for pid in sorted(pids):
            stat = facts.stat(pid)
            known = self._known.get(pid)
            if stat is None:
                self._known.pop(pid, None)  # gone, or in a PID namespace we do not see
            elif known is None or known.start != stat[1] or now >= known.until:
                pending[pid] = stat[1]
        if pending:
            self._examine(pending, facts, now)
        return {pid: self._known[pid].target if pid in self._known else "" for pid in pids}

    def _examine(self, pending: Mapping[int, int], facts: _Pass, now: float) -> None:
        chains: dict[int, tuple[int, ...]] = {}
        listeners: dict[str, set[int]] = {}
        unexplained = []
        for pid in pending:
            chain = []
            for member in facts.chain(pid):
                chain.append(member)
                names = facts.listening_for(member)
                for name in names:
                    listeners.setdefault(name, set()).add(member)
                if names:
                    break
            else:
                unexplained.append(pid)
            chains[pid] = tuple(chain)
        containers: dict[int, str | None] = {pid: facts.container(pid) for pid in unexplained}
        if any(containers.values()):
            served = facts.served(pid for pid in unexplained if containers[pid])
            unseen = served.keys() - self._holders.keys()
            if unseen:
                found = socket_holders(unseen, self._proc)
                self._holders.update({inode: found.get(inode, frozenset()) for inode in unseen})
            if len(self._holders) > _MAX_HOLDERS:
                self._holders = {inode: self._holders[inode] for inode in served}
            for inode, names in served.items():
                for name in names:
                    listeners.setdefault(name, set()).update(self._holders[inode])
            containers.update({pid: facts.container(pid) for pids in listeners.values() for pid in pids})
        for pid, target in attribute_processes(pending, listeners, chains, containers).items():
            self._known[pid] = _Known(pending[pid], target, math.inf if target else now + self._retry_seconds)
