"""`plimsoll status` as a user runs it: a subprocess, wide enough for every column, with only the environment the
test gives it (a PLIMSOLL_STATUS_PASSWORD in the test runner's own environment must not log it in)."""

import subprocess
import sys

COMMAND_TIMEOUT_SECONDS = 30


def run_status(*args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "250"}
    if password is not None:
        env["PLIMSOLL_STATUS_PASSWORD"] = password
    return subprocess.run(
        [sys.executable, "-m", "exporter", "status", *args],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        env=env,
    )
