"""Bad configs and flags, through the real `plimsoll` command: every problem named in one run, exit 2, no traceback,
no secret echoed, and hostile YAML refused quickly."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.daemon_process import running_daemon
from tests.support.prometheus import LOOPBACK, free_port, wait_until

COMMAND_TIMEOUT_S = 20.0
PASSWORD = "s3cret-pw-7731"


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def plimsoll(*args: str) -> Outcome:
    """The CLI as users run it. A daemon that starts when it should have refused its flags is killed at the
    deadline and reaped by subprocess.run, and the test then fails on the exit code."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "exporter", *args],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"plimsoll {' '.join(args)} still running after {COMMAND_TIMEOUT_S}s") from expired
    return Outcome(done.returncode, done.stdout, done.stderr)


def refused(outcome: Outcome) -> str:
    """The error output of a run that must have been refused as bad input."""
    assert "Traceback" not in outcome.text, outcome.text
    assert outcome.code == 2, f"exit {outcome.code}, expected 2:\n{outcome.text}"
    return outcome.err


def write(tmp_path: Path, text: str, name: str = "plimsoll.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_check_config_names_every_problem_of_every_section_in_one_run(tmp_path):
    config = write(
        tmp_path,
        """
        listen: "nowhere"
        poll_interval: [5s]
        nvml: "sometimes"
        colour: blue
        targets:
          - url: "localhost:8000"
            engine: vlm
          - name: llama
            url: http://127.0.0.1:8001/metrics
            model: llama-3.1-8b
            deployment: {tensor_parallel: 3}
        slos:
          ttft: {threshold: 500, objective: 99}
        saturation: {kv_usage: 1.5, lead_time: {minutes: 15}}
        discovery:
          files: targets.json
        """,
    )
    err = refused(plimsoll("check-config", str(config)))
    expected = [
        f"{config}: listen:",
        f"{config}: poll_interval: expected a duration such as 5s, got a list",
        f"{config}: nvml:",
        f"{config}: colour: unknown field",
        f"{config}: targets[0].url: 'localhost:8000' is not a URL",
        f"{config}: targets[0].engine: 'vlm' is not one of",
        f"{config}: targets[1].deployment: --tp 3 does not divide the model's 32 attention heads",
        f"{config}: slos.ttft.threshold: 500 has no unit: write 500s",
        f"{config}: slos.ttft.objective: 99 is not a ratio",
        f"{config}: saturation.kv_usage:",
        f"{config}: saturation.lead_time: expected a duration such as 5s, got a map",
        f"{config}: discovery.files: expected a list",
    ]
    missing = [line for line in expected if line not in err]
    assert not missing, f"not reported: {missing}\n--- stderr ---\n{err}"


@pytest.mark.parametrize(("value", "kind"), [("[5s]", "a list"), ("{seconds: 5}", "a map")])
def test_a_list_or_map_where_a_duration_belongs_is_named_not_a_traceback(tmp_path, value, kind):
    config = write(tmp_path, f"poll_interval: {value}\n")
    err = refused(plimsoll("check-config", str(config)))
    assert f"{config}: poll_interval: expected a duration such as 5s, got {kind}" in err


def test_quoted_off_turns_nvml_off_and_an_unknown_word_is_refused(tmp_path):
    from exporter.config import load_config

    assert load_config(write(tmp_path, 'nvml: "off"\n')).nvml is False
    assert load_config(write(tmp_path, 'nvml: "No"\n')).nvml is False
    assert load_config(write(tmp_path, 'nvml: "on"\n')).nvml is True
    config = write(tmp_path, 'nvml: "sometimes"\ndiscovery: {scan_local_ports: "nah"}\n')
    err = refused(plimsoll("check-config", str(config)))
    assert f"{config}: nvml: expected true or false" in err
    assert f"{config}: discovery.scan_local_ports: expected true or false" in err


def test_a_duration_without_a_unit_is_refused_with_the_fix(tmp_path):
    config = write(tmp_path, "poll_interval: 5\n")
    err = refused(plimsoll("check-config", str(config)))
    assert f"{config}: poll_interval: 5 has no unit: write 5s" in err
    err = refused(plimsoll("run", "--check-only", "--poll-interval", "5"))
    assert "--poll-interval" in err and "5 has no unit: write 5s" in err
    err = refused(plimsoll("probe", "--timeout", "3", "http://127.0.0.1:9/metrics"))
    assert "3 has no unit: write 3s" in err


def test_tensor_parallel_that_does_not_divide_the_heads_is_refused(tmp_path):
    config = write(
        tmp_path,
        """
        targets:
          - url: http://127.0.0.1:8000/metrics
            model: llama-3.1-8b
            deployment: {tensor_parallel: 3}
        """,
    )
    err = refused(plimsoll("check-config", str(config)))
    assert f"{config}: targets[0].deployment: --tp 3 does not divide the model's 32 attention heads" in err


def test_tensor_parallel_times_pipeline_parallel_must_match_the_listed_gpus(tmp_path):
    config = write(
        tmp_path,
        """
        targets:
          - url: http://127.0.0.1:8000/metrics
            model: llama-3.1-8b
            gpus: [0]
            deployment: {tensor_parallel: 2}
        """,
    )
    err = refused(plimsoll("check-config", str(config)))
    assert f"{config}: targets[0].gpus: lists 1 GPU but tensor_parallel 2 x pipeline_parallel 1 needs 2" in err


def test_a_model_that_does_not_fit_its_gpu_type_is_refused_with_the_shortfall(tmp_path):
    config = write(
        tmp_path,
        """
        targets:
          - url: http://127.0.0.1:8000/metrics
            model: llama-3.1-70b
            gpu_type: L4
        """,
    )
    err = refused(plimsoll("check-config", str(config)))
    (line,) = [line for line in err.splitlines() if f"{config}: targets[0].gpu_type: " in line]
    assert "does not fit on L4: short by" in line


def billion_laughs() -> list[str]:
    """Nine anchors, each a list of ten aliases of the one before: 10**9 strings once expanded."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for before, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{before}'] * 10)}]")
    return lines


# Loads the file in a child limited to 1 GiB of address space, timing the load alone (not the interpreter start).
_TIMED_LOAD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from exporter.config import ConfigError, load_config, parse_target_file
kind, path = sys.argv[1], sys.argv[2]
started = time.perf_counter()
try:
    if kind == "config":
        load_config(path)
    else:
        parse_target_file(open(path).read(), path)
    problems = []
except ConfigError as error:
    problems = error.problems
print(json.dumps({"seconds": time.perf_counter() - started, "problems": problems}))
"""


def timed_load(kind: str, path: Path) -> tuple[float, list[str]]:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TIMED_LOAD, kind, str(path)], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"loading {path} did not finish within 30 s") from expired
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    return answer["seconds"], answer["problems"]


def test_a_yaml_alias_bomb_is_refused_in_well_under_a_second(tmp_path):
    bomb = [*billion_laughs(), 'targets: [{url: "http://127.0.0.1:8000/metrics", engine: *i, model: *i}]']
    config = write(tmp_path, "\n".join(bomb) + "\n")
    seconds, problems = timed_load("config", config)
    assert seconds < 1.0, f"took {seconds:.2f}s"
    assert any("aliases" in p for p in problems), problems
    err = refused(plimsoll("check-config", str(config)))
    assert "aliases" in err


def test_a_file_sd_alias_bomb_is_refused_in_well_under_a_second(tmp_path):
    anchors = billion_laughs()
    group = [f"- {anchors[0]}", *(f"  {line}" for line in anchors[1:])]
    group += ['  targets: ["127.0.0.1:8000"]', "  labels: {engine: *i, model: *i}"]
    path = write(tmp_path, "\n".join(group) + "\n", "sd.yaml")
    seconds, problems = timed_load("file_sd", path)
    assert seconds < 1.0, f"took {seconds:.2f}s"
    assert any("aliases" in p for p in problems), problems


def test_a_config_over_one_mebibyte_is_refused_before_parsing(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text("# padding\n" * (2 * 1024 * 1024 // 10) + "poll_interval: 5s\n")
    err = refused(plimsoll("check-config", str(config)))
    assert "over 1 MiB" in err


def test_run_with_a_listen_address_that_is_not_host_port_says_so_on_one_line():
    err = refused(plimsoll("run", "--nvml", "off", "--listen", "nonsense"))
    assert err.strip().count("\n") == 0, err
    assert "--listen" in err and "'nonsense' is not host:port" in err


def test_run_with_a_target_that_is_not_a_url_says_so_on_one_line():
    listen = f"{LOOPBACK}:{free_port()}"
    err = refused(plimsoll("run", "--nvml", "off", "--listen", listen, "--target", "localhost:8000"))
    assert err.strip().count("\n") == 0, err
    assert "--target" in err and "'localhost:8000' is not a URL (expected http://host:port/path)" in err


def test_a_password_in_a_target_url_is_refused_and_never_echoed(tmp_path):
    url = f"http://admin:{PASSWORD}@127.0.0.1:8000/metrics"
    config = write(tmp_path, f"targets: [{{url: '{url}'}}]\n")
    outcome = plimsoll("check-config", str(config))
    err = refused(outcome)
    assert PASSWORD not in outcome.text
    assert f"{config}: targets[0].url: credentials in the URL" in err and "password_file" in err

    listen = f"{LOOPBACK}:{free_port()}"
    outcome = plimsoll("run", "--nvml", "off", "--listen", listen, "--target", url)
    refused(outcome)
    assert PASSWORD not in outcome.text

    broken = write(tmp_path, f"targets: [{{url: 'http://admin:{PASSWORD}@[::1/metrics'}}]\n", "broken.yaml")
    outcome = plimsoll("check-config", str(broken))
    refused(outcome)
    assert PASSWORD not in outcome.text

    unparsable = write(tmp_path, f"targets:\n  - url: http://admin:{PASSWORD}@127.0.0.1:8000/m: [\n", "bad.yaml")
    outcome = plimsoll("check-config", str(unparsable))
    refused(outcome)
    assert PASSWORD not in outcome.text


def test_a_password_in_a_file_sd_address_is_refused_and_never_echoed():
    from exporter.config import ConfigError, parse_target_file

    with pytest.raises(ConfigError) as error:
        parse_target_file(f'[{{"targets": ["admin:{PASSWORD}@127.0.0.1:8000"]}}]', "sd.json")
    assert PASSWORD not in str(error.value)
    assert "sd.json: [0].targets[0]: credentials in an address" in str(error.value)


def test_a_reload_keeps_the_flags_and_their_environment_twins(tmp_path):
    """The file adds a target on SIGHUP; the --target flag's target, PLIMSOLL_POLL_INTERVAL's 1s and the flag's
    target stay. Engines are closed loopback ports: each poll of one counts a refused connection."""
    closed = [f"http://{LOOPBACK}:{free_port()}/metrics" for _ in range(3)]
    config = {"targets": [{"name": "from-file", "url": closed[0]}]}
    env = {**os.environ, "PLIMSOLL_POLL_INTERVAL": "1s"}
    with running_daemon(tmp_path, config, args=["--target", closed[1]], env=env) as daemon:
        flag_target = closed[1].split("//")[1].split("/")[0]
        daemon.wait_for_state(lambda s: len(s["targets"]) == 2, 10, "the file's and the flag's targets polled")
        assert daemon.config_path is not None
        config["targets"].append({"name": "added", "url": closed[2]})
        daemon.config_path.write_text(yaml.safe_dump(config))
        daemon.signal(signal.SIGHUP)
        daemon.wait_for_state(
            lambda s: {t["target"] for t in s["targets"]} == {"from-file", "added", flag_target},
            10,
            f"after SIGHUP: from-file, added and {flag_target}",
        )

        def refused(state: dict) -> int:
            (added,) = [t for t in state["targets"] if t["target"] == "added"]
            return added["failures_total"].get("refused", 0)

        before = refused(daemon.state())
        # Three polls at 1 s take about 3 s; at the 5 s default they would take 15.
        wait_until(lambda: refused(daemon.state()) >= before + 3 or None, 8, "three polls of 'added' at 1s")
        daemon.assert_running()


# YAML escapes: a carriage return, NEL (U+0085), NUL and a line separator end a line (or the file) for some YAML
# or PromQL reader, and << >> are prometheus-adapter's template delimiters.
_NOT_LABEL_VALUES = {
    "carriage return": r'"tiny\rkind: ConfigMap"',
    "next line": r'"tiny\Nkind: ConfigMap"',
    "nul": r'"tiny\0"',
    "line separator": r'"tiny\Lkind: ConfigMap"',
    "adapter template": '"<<.Series>>"',
}


@pytest.mark.parametrize("model", _NOT_LABEL_VALUES.values(), ids=_NOT_LABEL_VALUES.keys())
def test_generate_refuses_a_model_that_is_not_a_label_value_naming_the_field_and_writes_nothing(tmp_path, model):
    config = write(
        tmp_path,
        f"""
        autoscaling:
          workloads:
            - {{model: {model}, name: vllm-tiny, namespace: inference, max_replicas: 2}}
        """,
    )
    out = tmp_path / "out"
    for command in (("check-config", str(config)), ("generate", "--config", str(config), "--out", str(out))):
        err = refused(plimsoll(*command))
        assert f"{config}: autoscaling.workloads[0].model: " in err
        assert "a label value is printable text" in err
    assert not out.exists()


@pytest.mark.parametrize("name", [r'"node-a\rfoo"', r'"node-a\x85"', '"<<.Series>>"'])
def test_check_config_refuses_a_target_name_that_is_not_a_label_value(tmp_path, name):
    config = write(tmp_path, f"targets: [{{name: {name}, url: 'http://127.0.0.1:8000/metrics'}}]\n")
    err = refused(plimsoll("check-config", str(config)))
    assert f"{config}: targets[0].name: " in err and "a label value is printable text" in err


def test_generate_takes_a_model_with_quotes_braces_and_unicode_and_every_file_reads_back_as_written(tmp_path):
    model = 'acme/"Llama" {{3.1}} \\ it\'s #1: [ünïcødé 模型] & *ref'
    workload = {"model": model, "name": "vllm-acme", "namespace": "inference", "max_replicas": 2}
    config = tmp_path / "plimsoll.yaml"
    config.write_text(yaml.safe_dump({"autoscaling": {"workloads": [workload]}}, allow_unicode=True))
    out = tmp_path / "out"
    done = plimsoll("generate", "--config", str(config), "--out", str(out))
    assert done.code == 0, done.text
    files = {path.relative_to(out).as_posix(): path.read_text() for path in out.rglob("*.yaml")}
    documents = {path: list(yaml.safe_load_all(text)) for path, text in files.items()}
    assert all(len(found) == 1 for found in documents.values()), documents
    (rule_file,) = documents["rules/plimsoll.rules.yaml"]
    labelled = [
        rule["labels"]["model"]
        for group in rule_file["groups"]
        for rule in group["rules"]
        if "labels" in rule and "model" in rule["labels"]
    ]
    assert labelled == [model]
