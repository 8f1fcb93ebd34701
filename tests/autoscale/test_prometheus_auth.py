"""`plimsoll autoscale replay --prometheus` against a Prometheus behind authentication or a private CA, through the
real CLI: a local aiohttp server stands in for the query API and checks each request's Authorization header (the
real Prometheus, in test_prometheus_replay.py, is also read through such a checking proxy).

What must hold: the secret read from its file reaches the header of every query and nothing else (not stdout,
stderr, result.json or report.html); a file that cannot be used, and flags that do not pair, are one line naming the
flag and the file, exit 2, before Prometheus is asked; a 401 or 403 is one line naming the URL and saying the
credentials were refused; a certificate from a private CA is trusted with --prometheus-ca-file only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme
from aiohttp import web

from exporter.autoscale.prometheus import MAX_SECRET_BYTES, prometheus_access
from exporter.cli import main
from tests.support.daemon_process import app_in_thread

LOOPBACK = "127.0.0.1"
TOKEN = "t0ken-Zq8"
USER, PASSWORD = "reader", "pa55-Wy3"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
MODEL = "chat"
CONFIG = f"""autoscaling:
  margin: 0.8
  workloads:
    - model: {MODEL}
      name: vllm-chat
      namespace: inference
      min_replicas: 1
      max_replicas: 10
      startup: 60s
      knee_concurrency: 4
"""


@dataclass
class Guarded:
    """A query API answering only requests whose Authorization header is `wanted` (None: any), else `refusal`."""

    url: str
    wanted: str | None
    refusal: int = 401
    seen: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, request: web.Request) -> web.Response:
        got = request.headers.get("Authorization")
        with self.lock:
            self.seen.append(got)
        if self.wanted is not None and got != self.wanted:
            return web.json_response({"status": "error", "error": "unauthorized"}, status=self.refusal)
        start, end, step = (float(request.query[key]) for key in ("start", "end", "step"))
        values = [[start + k * step, "3"] for k in range(round((end - start) / step) + 1)]
        data = {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
        return web.json_response({"status": "success", "data": data})


@contextlib.contextmanager
def _guarded(wanted: str | None, refusal: int = 401, tls: ssl.SSLContext | None = None) -> Iterator[Guarded]:
    """Serve a Guarded query API on a free loopback port."""
    guarded = Guarded("", wanted, refusal)

    async def respond(request: web.Request) -> web.Response:
        return guarded.answer(request)

    app = web.Application()
    app.router.add_get("/api/v1/query_range", respond)
    with app_in_thread(app, tls) as url:
        guarded.url = url
        yield guarded


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    return path


def _secret(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return path


def _replay(capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str, *argv: str) -> tuple[int, str, str]:
    config = str(_config(tmp_path))
    status = main(["autoscale", "replay", "--config", config, "--prometheus", url, "--since", "10m", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _refused(status: int, err: str, *words: str) -> None:
    assert status == 2
    assert err.count("\n") == 1, err
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("given", ["flags", "environment"])
@pytest.mark.parametrize("scheme", ["bearer", "basic"])
def test_the_secret_from_its_file_is_in_every_query_and_nowhere_else(tmp_path, capsys, monkeypatch, scheme, given):
    if scheme == "bearer":
        wanted, secret = f"Bearer {TOKEN}", TOKEN
        options = {"--prometheus-bearer-token-file": str(_secret(tmp_path, "token", f"{TOKEN}\n"))}
    else:
        wanted, secret = BASIC, PASSWORD
        options = {
            "--prometheus-basic-auth-user": USER,
            "--prometheus-password-file": str(_secret(tmp_path, "password", f"  {PASSWORD}\r\n")),
        }
    if given == "flags":
        argv = [part for pair in options.items() for part in pair]
    else:
        argv = []
        for flag, value in options.items():
            monkeypatch.setenv("PLIMSOLL_" + flag.removeprefix("--").replace("-", "_").upper(), value)
    out_dir = tmp_path / "out"

    with _guarded(wanted) as guarded:
        status, out, err = _replay(capsys, tmp_path, guarded.url, *argv, "--format", "json", "--out", str(out_dir))

    assert status == 0, err
    assert len(guarded.seen) >= 2 and set(guarded.seen) == {wanted}  # the demand and the queue queries
    (workload,) = json.loads(out)["workloads"]
    assert workload["trace"]["samples"] == 41 and {d for _, d in workload["trace"]["demand"]} == {3.0}
    written = [(out_dir / name).read_text() for name in ("result.json", "report.html")]
    encoded = wanted.split(" ", 1)[1]
    for text in (out, err, *written):
        assert secret not in text and encoded not in text


def test_the_access_does_not_show_its_secret(tmp_path):
    access = prometheus_access(str(_secret(tmp_path, "token", TOKEN)), None, None, None)
    assert access.headers == {"Authorization": f"Bearer {TOKEN}"}
    assert TOKEN not in repr(access) and TOKEN not in str(access)


@pytest.mark.parametrize("refusal", [401, 403])
def test_credentials_refused_are_one_line_naming_the_url_and_nothing_is_written(tmp_path, capsys, refusal):
    token = _secret(tmp_path, "token", TOKEN)
    out_dir = tmp_path / "out"
    with _guarded("Bearer another", refusal) as guarded:
        status, out, err = _replay(
            capsys, tmp_path, guarded.url, "--prometheus-bearer-token-file", str(token), "--out", str(out_dir)
        )
    _refused(status, err, guarded.url, f"refused the credentials (HTTP {refusal})")
    assert TOKEN not in err and out == ""
    assert not out_dir.exists()


def test_a_prometheus_asking_for_credentials_where_none_were_given_names_the_flags(tmp_path, capsys):
    with _guarded(f"Bearer {TOKEN}") as guarded:
        status, _, err = _replay(capsys, tmp_path, guarded.url)
    _refused(status, err, guarded.url, "without credentials (HTTP 401)", "--prometheus-bearer-token-file")
    assert guarded.seen and set(guarded.seen) == {None}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "cannot read it (No such file or directory)"),
        ("  \n", "the file is empty"),
        (f"{TOKEN}\nsecond line", "holds a line break or a control character"),
        (b"\xff\xfe" + TOKEN.encode(), "not UTF-8 text"),
        ("x" * (MAX_SECRET_BYTES + 1), "over 64 KiB"),
        ("fifo", "cannot read it (not a regular file)"),
    ],
    ids=["missing", "empty", "two-lines", "not-utf8", "too-large", "fifo"],
)
def test_a_secret_file_that_cannot_be_used_is_one_line_naming_it_before_prometheus_is_asked(
    tmp_path, capsys, content, words
):
    path = tmp_path / "token"
    if content == "fifo":  # a read would wait for a writer for ever
        os.mkfifo(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with _guarded(None) as guarded:
        status, _, err = _replay(capsys, tmp_path, guarded.url, "--prometheus-bearer-token-file", str(path))
    _refused(status, err, f"--prometheus-bearer-token-file {path}: {words}")
    assert TOKEN not in err and "second line" not in err
    assert guarded.seen == []


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--prometheus-bearer-token-file", "{token}", "--prometheus-basic-auth-user", USER],
            "give one, not both",
        ),
        (["--prometheus-basic-auth-user", USER], "--prometheus-basic-auth-user: needs --prometheus-password-file"),
        (["--prometheus-password-file", "{token}"], "--prometheus-password-file: needs --prometheus-basic-auth-user"),
        (
            ["--prometheus-basic-auth-user", "a:b", "--prometheus-password-file", "{token}"],
            "a user name holds no ':'",
        ),
    ],
    ids=["both", "user-alone", "password-alone", "colon-in-user"],
)
def test_flags_that_do_not_pair_are_one_line_before_prometheus_is_asked(tmp_path, capsys, argv, words):
    token = str(_secret(tmp_path, "token", TOKEN))
    with _guarded(None) as guarded:
        status, _, err = _replay(capsys, tmp_path, guarded.url, *(part.format(token=token) for part in argv))
    _refused(status, err, words)
    assert TOKEN not in err and guarded.seen == []


def test_the_access_flags_are_not_read_for_a_demand_csv(tmp_path, capsys, monkeypatch):
    """An environment set up for --prometheus does not stop a CSV replay."""
    monkeypatch.setenv("PLIMSOLL_PROMETHEUS_BEARER_TOKEN_FILE", str(tmp_path / "absent"))
    demand = tmp_path / "demand.csv"
    demand.write_text("time,demand\n0,3\n15,3\n")
    status = main(["autoscale", "replay", "--config", str(_config(tmp_path)), "--demand", str(demand)])
    assert status == 0, capsys.readouterr().err


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory) -> tuple[ssl.SSLContext, Path]:
    """A server context whose certificate a CA made here signed, and that CA's certificate in a file."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(LOOPBACK).configure_cert(server)
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return server, path


def test_a_private_ca_is_trusted_with_the_ca_file(tmp_path, capsys, private_ca):
    server, ca_file = private_ca
    with _guarded(None, tls=server) as guarded:
        status, _, err = _replay(capsys, tmp_path, guarded.url, "--prometheus-ca-file", str(ca_file))
    assert status == 0, err
    assert guarded.url.startswith("https://") and guarded.seen


def test_a_bundle_whose_comments_name_an_issuer_in_utf8_is_trusted(tmp_path, capsys, private_ca):
    server, ca_file = private_ca
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes("# Issuer: Zertifizierungsstelle Grüne Wiese\n".encode() + ca_file.read_bytes())
    with _guarded(None, tls=server) as guarded:
        status, _, err = _replay(capsys, tmp_path, guarded.url, "--prometheus-ca-file", str(bundle))
    assert status == 0, err


def test_a_certificate_from_an_unknown_ca_names_the_ca_file_flag(tmp_path, capsys, private_ca):
    server, _ = private_ca
    with _guarded(None, tls=server) as guarded:
        status, _, err = _replay(capsys, tmp_path, guarded.url)
    _refused(status, err, guarded.url, "TLS failed", "--prometheus-ca-file FILE")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("not a certificate\n", "holds no PEM certificate"),
        ("", "holds no PEM certificate"),  # not the system's CAs in its place
        (None, "cannot read it"),
    ],
)
def test_a_ca_file_that_cannot_be_used_is_one_line_naming_it(tmp_path, capsys, content, words):
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_text(content)
    status, _, err = _replay(capsys, tmp_path, "https://127.0.0.1:9", "--prometheus-ca-file", str(path))
    _refused(status, err, f"--prometheus-ca-file {path}: {words}")


def test_credentials_in_the_url_are_refused_without_repeating_them(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        _replay(capsys, tmp_path, f"http://{USER}:{PASSWORD}@127.0.0.1:9")
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert PASSWORD not in err and "--prometheus-bearer-token-file FILE" in err


@pytest.mark.parametrize("suffix", [f"?access_token={PASSWORD}", f"#{PASSWORD}", "?"])
def test_a_query_or_fragment_in_the_url_is_refused_without_repeating_it(tmp_path, capsys, suffix):
    """Each request sets its own query, so a token put in the URL's would be dropped unsent, and shown."""
    with pytest.raises(SystemExit) as exited:
        _replay(capsys, tmp_path, f"http://127.0.0.1:9/{suffix}")
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert PASSWORD not in err and "a ?query or #fragment would be dropped from every request" in err
