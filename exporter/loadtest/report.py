"""report.html: one self-contained page drawn from result.json's document.

It opens with no network at all: inline CSS, charts as inline SVG, no script, no font or image from elsewhere
(offline readers of other load testers' reports get a blank page). The verdict comes first in words, then the
charts against concurrency, the per-step time series of the engine's own readings, and a table of the steps.
"""

from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from exporter.loadtest.measure import describe_load, open_loop, step_load
from exporter.svg import PAGE_CSS, Axis, Marker, Reference, Series, line_chart

# Colours that stay apart for the common colour-vision deficiencies (Okabe-Ito).
_BLUE, _ORANGE, _GREEN, _VERMILION, _PURPLE, _SKY, _YELLOW = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#d55e00",
    "#cc79a7",
    "#56b4e9",
    "#b59f00",
)
_STEP_COLOURS = (_BLUE, _ORANGE, _GREEN, _VERMILION, _PURPLE, _SKY, _YELLOW, "#555555")
_SLO_LINE = "#c00000"
_KNEE = "#333333"
_MISSING = "-"

_LIMITED_BY = {
    "slo:ttft": "the time-to-first-token SLO",
    "slo:itl": "the inter-token latency SLO",
    "errors": "errors from the server",
    "kv_cache": "the KV cache (the engine saturated: it filled, requests queued or were preempted)",
    "saturation": "the engine's batch or compute (it saturated with room in its KV cache: requests queued)",
    "client": "the load generator itself (it could not keep up: this is not a server limit)",
    "max_concurrency": "nothing up to --max-concurrency (the server may hold more)",
    "none": "nothing: the run ended before a limit was found",
}

_STYLE = (
    PAGE_CSS
    + """
h2 { font-size: 17px; margin: 28px 0 10px; }
.meta { color: #555; margin: 0 0 16px; }
.verdict { background: #fff; border: 1px solid #d8dce2; border-left: 6px solid #0072b2; border-radius: 6px;
           padding: 14px 18px; }
.verdict.none { border-left-color: #d55e00; }
.verdict p { margin: 4px 0; }
.big { font-size: 20px; font-weight: 600; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 10px 0 0; }
dl.facts dt { color: #555; }
dl.facts dd { margin: 0; }
svg .marker { stroke-width: 1.5; stroke-dasharray: 2 3; }
td.text { text-align: left; white-space: normal; min-width: 320px; }
tr.knee td { background: #e8f1fa; font-weight: 600; }
tr.fail td.verdict-cell { color: #b00020; }
.empty { color: #555; font-style: italic; }
"""
)


def render_report(result: Mapping[str, Any]) -> str:
    # One point per load on the charts, its last run (a level confirmed by a second run has two).
    last_runs = {step_load(step): step for step in result["steps"] if not step["interrupted"]}
    steps = [last_runs[level] for level in sorted(last_runs)]
    title = f"Load test: {result['model']} at {result['endpoint']}"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{escape(title)}</title>",
            f"<style>{_STYLE}</style>",
            "</head><body><main>",
            f"<h1>{escape(title)}</h1>",
            f'<p class="meta">Started {escape(str(result["started_at"]))} · {len(result["steps"])} '
            f"step{'s' if len(result['steps']) != 1 else ''} · plimsoll loadtest</p>",
            _verdict(result),
            _notes(result["notes"]),
            "<h2>Against load</h2>",
            '<div class="charts">',
            *(f"<figure>{chart}</figure>" for chart in _load_charts(result, steps)),
            "</div>",
            "<h2>The engine during each step</h2>",
            _engine_charts(steps),
            "<h2>Steps</h2>",
            _steps_table(result["steps"], result["operating_point"]),
            "</main></body></html>",
        ]
    )


def _verdict(result: Mapping[str, Any]) -> str:
    knee, slos, thresholds = result["knee"], result["slos"], result["thresholds"]
    saturation = result["saturation"]
    point = result["operating_point"]
    if point is None:
        # The lowest load tried: a search starts at concurrency 1, --concurrency and --rate where they say.
        lowest = min((step for step in result["steps"] if not step["interrupted"]), key=step_load, default=None)
        at = "the lowest load tried" if lowest is None else _described(lowest)
        headline = f"No answer: the SLOs did not hold even at {at}, and the engine never saturated."
        if result["limited_by"] == "none":
            headline = "No answer: the run ended before any step passed or saturated the engine."
    else:
        at = knee if knee is not None and step_load(knee) == point else saturation
        if open_loop(result["steps"]):
            held = f"{point:g} requests/s"
        else:
            held = f"{point} concurrent request{'s' if point != 1 else ''}"
        headline = (
            f"One replica holds {held}: "
            f"{_number(at['request_rate'])} requests/s, "
            f"{_number(at['output_tokens_per_second'])} output tokens/s."
        )
    facts = [
        ("Limited by", _LIMITED_BY.get(result["limited_by"], result["limited_by"])),
        ("Why", result["reason"]),
        ("Saturation point", _saturation_text(saturation)),
        ("SLO knee", _knee_text(knee, result["knee_range"])),
        ("SLOs", _slo_text(slos)),
    ]
    if knee is not None:
        facts.append(
            (
                "At the knee",
                f"KV cache usage {_percent(knee['kv_cache_usage_ratio'])} (p90), "
                f"{_number(knee['requests_waiting'])} requests waiting (mean), TTFT p99 "
                f"{_ms(knee['ttft_p99_seconds'])}, ITL p99 {_ms(knee['itl_p99_seconds'])}, "
                f"SLO attainment {_percent(knee['slo_attainment'])}",
            )
        )
    facts.append(("Thresholds", _thresholds_text(thresholds)))
    if result["model_prediction"] is not None:
        facts.append(("Capacity model", _prediction_text(result["model_prediction"])))
    if result["interrupted"]:
        facts.append(("Interrupted", "yes: the run was stopped; this is what it measured until then"))
    rows = "".join(f"<dt>{escape(name)}</dt><dd>{escape(str(value))}</dd>" for name, value in facts)
    css = "verdict none" if point is None else "verdict"
    return f'<section class="{css}"><p class="big">{escape(headline)}</p><dl class="facts">{rows}</dl></section>'


def _saturation_text(saturation: Mapping[str, Any] | None) -> str:
    if saturation is None:
        return "not reached: the engine held every load tried (or reported no metrics)"
    below = saturation["unsaturated_below"]
    under = "" if below is None else f"; {_at(saturation, below)} was not saturated"
    return f"{_described(saturation)} ({', '.join(saturation['signals'])}){under}"


def _knee_text(knee: Mapping[str, Any] | None, knee_range: Sequence[int] | None) -> str:
    if knee is None:
        return "none: no step met the objective"
    apart = ""
    if knee_range is not None and knee_range[1] != knee_range[0]:
        apart = f"; {_at(knee, knee_range[1])} passed in one run and failed in another"
    return f"{_described(knee)}{apart}"


def _described(step: Mapping[str, Any]) -> str:
    return describe_load(step["concurrency"], step.get("offered_rate"))


def _at(step: Mapping[str, Any], load: float) -> str:
    """Another load of the same kind as `step`'s, in words."""
    return describe_load(int(load), None) if step.get("offered_rate") is None else describe_load(0, load)


def _notes(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    items = "".join(f"<li>{escape(note)}</li>" for note in notes)
    return f'<h2>Notes</h2><div class="notes"><ul>{items}</ul></div>'


def _load_charts(result: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> list[str]:
    slos, thresholds = result["slos"], result["thresholds"]
    point = result["operating_point"]
    marker = None if point is None else Marker(f"operating point ({point})", point, _KNEE)
    x = (
        Axis("offered rate (requests/s)", _count, log2=True)
        if open_loop(steps)
        else Axis("offered concurrency (requests in flight)", _count, log2=True)
    )

    def line(label: str, key: str, colour: str, scale: float = 1.0, dashed: bool = False) -> Series:
        points = tuple((step_load(s), s[key] * scale) for s in steps if s[key] is not None)
        return Series(label, points, colour, dashed)

    def slo_line(key: str, label: str) -> list[Reference]:
        value = slos[key]
        return [] if value is None else [Reference(f"{label} SLO {_ms(value)}", value * 1000, _SLO_LINE)]

    charts = [
        line_chart(
            "SLO attainment",
            x,
            Axis("requests within the SLOs (%)", _count, minimum=0.0, maximum=100.0),
            [
                line("attainment", "slo_attainment", _BLUE, 100),
                line("95% interval, low", "attainment_low", _SKY, 100, dashed=True),
                line("95% interval, high", "attainment_high", _SKY, 100, dashed=True),
            ],
            [Reference(f"objective {_percent(slos['objective'])}", slos["objective"] * 100, _SLO_LINE)],
            marker,
        ),
        line_chart(
            "Time to first token",
            x,
            Axis("TTFT (ms)", _count),
            [line("p50", "ttft_p50_seconds", _GREEN, 1000), line("p99", "ttft_p99_seconds", _VERMILION, 1000)],
            slo_line("ttft_seconds", "TTFT"),
            marker,
        ),
        line_chart(
            "Inter-token latency",
            x,
            Axis("ITL (ms)", _count),
            [line("p50", "itl_p50_seconds", _GREEN, 1000), line("p99", "itl_p99_seconds", _VERMILION, 1000)],
            slo_line("itl_seconds", "ITL"),
            marker,
        ),
        line_chart(
            "Achieved throughput: requests",
            x,
            Axis("completed requests/s", _count),
            [line("requests/s", "request_rate", _BLUE)],
            marker=marker,
        ),
        line_chart(
            "Achieved throughput: tokens",
            x,
            Axis("output tokens/s", _count),
            [line("output tokens/s", "output_tokens_per_second", _ORANGE)],
            marker=marker,
        ),
        line_chart(
            "KV cache usage",
            x,
            Axis("KV cache usage (%)", _count, minimum=0.0, maximum=100.0),
            [line("p90 in step", "kv_cache_usage_ratio", _BLUE, 100), line("max", "kv_cache_usage_max", _PURPLE, 100)],
            []
            if thresholds["kv_usage"] is None
            else [Reference(f"threshold {_percent(thresholds['kv_usage'])}", thresholds["kv_usage"] * 100, _SLO_LINE)],
            marker,
        ),
        line_chart(
            "Queue",
            x,
            Axis("requests (mean in step)", _count),
            [line("waiting", "requests_waiting", _ORANGE), line("running", "requests_running", _GREEN, dashed=True)],
            []
            if thresholds["queue"] is None
            else [Reference(f"threshold {thresholds['queue']}", thresholds["queue"], _SLO_LINE)],
            marker,
        ),
    ]
    return charts


def _engine_charts(steps: Sequence[Mapping[str, Any]]) -> str:
    with_samples = [step for step in steps if step["engine"]]
    missing = [step for step in steps if not step["engine"]]
    parts = []
    if with_samples:
        x = Axis("time in step (s)", _count)

        def series(key: str, scale: float) -> list[Series]:
            return [
                Series(
                    _described(step),
                    tuple((s["t"], s[key] * scale) for s in step["engine"] if s[key] is not None),
                    _STEP_COLOURS[index % len(_STEP_COLOURS)],
                )
                for index, step in enumerate(with_samples)
            ]

        kv_chart = line_chart(
            "KV cache usage over each step",
            x,
            Axis("KV cache usage (%)", _count, minimum=0.0, maximum=100.0),
            series("kv_cache_usage_ratio", 100),
        )
        queue_chart = line_chart(
            "Requests waiting over each step", x, Axis("requests waiting", _count), series("requests_waiting", 1)
        )
        parts += ['<div class="charts">', f"<figure>{kv_chart}</figure>", f"<figure>{queue_chart}</figure>", "</div>"]
    for step in missing:
        why = step["engine_error"] or "the engine's /metrics gave no readings"
        parts.append(f'<p class="empty">{escape(_described(step))}: no engine readings ({escape(why)}).</p>')
    return "\n".join(parts)


_COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("concurrency", "concurrency", str),
    ("offered rate", "offered_rate", lambda v: f"{v:g}/s"),
    ("verdict", "verdict", str),
    ("SLO attainment", "slo_attainment", lambda v: _percent(v)),
    ("95% interval", "", str),
    ("requests", "requests", str),
    ("errors", "errors", str),
    ("requests/s", "request_rate", lambda v: _number(v)),
    ("output tokens/s", "output_tokens_per_second", lambda v: _number(v)),
    ("TTFT p50", "ttft_p50_seconds", lambda v: _ms(v)),
    ("TTFT p99", "ttft_p99_seconds", lambda v: _ms(v)),
    ("ITL p50", "itl_p50_seconds", lambda v: _ms(v)),
    ("ITL p99", "itl_p99_seconds", lambda v: _ms(v)),
    ("KV usage p90", "kv_cache_usage_ratio", lambda v: _percent(v)),
    ("waiting", "requests_waiting", lambda v: _number(v)),
    ("preemptions", "preemptions", lambda v: _number(v)),
    ("duration", "duration_seconds", lambda v: f"{v:.1f} s"),
    ("client lag p99", "client_lag_p99_seconds", lambda v: _ms(v)),
)


def _steps_table(steps: Sequence[Mapping[str, Any]], operating_point: float | None) -> str:
    """In the order run, so the search (doubling, then bisection) reads top to bottom."""
    header = "".join(f"<th>{escape(name)}</th>" for name, _, _ in _COLUMNS) + "<th>note</th>"
    rows = []
    for step in steps:
        cells = []
        for _, key, show in _COLUMNS:
            if not key:
                text = f"{_percent(step['attainment_low'])}-{_percent(step['attainment_high'])}"
            else:
                text = _MISSING if step[key] is None else show(step[key])
            cls = ' class="verdict-cell"' if key == "verdict" else ""
            cells.append(f"<td{cls}>{escape(text)}</td>")
        note = "; ".join(
            part
            for part in (
                step["ended_early"],
                "interrupted" if step["interrupted"] else None,
                "unsure: decided by the point estimate" if step["verdict"] == "unsure" else None,
                f"most misses: {step['failing_slo']}" if step["failing_slo"] else None,
                _errors_text(step["error_reasons"]),
                f"engine: {', '.join(step['engine_signals'])}" if step["engine_signals"] else None,
            )
            if part
        )
        cells.append(f'<td class="text">{escape(note)}</td>')
        css = "knee" if step_load(step) == operating_point else ("fail" if not step["passed"] else "")
        rows.append(f'<tr class="{css}">{"".join(cells)}</tr>')
    return f'<div class="table"><table><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _errors_text(reasons: Mapping[str, int]) -> str | None:
    """Why the step's requests failed, most frequent first (result.json's error_reasons)."""
    if not reasons:
        return None
    return "errors: " + ", ".join(f"{reason} ({count})" for reason, count in reasons.items())


def _slo_text(slos: Mapping[str, Any]) -> str:
    parts = [
        f"{name} ≤ {_ms(slos[key])}"
        for name, key in (("TTFT", "ttft_seconds"), ("ITL (mean per request)", "itl_seconds"))
        if slos[key] is not None
    ]
    judged = " and ".join(parts) or "no latency SLO"
    return f"{judged} for {_percent(slos['objective'])} of requests; errors count as misses"


def _thresholds_text(thresholds: Mapping[str, Any]) -> str:
    if thresholds["kv_usage"] is None and thresholds["queue"] is None:
        return "none written: no answer with engine readings to calibrate from"
    parts = []
    if thresholds["kv_usage"] is not None:
        parts.append(f"saturation.kv_usage {thresholds['kv_usage']:g}")
    if thresholds["queue"] is not None:
        parts.append(f"saturation.queue {thresholds['queue']}")
    return (
        f"{', '.join(parts)} (margin {thresholds['margin']:g} below the operating point, the lower of the two "
        "answers; see thresholds.yaml)"
    )


def _prediction_text(prediction: Mapping[str, Any]) -> str:
    source = "Plimsoll's capacity model" if prediction["source"] == "model" else "the engine's reported pool"
    text = (
        f"{prediction['kv_cache_tokens']} KV tokens ({source}) / {_number(prediction['request_footprint_tokens'])} "
        f"tokens per request = the pool fills at about {_number(prediction['predicted_concurrency'])} "
        "concurrent requests"
    )
    if prediction["ratio"] is not None:
        text += f"; the operating point is {prediction['ratio']:.2f}x that"
    return text


def _count(value: float) -> str:
    return f"{value:g}" if abs(value) < 10_000 else f"{value:,.0f}"


def _number(value: float | None) -> str:
    if value is None:
        return _MISSING
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _percent(ratio: float | None) -> str:
    return _MISSING if ratio is None else f"{ratio * 100:.1f}%"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return _MISSING
    milliseconds = seconds * 1000
    return f"{milliseconds:,.0f} ms" if milliseconds >= 100 else f"{milliseconds:.3g} ms"
