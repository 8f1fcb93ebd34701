"""`plimsoll autoscale replay` through the real CLI, on demand CSVs written here: what is true by construction of a
burst (the static fleet's size, the oracle never short, the scaler between the two, overflow while replicas start),
the document's keys, result.json, the cost, and every refusal as one line with exit 2 and nothing written."""

import contextlib
import json
import math
import os
import signal
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import main

KNEE = 10
STARTUP = 120
SPAN = 3600
BURST_START, BURST_END = 1200, 1800
BASE, PEAK = 10.0, 80.0


def _config(tmp_path: Path, workloads: str, extra: str = "") -> Path:
    path = tmp_path / "plimsoll.yaml"
    path.write_text(f"{extra}autoscaling:\n  margin: 0.8\n  demand_window: 10m\n  workloads:\n{workloads}")
    return path


def _workload(name: str, model: str, knee: str = f"knee_concurrency: {KNEE}", more: str = "") -> str:
    lines = [
        f"model: {model}",
        f"name: {name}",
        "namespace: inference",
        "min_replicas: 1",
        "max_replicas: 20",
        f"startup: {STARTUP}s",
        knee,
        more,
    ]
    return "    - " + "\n      ".join(line for line in lines if line) + "\n"


LLAMA = _workload("vllm-llama", "llama", more="gpu: H100-80GB\n      gpus_per_replica: 2")
PRICING = "pricing:\n  gpu_hour:\n    H100-80GB: 2.5\n"


def _burst_csv(tmp_path: Path) -> Path:
    """An hour at 15 s steps: BASE requests in flight, PEAK for ten minutes from BURST_START, a step up far
    faster than a replica starts."""
    rows = ["time,demand"]
    for time in range(0, SPAN + 1, 15):
        rows.append(f"{time},{PEAK if BURST_START <= time < BURST_END else BASE}")
    path = tmp_path / "burst.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _replay(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["autoscale", "replay", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _json(capsys: pytest.CaptureFixture[str], config: Path, demand: Path, *argv: str) -> dict[str, Any]:
    status, out, _ = _replay(capsys, "--config", str(config), "--demand", str(demand), "--format", "json", *argv)
    assert status == 0
    document: dict[str, Any] = json.loads(out)
    return document


def test_a_burst_against_the_baselines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(capsys, _config(tmp_path, LLAMA, PRICING), _burst_csv(tmp_path))
    (workload,) = document["workloads"]
    static, oracle = workload["baselines"]["static_peak"], workload["baselines"]["oracle"]
    # The static fleet is the peak's replicas all along, within min and max replicas.
    assert static["peak_replicas"] == min(max(math.ceil(PEAK / KNEE), 1), 20)
    assert static["replica_hours"] == pytest.approx(static["peak_replicas"] * SPAN / 3600)
    assert static["overflow_seconds"] == 0
    # The oracle has what is needed ready at every moment: never short.
    assert oracle["overflow_seconds"] == 0
    assert oracle["overflow_request_seconds"] == 0
    # One short burst: the scaler costs less than the peak all along, and more than the oracle.
    assert oracle["replica_hours"] < workload["replica_hours"] < static["replica_hours"]
    # The burst arrives at once: no replica asked for it serves before a start-up time has passed.
    assert workload["overflow_seconds"] >= STARTUP
    assert workload["overflow_request_seconds"] >= STARTUP * (PEAK - math.ceil(BASE / (KNEE * 0.8)) * KNEE)
    assert workload["peak_replicas"] >= static["peak_replicas"]
    scale_ups = [d for d in workload["decisions"] if d["replicas"] > d["current_replicas"]]
    assert scale_ups[0]["time"] == BURST_START
    assert scale_ups[0]["metric"] == "peak_demand"
    assert scale_ups[0]["value"] == PEAK


def test_the_document_keys_and_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(capsys, _config(tmp_path, LLAMA, PRICING), _burst_csv(tmp_path))
    (workload,) = document["workloads"]
    for key in ("replica_hours", "cost", "overflow_seconds", "overflow_request_seconds", "peak_replicas"):
        assert key in workload
        for baseline in ("static_peak", "oracle"):
            assert key in workload["baselines"][baseline]
    assert set(workload["decisions"][0]) >= {"time", "metric", "value", "proposed", "replicas", "reason"}
    assert workload["trace"]["samples"] == SPAN // 15 + 1
    # Two H100s a replica at 2.5 per GPU-hour.
    assert workload["replica_hour_price"] == 5.0
    assert workload["cost"] == pytest.approx(workload["replica_hours"] * 5.0)
    static = workload["baselines"]["static_peak"]
    assert static["cost"] == pytest.approx(static["replica_hours"] * 5.0)


def test_without_a_gpu_or_a_price_there_is_no_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demand = _burst_csv(tmp_path)
    no_gpu = _json(capsys, _config(tmp_path, _workload("vllm-llama", "llama"), PRICING), demand)["workloads"][0]
    assert no_gpu["cost"] is None and no_gpu["baselines"]["oracle"]["cost"] is None
    assert "names no gpu" in no_gpu["unpriced"]
    unpriced = _json(capsys, _config(tmp_path, LLAMA), demand)["workloads"][0]
    assert unpriced["cost"] is None
    assert unpriced["unpriced"] == "pricing.gpu_hour has no price for H100-80GB"


def test_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, demand = _config(tmp_path, LLAMA, PRICING), _burst_csv(tmp_path)
    status, out, err = _replay(capsys, "--config", str(config), "--demand", str(demand))
    assert status == 0 and err == ""
    for words in ("inference/vllm-llama (llama)", "generated scaler", "static at peak", "oracle", "+0:20:00"):
        assert words in out


def test_the_workload_named_among_several(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, LLAMA + _workload("vllm-qwen", "qwen", knee="knee_concurrency: 40"))
    document = _json(capsys, config, _burst_csv(tmp_path), "--workload", "vllm-qwen")
    (workload,) = document["workloads"]
    assert (workload["name"], workload["knee_concurrency"]) == ("vllm-qwen", 40)
    assert workload["baselines"]["static_peak"]["peak_replicas"] == math.ceil(PEAK / 40)


def test_out_writes_result_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "replay"
    document = _json(capsys, _config(tmp_path, LLAMA, PRICING), _burst_csv(tmp_path), "--out", str(out))
    assert json.loads((out / "result.json").read_text()) == document
    assert sorted(os.listdir(out)) == ["report.html", "result.json"]  # no temporary file left beside them


def test_a_demand_file_name_not_in_utf8_is_written_with_replacement_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demand = _burst_csv(tmp_path).rename(tmp_path / os.fsdecode(b"burst-\xff.csv"))
    out = tmp_path / "replay"
    status, _, err = _replay(
        capsys, "--config", str(_config(tmp_path, LLAMA)), "--demand", str(demand), "--out", str(out)
    )
    assert status == 0, err
    assert json.loads((out / "result.json").read_text())["source"]["demand"] == f"{tmp_path}/burst-\ufffd.csv"
    assert "burst-\ufffd.csv" in (out / "report.html").read_text()


def test_a_gap_longer_than_the_demand_window_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two hours without a sample: the peak signal forgets the demand after the 10-minute window while the figures
    hold it, so the overflow across the gap is the trace's, and the answer says so."""
    demand = tmp_path / "gap.csv"
    demand.write_text("time,demand\n0,50\n15,50\n7215,50\n7230,50\n")
    config, out = _config(tmp_path, LLAMA), tmp_path / "replay"
    (workload,) = _json(capsys, config, demand, "--out", str(out))["workloads"]
    assert workload["trace"]["gaps"] == [[15.0, 7215.0]]
    assert workload["overflow_seconds"] == 7215 - 1455 + 15  # from 4 replicas ready (40) to the end: the gap's
    words = "1 gap(s) without a sample longer than the demand window, the longest 2:00:00 (h:mm:ss) from +0:00:15"
    status, printed, _ = _replay(capsys, "--config", str(config), "--demand", str(demand))
    assert status == 0 and words in printed
    assert words in (out / "report.html").read_text()
    steady = _json(capsys, config, _burst_csv(tmp_path))["workloads"][0]
    assert steady["trace"]["gaps"] == []


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    status, out, err = _replay(capsys, *argv)
    assert status == 2 and out == ""
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_a_bad_csv_is_refused_and_nothing_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demand = tmp_path / "bad.csv"
    demand.write_text("time,demand\n0,1\n15,lots\n")
    out = tmp_path / "replay"
    err = _refused(capsys, "--config", str(_config(tmp_path, LLAMA)), "--demand", str(demand), "--out", str(out))
    assert f"{demand}:3: demand: 'lots' is not a number" in err
    assert not out.exists()


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demand = tmp_path / "latin1.csv"
    demand.write_bytes(b"time,demand\n0,1\n15,\xe9\n")
    err = _refused(capsys, "--config", str(_config(tmp_path, LLAMA)), "--demand", str(demand))
    assert "not UTF-8" in err


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing file", "cannot read it (No such file or directory)"),
        ("a directory", "cannot read it"),
        ("unknown workload", "--workload vllm-nope: not in autoscaling.workloads"),
        ("several, none named", "name it with --workload (one of vllm-llama, vllm-qwen)"),
        ("no knee", "no knee_concurrency"),
        ("no autoscaling", "no autoscaling section"),
        ("bad gpu", "autoscaling.workloads[0].gpu"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expected: str) -> None:
    demand = _burst_csv(tmp_path)
    qwen = _workload("vllm-qwen", "qwen")
    config, more = _config(tmp_path, LLAMA), []
    if case == "missing file":
        demand = tmp_path / "absent.csv"
    elif case == "a directory":
        demand = tmp_path
    elif case == "unknown workload":
        more = ["--workload", "vllm-nope"]
    elif case == "several, none named":
        config = _config(tmp_path, LLAMA + qwen)
    elif case == "no knee":
        config = _config(tmp_path, _workload("vllm-llama", "llama", knee=""))
    elif case == "no autoscaling":
        config.write_text("listen: 127.0.0.1:19842\n")
    elif case == "bad gpu":
        config = _config(tmp_path, _workload("vllm-llama", "llama", more="gpu: H1OO"))
    out = tmp_path / "replay"
    err = _refused(capsys, "--config", str(config), "--demand", str(demand), "--out", str(out), *more)
    assert expected in err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--demand", "x.csv"],  # no --config
        ["--config", "plimsoll.yaml"],  # no trace
        ["--config", "plimsoll.yaml", "--demand", "x.csv", "--format", "yaml"],
        ["--config", "plimsoll.yaml", "--demand", "x.csv", "--prometheus", "http://127.0.0.1:9"],
        ["--config", "plimsoll.yaml", "--prometheus", "not a url"],
        ["--config", "plimsoll.yaml", "--prometheus", "http://127.0.0.1:9", "--since", "a week"],
        ["--config", "plimsoll.yaml", "--demand", "x.csv", "--out", ""],  # an unset variable: not the working folder
    ],
)
def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    monkeypatch.delenv("PLIMSOLL_CONFIG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["autoscale", "replay", *argv])
    assert exit_.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_file_over_the_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cut mid-character by the bounded read, an over-long file must still read as too long, never as not UTF-8.
    monkeypatch.setattr("exporter.autoscale.command.MAX_DEMAND_BYTES", 16)
    demand = tmp_path / "long.csv"
    demand.write_text("time,demand\n0,1\né\n")  # the read's 17th byte is the first of é's two
    err = _refused(capsys, "--config", str(_config(tmp_path, LLAMA)), "--demand", str(demand))
    assert f"{demand}: over" in err


@contextlib.contextmanager
def _prometheus(status: int = 200) -> Iterator[str]:
    """A stand-in for Prometheus' query_range on loopback: the burst's demand on every step asked for (its times
    from the query's start), no queue series; `status` other than 200 answers an error."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            start, end, step = (float(query[key][0]) for key in ("start", "end", "step"))
            values = []
            if query["query"][0].startswith("sum(model:plimsoll_demand_requests:sum"):
                times = [start + k * step for k in range(int((end - start) / step) + 1)]
                values = [[t, str(PEAK if BURST_START <= t - start < BURST_END else BASE)] for t in times]
            result = [{"metric": {}, "values": values}] if values else []
            body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except ConnectionError:  # the client drops its other query once one has failed
                pass

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_trace_from_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, LLAMA + _workload("vllm-qwen", "qwen", knee="knee_concurrency: 40"), PRICING)
    with _prometheus() as url:
        status, out, _ = _replay(
            capsys, "--config", str(config), "--prometheus", url, "--since", "1h", "--format", "json"
        )
    assert status == 0
    document = json.loads(out)
    assert document["source"] == {"prometheus": url, "since_seconds": 3600.0, "step_seconds": 15.0}
    # Every workload without --workload, each over its own model's trace.
    assert [workload["name"] for workload in document["workloads"]] == ["vllm-llama", "vllm-qwen"]
    for workload, knee in zip(document["workloads"], (KNEE, 40), strict=True):
        assert workload["trace"]["samples"] == SPAN // 15 + 1
        assert workload["baselines"]["static_peak"]["peak_replicas"] == math.ceil(PEAK / knee)
        assert workload["baselines"]["oracle"]["overflow_seconds"] == 0
        assert workload["overflow_seconds"] >= STARTUP
        assert workload["signals"] == ["peak_demand"]  # no queue series answered: the queue is not modelled


def test_a_prometheus_that_fails_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "replay"
    with _prometheus(status=503) as url:
        err = _refused(capsys, "--config", str(_config(tmp_path, LLAMA)), "--prometheus", url, "--out", str(out))
    assert url in err
    assert not out.exists()


def test_since_is_for_prometheus_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, demand = _config(tmp_path, LLAMA), _burst_csv(tmp_path)
    err = _refused(capsys, "--config", str(config), "--demand", str(demand), "--since", "1h")
    assert "--since: applies to --prometheus only" in err


def test_out_that_cannot_be_written_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config, demand = _config(tmp_path, LLAMA), _burst_csv(tmp_path)
    err = _refused(capsys, "--config", str(config), "--demand", str(demand), "--out", str(blocker))
    assert f"--out {blocker}: cannot write" in err


def test_a_report_that_cannot_be_written_leaves_the_previous_result_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "replay"
    (out / "report.html").mkdir(parents=True)  # in the way of the new report
    (out / "result.json").write_text("a previous run's result\n")
    config, demand = _config(tmp_path, LLAMA), _burst_csv(tmp_path)
    err = _refused(capsys, "--config", str(config), "--demand", str(demand), "--out", str(out))
    assert f"--out {out}: cannot write {out / 'report.html'} (a folder is in the way of the file)" in err
    assert (out / "result.json").read_text() == "a previous run's result\n"
    assert sorted(os.listdir(out)) == ["report.html", "result.json"]  # no temporary file left beside them


def test_the_docs_example_is_this_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/autoscaling.md shows this test's burst replayed: the table there must be what the command prints."""
    config, demand = _config(tmp_path, LLAMA, PRICING), _burst_csv(tmp_path)
    status, out, _ = _replay(capsys, "--config", str(config), "--demand", str(demand))
    assert status == 0
    docs = (Path(__file__).parents[2] / "docs" / "autoscaling.md").read_text()
    shown = docs.split("$ plimsoll autoscale replay --config plimsoll.yaml --demand burst.csv --out replay\n")[1]
    assert shown.split("\nwrote replay/result.json\n")[0].splitlines() == [line.rstrip() for line in out.splitlines()]


def test_ctrl_c_while_prometheus_answers_is_exit_130_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    interrupted, release = threading.Event(), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # never answers: Ctrl-C comes while the replay waits on the query
            if not interrupted.is_set():
                interrupted.set()
                os.kill(os.getpid(), signal.SIGINT)
            release.wait(10)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    out = tmp_path / "replay"
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        status = main(
            ["autoscale", "replay", "--config", str(_config(tmp_path, LLAMA)), "--prometheus", url, "--out", str(out)]
        )
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C came out of main as a traceback")
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join()
    assert interrupted.is_set() and status == 130
    assert capsys.readouterr().err == "plimsoll autoscale: interrupted\n"
    assert not out.exists()
