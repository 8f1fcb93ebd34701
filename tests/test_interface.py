"""The user-facing interface, recorded: what a move of code between modules must leave exactly as it was.

Compared with the files in tests/data/interface/: the `--help` text of `plimsoll` and of each command (at 100
columns), the metric names the daemon serves on /metrics, the key paths of /api/v1/state, of a loadtest's
result.json and of `plimsoll plan --format json` (values dropped; `a[].b` is key b of a list's items).

A deliberate change of the interface is recorded again with

    PLIMSOLL_RECORD_INTERFACE=1 .venv/bin/pytest -q -p no:randomly tests/test_interface.py

which writes the files instead of comparing; review their diff before committing it.
"""

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import main
from tests.conftest import TESTS
from tests.daemon.pages import serve_daemon
from tests.loadtest.fake_openai import Behaviour
from tests.loadtest.test_cli import VLLM_PAGE, fake_server, loadtest_args

RECORDED = TESTS / "data" / "interface"
RECORD = os.environ.get("PLIMSOLL_RECORD_INTERFACE") == "1"
COMMANDS = ("run", "probe", "check-config", "plan", "generate", "loadtest", "status", "autoscale", "autoscale replay")


def _matches_record(name: str, text: str) -> None:
    path = RECORDED / name
    if RECORD:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} is missing: record it with PLIMSOLL_RECORD_INTERFACE=1"
    assert text == path.read_text(), f"differs from {path} (a deliberate change: PLIMSOLL_RECORD_INTERFACE=1)"


def _sorted_json(items: set[str]) -> str:
    return json.dumps(sorted(items), indent=1) + "\n"


def key_paths(value: Any, prefix: str = "") -> Iterator[str]:
    """Every key's path in a JSON document; a list's items share one path (`a[]`), their keys united."""
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from key_paths(inner, path)
    elif isinstance(value, list):
        for item in value:
            yield from key_paths(item, f"{prefix}[]")


@pytest.fixture(autouse=True)
def _fixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The flags' environment twins show in --help as defaults, and argparse wraps at the terminal's width.
    for name in [n for n in os.environ if n.startswith("PLIMSOLL_") and n != "PLIMSOLL_RECORD_INTERFACE"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "100")


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_help_texts(capsys: pytest.CaptureFixture[str]) -> None:
    texts = [_help(capsys)] + [_help(capsys, *command.split()) for command in COMMANDS]
    _matches_record("help.txt", "\f\n".join(texts))


def test_metric_names_and_state_keys() -> None:
    async def check(client: TestClient) -> tuple[str, dict[str, Any]]:
        metrics = await (await client.get("/metrics")).text()
        state = await (await client.get("/api/v1/state")).json()
        return metrics, state

    metrics, state = serve_daemon(check)
    names = {family.name for family in text_string_to_metric_families(metrics)}
    _matches_record("metrics.json", _sorted_json(names))
    _matches_record("state.json", _sorted_json(set(key_paths(state))))


def test_loadtest_result_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    with fake_server(Behaviour(itl_seconds=0.001, metrics_page=VLLM_PAGE)) as fake:
        flags = ("--concurrency", "1", "--model", "llama-3.1-8b", "--out", str(out), "--format", "json")
        assert main(loadtest_args(fake.url, "ttft=500ms,itl=50ms", *flags)) == 0
    capsys.readouterr()
    _matches_record("loadtest-result.json", _sorted_json(set(key_paths(json.loads((out / "result.json").read_text())))))


@pytest.mark.parametrize(
    ("name", "flags"),
    [("plan.json", ()), ("plan-fleet.json", ("--concurrency", "64", "--context", "4096"))],
)
def test_plan_json_keys(name: str, flags: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "H100", *flags, "--format", "json"]) == 0
    _matches_record(name, _sorted_json(set(key_paths(json.loads(capsys.readouterr().out)))))
