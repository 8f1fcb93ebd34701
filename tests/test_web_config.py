"""The web config (Prometheus exporter-toolkit format): every problem reported in one pass naming the file and the
field, and TLS, client certificates and basic auth on real HTTPS on 127.0.0.1, with certificates made in the test
(trustme) and bcrypt hashes of cost 4 (valid, and fast enough to make per test)."""

import asyncio
import os
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import pytest
import trustme
import yaml
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives import serialization

from exporter.config import Config, ConfigError
from exporter.daemon import web_config
from exporter.daemon.poll import Daemon
from exporter.daemon.server import build_app
from exporter.daemon.web_config import BasicAuth, WebConfig, load_web_config

LOOPBACK = "127.0.0.1"
USER = "prometheus"
PASSWORD = "correct horse battery staple"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
COMMAND_TIMEOUT_S = 20.0  # a check-config that opened a FIFO would wait for a writer forever


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _write_certificates(ca: trustme.CA, directory: Path) -> None:
    """server.pem (certificate chain and key, for 127.0.0.1) and ca.pem in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca.issue_cert(LOOPBACK).private_key_and_cert_chain_pem.write_to_path(str(directory / "server.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))


def _web_config(directory: Path, document: Any) -> str:
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def _secured(ca: trustme.CA, directory: Path, **tls: Any) -> WebConfig:
    _write_certificates(ca, directory)
    document = {
        "tls_server_config": {"cert_file": "server.pem", "key_file": "server.pem", **tls},
        "basic_auth_users": {USER: HASH},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    }
    return load_web_config(_web_config(directory, document))


def _problems(path: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load_web_config(path)
    return raised.value.problems


def test_tls_and_users_load_with_paths_relative_to_the_web_config(ca, tmp_path, monkeypatch):
    loaded = _secured(ca, tmp_path / "etc")
    monkeypatch.chdir(tmp_path)  # the file names are found beside the web config, not in the working directory
    assert load_web_config(str(tmp_path / "etc" / "web.yml")).users.keys() == {USER}
    assert isinstance(loaded.tls, ssl.SSLContext)
    assert loaded.tls.minimum_version == ssl.TLSVersion.TLSv1_2
    assert loaded.tls.verify_mode == ssl.CERT_NONE
    assert dict(loaded.headers) == {"X-Content-Type-Options": "nosniff"}


def test_an_empty_file_means_plain_http_and_no_users(tmp_path):
    loaded = load_web_config(_web_config(tmp_path, None))
    assert (loaded.tls, dict(loaded.users), dict(loaded.headers)) == (None, {}, {})


def test_every_problem_is_reported_at_once_naming_the_file_and_the_field(ca, tmp_path):
    _write_certificates(ca, tmp_path)
    path = _web_config(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": "server.pem",
                "cipher_suites": ["TLS_AES_128_GCM_SHA256"],
                "min_version": "TLS10",
                "client_auth_type": "RequestClientCert",
                "client_allowed_sans": ["scraper"],
            },
            "basic_auth_users": {USER: "hunter2-in-plain-text"},
            "http_server_config": {"headers": {"X-Frame-Options": "allow"}, "http3": True},
            "rate_limit": {"interval": "1s", "burst": 10},
            "tls_config": {},
        },
    )
    problems = _problems(path)
    expected = {
        "tls_server_config.key_file": "missing",
        "tls_server_config.cipher_suites": "not supported",
        "tls_server_config.min_version": "TLS10 is not supported",
        "tls_server_config.client_auth_type": "without verifying",
        "tls_server_config.client_allowed_sans": "not supported",
        "basic_auth_users.prometheus": "not a bcrypt hash",
        "http_server_config.headers.X-Frame-Options": "not one of deny, sameorigin",
        "http_server_config.http3": "unknown key",
        "rate_limit": "not supported",
        "tls_config": "unknown key",
    }
    for field, words in expected.items():
        assert any(p.startswith(f"{path}: {field}: ") and words in p for p in problems), (field, problems)
    assert len(problems) == len(expected), problems
    assert not any("hunter2" in p for p in problems), "a secret was echoed"


@pytest.mark.parametrize(
    ("tls", "field", "words"),
    [
        ({"client_ca_file": "ca.pem"}, "client_ca_file", "set client_auth_type: RequireAndVerifyClientCert"),
        ({"client_auth_type": "RequireAndVerifyClientCert"}, "client_auth_type", "needs client_ca_file"),
        ({"client_auth_type": "Sometimes"}, "client_auth_type", "is not one of NoClientCert"),
        ({"min_version": "TLS13", "max_version": "TLS12"}, "min_version", "is above max_version"),
        ({"client_ca_file": "absent.pem"}, "client_ca_file", "cannot read"),
    ],
)
def test_client_authentication_and_versions_must_make_sense(ca, tmp_path, tls, field, words):
    _write_certificates(ca, tmp_path)
    path = _web_config(tmp_path, {"tls_server_config": {"cert_file": "server.pem", "key_file": "server.pem", **tls}})
    problems = _problems(path)
    assert any(p.startswith(f"{path}: tls_server_config.{field}: ") and words in p for p in problems), problems


def test_a_key_that_does_not_belong_to_the_certificate_is_refused(ca, tmp_path):
    ca.issue_cert(LOOPBACK).cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.issue_cert(LOOPBACK).private_key_pem.write_to_path(str(tmp_path / "other.key"))
    path = _web_config(tmp_path, {"tls_server_config": {"cert_file": "cert.pem", "key_file": "other.key"}})
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}: tls_server_config.cert_file: cannot load")


def test_an_encrypted_key_is_refused_without_a_prompt(ca, tmp_path):
    leaf = ca.issue_cert(LOOPBACK)
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    (tmp_path / "key.pem").write_bytes(encrypted)
    path = _web_config(tmp_path, {"tls_server_config": {"cert_file": "cert.pem", "key_file": "key.pem"}})
    (problem,) = _problems(path)
    assert "tls_server_config.cert_file: cannot load" in problem


def test_a_missing_or_broken_file_is_one_problem_saying_so(tmp_path):
    missing = str(tmp_path / "absent.yml")
    assert _problems(missing) == [f"{missing}: cannot read the web config (No such file or directory)"]
    broken = tmp_path / "broken.yml"
    broken.write_text("tls_server_config: [\n")
    (problem,) = _problems(str(broken))
    assert problem.startswith(f"{broken}: not valid YAML: line 2")


async def _answers(web: WebConfig, requests: list[dict[str, Any]]) -> list[Any]:
    """Serve build_app with `web` on 127.0.0.1 (HTTPS when it has TLS); each request's status, headers and
    exception, in order."""
    app = build_app(Daemon(Config(nvml=False)), web)
    server = TestServer(app, host=LOOPBACK)
    await server.start_server(ssl=web.tls)
    answers: list[Any] = []
    try:
        async with aiohttp.ClientSession() as session:
            for request in requests:
                scheme = request.pop("scheme", "https")
                url = f"{scheme}://{LOOPBACK}:{server.port}{request.pop('path', '/metrics')}"
                try:
                    async with session.get(url, **request) as response:
                        answers.append((response.status, dict(response.headers)))
                except aiohttp.ClientError as error:
                    answers.append(error)
    finally:
        await server.close()
    return answers


def _trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def test_https_with_basic_auth_admits_the_right_password_only(ca, tmp_path):
    web = _secured(ca, tmp_path)
    trusted = _trusting(ca)
    right = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD)}
    answers = asyncio.run(
        _answers(
            web,
            [
                {"ssl": trusted, "headers": right},
                {"ssl": trusted, "headers": {"Authorization": aiohttp.encode_basic_auth(USER, "wrong")}},
                {"ssl": trusted, "headers": {"Authorization": aiohttp.encode_basic_auth("nobody", PASSWORD)}},
                {"ssl": trusted},
                {"ssl": trusted, "path": "/healthz"},
                {"ssl": trusted, "headers": right, "path": "/api/v1/state"},
                {"scheme": "http"},
            ],
        )
    )
    (ok, ok_headers), *refusals, (probe, _), (state, _), plain = answers
    assert ok == 200 and state == 200
    assert ok_headers["X-Content-Type-Options"] == "nosniff"
    for status, headers in refusals:
        assert status == 401
        assert headers["WWW-Authenticate"].startswith("Basic")
    assert probe == 200, "the liveness probe needs no password"
    assert isinstance(plain, aiohttp.ClientError), f"plain HTTP to the TLS port was answered: {plain}"


def test_client_certificates_are_required_and_verified_when_configured(ca, tmp_path):
    web = _secured(ca, tmp_path, client_auth_type="RequireAndVerifyClientCert", client_ca_file="ca.pem")
    right = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD)}
    with_certificate = _trusting(ca)
    ca.issue_cert("scraper@example.com").configure_cert(with_certificate)
    from_another_ca = _trusting(ca)
    trustme.CA().issue_cert("scraper@example.com").configure_cert(from_another_ca)
    answers = asyncio.run(
        _answers(
            web,
            [
                {"ssl": with_certificate, "headers": right},
                {"ssl": _trusting(ca), "headers": right},
                {"ssl": from_another_ca, "headers": right},
            ],
        )
    )
    assert answers[0][0] == 200
    assert all(isinstance(answer, aiohttp.ClientError) for answer in answers[1:]), answers


def test_a_password_is_checked_by_bcrypt_once_and_an_unknown_user_after_the_same_work(monkeypatch):
    checked: list[bytes] = []
    checkpw = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return checkpw(password, hashed)

    monkeypatch.setattr(web_config.bcrypt, "checkpw", counting)
    check = BasicAuth({USER: HASH.encode()})
    right = aiohttp.encode_basic_auth(USER, PASSWORD)
    stranger = aiohttp.encode_basic_auth("stranger", PASSWORD)

    async def go() -> list[bool]:
        headers = (right, right, right, stranger, "Basic !!!", None)
        return [(await check.check(header, LOOPBACK)).allowed for header in headers]

    assert asyncio.run(go()) == [True, True, True, False, False, False]
    assert len(checked) == 2, "the right password was hashed once; the stranger against a decoy"
    assert checked[1] != HASH.encode()


def test_a_tls_setting_without_a_certificate_is_refused_rather_than_serving_plain_http(tmp_path):
    path = _web_config(tmp_path, {"tls_server_config": {"min_version": "TLS13"}})
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}: tls_server_config: TLS settings without cert_file and key_file")


def _users_problems(tmp_path: Path, hashed: str) -> list[str]:
    return _problems(_web_config(tmp_path, {"basic_auth_users": {USER: hashed}}))


@pytest.mark.parametrize(
    ("hashed", "words"),
    [
        ("$2$10$" + HASH[7:], "bcrypt refuses it"),  # a version the bcrypt library does not know
        ("$2b$04$" + HASH[7:28] + "z" + HASH[29:], "bcrypt refuses it"),  # a salt whose last character is not canonical
        ("$2b$03$" + HASH[7:], "cost 3 is outside bcrypt's 4 to 31"),
        ("$2b$99$" + HASH[7:], "cost 99 is outside bcrypt's 4 to 31"),
    ],
    ids=["version-2", "salt", "cost-03", "cost-99"],
)
def test_a_hash_bcrypt_refuses_is_refused_at_load_naming_the_user_and_the_reason(tmp_path, hashed, words):
    (problem,) = _users_problems(tmp_path, hashed)
    assert problem.startswith(f"{tmp_path / 'web.yml'}: basic_auth_users.{USER}: ") and words in problem, problem


@pytest.mark.parametrize("cost", [web_config.MAX_BCRYPT_COST + 1, 31])
def test_a_bcrypt_cost_above_the_limit_is_refused_naming_the_user_and_the_limit(tmp_path, cost):
    hashed = f"$2b${cost:02d}$" + HASH[7:]
    (problem,) = _users_problems(tmp_path, hashed)
    assert f"basic_auth_users.{USER}: bcrypt cost {cost} is above {web_config.MAX_BCRYPT_COST}" in problem, problem


def test_more_users_than_scrapers_are_refused_before_any_hash_is_checked(tmp_path):
    users = {f"scraper{number}": HASH for number in range(web_config.MAX_USERS + 1)}
    started = time.monotonic()
    (problem,) = _problems(_web_config(tmp_path, {"basic_auth_users": users}))
    checking = time.monotonic() - started
    assert problem == f"{tmp_path / 'web.yml'}: basic_auth_users: 1,001 users, more than 1,000: scrapers, not people"
    # Not one hash was checked: the same file at the limit, each hash checked, takes longer than the refusal.
    del users["scraper0"]
    started = time.monotonic()
    assert len(load_web_config(_web_config(tmp_path, {"basic_auth_users": users})).users) == web_config.MAX_USERS
    assert time.monotonic() - started > checking


def test_a_password_longer_than_bcrypt_reads_is_checked_on_its_first_72_bytes_as_exporter_toolkit_does(ca, tmp_path):
    long_password = "x" * 72 + "and more that bcrypt never reads"
    web = load_web_config(
        _web_config(tmp_path, {"basic_auth_users": {USER: bcrypt.hashpw(b"x" * 72, bcrypt.gensalt(4)).decode()}})
    )
    answers = asyncio.run(
        _answers(
            web,
            [
                {"scheme": "http", "headers": {"Authorization": aiohttp.encode_basic_auth(USER, long_password)}},
                {"scheme": "http", "headers": {"Authorization": aiohttp.encode_basic_auth(USER, "y" * 100)}},
            ],
        )
    )
    assert [status for status, _ in answers] == [200, 401]


@pytest.mark.parametrize("fifo_as", ["cert_file", "key_file", "client_ca_file"])
def test_a_fifo_named_as_a_tls_file_is_refused_by_check_config_naming_it(ca, tmp_path, fifo_as):
    _write_certificates(ca, tmp_path)
    os.mkfifo(tmp_path / "fifo")
    tls = {"cert_file": "server.pem", "key_file": "server.pem", fifo_as: "fifo"}
    if fifo_as == "client_ca_file":
        tls["client_auth_type"] = "RequireAndVerifyClientCert"
    _web_config(tmp_path, {"tls_server_config": tls})
    config = tmp_path / "plimsoll.yaml"
    config.write_text("web_config: web.yml\n")
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert done.returncode == 2, done.stderr
    assert f"tls_server_config.{fifo_as}: {tmp_path / 'fifo'} is not a regular file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_fifo_as_the_web_config_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "web.yml"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_web_config(str(fifo))
            outcome.append(None)
        except BaseException as error:  # the thread hands whatever happened to the test
            outcome.append(error)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(10)
    if loader.is_alive():
        with open(fifo, "w"):  # a writer releases the blocked open, so the thread ends with the test
            pass
        pytest.fail("loading a FIFO as the web config waited for a writer")
    (error,) = outcome
    assert isinstance(error, ConfigError) and f"{fifo}: cannot read the web config (not a regular file)" in str(error)
