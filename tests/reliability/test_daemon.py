"""The poll loop against hostile and misbehaving engines, black-box: a real `plimsoll run` over loopback HTTP.

Each class runs one daemon (tests/support/daemon_process.py) for its checks, polling the pages of
tests/reliability/hostile.py every 500 ms so a check takes a few seconds. The checks read what an operator reads:
/api/v1/state, /metrics, /healthz, /readyz and the daemon's log; none reaches into the process.
"""

import json
import re
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.reliability.hostile import (
    RECORDED_MODEL,
    Hits,
    PageControl,
    counting_app,
    hostile_app,
)
from tests.support.daemon_process import DaemonProcess, app_in_thread, running_daemon
from tests.support.prometheus import LOOPBACK, NotReady, free_port, http, wait_until

POLL = "500ms"
POLL_S = 0.5
CONDITION_TIMEOUT_S = 10.0
SIGTERM_EXIT_S = 5.0
SECRET = "s3cret-in-a-redirect"
SCANNED_PORTS = (8000, 30000, 8002, 8080, 23333)


# --- what the tests read -------------------------------------------------------------------------------------------


def _target(state: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in state["targets"] if t["target"] == name), None)


def _settled(daemon: DaemonProcess, name: str, what: str, check: Any) -> dict[str, Any]:
    """The target's state once `check(target)` holds; fails after a deadline naming `what` and the last state."""
    seen: dict[str, Any] = {}

    def probe(state: dict[str, Any]) -> bool:
        target = _target(state, name)
        seen["last"] = target
        return target is not None and bool(check(target))

    try:
        state = daemon.wait_for_state(probe, CONDITION_TIMEOUT_S, f"target {name}: {what}")
    except NotReady as error:
        raise AssertionError(f"{error}; last seen: {json.dumps(seen.get('last'))[:1500]}") from None
    found = _target(state, name)
    assert found is not None
    return found


def _successes(daemon: DaemonProcess, names: tuple[str, ...], count: int, timeout_s: float) -> dict[str, set[float]]:
    """Wait until every target in `names` has `count` new last_success_timestamp values (polls that succeeded
    after this call); returns the values seen per target."""
    first = {name: (_target(daemon.state(), name) or {}).get("last_success_timestamp") for name in names}
    seen: dict[str, set[float]] = {name: set() for name in names}

    def probe(state: dict[str, Any]) -> bool:
        for name in names:
            stamp = (_target(state, name) or {}).get("last_success_timestamp")
            if stamp is not None and stamp != first[name]:
                seen[name].add(stamp)
        return all(len(stamps) >= count for stamps in seen.values())

    try:
        daemon.wait_for_state(probe, timeout_s, f"{count} new successful polls of each of {', '.join(names)}")
    except NotReady as error:
        counts = {name: len(stamps) for name, stamps in seen.items()}
        raise AssertionError(f"{error}; new successes seen: {counts}") from None
    return seen


def _exposition(daemon: DaemonProcess) -> list[Sample]:
    status, text = daemon.get("/metrics")
    assert status == 200, f"/metrics answered {status}"
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _samples(daemon: DaemonProcess, metric: str) -> list[tuple[dict[str, str], float]]:
    return [(sample.labels, sample.value) for sample in _exposition(daemon) if sample.name == metric]


def _log_lines(daemon: DaemonProcess, pattern: str) -> list[str]:
    return [line for line in daemon.log().splitlines() if re.search(pattern, line)]


def _ready(daemon: DaemonProcess) -> None:
    wait_until(lambda: daemon.get("/readyz")[0] == 200 or None, CONDITION_TIMEOUT_S, "/readyz answering 200")


def _stops_cleanly(daemon: DaemonProcess) -> None:
    """The daemon is still running, and SIGTERM ends it with exit status 0 within SIGTERM_EXIT_S."""
    daemon.assert_running()
    daemon.signal(signal.SIGTERM)
    try:
        code = daemon.process.wait(timeout=SIGTERM_EXIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {SIGTERM_EXIT_S:g} s after SIGTERM:\n{daemon.log()[-3000:]}") from None
    assert code == 0, f"exit status {code} after SIGTERM:\n{daemon.log()[-3000:]}"


# --- one daemon beside a page server of hostile targets ------------------------------------------------------------

KV_VALUES = {"kv-5": "5", "kv-minus-inf": "-Inf", "kv-1e308": "1e308", "kv-nan": "NaN"}
GOOD = "good"
FROM_FILE = "from-file"
BOGUS = "bogus-engine"


@dataclass
class Fleet:
    daemon: DaemonProcess
    control: PageControl
    hits: Hits
    away_port: int


@pytest.fixture(scope="class")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fleet")
    control = PageControl(flap_status=404)
    hits = Hits()
    # The page that never answers has an origin of its own here: how hanging targets treat their neighbours on one
    # origin is test_targets_that_never_answer_do_not_slow_a_target_on_the_same_origin's question, not these.
    with (
        app_in_thread(counting_app(hits)) as away,
        app_in_thread(hostile_app(control)) as base,
        app_in_thread(hostile_app(control)) as stalling,
    ):
        away_port = int(away.rsplit(":", 1)[1])
        control.away = f"http://plimsoll:{SECRET}@{LOOPBACK}:{away_port}/metrics"
        address = base.removeprefix("http://")
        (workdir / "targets.json").write_text(
            json.dumps(
                [
                    {"targets": [address], "labels": {"target": BOGUS, "engine": "bogus", "__metrics_path__": "/page"}},
                    {"targets": [address], "labels": {"target": FROM_FILE, "__metrics_path__": "/page"}},
                ]
            )
        )
        config = {
            "poll_interval": POLL,
            "timeout": "1s",
            "targets": [
                {"name": GOOD, "url": f"{base}/page"},
                {"name": "slow", "url": f"{stalling}/never"},
                {"name": "refused", "url": f"http://{LOOPBACK}:{free_port()}/metrics"},
                *({"name": name, "url": f"{base}/kv/{value}"} for name, value in KV_VALUES.items()),
                {"name": "redirect-away", "url": f"{base}/redirect-away"},
                {"name": "redirect-same", "url": f"{base}/redirect-same"},
                {"name": "flapping", "url": f"{base}/flap"},
                {"name": "partial", "url": f"{base}/partial"},
                {"name": "mismatch", "url": f"{base}/page", "model": "llama-3.1-8b"},
            ],
            "discovery": {"files": ["targets.json"]},
        }
        with running_daemon(workdir, config) as daemon:
            yield Fleet(daemon, control, hits, away_port)


class TestOneDaemonBesideHostileTargets:
    def test_an_unknown_engine_label_marks_only_its_target_down(self, fleet: Fleet) -> None:
        daemon = fleet.daemon
        _ready(daemon)
        bogus = _settled(daemon, BOGUS, "shown down", lambda t: t["last_failure"] is not None)
        assert bogus["up"] is False
        assert bogus["last_failure"] == "invalid_target", bogus
        assert "bogus" in (bogus["last_error"] or ""), bogus
        _successes(daemon, (GOOD, FROM_FILE), count=3, timeout_s=CONDITION_TIMEOUT_S)
        state = daemon.state()
        assert [(_target(state, name) or {}).get("up") for name in (GOOD, FROM_FILE)] == [True, True], state

    @pytest.mark.parametrize("name", KV_VALUES)
    def test_kv_usage_outside_0_to_1_is_refused_per_field_and_never_exported(self, fleet: Fleet, name: str) -> None:
        daemon = fleet.daemon
        target = _settled(daemon, name, "up with an instance", lambda t: t["up"] and t["instances"])
        (instance,) = target["instances"]
        assert instance["kv_cache_usage_ratio"] is None, instance
        reason = instance["invalid"].get("kv_cache_usage_ratio")
        assert isinstance(reason, str) and reason, f"no reason for refusing {KV_VALUES[name]}: {instance['invalid']}"
        assert instance["requests_running"] == 10.0  # the page's other fields are still read
        assert instance["requests_waiting"] == 2.0
        exported = _samples(daemon, "plimsoll_kv_cache_usage_ratio")
        assert [v for _, v in exported if not 0.0 <= v <= 1.0] == [], exported
        assert [v for labels, v in exported if labels.get("target") == name] == []

    def test_a_redirect_to_another_origin_is_not_followed_and_says_where(self, fleet: Fleet) -> None:
        daemon = fleet.daemon
        target = _settled(daemon, "redirect-away", "shown down", lambda t: t["last_failure"] is not None)
        assert target["up"] is False
        assert target["last_failure"] == "redirect", target
        assert f"{LOOPBACK}:{fleet.away_port}" in (target["last_error"] or ""), target
        assert fleet.hits.paths == [], f"the other origin was requested: {fleet.hits.paths}"
        assert SECRET not in json.dumps(daemon.state())
        assert SECRET not in daemon.log()

    def test_a_redirect_within_the_same_origin_is_followed(self, fleet: Fleet) -> None:
        target = _settled(fleet.daemon, "redirect-same", "up", lambda t: t["up"])
        assert target["instances"], target

    def test_going_down_and_coming_back_is_logged_once_per_change_with_its_cause(self, fleet: Fleet) -> None:
        daemon = fleet.daemon

        def failed_polls(target: dict[str, Any]) -> int:
            return int(target["failures_total"].get("http_status", 0))

        down = _settled(daemon, "flapping", "down on HTTP 404 for 3 polls", lambda t: failed_polls(t) >= 3)
        assert (down["up"], down["last_error"]) == (False, "HTTP 404"), down
        fleet.control.flap_status = 200
        _settled(daemon, "flapping", "up again", lambda t: t["up"])
        _successes(daemon, ("flapping",), count=3, timeout_s=CONDITION_TIMEOUT_S)
        fleet.control.flap_status = 404
        before = failed_polls(_target(daemon.state(), "flapping") or {})
        again = _settled(daemon, "flapping", "down again for 3 polls", lambda t: failed_polls(t) >= before + 3)
        assert (again["up"], again["last_error"]) == (False, "HTTP 404"), again
        downs = _log_lines(daemon, r"target flapping down\b")
        ups = _log_lines(daemon, r"target flapping up\b")
        assert len(downs) == 2 and all("HTTP 404" in line for line in downs), downs
        assert len(ups) == 1, ups

    def test_a_refused_connection_and_a_timeout_are_told_apart(self, fleet: Fleet) -> None:
        daemon = fleet.daemon
        refused = _settled(daemon, "refused", "shown down", lambda t: t["last_error"] is not None)
        assert "connection refused" in refused["last_error"].lower(), refused
        slow = _settled(daemon, "slow", "shown down", lambda t: t["last_error"] is not None)
        assert "timeout after 1s" in slow["last_error"], slow

    def test_a_configured_model_the_engine_does_not_serve_is_a_warning(self, fleet: Fleet) -> None:
        daemon = fleet.daemon
        _settled(daemon, "mismatch", "up", lambda t: t["up"])
        _successes(daemon, ("mismatch",), count=3, timeout_s=CONDITION_TIMEOUT_S)
        target = _target(daemon.state(), "mismatch") or {}
        warnings = target.get("warnings")
        assert isinstance(warnings, list) and len(warnings) == 1, target
        assert "llama-3.1-8b" in warnings[0] and RECORDED_MODEL in warnings[0], warnings
        logged = _log_lines(daemon, rf"mismatch.*({RECORDED_MODEL}.*llama-3\.1-8b|llama-3\.1-8b.*{RECORDED_MODEL})")
        assert len(logged) == 1, logged

    def test_a_partial_page_yields_what_it_carries_and_names_what_is_absent(self, fleet: Fleet) -> None:
        target = _settled(fleet.daemon, "partial", "up with an instance", lambda t: t["up"] and t["instances"])
        (instance,) = target["instances"]
        assert (instance["requests_running"], instance["kv_cache_usage_ratio"]) == (3.0, 0.25), instance
        assert "preemptions_total" in instance["absent"], instance
        assert "requests_waiting" in instance["absent"], instance

    def test_after_every_hostile_target_the_daemon_runs_and_exits_0_on_sigterm(self, fleet: Fleet) -> None:
        # Last in the class on purpose: it ends the class's daemon.
        _stops_cleanly(fleet.daemon)


# --- targets that never answer ---------------------------------------------------------------------------------------

HANGING_TARGETS = 3  # more than one origin's share of connections in a client pool that limits them per host


def test_targets_that_never_answer_do_not_slow_a_target_on_the_same_origin(tmp_path: Path) -> None:
    with app_in_thread(hostile_app(PageControl())) as base:
        hanging = [{"name": f"never-{i}", "url": f"{base}/never", "timeout": "3s"} for i in range(HANGING_TARGETS)]
        config = {"poll_interval": POLL, "targets": [{"name": GOOD, "url": f"{base}/page"}, *hanging]}
        with running_daemon(tmp_path, config) as daemon:
            _settled(daemon, GOOD, "up", lambda t: t["up"])
            # At 500 ms (±10%) four new successes fit in 2.2 s; a poll that waits for the 3 s timeouts gets one or
            # two in 4 s.
            _successes(daemon, (GOOD,), count=4, timeout_s=4.0)
            never = _settled(daemon, "never-0", "timed out", lambda t: t["last_failure"] is not None)
            assert (never["up"], never["last_failure"]) == (False, "timeout"), never
            _stops_cleanly(daemon)


# --- a 7 MB page of 60,000 engine instances ------------------------------------------------------------------------

HEALTHZ_BOUND_S = 1.0
HEALTHZ_WINDOW_S = 5.0


def _healthz_latency(daemon: DaemonProcess) -> float:
    started = time.monotonic()
    try:
        status, _ = http("GET", daemon.url + "/healthz", timeout_s=HEALTHZ_BOUND_S * 2)
    except OSError:
        return float("inf")
    return time.monotonic() - started if status == 200 else float("inf")


def test_a_page_of_60000_instances_costs_only_its_own_target(tmp_path: Path) -> None:
    with app_in_thread(hostile_app(PageControl())) as base:
        config = {
            "poll_interval": "1s",
            "timeout": "3s",
            "max_response_size": "16MiB",
            # Raised so the page is read far enough to meet the instance cap (the series cap would stop it first).
            "max_series_per_target": 1_000_000,
            "targets": [{"name": "huge", "url": f"{base}/huge"}, {"name": GOOD, "url": f"{base}/page"}],
        }
        with running_daemon(tmp_path, config) as daemon:
            huge = _settled(daemon, "huge", "refused", lambda t: t["last_failure"] is not None)
            assert (huge["up"], huge["last_failure"]) == (False, "too_many_instances"), huge
            reads_before = huge["failures_total"].get("too_many_instances", 0)
            good_before = (_target(daemon.state(), GOOD) or {}).get("last_success_timestamp")
            latencies = []
            deadline = time.monotonic() + HEALTHZ_WINDOW_S
            while time.monotonic() < deadline:
                latencies.append(_healthz_latency(daemon))
                time.sleep(0.2)  # the pace of the probe, not a wait for a condition
            state = daemon.state()
            huge, good = _target(state, "huge") or {}, _target(state, GOOD) or {}
            # A read of the page costs seconds of parsing: at least one ends inside the window.
            assert huge["failures_total"].get("too_many_instances", 0) > reads_before, (
                f"the huge page was not read again during the window: {huge}"
            )
            slow = [f"{s:.2f}" for s in latencies if s >= HEALTHZ_BOUND_S]
            assert not slow, f"/healthz took over {HEALTHZ_BOUND_S:g} s in {len(slow)} of {len(latencies)}: {slow}"
            assert good["up"] and good["last_success_timestamp"] != good_before, good
            assert state["taken_at"] - good["last_success_timestamp"] < 3.0, (state["taken_at"], good)
            _stops_cleanly(daemon)


# --- file_sd: half-written files, bad addresses, one name twice ----------------------------------------------------

GOOD_FILE_TARGETS = ("file-a", "file-b")
TWIN = "twin"


@dataclass
class FileFleet:
    daemon: DaemonProcess
    workdir: Path
    address: str


@pytest.fixture(scope="class")
def file_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileFleet]:
    workdir = tmp_path_factory.mktemp("file_sd")
    with app_in_thread(hostile_app(PageControl())) as base:
        address = base.removeprefix("http://")

        def group(name: str, where: str = address) -> dict[str, Any]:
            return {"targets": [where], "labels": {"target": name, "__metrics_path__": "/page"}}

        (workdir / "targets.json").write_text(json.dumps([group(n) for n in GOOD_FILE_TARGETS], indent=1))
        (workdir / "bad.json").write_text(json.dumps([{"targets": ["127.0"], "labels": {"__metrics_path__": "/page"}}]))
        (workdir / "dup1.json").write_text(json.dumps([group(TWIN)]))
        (workdir / "dup2.json").write_text(json.dumps([group(TWIN)]))
        config = {
            "poll_interval": POLL,
            "timeout": "1s",
            "discovery": {"files": ["targets.json", "bad.json", "dup1.json", "dup2.json"]},
        }
        with running_daemon(workdir, config) as daemon:
            yield FileFleet(daemon, workdir, address)


class TestFileDiscovery:
    def test_a_half_written_file_keeps_its_last_good_targets_and_is_reported_once(self, file_fleet: FileFleet) -> None:
        daemon = file_fleet.daemon
        for name in GOOD_FILE_TARGETS:
            _settled(daemon, name, "up", lambda t: t["up"])
        names_before = {t["target"] for t in daemon.state()["targets"]}
        path = file_fleet.workdir / "targets.json"
        text = path.read_text()
        warned_before = len(_log_lines(daemon, r"targets\.json"))
        path.write_text(text[: text.index('"file-b"') + 4])  # in place, cut inside a string: it does not parse
        broken_at = daemon.state()["taken_at"]
        names_seen: set[str] = set()

        def read_since(state: dict[str, Any]) -> bool:
            names_seen.update(t["target"] for t in state["targets"])
            stamps = [(_target(state, name) or {}).get("last_success_timestamp") or 0 for name in GOOD_FILE_TARGETS]
            return all(stamp > broken_at + 4 * POLL_S for stamp in stamps)

        daemon.wait_for_state(read_since, CONDITION_TIMEOUT_S, f"{GOOD_FILE_TARGETS} polled 4 times after the break")
        assert names_seen == names_before, f"targets appeared or went: {names_seen ^ names_before}"
        warned = _log_lines(daemon, r"targets\.json")[warned_before:]
        assert len(warned) == 1 and "WARNING" in warned[0], warned

    def test_an_address_that_is_not_host_port_is_no_target(self, file_fleet: FileFleet) -> None:
        daemon = file_fleet.daemon
        _settled(daemon, TWIN, "up", lambda t: t["up"])  # discovery has run and its targets are polled
        names = sorted(t["target"] for t in daemon.state()["targets"])
        assert names == sorted((*GOOD_FILE_TARGETS, TWIN)), f"127.0 is not host:port, yet targets are {names}"
        assert _log_lines(daemon, r"bad\.json.*127\.0"), "no message names bad.json and its address"

    def test_one_name_in_two_files_is_one_target_and_both_files_are_named(self, file_fleet: FileFleet) -> None:
        daemon = file_fleet.daemon
        _settled(daemon, TWIN, "up", lambda t: t["up"])
        assert [t["target"] for t in daemon.state()["targets"]].count(TWIN) == 1
        up = [labels for labels, _ in _samples(daemon, "plimsoll_target_up") if labels.get("target") == TWIN]
        assert len(up) == 1, up
        series = Counter((sample.name, tuple(sorted(sample.labels.items()))) for sample in _exposition(daemon))
        assert [s for s, n in series.items() if n > 1] == []
        both = [line for line in _log_lines(daemon, r"dup1\.json") if "dup2.json" in line]
        assert both, "no message names both dup1.json and dup2.json"


FILE_COUNT = 2_000
# Re-reading 2,000 small files costs about 2 s here (PyYAML's Python loader, ~1 ms a file); looking at whether they
# changed costs a few milliseconds.
CYCLE_BOUND_S = 0.2


def _poll_duration(daemon: DaemonProcess) -> float:
    (sample,) = [v for _, v in _samples(daemon, "plimsoll_poll_duration_seconds")]
    return sample


def test_file_sd_files_are_re_read_only_when_they_change(tmp_path: Path) -> None:
    groups = [{"targets": [], "labels": {"engine": "vllm", "team": f"capacity-{i}"}} for i in range(2)]
    folder = tmp_path / "targets"
    folder.mkdir()
    for i in range(FILE_COUNT):
        (folder / f"{i:04}.json").write_text(json.dumps(groups))
    config = {"poll_interval": POLL, "discovery": {"files": ["targets/*.json"]}}
    with running_daemon(tmp_path, config) as daemon:
        _ready(daemon)
        first_taken_at = daemon.state()["taken_at"]
        first = _poll_duration(daemon)
        later: dict[float, float] = {}  # taken_at of a later cycle -> the gauge read after it

        def later_cycles(state: dict[str, Any]) -> bool:
            if state["taken_at"] != first_taken_at:
                later[state["taken_at"]] = _poll_duration(daemon)
            return len(later) >= 3

        daemon.wait_for_state(later_cycles, CONDITION_TIMEOUT_S, "3 poll cycles after the first")
        slow = sorted(f"{d:.3f}" for d in later.values() if d >= CYCLE_BOUND_S)
        assert not slow, f"cycles after the first read took {slow} s (the first: {first:.3f} s)"
        _stops_cleanly(daemon)


# --- no config: the port scan --------------------------------------------------------------------------------------


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((LOOPBACK, port)) == 0


def test_without_a_config_only_ports_that_answer_become_targets(tmp_path: Path) -> None:
    busy = [port for port in SCANNED_PORTS if _listening(port)]
    if busy:
        pytest.skip(f"something listens on {busy} on this machine: a scan may rightly keep it")
    with running_daemon(tmp_path, None) as daemon:
        _ready(daemon)
        down = [t["target"] for t in daemon.state()["targets"] if not t["up"]]
        assert down == [], f"ports with nothing behind them are targets: {down}"
        _stops_cleanly(daemon)
