"""docs/autoscaling.md's worked example ("A worked example: a day with a burst") cannot rot: the trace is what
`bench.diurnal_trace` writes, the tuned config is the original with the printed change pasted, every command shown
there is run again through the real CLI and must print exactly the lines shown, and the summary table holds the
figures those runs wrote."""

import contextlib
import io
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import diurnal_trace
from exporter.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "autoscaling.md"
EXAMPLES = ROOT / "docs" / "examples"
TRACE = EXAMPLES / "diurnal-burst.csv"
CONFIG = EXAMPLES / "diurnal-burst.yaml"
TUNED = EXAMPLES / "diurnal-burst-tuned.yaml"
SECTION = "### A worked example: a day with a burst\n"
OUT = "replay"  # the --out the page shows; the tests write under tmp_path instead


def _section() -> str:
    text = DOCS.read_text()
    start = text.index(SECTION)
    following = text.find("\n#", start + len(SECTION))
    return text[start:] if following < 0 else text[start:following]


def _shown() -> list[tuple[str, list[str]]]:
    """Each `$ plimsoll ...` line of the section's code blocks, and the lines shown after it up to the next command or
    the block's end."""
    commands: list[tuple[str, list[str]]] = []
    inside = False
    for line in _section().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside and line.startswith("$ plimsoll "):
            commands.append((line[2:], []))
        elif inside and commands:
            commands[-1][1].append(line)
    return commands


def _run(command: str, out: Path) -> list[str]:
    """What `command` prints, run from the repository root as the page shows it: its pipe into `head -N` or
    `sed -n '/^X/,$p'` applied here, and its --out pointed at `out`, named as the page names it."""
    pipeline = command.split(" | ")
    argv = shlex.split(pipeline[0])[1:]
    if "--out" in argv:
        argv[argv.index("--out") + 1] = str(out)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert main(argv) == 0, stderr.getvalue()
    lines = [line.rstrip() for line in stdout.getvalue().splitlines()]
    for stage in pipeline[1:]:
        words = shlex.split(stage)
        if words[0] == "head":
            lines = lines[: int(words[1].lstrip("-"))]
        else:
            assert words[:2] == ["sed", "-n"] and words[2].startswith("/^") and words[2].endswith("/,$p"), stage
            first = next(index for index, line in enumerate(lines) if line.startswith(words[2][2:-4]))
            lines = lines[first:]
    if len(pipeline) == 1:  # stderr reaches the terminal only where nothing is piped
        lines += [line.replace(str(out), OUT) for line in stderr.getvalue().splitlines()]
    return lines


@pytest.fixture(scope="module")
def at_root() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        yield


@pytest.mark.usefixtures("at_root")
def test_every_command_shown_prints_what_is_shown(tmp_path: Path) -> None:
    shown = _shown()
    assert len(shown) == 4, [command for command, _ in shown]
    for index, (command, lines) in enumerate(shown):
        assert _run(command, tmp_path / f"out{index}") == lines, command


@pytest.mark.usefixtures("at_root")
def test_the_summary_table_holds_the_figures_of_the_runs(tmp_path: Path) -> None:
    def figures(config: Path) -> dict[str, Any]:
        out = tmp_path / config.stem
        _run(f"plimsoll autoscale replay --config {config} --demand {TRACE} --out {out}", out)
        (workload,) = json.loads((out / "result.json").read_text())["workloads"]
        document: dict[str, Any] = workload
        return document

    config, tuned = figures(CONFIG), figures(TUNED)
    expected = {
        "static at the peak": config["baselines"]["static_peak"],
        "generated scaler, the config (margin 0.8, demand_window 10m)": config,
        "generated scaler, tuned (margin 1, demand_window 5m)": tuned,
        "oracle": config["baselines"]["oracle"],
    }
    assert tuned["baselines"] == config["baselines"]
    table = [line for line in _section().splitlines() if line.startswith("| ") and not line.startswith("| fleet")]
    rows = {cells[0]: cells[1:] for cells in ([cell.strip() for cell in row.strip("|").split("|")] for row in table)}
    assert rows == {
        label: [
            f"{run['replica_hours']:.2f}",
            f"{run['cost']:,.2f}",
            f"{run['overflow_seconds']:g}",
            f"{run['overflow_request_seconds']:g}",
            str(run["peak_replicas"]),
        ]
        for label, run in expected.items()
    }


@pytest.mark.usefixtures("at_root")
def test_the_tuned_config_is_the_printed_change_pasted(tmp_path: Path) -> None:
    (printed,) = [lines for command, lines in _shown() if command.endswith("--tune --out replay")]
    change = yaml.safe_load(
        "\n".join(printed[printed.index("autoscaling:") : printed.index(f"wrote {OUT}/result.json")])
    )
    original, tuned = yaml.safe_load(CONFIG.read_text()), yaml.safe_load(TUNED.read_text())
    original["autoscaling"].update(change["autoscaling"])
    assert tuned == original


def test_the_trace_is_what_the_script_writes(tmp_path: Path) -> None:
    written = tmp_path / "trace.csv"
    diurnal_trace.main(["--out", str(written)])
    assert written.read_bytes() == TRACE.read_bytes()


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--trough", "-5"], "--trough"), (["--burst", "-200"], "--burst"), (["--days", "0"], "--days")],
)
def test_the_script_refuses_a_trace_it_cannot_draw_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    written = tmp_path / "trace.csv"
    with pytest.raises(SystemExit) as exited:
        diurnal_trace.main(["--out", str(written), *flags])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and named in err and "Traceback" not in err
    assert not written.exists()
