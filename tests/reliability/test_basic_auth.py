"""Basic auth on the daemon's port against whoever can reach it: a real `plimsoll run --web-config` on loopback.

The attacker sends wrong passwords from many loopback addresses (127.0.0.2, 127.0.0.3, ...: Linux routes all of
127/8 to lo), as a crowd of machines would. Hashes are of cost 10: a check takes ~0.1 s, measured here once per
test, and every time limit below is a multiple of that measurement, not an absolute time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import bcrypt
import yaml

from tests.support.daemon_process import DaemonProcess, running_daemon
from tests.support.prometheus import wait_until

USER = "prometheus"
PASSWORD = "correct horse battery staple"
ROTATED = "tr0ub4dor&3"
COST = 10
STORM_ADDRESSES = 48
CONDITION_TIMEOUT_S = 20.0


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=COST)).decode()


def _check_seconds() -> float:
    """What one bcrypt check of COST takes on this machine now (the median of three)."""
    hashed = _hash(PASSWORD).encode()
    took = []
    for _ in range(3):
        started = time.perf_counter()
        bcrypt.checkpw(b"wrong", hashed)
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def _write_web_config(path: Path, users: dict[str, str]) -> None:
    path.write_text(yaml.safe_dump({"basic_auth_users": users}))


@contextlib.contextmanager
def _secured_daemon(tmp_path: Path) -> Iterator[tuple[DaemonProcess, Path]]:
    tmp_path.mkdir(exist_ok=True)
    web = tmp_path / "web.yml"
    _write_web_config(web, {USER: _hash(PASSWORD)})
    config = {"poll_interval": "60s", "targets": []}
    with running_daemon(tmp_path, config, args=["--web-config", str(web)]) as daemon:
        yield daemon, web


def _auth(password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(USER, password)}


async def _status(url: str, password: str | None, source: str = "127.0.0.1") -> tuple[int, str | None, float]:
    """(status, Retry-After, seconds taken) of GET /metrics with `password` (None: no credentials), sent from the
    address `source`."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    headers = _auth(password) if password is not None else {}
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(url + "/metrics", headers=headers) as response,
    ):
        await response.read()
        return response.status, response.headers.get("Retry-After"), time.perf_counter() - started


@contextlib.asynccontextmanager
async def _storm(url: str, answered: list[int]) -> AsyncIterator[None]:
    """Wrong passwords, each a new one, from STORM_ADDRESSES addresses, each one request after another, until the
    block ends; every status is appended to `answered`."""

    async def attacker(source: str) -> None:
        connector = aiohttp.TCPConnector(local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector) as session:
            for guess in itertools.count():
                try:
                    async with session.get(url + "/metrics", headers=_auth(f"{source} guess {guess}")) as response:
                        await response.read()
                        answered.append(response.status)
                except aiohttp.ClientError:
                    answered.append(0)
                    await asyncio.sleep(0.05)

    tasks = [asyncio.ensure_future(attacker(f"127.0.0.{2 + i}")) for i in range(STORM_ADDRESSES)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _until(condition, what: str) -> None:
    deadline = time.monotonic() + CONDITION_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {CONDITION_TIMEOUT_S:g}s: {what}")
        await asyncio.sleep(0.01)


def test_a_cached_password_is_answered_at_once_during_a_storm_of_wrong_passwords(tmp_path):
    """Measured against a request with no credentials during the same storm: it needs no check, so what the two
    share (a busy port, a busy machine) cancels out, and what is left is any wait behind the wrong passwords."""
    check = _check_seconds()

    async def go() -> tuple[list[float], list[float], list[int]]:
        assert (await _status(daemon.url, PASSWORD))[0] == 200  # verified once, then cached
        answered: list[int] = []
        cached, uncredentialed = [], []
        async with _storm(daemon.url, answered):
            await _until(lambda: len(answered) >= STORM_ADDRESSES, "the storm under way")
            for _ in range(5):
                status, _, took = await _status(daemon.url, PASSWORD)
                assert status == 200
                cached.append(took)
                status, _, took = await _status(daemon.url, None)
                assert status == 401
                uncredentialed.append(took)
        return cached, uncredentialed, answered

    with _secured_daemon(tmp_path) as (daemon, _):
        cached, uncredentialed, answered = asyncio.run(go())
        daemon.assert_running()
    assert set(answered) <= {401, 429}, set(answered)
    waited = statistics.median(cached) - statistics.median(uncredentialed)
    assert waited < check, (
        f"during the storm a cached password took {waited:.3f}s longer than no password (medians); one bcrypt "
        f"check takes {check:.3f}s: it waited behind the wrong ones"
    )


def test_failed_logins_past_an_addresses_budget_are_refused_with_429_without_a_bcrypt_check(tmp_path):
    check = _check_seconds()

    async def go() -> list[tuple[int, str | None, float]]:
        return [await _status(daemon.url, f"guess {i}") for i in range(40)]

    with _secured_daemon(tmp_path) as (daemon, _):
        answers = asyncio.run(go())
        statuses = [status for status, _, _ in answers]
        assert statuses[0] == 401 and 429 in statuses, statuses
        throttled = [(retry_after, took) for status, retry_after, took in answers if status == 429]
        assert all(retry_after is not None and int(retry_after) >= 1 for retry_after, _ in throttled), throttled
        typical = statistics.median(took for _, took in throttled)
        assert typical < check / 2, f"a 429 took {typical:.3f}s (median), a bcrypt check {check:.3f}s: it was hashed"
        elsewhere = asyncio.run(_status(daemon.url, PASSWORD, source="127.0.0.9"))
        assert elsewhere[0] == 200, "another address is not throttled"


def _sigterm_seconds(daemon: DaemonProcess) -> float:
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    wait_until(lambda: daemon.process.poll() is not None, CONDITION_TIMEOUT_S, "the daemon to exit")
    return time.monotonic() - started


def test_sigterm_during_a_storm_of_wrong_passwords_exits_without_working_through_the_queue(tmp_path):
    """Compared with the same daemon stopped idle: the storm may add the checks running when SIGTERM came (and the
    load of the storm itself), not the checks of every attacker waiting in line."""
    check = _check_seconds()

    async def storm_then_stop(daemon: DaemonProcess) -> float:
        answered: list[int] = []
        async with _storm(daemon.url, answered):
            await _until(lambda: len(answered) >= 4, "wrong passwords being checked")
            return await asyncio.to_thread(_sigterm_seconds, daemon)

    with _secured_daemon(tmp_path / "idle") as (daemon, _):
        idle = _sigterm_seconds(daemon)
    with _secured_daemon(tmp_path / "storm") as (daemon, _):
        stormed = asyncio.run(storm_then_stop(daemon))
        assert daemon.process.returncode == 0, daemon.log()[-3000:]
    in_line = STORM_ADDRESSES * check
    assert stormed - idle < in_line / 4, (
        f"SIGTERM took {stormed:.2f}s during the storm, {idle:.2f}s idle; the attackers' checks take {in_line:.2f}s"
    )


def test_sighup_applies_a_rotated_password_and_keeps_the_running_web_config_when_the_file_is_broken(tmp_path):
    def statuses() -> tuple[int, int]:
        old, new = (asyncio.run(_status(daemon.url, password))[0] for password in (PASSWORD, ROTATED))
        return old, new

    def logged(words: str) -> bool:
        daemon.assert_running()
        return words in daemon.log()

    with _secured_daemon(tmp_path) as (daemon, web):
        assert statuses() == (200, 401)
        _write_web_config(web, {USER: _hash(ROTATED)})
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: logged(f"web config {web} applied"), CONDITION_TIMEOUT_S, "the rotation applied")
        assert statuses() == (401, 200), "the old password still passes after the rotation"
        web.write_text("basic_auth_users: {prometheus: not-a-hash}\n")
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: logged("web config reload rejected"), CONDITION_TIMEOUT_S, "the broken file refused")
        assert statuses() == (401, 200), "the running web config was not kept"
        log = daemon.log()
    assert log.count(f"web config {web} applied") == 1, log[-3000:]
    assert "basic_auth_users.prometheus" in log and "Traceback" not in log, log[-3000:]
