"""What `plimsoll autoscale replay` answers: one document (result.json, and `--format json`) holding, per workload,
the generated scaler's figures, its decisions and the same figures for the baselines; the table is drawn from that
document, so the two never disagree.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from exporter.autoscale.demand import DemandPoint
from exporter.autoscale.fleet import Run
from exporter.autoscale.replay import Decided, Replay
from exporter.autoscale.tune import Outcome, Tuning, config_change
from exporter.config import ScaledWorkload
from exporter.core.units import duration
from exporter.display import plain

RESULT_VERSION = 1
RESULT_FILE = "result.json"
# The table lists this many of the decisions that changed the replicas; the document holds every decision, a run
# of syncs that decided the same as one entry.
TABLE_DECISIONS = 20


@dataclass(frozen=True)
class WorkloadReplay:
    """One workload's replay and its baselines over one trace."""

    workload: ScaledWorkload
    trace: Sequence[DemandPoint]
    replay: Replay
    static_peak: Run
    oracle: Run
    replica_hour_price: float | None  # None: the config does not price this workload's GPUs
    unpriced: str | None  # why there is no cost, in the words the table shows
    gaps: tuple[tuple[float, float], ...]  # (a sample, the next) further apart than the demand window


def _figures(run: Run, price: float | None) -> dict[str, Any]:
    figures = run.figures
    return {
        "replica_hours": figures.replica_hours,
        "cost": None if price is None else figures.replica_hours * price,
        "overflow_seconds": figures.overflow_seconds,
        "overflow_request_seconds": figures.overflow_request_seconds,
        "peak_replicas": figures.peak_replicas,
        "fleet": [[change.time, change.replicas, change.ready] for change in run.fleet],
    }


def _decision(decided: Decided) -> dict[str, Any]:
    decision = decided.decision
    return {
        "time": decision.time,
        "metric": decision.metric,
        "value": decision.value,
        "proposed": decision.proposed_replicas,
        "stabilized": decision.stabilized_replicas,
        "current_replicas": decision.current_replicas,
        "ready_replicas": decision.ready_replicas,
        "replicas": decision.replicas,
        "reason": decision.reason,
        "syncs": decided.syncs,
    }


def _workload(result: WorkloadReplay) -> dict[str, Any]:
    workload = result.workload
    price = result.replica_hour_price
    return {
        "model": workload.model,
        "kind": workload.kind,
        "name": workload.name,
        "namespace": workload.namespace,
        "min_replicas": workload.min_replicas,
        "max_replicas": workload.max_replicas,
        "startup_seconds": workload.startup_seconds,
        "knee_concurrency": workload.knee_concurrency,
        "signals": list(result.replay.signals),
        "replica_hour_price": price,
        "unpriced": result.unpriced,
        "trace": {
            "start": result.trace[0].time,
            "end": result.trace[-1].time,
            "samples": len(result.trace),
            "demand": [[point.time, point.demand] for point in result.trace],
            "gaps": [list(gap) for gap in result.gaps],
        },
        **_figures(result.replay.run, price),
        "decisions": [_decision(decision) for decision in result.replay.decisions],
        "baselines": {"static_peak": _figures(result.static_peak, price), "oracle": _figures(result.oracle, price)},
    }


def result_document(source: Mapping[str, Any], results: Sequence[WorkloadReplay]) -> dict[str, Any]:
    """`source` says where the traces came from (the flags that named them)."""
    return {"version": RESULT_VERSION, "source": dict(source), "workloads": [_workload(result) for result in results]}


def _outcome(outcome: Outcome, results: Sequence[WorkloadReplay]) -> dict[str, Any]:
    prices = [result.replica_hour_price for result in results]
    costs = [
        None if price is None else hours * price for hours, price in zip(outcome.replica_hours, prices, strict=True)
    ]
    return {
        "margin": outcome.knobs.margin,
        "demand_window_seconds": outcome.knobs.demand_window_seconds,
        "replica_hours": outcome.total_replica_hours,
        "cost": None if None in costs else sum(cost for cost in costs if cost is not None),
        "overflow_request_seconds": sum(outcome.overflow_request_seconds),
        "worst_overflow_share": outcome.worst_share,
        "meets_budget": outcome.meets_budget,
        "workloads": [
            {
                "name": result.workload.name,
                "replica_hours": hours,
                "cost": cost,
                "overflow_seconds": seconds,
                "overflow_request_seconds": overflow,
                "overflow_share": share,
                "peak_replicas": peak,
            }
            for result, hours, cost, seconds, overflow, share, peak in zip(
                results,
                outcome.replica_hours,
                costs,
                outcome.overflow_seconds,
                outcome.overflow_request_seconds,
                outcome.overflow_shares,
                outcome.peak_replicas,
                strict=True,
            )
        ],
    }


def tune_document(tuning: Tuning, results: Sequence[WorkloadReplay], unreplayed: Sequence[str]) -> dict[str, Any]:
    """`--tune`'s answer, for the document's `tune` key; `results` in the order the tuning's workloads were given,
    `unreplayed` the names of the config's other workloads, which the knobs also scale."""
    chosen = tuning.chosen
    return {
        "overflow_budget": tuning.budget,
        "unreplayed_workloads": list(unreplayed),
        "replays": tuning.replays,
        "searched": {"margins": list(tuning.margins), "demand_windows_seconds": list(tuning.demand_windows_seconds)},
        "current": _outcome(tuning.current, results),
        "chosen": None if chosen is None else _outcome(chosen, results),
        "lowest_overflow": _outcome(tuning.lowest_overflow, results),
        "config_change": None if chosen is None else config_change(chosen.knobs),
    }


def result_text(document: Mapping[str, Any]) -> str:
    """result.json's content."""
    return json.dumps(document, indent=2) + "\n"


def offset_text(seconds: float) -> str:
    """A time into the trace as +h:mm:ss."""
    whole = round(seconds)
    return f"+{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def cost_text(value: float | None) -> str:
    """A cost as the table and the report print it: "-" where the workload has no price."""
    return "-" if value is None else f"{value:,.2f}"


def amount_text(value: float) -> str:
    """An overflow figure with no exponent however large: a week's request-seconds reach millions, where `:g` would
    print 1.23457e+06."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _figures_table(workload: Mapping[str, Any]) -> Table:
    table = Table(box=None, pad_edge=False)
    for heading in ("fleet", "replica-hours", "cost", "overflow s", "overflow request-s", "peak replicas"):
        table.add_column(heading, justify="left" if heading == "fleet" else "right")
    rows = (
        ("generated scaler", workload),
        ("static at peak", workload["baselines"]["static_peak"]),
        ("oracle", workload["baselines"]["oracle"]),
    )
    for label, figures in rows:
        table.add_row(
            label,
            f"{figures['replica_hours']:.2f}",
            cost_text(figures["cost"]),
            amount_text(figures["overflow_seconds"]),
            amount_text(figures["overflow_request_seconds"]),
            str(figures["peak_replicas"]),
        )
    return table


def gaps_text(trace: Mapping[str, Any]) -> str:
    """What the trace's gaps longer than the demand window do to the figures, and what to do."""
    gaps = trace["gaps"]
    start, end = max(gaps, key=lambda gap: gap[1] - gap[0])
    longest = offset_text(end - start)[1:]
    return (
        f"{len(gaps)} gap(s) without a sample longer than the demand window, the longest {longest} (h:mm:ss) from "
        f"{offset_text(start - trace['start'])}: across a gap the scaler reads no demand while the figures hold the "
        "sample before it, so overflow there is the gap's, not the scaler's; replay the spans either side apart"
    )


def synced(decisions: Sequence[Mapping[str, Any]]) -> int:
    """The syncs the document's decisions stand for: each entry is a run of `syncs` that decided the same."""
    return sum(decision["syncs"] for decision in decisions)


def _decisions_table(decisions: Sequence[Mapping[str, Any]], start: float) -> Table:
    table = Table(box=None, pad_edge=False)
    for heading in ("time", "metric", "value", "proposed", "replicas", "reason"):
        table.add_column(heading, justify="left" if heading in ("metric", "reason") else "right")
    for decision in decisions[:TABLE_DECISIONS]:
        table.add_row(
            offset_text(decision["time"] - start),
            decision["metric"],
            f"{decision['value']:g}",
            str(decision["proposed"]),
            f"{decision['current_replicas']} -> {decision['replicas']}",
            decision["reason"],
        )
    return table


def _workload_lines(workload: Mapping[str, Any]) -> list[RenderableType]:
    trace = workload["trace"]
    start = trace["start"]
    title = Text.assemble(
        plain(f"{workload['namespace']}/{workload['name']}", "bold"),
        " ",
        plain(f"({workload['model']})"),
        f": {trace['samples']} samples over {offset_text(trace['end'] - start)[1:]} (h:mm:ss)",
    )
    lines: list[RenderableType] = [title, _figures_table(workload)]
    if workload["unpriced"] is not None:
        lines.append(plain(f"no cost: {workload['unpriced']}"))
    if trace["gaps"]:
        lines.append(Text(gaps_text(trace)))
    decisions = workload["decisions"]
    changes = [decision for decision in decisions if decision["replicas"] != decision["current_replicas"]]
    syncs = synced(decisions)
    lines.append(
        Text(
            f"{syncs} scaling decisions: {len(changes)} changed the replicas (below, time into the trace), "
            f"{syncs - len(changes)} were held by a rule (--format json or --out lists every one)"
        )
    )
    if changes:
        lines.append(_decisions_table(changes, start))
    if len(changes) > TABLE_DECISIONS:
        lines.append(Text(f"... and {len(changes) - TABLE_DECISIONS} more changes"))
    return lines


def knobs_text(outcome: Mapping[str, Any]) -> str:
    """A tuning outcome's margin and window, in the config's words."""
    return f"margin {outcome['margin']:g}, demand_window {duration(outcome['demand_window_seconds'])}"


def _tune_table(tune: Mapping[str, Any]) -> Table:
    table = Table(box=None, pad_edge=False)
    for heading in ("knobs", "replica-hours", "cost", "overflow request-s", "worst overflow share"):
        table.add_column(heading, justify="left" if heading == "knobs" else "right")
    rows = [("config now", tune["current"])]
    if tune["chosen"] is not None:
        rows.append(("tuned", tune["chosen"]))
    for label, outcome in rows:
        table.add_row(
            f"{label}: {knobs_text(outcome)}",
            f"{outcome['replica_hours']:.2f}",
            cost_text(outcome["cost"]),
            amount_text(outcome["overflow_request_seconds"]),
            f"{outcome['worst_overflow_share']:.3%}",
        )
    return table


UNCHANGED = "the config's own margin and demand_window are the cheapest within the budget"


def unchanged(tune: Mapping[str, Any]) -> bool:
    """Whether the knobs chosen are the config's own: nothing to paste."""
    chosen, current = tune["chosen"], tune["current"]
    return (chosen["margin"], chosen["demand_window_seconds"]) == (current["margin"], current["demand_window_seconds"])


def unreplayed_text(tune: Mapping[str, Any]) -> str:
    """Where the knobs were tuned on some of the config's workloads: that they scale the others too."""
    names = ", ".join(tune["unreplayed_workloads"])
    return (
        f"not replayed: {names}; margin and demand_window scale every workload in the config, so replay these with "
        "the change too (--workload NAME, or --prometheus for all) before applying it"
    )


def unmet_budget_text(tune: Mapping[str, Any]) -> str:
    """Where no candidate met the budget: how close one came, and what would let one meet it."""
    lowest = tune["lowest_overflow"]
    return (
        f"the lowest overflow reached is {lowest['worst_overflow_share']:.3%} ({knobs_text(lowest)}, "
        f"{lowest['replica_hours']:.2f} replica-hours); demand faster than a start-up needs a larger "
        "--overflow-budget, a shorter start-up, or more min_replicas or max_replicas"
    )


def _tune_lines(tune: Mapping[str, Any]) -> list[RenderableType]:
    budget = f"{tune['overflow_budget']:.3%}"
    lines: list[RenderableType] = [
        Text(
            f"tune: {tune['replays']} replays for the fewest replica-hours with overflow at most {budget} of each "
            "workload's demand request-seconds",
            style="bold",
        ),
        _tune_table(tune),
    ]
    if tune["chosen"] is None:
        lines.append(Text(f"no candidate meets the budget: {unmet_budget_text(tune)}"))
    elif unchanged(tune):
        lines.append(Text(f"no change: {UNCHANGED}"))
    else:
        lines += [Text("the config change (paste into the config):"), Text(tune["config_change"].rstrip("\n"))]
    if tune["unreplayed_workloads"]:
        lines.append(plain(unreplayed_text(tune)))
    return lines


def result_table(document: Mapping[str, Any]) -> Group:
    lines: list[RenderableType] = []
    for workload in document["workloads"]:
        lines += [*_workload_lines(workload), Text("")]
    if "tune" in document:
        lines += [*_tune_lines(document["tune"]), Text("")]
    return Group(*lines[:-1])
