"""`plimsoll status` against a daemon behind `--web-config` (TLS and basic auth, certificates made here by trustme):
the CA file and the password from the environment, a file or the URL get the rows; a wrong password or an untrusted
certificate is one line and exit 1; a password in the URL is printed masked."""

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import bcrypt
import pytest
import trustme
import yaml

from tests.status.command import run_status
from tests.status.engine import SettableEngine
from tests.support.daemon_process import app_in_thread
from tests.support.prometheus import LOOPBACK, free_port, stop_process, wait_until

USER = "ops"
PASSWORD = "correct horse battery staple"
START_TIMEOUT_SECONDS = 20.0


@contextlib.contextmanager
def _secured_daemon(workdir: Path, ca: trustme.CA) -> Iterator[str]:
    ca.issue_cert(LOOPBACK).private_key_and_cert_chain_pem.write_to_path(str(workdir / "server.pem"))
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web_config = workdir / "web.yml"
    web_config.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": "server.pem", "key_file": "server.pem"},
                "basic_auth_users": {USER: hashed},
            }
        )
    )
    engine = SettableEngine(0.42)
    with app_in_thread(engine.app()) as pages:
        address = f"{LOOPBACK}:{free_port()}"
        argv = [sys.executable, "-m", "exporter", "run", "--listen", address, "--nvml", "off"]
        argv += ["--target", f"{pages}/vllm/metrics", "--poll-interval", "500ms", "--web-config", str(web_config)]
        log_path = workdir / "plimsoll.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            ca.cert_pem.write_to_path(str(workdir / "ca.pem"))

            def answering() -> bool | None:
                if process.poll() is not None:
                    raise AssertionError(f"plimsoll exited:\n{log_path.read_text()[-3000:]}")
                ca_file = str(workdir / "ca.pem")
                done = run_status(
                    f"https://{address}", "--ca-file", ca_file, "--basic-auth-user", USER, password=PASSWORD
                )
                return "42%" in done.stdout or None

            wait_until(answering, START_TIMEOUT_SECONDS, f"plimsoll status reading the TLS daemon on {address}")
            yield f"https://{address}"
        finally:
            stop_process(process)


@pytest.fixture(scope="module")
def secured(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    workdir = tmp_path_factory.mktemp("secured")
    with _secured_daemon(workdir, trustme.CA()) as url:
        yield url, workdir


def test_the_ca_file_and_the_password_from_the_environment_get_the_rows(secured):
    url, workdir = secured
    done = run_status(url, "--ca-file", str(workdir / "ca.pem"), "--basic-auth-user", USER, password=PASSWORD)
    assert done.returncode == 0, done.stderr
    assert "42%" in done.stdout


def test_the_password_from_a_file_gets_the_rows(secured):
    url, workdir = secured
    (workdir / "password").write_text(PASSWORD + "\n")
    args = [
        "--ca-file",
        str(workdir / "ca.pem"),
        "--basic-auth-user",
        USER,
        "--password-file",
        str(workdir / "password"),
    ]
    done = run_status(url, *args)
    assert done.returncode == 0, done.stderr
    assert "42%" in done.stdout


def test_a_wrong_password_is_one_line_and_exit_1(secured):
    url, workdir = secured
    done = run_status(url, "--ca-file", str(workdir / "ca.pem"), "--basic-auth-user", USER, password="not it")
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "401 Unauthorized" in done.stderr and PASSWORD not in done.stderr


def test_a_certificate_from_another_ca_is_one_line_and_exit_1(secured, tmp_path):
    url, _ = secured
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "other.pem"))
    done = run_status(url, "--ca-file", str(tmp_path / "other.pem"), "--basic-auth-user", USER, password=PASSWORD)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "TLS failed" in done.stderr and "(--ca-file names the CA of the daemon's certificate)" in done.stderr


@pytest.mark.parametrize(("password", "code", "shown"), [(PASSWORD, 0, "42%"), ("not it", 1, "401 Unauthorized")])
def test_a_password_in_the_url_logs_in_and_is_never_printed(secured, password: str, code: int, shown: str):
    url, workdir = secured
    done = run_status(
        url.replace("https://", f"https://{USER}:{quote(password)}@"), "--ca-file", str(workdir / "ca.pem")
    )
    printed = done.stdout + done.stderr
    assert done.returncode == code and shown in printed, printed
    assert quote(password) not in printed and password not in printed
    assert url.replace("https://", "https://***@") in printed
