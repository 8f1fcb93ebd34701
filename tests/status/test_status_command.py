"""`plimsoll status` against a real `plimsoll run` (tests/status/conftest.py), as a user runs it: a subprocess."""

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time

from tests.status.command import COMMAND_TIMEOUT_SECONDS, run_status
from tests.status.conftest import Fleet


def _line(stdout: str, target: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith(target + " ")]
    assert len(lines) == 1, f"one row for {target} in:\n{stdout}"
    return lines[0]


def test_the_table_has_the_pages_rows(fleet: Fleet):
    fleet.set_usage(0.85)
    done = run_status(fleet.daemon.url)
    assert done.returncode == 0, done.stderr
    tiny = _line(done.stdout, "vllm-tiny").split()
    assert tiny[:4] == ["vllm-tiny", "vllm", "tiny-llama", "85%"]
    assert "10 / 2" in " ".join(tiny), "running / waiting from the recorded page"
    assert "no model given" in _line(done.stdout, "sglang-no-model")
    assert "down (refused): connection refused" in _line(done.stdout, "refused")
    assert "threshold 90% KV usage" in done.stdout and "NVML down: NVML disabled" in done.stdout


def test_json_is_the_daemons_state_for_scripts(fleet: Fleet):
    fleet.set_usage(0.30)
    done = run_status(fleet.daemon.url, "--format", "json")
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)
    assert [t["target"] for t in state["targets"]] == ["vllm-tiny", "sglang-no-model", "refused"]
    tiny = state["targets"][0]["instances"][0]
    assert tiny["kv_cache_usage_ratio"] == 0.30 and tiny["kv_usage_history"][-1][1] == 0.30


def test_a_dead_url_is_one_line_and_exit_1():
    with socket.socket() as dead:  # bound, never listening: refused
        dead.bind(("127.0.0.1", 0))
        done = run_status(f"http://127.0.0.1:{dead.getsockname()[1]}")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("plimsoll status: cannot reach http://127.0.0.1:")
    assert "Connection refused" in done.stderr or "connection refused" in done.stderr


def test_a_server_that_is_not_plimsoll_is_one_line_and_exit_1(fleet: Fleet):
    done = run_status(fleet.pages)  # the engines' server: /api/v1/state is a 404 there
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "not a Plimsoll daemon's state" in done.stderr


def test_a_bad_url_or_a_user_without_password_is_exit_2():
    assert run_status("localhost:19842").returncode == 2
    done = run_status("http://127.0.0.1:1", "--basic-auth-user", "ops")
    assert done.returncode == 2 and "PLIMSOLL_STATUS_PASSWORD" in done.stderr


def test_watch_refreshes_in_place_until_ctrl_c(fleet: Fleet):
    """In a terminal (a pty here, as rich only redraws on one): the usage the engine reports next appears without
    restarting the command, and Ctrl-C ends it with exit 0."""
    fleet.set_usage(0.30)
    controller, terminal = pty.openpty()
    env = {**os.environ, "COLUMNS": "250", "LINES": "50", "TERM": "xterm"}
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "status", fleet.daemon.url, "--watch", "--interval", "500ms"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
    )
    os.close(terminal)
    seen = b""
    try:

        def shows(text: bytes) -> bool:
            nonlocal seen
            deadline = time.monotonic() + COMMAND_TIMEOUT_SECONDS
            while text not in seen:
                assert time.monotonic() < deadline, f"--watch never showed {text!r}:\n{seen[-3000:]!r}"
                ready, _, _ = select.select([controller], [], [], 0.5)
                if ready:
                    seen += os.read(controller, 65536)
            return True

        assert shows(b"30%")
        fleet.set_usage(0.95)
        assert shows(b"95%")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=COMMAND_TIMEOUT_SECONDS) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)
