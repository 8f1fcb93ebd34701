"""report.html, beside result.json: one self-contained page drawn from the same document, so the two never disagree.

It opens with no network at all: inline CSS, charts as inline SVG, no script. Per workload: demand against the
ready replicas' capacity with the overflow (demand above it) shaded and the oracle's ready capacity beside it, the
replicas asked for and ready, the figures of the scaler and both baselines (and the trace's gaps longer than the
demand window, as the table names them), and the decisions that changed the replicas. With `--tune`, what the tuner
searched, the config lines it proposes (as the table prints them, or that there is no change) and each workload's
figures with the config's knobs and the tuned ones, or that no candidate met the budget; and the config's workloads
it did not replay.

A week at one sample per 15 s is 40,320 points, far more than a chart is pixels wide: a series with more changes
than that is drawn as one value per pixel-wide bucket of time, the most demand and the fewest ready replicas in it
(the oracle's most: it has ready what the demand needs, within max_replicas), so a peak one sample long, and any
overflow, still shows. The page says where it did so.
"""

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from html import escape
from typing import Any

from exporter.autoscale.outputs import (
    UNCHANGED,
    amount_text,
    cost_text,
    gaps_text,
    knobs_text,
    offset_text,
    synced,
    unchanged,
    unmet_budget_text,
    unreplayed_text,
)
from exporter.core.units import duration
from exporter.svg import PAGE_CSS, PLOT_WIDTH, Axis, Reference, Series, Shade, line_chart

REPORT_FILE = "report.html"
# The page lists this many of the decisions that changed the replicas; result.json holds every decision.
REPORT_DECISIONS = 200
BUCKETS = PLOT_WIDTH

Segment = tuple[float, float, float]  # (from, to, value) of a step function
Keep = Callable[[Iterable[float]], float]

# Okabe-Ito colours, as the load-test report uses: apart for the common colour-vision deficiencies.
_DEMAND, _CAPACITY, _OVERFLOW, _DESIRED, _READY, _STATIC, _ORACLE = (
    "#0072b2",
    "#009e73",
    "#d55e00",
    "#e69f00",
    "#56b4e9",
    "#555555",
    "#cc79a7",
)

_STYLE = (
    PAGE_CSS
    + """
h2 { font-size: 18px; margin: 32px 0 6px; }
h3 { font-size: 15px; margin: 18px 0 8px; }
.meta { color: #555; margin: 0 0 12px; }
td.text, th.text { text-align: left; white-space: normal; min-width: 320px; }
pre.change { background: #fff; border: 1px solid #d8dce2; border-radius: 6px; padding: 8px 16px; }
"""
)


def steps(changes: Sequence[tuple[float, float]], end: float, buckets: int, keep: Keep) -> tuple[Segment, ...]:
    """The step function `changes` ((time, value) sorted by time, each value holding until the next change, the
    last until `end`) as segments: its own where it changes no more than `buckets` times, else one per equal
    bucket of time holding `keep` (max or min) of every value in force during that bucket."""
    changes = [change for change in changes if change[0] < end]
    if len(changes) <= buckets:
        stops = [time for time, _ in changes[1:]] + [end]
        return tuple((time, stop, value) for (time, value), stop in zip(changes, stops, strict=True))
    start = changes[0][0]
    width = (end - start) / buckets
    segments: list[Segment] = []
    current = 0
    for bucket in range(buckets):
        low = start + bucket * width
        high = end if bucket == buckets - 1 else low + width
        while current + 1 < len(changes) and changes[current + 1][0] <= low:
            current += 1
        following = current + 1
        while following < len(changes) and changes[following][0] < high:
            following += 1
        segments.append((low, high, keep(value for _, value in changes[current:following])))
    return tuple(segments)


def overflow(demand: Sequence[Segment], capacity: Sequence[Segment]) -> tuple[tuple[float, float, float, float], ...]:
    """Where `demand` is above `capacity` (both segments over the same span): boxes (from, to, capacity, demand)."""
    cuts = sorted({low for low, _, _ in demand} | {low for low, _, _ in capacity} | {demand[-1][1]})
    boxes = []
    d = c = 0
    for low, high in itertools.pairwise(cuts):
        while demand[d][1] <= low:
            d += 1
        while capacity[c][1] <= low:
            c += 1
        if demand[d][2] > capacity[c][2]:
            boxes.append((low, high, capacity[c][2], demand[d][2]))
    return tuple(boxes)


def _line(segments: Sequence[Segment], start: float, scale: float) -> tuple[tuple[float, float], ...]:
    """A step line's corners, time as `scale` units into the trace."""
    return tuple(
        point
        for low, high, value in segments
        for point in (((low - start) / scale, value), ((high - start) / scale, value))
    )


def _time_axis(span: float) -> tuple[Axis, float]:
    """Hours into the trace, or minutes for one under three hours."""
    if span >= 3 * 3600:
        return Axis("time into the trace (h)", lambda value: f"{value:g}", minimum=0.0, maximum=span / 3600), 3600.0
    return Axis("time into the trace (min)", lambda value: f"{value:g}", minimum=0.0, maximum=span / 60), 60.0


def _charts(workload: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The two charts, and whether any line was drawn in buckets."""
    trace = workload["trace"]
    start, end = trace["start"], trace["end"]
    knee = workload["knee_concurrency"]
    fleet = workload["fleet"]
    demand = steps([(time, value) for time, value in trace["demand"]], end, BUCKETS, max)
    capacity = steps([(time, ready * knee) for time, _, ready in fleet], end, BUCKETS, min)
    oracle_fleet = workload["baselines"]["oracle"]["fleet"]
    # Its most in a bucket: the oracle has the demand's peak ready, and its line is drawn above that peak, as it is.
    oracle = steps([(time, ready * knee) for time, _, ready in oracle_fleet], end, BUCKETS, max)
    desired = steps([(time, replicas) for time, replicas, _ in fleet], end, BUCKETS, max)
    ready = steps([(time, ready) for time, _, ready in fleet], end, BUCKETS, min)
    x, scale = _time_axis(end - start)
    boxes = tuple(
        ((low - start) / scale, (high - start) / scale, bottom, top)
        for low, high, bottom, top in overflow(demand, capacity)
    )
    load = line_chart(
        "Demand against ready capacity",
        x,
        Axis("requests in flight", lambda value: f"{value:g}"),
        [  # demand drawn last: on top, where a spike over capacity shows
            Series(f"ready x knee ({knee:g})", _line(capacity, start, scale), _CAPACITY, dots=False),
            Series("oracle's ready x knee", _line(oracle, start, scale), _ORACLE, dashed=True, dots=False, thin=True),
            Series("demand", _line(demand, start, scale), _DEMAND, dots=False),
        ],
        shade=Shade("overflow (demand above)", boxes, _OVERFLOW),
    )
    static = workload["baselines"]["static_peak"]["peak_replicas"]
    replicas = line_chart(
        "Replicas",
        x,
        Axis("replicas", lambda value: f"{value:g}", whole=True),
        [
            Series("asked for (desired)", _line(desired, start, scale), _DESIRED, dots=False),
            Series("ready", _line(ready, start, scale), _READY, dashed=True, dots=False),
        ],
        references=[Reference(f"static at the peak ({static})", static, _STATIC)],
    )
    bucketed = max(len(trace["demand"]), len(fleet), len(oracle_fleet)) > BUCKETS
    return [load, replicas], bucketed


def _figures(workload: Mapping[str, Any]) -> str:
    rows = (
        ("generated scaler", workload),
        ("static fleet at the peak", workload["baselines"]["static_peak"]),
        ("oracle", workload["baselines"]["oracle"]),
    )
    headings = ("fleet", "replica-hours", "cost", "overflow (s)", "overflow (request-s)", "peak replicas")
    body = [
        f'<tr><td class="text">{label}</td><td>{figures["replica_hours"]:.2f}</td><td>{cost_text(figures["cost"])}</td>'
        f"<td>{amount_text(figures['overflow_seconds'])}</td><td>{amount_text(figures['overflow_request_seconds'])}</td>"
        f"<td>{figures['peak_replicas']}</td></tr>"
        for label, figures in rows
    ]
    head = '<th class="text">fleet</th>' + "".join(f"<th>{heading}</th>" for heading in headings[1:])
    return f'<div class="table"><table class="figures"><tr>{head}</tr>{"".join(body)}</table></div>'


def _decisions(workload: Mapping[str, Any]) -> list[str]:
    decisions = workload["decisions"]
    changes = [decision for decision in decisions if decision["replicas"] != decision["current_replicas"]]
    start, syncs = workload["trace"]["start"], synced(decisions)
    parts = [
        f"<p>{syncs} scaling decisions: {len(changes)} changed the replicas (below, time into the trace), "
        f"{syncs - len(changes)} were held by a rule; result.json lists every one, consecutive syncs that decided the "
        "same as one entry with their count (<code>syncs</code>).</p>"
    ]
    if not changes:
        return parts
    headings = ("time", "metric", "value", "proposed", "replicas", "reason")
    rows = [
        f'<tr><td>{offset_text(decision["time"] - start)}</td><td class="text">{escape(decision["metric"])}</td>'
        f"<td>{decision['value']:g}</td><td>{decision['proposed']}</td>"
        f"<td>{decision['current_replicas']} &rarr; {decision['replicas']}</td>"
        f'<td class="text">{escape(decision["reason"])}</td></tr>'
        for decision in changes[:REPORT_DECISIONS]
    ]
    head = "".join(f'<th class="text">{h}</th>' if h in ("metric", "reason") else f"<th>{h}</th>" for h in headings)
    parts.append(f'<div class="table"><table class="decisions"><tr>{head}</tr>{"".join(rows)}</table></div>')
    if len(changes) > REPORT_DECISIONS:
        parts.append(
            f'<p class="cut">The first {REPORT_DECISIONS} changes are shown; {len(changes) - REPORT_DECISIONS} more '
            "are cut here (result.json lists them).</p>"
        )
    return parts


def _workload(workload: Mapping[str, Any]) -> list[str]:
    trace = workload["trace"]
    charts, bucketed = _charts(workload)
    title = f"{workload['namespace']}/{workload['name']} ({workload['model']})"
    facts = (
        f"{trace['samples']} samples over {offset_text(trace['end'] - trace['start'])[1:]} (h:mm:ss) · knee "
        f"{workload['knee_concurrency']:g} requests per replica · start-up {workload['startup_seconds']:g} s · "
        f"{workload['min_replicas']} to {workload['max_replicas']} replicas · signals: "
        f"{', '.join(workload['signals'])}"
    )
    parts = [f'<section class="workload"><h2>{escape(title)}</h2>', f'<p class="meta">{escape(facts)}</p>']
    if bucketed:
        parts.append(
            f'<p class="notes">Drawn downsampled: the charts hold {BUCKETS} equal buckets of time, each showing the '
            "most demand and the fewest ready replicas (the most asked for, and the most the oracle has ready) in it, "
            "so no peak or overflow vanishes; "
            "the figures below are from every sample.</p>"
        )
    parts += ['<div class="charts">', *(f"<figure>{chart}</figure>" for chart in charts), "</div>"]
    parts += ["<h3>Figures</h3>", _figures(workload)]
    if workload["unpriced"] is not None:
        parts.append(f"<p>No cost: {escape(workload['unpriced'])}.</p>")
    if trace["gaps"]:
        parts.append(f'<p class="notes">{escape(gaps_text(trace))}.</p>')
    parts += ["<h3>Decisions</h3>", *_decisions(workload), "</section>"]
    return parts


def _share(value: float) -> str:
    return f"{value:.3%}"


def _proposal(tune: Mapping[str, Any]) -> list[str]:
    """The tuner's answer in the words the table prints: the config lines to paste, or that nothing met the budget,
    and the workloads it was not tuned on."""
    unreplayed = [f'<p class="notes">{escape(unreplayed_text(tune))}.</p>'] if tune["unreplayed_workloads"] else []
    return _answer(tune) + unreplayed


def _answer(tune: Mapping[str, Any]) -> list[str]:
    chosen, current = tune["chosen"], tune["current"]
    if chosen is None:
        return [f'<p class="notes">No candidate meets the budget: {escape(unmet_budget_text(tune))}.</p>']
    if unchanged(tune):
        return [f"<p>No change: {escape(UNCHANGED)} ({knobs_text(chosen)}).</p>"]
    change = chosen["replica_hours"] / current["replica_hours"] - 1 if current["replica_hours"] > 0 else 0.0
    lines = tune["config_change"].rstrip("\n")
    return [
        f"<p>Proposed: <b>{knobs_text(chosen)}</b>, {chosen['replica_hours']:.2f} replica-hours over every workload "
        f"against the config's {current['replica_hours']:.2f} ({change:+.0%}), cost {cost_text(chosen['cost'])} "
        f"against {cost_text(current['cost'])}, the worst overflow {_share(chosen['worst_overflow_share'])} of a "
        f"workload's demand against {_share(current['worst_overflow_share'])}. The config change (paste into the "
        "config):</p>",
        f'<pre class="change">{escape(lines)}</pre>',
    ]


def _tune_figures(tune: Mapping[str, Any], workloads: Sequence[Mapping[str, Any]]) -> str:
    """Each workload's figures with the config's knobs and with the tuned ones (or the least overflowing)."""
    other = ("tuned", tune["chosen"]) if tune["chosen"] is not None else ("least overflow", tune["lowest_overflow"])
    headings = ("replica-hours", "cost", "overflow (s)", "overflow (request-s)", "overflow share", "peak replicas")
    body = []
    for index, workload in enumerate(workloads):
        for label, outcome in (("generated scaler, the config", tune["current"]), other):
            figures = outcome["workloads"][index]
            name = f"{workload['namespace']}/{workload['name']}: {label} ({knobs_text(outcome)})"
            body.append(
                f'<tr><td class="text">{escape(name)}</td><td>{figures["replica_hours"]:.2f}</td>'
                f"<td>{cost_text(figures['cost'])}</td><td>{amount_text(figures['overflow_seconds'])}</td>"
                f"<td>{amount_text(figures['overflow_request_seconds'])}</td><td>{_share(figures['overflow_share'])}</td>"
                f"<td>{figures['peak_replicas']}</td></tr>"
            )
    head = '<th class="text">workload: fleet</th>' + "".join(f"<th>{heading}</th>" for heading in headings)
    return f'<div class="table"><table class="tuned"><tr>{head}</tr>{"".join(body)}</table></div>'


def _tune(tune: Mapping[str, Any], workloads: Sequence[Mapping[str, Any]]) -> list[str]:
    searched = tune["searched"]
    margins = ", ".join(f"{margin:g}" for margin in searched["margins"])
    windows = ", ".join(duration(window) for window in searched["demand_windows_seconds"])
    return [
        '<section class="tune" id="tune"><h2>Tuning (--tune)</h2>',
        f'<p class="meta">{tune["replays"]} replays: every autoscaling.margin of {margins} with every '
        f"autoscaling.demand_window of {windows}, over each workload's trace, for the fewest replica-hours with "
        f"overflow at most {_share(tune['overflow_budget'])} of each workload's demand request-seconds.</p>",
        *_proposal(tune),
        "<h3>Figures, the config's knobs and the tuned ones</h3>",
        _tune_figures(tune, workloads),
        "</section>",
    ]


def _tune_summary(tune: Mapping[str, Any]) -> str:
    """What the page's head says of the tuning, linking to it."""
    if tune["chosen"] is None:
        return f' · <a href="#tune">--tune</a>: no candidate met the {_share(tune["overflow_budget"])} budget'
    if unchanged(tune):
        return ' · <a href="#tune">--tune</a>: no change'
    return f' · <a href="#tune">--tune</a> proposes {knobs_text(tune["chosen"])}'


def _source(source: Mapping[str, Any]) -> str:
    if "demand" in source:
        return f"demand from {source['demand']}"
    return f"demand from {source['prometheus']}, the last {source['since_seconds']:g} s"


def render_report(document: Mapping[str, Any]) -> str:
    workloads = document["workloads"]
    tune = document.get("tune")
    title = "Autoscaler replay"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{title}</title>",
            f"<style>{_STYLE}</style>",
            "</head><body><main>",
            f"<h1>{title}</h1>",
            f'<p class="meta">{escape(_source(document["source"]))} · {len(workloads)} '
            f"workload{'s' if len(workloads) != 1 else ''} · plimsoll autoscale replay"
            f"{_tune_summary(tune) if tune is not None else ''}</p>",
            *(part for workload in workloads for part in _workload(workload)),
            *(_tune(tune, workloads) if tune is not None else ()),
            "</main></body></html>",
        ]
    )
