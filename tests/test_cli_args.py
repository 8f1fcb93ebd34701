"""exporter/cli_args.py's environment twins: the variable stands in for its flag, a required one included, and a bad
value in it is an error naming the variable."""

import argparse
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.cli_args import env_twin, positive_int


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twins")
    env_twin(parser, "--count", "PLIMSOLL_TEST_COUNT", type=positive_int)
    env_twin(parser, "--config", "PLIMSOLL_TEST_CONFIG", required=True)
    return parser


def test_the_variable_gives_a_required_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLIMSOLL_TEST_CONFIG", "from-env.yaml")
    assert _parser().parse_args([]).config == "from-env.yaml"
    assert _parser().parse_args(["--config", "typed.yaml"]).config == "typed.yaml"


def test_a_required_flag_without_its_variable_is_still_required(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PLIMSOLL_TEST_CONFIG", raising=False)
    with pytest.raises(SystemExit):
        _parser().parse_args([])
    assert "--config" in capsys.readouterr().err


def test_a_bad_value_in_the_variable_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PLIMSOLL_TEST_CONFIG", "c.yaml")
    monkeypatch.setenv("PLIMSOLL_TEST_COUNT", "0")
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --count: PLIMSOLL_TEST_COUNT='0' (the environment): 0 must be at least 1" in err
    # Typed on the command line, the same value is the flag's, as argparse words it.
    with pytest.raises(SystemExit):
        _parser().parse_args(["--count", "x"])
    assert "argument --count: invalid positive_int value: 'x'" in capsys.readouterr().err
    assert _parser().parse_args(["--count", "3"]).count == 3  # the flag wins over a bad variable


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PLIMSOLL_TEST_COUNT", "")
    monkeypatch.setenv("PLIMSOLL_TEST_CONFIG", "")
    with pytest.raises(SystemExit):  # still required: "" is no config file
        _parser().parse_args([])
    assert "the following arguments are required: --config" in capsys.readouterr().err
    assert _parser().parse_args(["--config", "c.yaml"]).count is None


def test_an_empty_poll_interval_variable_leaves_the_configs_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "plimsoll.yaml"
    config.write_text("poll_interval: 7s\ntargets: [{url: 'http://127.0.0.1:8000/metrics'}]\nnvml: false\n")
    monkeypatch.setenv("PLIMSOLL_POLL_INTERVAL", "")
    assert main(["run", "--config", str(config), "--check-only"]) == 0, capsys.readouterr().err


def test_plimsoll_config_gives_autoscale_replay_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "plimsoll.yaml"
    config.write_text(
        "autoscaling:\n  workloads:\n    - {model: m, name: w, namespace: n, min_replicas: 1, max_replicas: 4, "
        "startup: 60s, knee_concurrency: 4}\n"
    )
    demand = tmp_path / "demand.csv"
    demand.write_text("time,demand\n0,1\n60,2\n")
    monkeypatch.setenv("PLIMSOLL_CONFIG", str(config))
    assert main(["autoscale", "replay", "--demand", str(demand), "--format", "json"]) == 0
    assert '"workloads"' in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv", [["plan", "--model", "llama-3.1-8b", "--tp", "abc"], ["plan", "--bogus"], ["status", "--watch", "x", "y"]]
)
def test_a_refused_argument_is_one_line_pointing_at_help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert len(err.splitlines()) == 1 and err.rstrip().endswith("--help)"), err
