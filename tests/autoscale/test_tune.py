"""`plimsoll autoscale replay --tune` through the real CLI: on a slow diurnal trace less headroom (a higher margin, a
shorter window) is cheaper and stays within the budget, which a plain replay of the pasted config change confirms;
on a burst faster than a start-up no candidate meets a tight budget; the printed YAML loads as config; bad budgets
are refused in one line with exit 2."""

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.autoscale.demand import DemandPoint, parse_demand
from exporter.autoscale.replay import replay
from exporter.autoscale.tune import MARGINS, Knobs, Outcome, config_change, demand_request_seconds, tune, windows
from exporter.cli import main
from exporter.config import AutoscalingConfig, ScaledWorkload, load_config
from exporter.scaling import scaler_spec

KNEE = 10
STARTUP = 120
STEP = 15
DAY = 6 * 3600  # a short "day": the tests replay 44 candidates


def _config(tmp_path: Path, name: str = "plimsoll.yaml", margin: str = "0.8", window: str = "10m") -> Path:
    path = tmp_path / name
    path.write_text(
        "pricing:\n  gpu_hour:\n    H100-80GB: 2.5\n"
        f"autoscaling:\n  margin: {margin}\n  demand_window: {window}\n  workloads:\n"
        "    - model: llama\n      name: vllm-llama\n      namespace: inference\n      min_replicas: 1\n"
        f"      max_replicas: 20\n      startup: {STARTUP}s\n      knee_concurrency: {KNEE}\n      gpu: H100-80GB\n"
    )
    return path


def _csv(tmp_path: Path, demand: list[float]) -> Path:
    path = tmp_path / "demand.csv"
    path.write_text("time,demand\n" + "".join(f"{i * STEP},{value:.3f}\n" for i, value in enumerate(demand)))
    return path


def _diurnal() -> list[float]:
    """10 to 100 requests in flight and back: slow beside a start-up, so the scaler can follow it closely."""
    return [55 - 45 * math.cos(2 * math.pi * i * STEP / DAY) for i in range(DAY // STEP + 1)]


def _burst() -> list[float]:
    """An hour at 10 with a step to 80 for ten minutes: no scaler has it ready before a start-up has passed."""
    return [80.0 if 1200 <= i * STEP < 1800 else 10.0 for i in range(3600 // STEP + 1)]


def _demand_request_seconds(demand: list[float]) -> float:
    return sum(value * STEP for value in demand[:-1])


def _run(capsys: pytest.CaptureFixture[str], config: Path, demand: Path, *argv: str) -> tuple[int, str, str]:
    status = main(["autoscale", "replay", "--config", str(config), "--demand", str(demand), *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _json(capsys: pytest.CaptureFixture[str], config: Path, demand: Path, *argv: str) -> dict[str, Any]:
    status, out, _ = _run(capsys, config, demand, "--format", "json", *argv)
    assert status == 0
    document: dict[str, Any] = json.loads(out)
    return document


def _pasted(tmp_path: Path, config: Path, change: str) -> Path:
    """The config with the printed change pasted over its autoscaling knobs."""
    whole = yaml.safe_load(config.read_text())
    whole["autoscaling"].update(yaml.safe_load(change)["autoscaling"])
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(whole))
    return path


def test_less_headroom_is_cheaper_within_budget_and_a_replay_confirms_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, demand = _config(tmp_path), _diurnal()
    trace = _csv(tmp_path, demand)
    document = _json(capsys, config, trace, "--tune", "--overflow-budget", "0.5%")
    tune = document["tune"]
    assert tune["overflow_budget"] == 0.005
    assert tune["replays"] == len(MARGINS) * 4  # 0.8 is on the grid; windows 10m, 7m, 5m, 2m
    current, chosen = tune["current"], tune["chosen"]
    assert (current["margin"], current["demand_window_seconds"]) == (0.8, 600)
    assert current["replica_hours"] == pytest.approx(document["workloads"][0]["replica_hours"])
    # Less headroom and a shorter memory of the peak: clearly fewer replica-hours, and still within the budget.
    assert chosen["margin"] > 0.8
    assert chosen["demand_window_seconds"] < 600
    assert chosen["replica_hours"] < 0.9 * current["replica_hours"]
    assert chosen["cost"] == pytest.approx(chosen["replica_hours"] * 2.5)
    # The check that does not trust the tuner: the pasted change, loaded as config and replayed on its own.
    tuned = _pasted(tmp_path, config, tune["config_change"])
    autoscaling = load_config(str(tuned)).autoscaling
    assert autoscaling is not None
    assert (autoscaling.margin, autoscaling.demand_window_seconds) == (
        chosen["margin"],
        chosen["demand_window_seconds"],
    )
    (replayed,) = _json(capsys, tuned, trace)["workloads"]
    assert replayed["replica_hours"] == pytest.approx(chosen["replica_hours"])
    assert replayed["overflow_request_seconds"] <= 0.005 * _demand_request_seconds(demand)
    # A tighter budget costs more headroom.
    tighter = _json(capsys, config, trace, "--tune", "--overflow-budget", "0.1%")["tune"]["chosen"]
    assert tighter["margin"] < chosen["margin"]
    assert tighter["replica_hours"] > chosen["replica_hours"]


def test_the_printed_yaml_is_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path)
    status, out, _ = _run(capsys, config, _csv(tmp_path, _diurnal()), "--tune")
    assert status == 0
    assert "tune: 44 replays" in out
    pasted = out[out.index("autoscaling:") :]
    change = yaml.safe_load(pasted)
    assert set(change) == {"autoscaling"} and set(change["autoscaling"]) == {"margin", "demand_window"}
    autoscaling = load_config(str(_pasted(tmp_path, config, pasted))).autoscaling
    assert autoscaling is not None
    assert autoscaling.margin == change["autoscaling"]["margin"]


def test_a_budget_nothing_meets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, trace = _config(tmp_path), _csv(tmp_path, _burst())
    tune = _json(capsys, config, trace, "--tune", "--overflow-budget", "0.1%")["tune"]
    assert tune["chosen"] is None and tune["config_change"] is None
    lowest = tune["lowest_overflow"]
    assert not lowest["meets_budget"] and lowest["worst_overflow_share"] > 0.001
    status, out, _ = _run(capsys, config, trace, "--tune", "--overflow-budget", "0.1%")
    assert status == 0
    assert f"no candidate meets the budget: the lowest overflow reached is {lowest['worst_overflow_share']:.3%}" in out
    assert "demand_window:" not in out


def test_the_window_steps() -> None:
    assert windows(600, 120) == (600, 420, 300, 120)
    assert windows(300, 300) == (300,)
    assert windows(180, 120) == (180, 120)  # no whole minute strictly between


def test_without_tune_there_is_no_tune_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "tune" not in _json(capsys, _config(tmp_path), _csv(tmp_path, _burst()))


@pytest.mark.parametrize("budget", ["0.5", "abc%", "%", "-1%", "100%", "nan%", "inf%"])
def test_a_bad_budget_exits_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], budget: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        _run(capsys, _config(tmp_path), _csv(tmp_path, _burst()), "--tune", f"--overflow-budget={budget}")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "--overflow-budget" in line and "error" in line]
    assert "percentage" in line
    assert "Traceback" not in err


def test_a_budget_without_tune_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _run(capsys, _config(tmp_path), _csv(tmp_path, _burst()), "--overflow-budget", "1%")
    assert status == 2 and out == ""
    assert err.strip().count("\n") == 0 and "--overflow-budget: applies with --tune only" in err


def test_the_docs_example_is_this_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/autoscaling.md shows this file's diurnal trace tuned: the lines there must be what the command prints."""
    status, out, _ = _run(capsys, _config(tmp_path), _csv(tmp_path, _diurnal()), "--tune")
    assert status == 0
    docs = (Path(__file__).parents[2] / "docs" / "autoscaling.md").read_text()
    shown = docs[docs.index("\ntune: 44 replays") + 1 :].split("\n```\n")[0]
    printed = out[out.index("tune: 44 replays") :]
    assert shown.splitlines() == [line.rstrip() for line in printed.splitlines()]


def test_result_json_holds_the_tuning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "replay"
    status, printed, _ = _run(capsys, _config(tmp_path), _csv(tmp_path, _diurnal()), "--tune", "--out", str(out))
    assert status == 0
    tune = json.loads((out / "result.json").read_text())["tune"]
    assert tune["config_change"] in printed and tune["chosen"]["meets_budget"]


def test_tuned_on_one_of_several_workloads_the_answer_names_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The knobs scale every workload of the config: a CSV tunes on one, and the change must not read as checked for
    the others."""
    config, trace = _config(tmp_path), _csv(tmp_path, _diurnal())
    alone = _json(capsys, config, trace, "--tune")["tune"]
    assert alone["unreplayed_workloads"] == []
    text = config.read_text()
    config.write_text(text + text[text.index("    - model: llama") :].replace("llama", "qwen"))
    out = tmp_path / "replay"
    status, printed, _ = _run(capsys, config, trace, "--tune", "--workload", "vllm-llama", "--out", str(out))
    assert status == 0
    assert json.loads((out / "result.json").read_text())["tune"]["unreplayed_workloads"] == ["vllm-qwen"]
    assert "not replayed: vllm-qwen; margin and demand_window scale every workload" in printed
    assert "not replayed: vllm-qwen; margin and demand_window scale every workload" in (out / "report.html").read_text()


def test_one_margin_and_window_must_hold_every_workload(tmp_path: Path) -> None:
    """The knobs are the config's, shared by its workloads: a workload whose burst no candidate absorbs leaves the
    budget unmet for both, though the other alone would meet it."""
    config = _config(tmp_path)
    text = config.read_text()
    second = text[text.index("    - model: llama") :].replace("llama", "qwen")
    config.write_text(text + second)
    autoscaling = load_config(str(config)).autoscaling
    assert autoscaling is not None
    llama, qwen = autoscaling.workloads
    diurnal = parse_demand(_csv(tmp_path, _diurnal()).read_text(), "diurnal.csv")
    burst = parse_demand(_csv(tmp_path, _burst()).read_text(), "burst.csv")
    alone = tune(autoscaling, [(llama, diurnal, KNEE)], None, 0.005)
    both = tune(autoscaling, [(llama, diurnal, KNEE), (qwen, burst, KNEE)], None, 0.005)
    assert alone.chosen is not None and alone.replays == 44
    assert both.chosen is None and both.replays == 88
    assert both.lowest_overflow.overflow_shares[0] <= 0.005 < both.lowest_overflow.overflow_shares[1]


def _straightforward(
    autoscaling: AutoscalingConfig,
    workloads: Sequence[tuple[ScaledWorkload, Sequence[DemandPoint], int]],
    budget: float,
) -> list[Outcome]:
    """Every candidate as a person would try it: the knobs pasted into the config, each workload replayed from its
    raw trace with `replay`, nothing shared between candidates."""
    shortest = max(workload.startup_seconds for workload in autoscaling.workloads)
    outcomes = []
    for window in windows(autoscaling.demand_window_seconds, shortest):
        for margin in sorted({*MARGINS, autoscaling.margin}, reverse=True):
            pasted = dataclasses.replace(autoscaling, margin=margin, demand_window_seconds=window)
            runs = [
                replay(trace, scaler_spec(pasted, workload, None), workload.startup_seconds, knee).run.figures
                for workload, trace, knee in workloads
            ]
            shares = tuple(
                figures.overflow_request_seconds / demand_request_seconds(trace)
                for figures, (_, trace, _) in zip(runs, workloads, strict=True)
            )
            outcomes.append(
                Outcome(
                    Knobs(margin, window),
                    tuple(figures.replica_hours for figures in runs),
                    tuple(figures.overflow_request_seconds for figures in runs),
                    tuple(figures.overflow_seconds for figures in runs),
                    tuple(figures.peak_replicas for figures in runs),
                    shares,
                    all(share <= budget for share in shares),
                )
            )
    return outcomes


@pytest.mark.parametrize("budget", [0.005, 0.001])
def test_the_tuner_answers_as_the_straightforward_search_does(tmp_path: Path, budget: float) -> None:
    """The tuner reads each trace once for all its candidates (docs/autoscaling.md gives its time on a week): its
    answer, to the last bit of every figure, is the one of replaying every candidate from scratch."""
    config = _config(tmp_path, margin="0.77", window="9m")  # off the grid: 12 margins, windows 9m, 7m, 4m, 2m
    text = config.read_text()
    config.write_text(text + text[text.index("    - model: llama") :].replace("llama", "qwen"))
    autoscaling = load_config(str(config)).autoscaling
    assert autoscaling is not None
    llama, qwen = autoscaling.workloads
    diurnal = parse_demand(_csv(tmp_path, _diurnal()).read_text(), "diurnal.csv")
    hourly = _burst() * 6  # a ten-minute burst every hour, on the diurnal curve
    bursts = parse_demand(_csv(tmp_path, [v + hourly[i] for i, v in enumerate(_diurnal())]).read_text(), "bursts.csv")
    workloads = [(llama, diurnal, KNEE), (qwen, bursts, KNEE)]
    outcomes = _straightforward(autoscaling, workloads, budget)
    within = [outcome for outcome in outcomes if outcome.meets_budget]
    current = Knobs(0.77, 540)
    tuned = tune(autoscaling, workloads, None, budget)
    assert tuned.replays == len(outcomes) * 2 == 96
    assert tuned.current == next(outcome for outcome in outcomes if outcome.knobs == current)
    assert tuned.chosen == min(
        within, key=lambda o: (o.total_replica_hours, o.worst_share, o.knobs != current), default=None
    )
    assert tuned.lowest_overflow == min(outcomes, key=lambda o: (o.worst_share, o.total_replica_hours))


def test_where_the_config_s_own_knobs_win_there_is_nothing_to_paste(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No demand at all: every candidate runs min replicas, a tie the config's own knobs win, so the answer is no
    change, not lines to paste that repeat the config."""
    out = tmp_path / "replay"
    status, printed, _ = _run(capsys, _config(tmp_path), _csv(tmp_path, [0.0] * 240), "--tune", "--out", str(out))
    assert status == 0
    tune = json.loads((out / "result.json").read_text())["tune"]
    assert (tune["chosen"]["margin"], tune["chosen"]["demand_window_seconds"]) == (0.8, 600)
    assert "no change: the config's own margin and demand_window are the cheapest within the budget" in printed
    assert "paste" not in printed
    page = (out / "report.html").read_text()
    assert "No change: the config&#x27;s own margin" in page and "--tune</a>: no change" in page


@pytest.mark.parametrize("knobs", [Knobs(0.8333333333333334, 1_000_030.0), Knobs(1.0, 1200.0), Knobs(0.7, 630.5)])
def test_the_config_change_reads_back_as_the_knobs_it_prints(tmp_path: Path, knobs: Knobs) -> None:
    """ "%g" printed a 1,000,030 s window as 1e+06s, which no config reads, and a margin cut to six digits."""
    config = _pasted(tmp_path, _config(tmp_path), config_change(knobs))
    section = load_config(config, environ={}).autoscaling
    assert (section.margin, section.demand_window_seconds) == (knobs.margin, knobs.demand_window_seconds)
