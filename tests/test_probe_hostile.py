"""`plimsoll probe` on hostile input: a page whose labels hold terminal escapes, a source that never ends (a
device, a pipe, an endless answer) and one larger than the cap. Escapes print escaped; every read stops at the
cap; a source that is not a regular file is refused, named, before a byte is read."""

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from exporter.probe import MAX_PAGE_BYTES
from tests.support.daemon_process import app_in_thread

ESCAPES = "\x1b]0;owned\x07\x1b[2J"
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

    app = web.Application()
    app.router.add_get("/hostile", hostile)
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


def test_an_answer_that_never_ends_is_cut_at_the_cap(pages: str):
    _refused(_probe(pages + "/endless"), f"over {MAX_PAGE_BYTES:,} bytes")
