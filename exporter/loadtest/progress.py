"""What `plimsoll loadtest` shows a person: a line per load step while it runs, and the final table.

The progress goes to stderr, so `--format json` leaves stdout to the document alone. A spinner shows the step in
progress where stderr is a terminal; elsewhere (CI logs, a pipe) only the finished steps' lines are printed.
Formatting is separate from the console: `step_line` and `result_table` turn values into text and tables.
"""

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.status import Status
from rich.table import Table
from rich.text import Text

from exporter.display import plain
from exporter.loadtest.judge import StepSummary
from exporter.loadtest.measure import describe_load, open_loop, step_load


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def verdict_text(verdict: str, passed: bool, interrupted: bool) -> str:
    """pass / fail, marked "(unsure)" where the point estimate decided because the sequential test could not."""
    if interrupted:
        return "interrupted"
    if verdict == "unsure":
        return f"{'pass' if passed else 'fail'} (unsure)"
    return verdict


def step_line(step: StepSummary) -> Text:
    """One finished step: the load, what the client measured, what the engine said, the verdict in its colour."""
    attainment = (
        "-"
        if step.slo_attainment is None
        else f"{step.slo_attainment:.1%} [{step.attainment_low:.1%}, {step.attainment_high:.1%}]"
    )
    style = "yellow" if step.interrupted else "green" if step.passed else "red"
    errors = f" errors {step.errors}" if step.errors else ""
    early = f"  ({step.ended_early})" if step.ended_early else ""
    saturated = "  saturated" if step.engine_saturated else ""
    line = plain(
        f"{_step_load(step)}  requests {step.requests:>4}{errors}  {step.request_rate:.1f} req/s  "
        f"attainment {attainment}  TTFT p99 {_ms(step.ttft_p99_seconds)}  ITL p99 {_ms(step.itl_p99_seconds)}  "
        f"KV {_percent(step.kv_cache_usage_ratio)}  waiting {_number(step.requests_waiting)}{saturated}  "
    )
    line.append(verdict_text(step.verdict, step.passed, step.interrupted), style=style)
    return line.append(plain(early))


def _step_load(step: StepSummary) -> str:
    if step.offered_rate is None:
        return f"concurrency {step.concurrency:>4}"
    return f"rate {step.offered_rate:>7g}/s"


def result_table(result: Mapping[str, Any]) -> Table:
    """Every step of a result.json document, in the order run; the knee's and the saturation point's rows marked."""
    knee, saturation = result.get("knee"), result.get("saturation")
    knee_load = step_load(knee) if knee else None
    saturation_load = step_load(saturation) if saturation else None
    table = Table(title="plimsoll loadtest", title_justify="left")
    for heading in ("load", "requests", "errors", "req/s", "tok/s", "SLO attainment", "TTFT p99", "ITL p99"):
        table.add_column(heading, justify="right")
    for heading in ("KV p90", "waiting", "preempt", "engine", "verdict"):
        table.add_column(heading, justify="right")
    for step in result["steps"]:
        marks = [
            name for name, level in (("knee", knee_load), ("saturation", saturation_load)) if step_load(step) == level
        ]
        marker = f" <- {' and '.join(marks)}" if marks else ""
        table.add_row(
            _load_cell(step),
            str(step["requests"]),
            str(step["errors"]),
            f"{step['request_rate']:.2f}",
            f"{step['output_tokens_per_second']:.0f}",
            _percent_of(step["slo_attainment"]),
            _ms(step["ttft_p99_seconds"]),
            _ms(step["itl_p99_seconds"]),
            _percent(step["kv_cache_usage_ratio"]),
            _number(step["requests_waiting"]),
            _number(step["preemptions"]),
            ", ".join(step["engine_signals"]) or "-",
            verdict_text(step["verdict"], step["passed"], step["interrupted"]) + marker,
        )
    return table


def _load_cell(step: Mapping[str, Any]) -> str:
    rate = step.get("offered_rate")
    return str(step["concurrency"]) if rate is None else f"{rate:g}/s"


def _described(step: Mapping[str, Any]) -> str:
    return describe_load(step["concurrency"], step.get("offered_rate"))


def _load(step: Mapping[str, Any]) -> str:
    return (
        f"{step['request_rate']:.2f} req/s, {step['output_tokens_per_second']:.0f} output tok/s, "
        f"KV {_percent(step['kv_cache_usage_ratio'])}, {_number(step['requests_waiting'])} waiting"
    )


def _percent_of(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.1%}"


def summary_lines(result: Mapping[str, Any], written: Sequence[str]) -> list[str]:
    """What the table does not say: the knee in words, what limited it, the model's view, and the files."""
    knee, saturation = result.get("knee"), result.get("saturation")
    lines = []
    if saturation:
        lines.append(
            f"saturation point: {_described(saturation)} ({_load(saturation)}; {', '.join(saturation['signals'])})"
        )
    else:
        lines.append("saturation point: none (the engine held every load tried, or reported nothing)")
    if knee:
        low, high = result.get("knee_range") or (step_load(knee), step_load(knee))
        apart = f", {high:g} passed in another run" if high != low else ""
        lines.append(f"SLO knee: {_described(knee)} ({_load(knee)}){apart}")
    else:
        lines.append("SLO knee: none (no step met the objective)")
    if result.get("operating_point") is not None:
        point = result["operating_point"]
        what = f"{point:g} requests/s" if open_loop(result["steps"]) else f"concurrency {point}"
        lines.append(f"operating point (thresholds, autoscaling): {what}")
    lines.append(f"limited by: {result['limited_by']}: {result['reason']}")
    prediction = result.get("model_prediction")
    if prediction:
        ratio = prediction["ratio"]
        apart = "" if ratio is None else f"; knee / prediction = {ratio:.2f}"
        lines.append(
            f"{prediction['source']} KV pool: {prediction['kv_cache_tokens']} tokens / "
            f"{prediction['request_footprint_tokens']:.0f} tokens a request = "
            f"{prediction['predicted_concurrency']:.1f} concurrent requests{apart}"
        )
    lines.extend(f"note: {note}" for note in result.get("notes", ()))
    lines.extend(f"wrote {path}" for path in written)
    return lines


class Progress:
    """The live display on stderr: a spinner for the step in progress (terminals only), a line per finished step."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._status: Status | None = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop_status()

    def message(self, text: str) -> None:
        self._console.print(plain(text), highlight=False)  # it holds the server's words (the model id)

    def step_started(self, load: str, seconds: float) -> None:
        self._stop_status()
        if self._console.is_terminal:
            self._status = self._console.status(f"{load}: running (about {seconds:g}s)")
            self._status.start()

    def step_finished(self, step: StepSummary) -> None:
        self._stop_status()
        self._console.print(step_line(step), highlight=False)

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
