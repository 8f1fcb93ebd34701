"""`plimsoll status` against a real `plimsoll run` (tests/status/conftest.py), as a user runs it: a subprocess."""

import errno
import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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
    done = run_status("http://127.0.0.1:1", "--watch", "--interval", "99999999999h")  # time.sleep overflows
    assert done.returncode == 2 and "argument --interval: '99999999999h' is out of range" in done.stderr, done.stderr
    done = run_status("http://127.0.0.1:1", "--watch", "--format", "json")  # a script reads one document
    assert done.returncode == 2 and done.stderr.startswith("plimsoll status: --watch: refreshes the table"), done.stderr
    for url in ("http://127.0.0.1:1/?x=1", "http://127.0.0.1:1#top"):
        done = run_status(url)
        assert done.returncode == 2 and "holds a query or fragment: give the daemon's base URL alone" in done.stderr


def test_a_password_file_that_is_a_pipe_or_a_device_is_refused_unread(tmp_path: Path):
    """Reading a FIFO waits for a writer and /dev/zero never ends: neither is opened for a blocking read."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        done = run_status("http://127.0.0.1:1", "--basic-auth-user", "ops", "--password-file", path)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"--password-file {path}: cannot read it (not a regular file)" in done.stderr


def test_a_password_file_holding_a_line_break_within_is_refused_never_sent(tmp_path: Path):
    """A second line would end the Authorization header and start another: refused before any request."""
    secret = tmp_path / "password"
    secret.write_text("hunter2\nX-Injected: yes\n")
    done = run_status("http://127.0.0.1:1", "--basic-auth-user", "ops", "--password-file", str(secret))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "holds a line break or a control character" in done.stderr and "hunter2" not in done.stderr


def test_credentials_or_a_ca_file_that_cannot_be_used_are_one_line_naming_the_flag(tmp_path: Path):
    """Each is refused before any request (port 1 refuses: a request made would be exit 1, not 2). A CA file that
    is a pipe without a writer is read by Plimsoll, bounded, not by OpenSSL, which waited on it forever."""
    fifo, empty = tmp_path / "fifo", tmp_path / "empty"
    os.mkfifo(fifo)
    empty.write_text("\n")
    url, logging_in = "http://127.0.0.1:1", "http://ops:hunter2@127.0.0.1:1"
    for args, password, named in [
        ((url, "--ca-file", str(fifo)), None, f"--ca-file {fifo}: cannot read it (not a regular file)"),
        ((url, "--ca-file", str(empty)), None, f"--ca-file {empty}: holds no PEM certificate"),
        ((url, "--basic-auth-user", "ops:x"), "pw", "give a user name that is not empty, with no ':'"),
        ((url, "--basic-auth-user", "ops"), "", "--basic-auth-user: PLIMSOLL_STATUS_PASSWORD is empty"),
        ((url, "--basic-auth-user", "ops", "--password-file", str(empty)), None, f"{empty}: empty (no password"),
        ((logging_in, "--basic-auth-user", "ops"), "pw", "give the credentials once"),
    ]:
        done = run_status(*args, password=password)
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, (args, done.stderr)
        assert named in done.stderr and "hunter2" not in done.stderr, (args, done.stderr)


def test_a_scheme_in_capitals_is_a_url():
    done = run_status("HTTP://127.0.0.1:1")
    assert done.returncode == 1 and "cannot reach HTTP://127.0.0.1:1/api/v1/state" in done.stderr, done.stderr


class _Terminal:
    """What a command wrote to the pty it runs on, read from the controller side with a deadline."""

    def __init__(self, controller: int, process: subprocess.Popen[bytes]):
        self.controller = controller
        self.process = process
        self.seen = b""

    def _read(self, deadline: float, waiting_for: str) -> bool:
        """One read into `seen`; False once the output has ended. On Linux, reading the controller after the
        last holder of the terminal side closed it (the command exited) raises EIO instead of returning b""."""
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"--watch {waiting_for} within {COMMAND_TIMEOUT_SECONDS}s:\n{self.seen[-3000:]!r}"
        ready, _, _ = select.select([self.controller], [], [], remaining)
        if not ready:
            return True
        try:
            chunk = os.read(self.controller, 65536)
        except OSError as error:
            if error.errno != errno.EIO:
                raise
            chunk = b""
        self.seen += chunk
        return bool(chunk)

    def shows(self, text: bytes) -> bool:
        deadline = time.monotonic() + COMMAND_TIMEOUT_SECONDS
        while text not in self.seen:
            if not self._read(deadline, f"never showed {text!r}"):
                code = self.process.wait(timeout=COMMAND_TIMEOUT_SECONDS)
                raise AssertionError(f"--watch exited ({code}) before showing {text!r}:\n{self.seen[-3000:]!r}")
        return True

    def ends(self) -> int:
        """The exit status, once the output has ended: reading on, so that a command writing its last frame is
        never blocked by a full terminal."""
        deadline = time.monotonic() + COMMAND_TIMEOUT_SECONDS
        while self._read(deadline, "did not end"):
            pass
        return self.process.wait(timeout=COMMAND_TIMEOUT_SECONDS)


def test_watch_refreshes_in_place_until_ctrl_c(fleet: Fleet):
    """In a terminal (a pty here, as rich only redraws on one): the usage the engine reports next appears without
    restarting the command, and Ctrl-C ends it with exit 0."""
    fleet.set_usage(0.30)
    controller, terminal = pty.openpty()
    env = {**os.environ, "COLUMNS": "250", "LINES": "50", "TERM": "xterm"}
    # --timeout as long as the test waits: on a loaded machine the first read may be slow, and a first read that
    # fails ends the command (exit 1) before it watches anything.
    watch = ["--watch", "--interval", "500ms", "--timeout", f"{COMMAND_TIMEOUT_SECONDS}s"]
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "status", fleet.daemon.url, *watch],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
    )
    os.close(terminal)
    screen = _Terminal(controller, process)
    try:
        assert screen.shows(b"30%")
        fleet.set_usage(0.95)
        assert screen.shows(b"95%")
        process.send_signal(signal.SIGINT)
        assert screen.ends() == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)
