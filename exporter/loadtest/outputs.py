"""What a load test leaves in its output directory: result.json (the stable contract), report.html and
thresholds.yaml, all derived from one `RunResult` and written as a set: all of them or none.

result.json is the single derivation: the report renders that document, so the two never disagree, and a report
can be drawn again from a saved result.json.
"""

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from exporter.files import write_all_or_none
from exporter.loadtest import report
from exporter.loadtest.judge import StepSummary, misses
from exporter.loadtest.measure import SloSpec, StepRun
from exporter.loadtest.model import ModelPrediction
from exporter.loadtest.search import Saturation, Search
from exporter.loadtest.thresholds import Thresholds, derive_thresholds, render_thresholds_yaml

RESULT_VERSION = 2  # 2: saturation, knee_range, operating_point; steps gained engine_signals and warm-up
RESULT_FILE = "result.json"
REPORT_FILE = "report.html"
THRESHOLDS_FILE = "thresholds.yaml"
# result.json's `knee`: the fields a person or a script reads first (a contract: tests/loadtest/contract.py).
KNEE_FIELDS = (
    "concurrency",
    "offered_rate",
    "request_rate",
    "output_tokens_per_second",
    "kv_cache_usage_ratio",
    "requests_waiting",
    "ttft_p99_seconds",
    "itl_p99_seconds",
    "slo_attainment",
)


@dataclass(frozen=True)
class RunSettings:
    """How the run was asked for: what result.json and the report say about it, next to what it measured."""

    target: str | None  # the config's target name, where --config named one
    endpoint: str  # the URL the requests went to, e.g. http://127.0.0.1:8000/v1/completions
    model: str  # the served model name sent with each request
    started_at: str  # ISO 8601, UTC
    slos: SloSpec
    workload: Mapping[str, Any]  # exporter.loadtest.workload.describe()
    max_concurrency: int
    tolerance: float
    margin: float  # below the knee's KV usage, for the threshold
    lead_time_seconds: float  # the config's saturation.lead_time, copied into thresholds.yaml


@dataclass(frozen=True)
class RunResult:
    settings: RunSettings
    search: Search
    model_prediction: ModelPrediction | None
    interrupted: bool  # Ctrl-C: the result holds what was measured before it
    notes: tuple[str, ...]  # things a reader must know (metrics unreachable, a step left unsure, ...)

    @property
    def thresholds(self) -> Thresholds:
        return derive_thresholds(self.search.operating_point, self.settings.margin)


@dataclass(frozen=True)
class WrittenOutputs:
    result: Path
    report: Path
    thresholds: Path | None  # None: nothing was measured to calibrate from (no knee, or no engine readings)


def result_document(run: RunResult) -> dict[str, Any]:
    """result.json's content: plain JSON values, keys in the documented order."""
    settings, search, thresholds = run.settings, run.search, run.thresholds
    knee = search.knee
    return {
        "version": RESULT_VERSION,
        "target": settings.target,
        "endpoint": settings.endpoint,
        "model": settings.model,
        "started_at": settings.started_at,
        "slos": {
            "ttft_seconds": settings.slos.ttft_seconds,
            "itl_seconds": settings.slos.itl_seconds,
            "objective": settings.slos.objective,
        },
        "workload": dict(settings.workload),
        "search": {"max_concurrency": settings.max_concurrency, "tolerance": settings.tolerance},
        "knee": None if knee is None else {name: getattr(knee, name) for name in KNEE_FIELDS},
        "knee_range": None if search.knee_range is None else list(search.knee_range),
        "saturation": _saturation_document(search.saturation),
        "operating_point": None if search.operating_point is None else search.operating_point.load,
        "limited_by": search.limited_by,
        "reason": search.reason,
        "steps": [_step_document(step) for step in search.steps],
        "model_prediction": None if run.model_prediction is None else run.model_prediction.to_dict(),
        "thresholds": {
            "kv_usage": thresholds.kv_usage,
            "queue": thresholds.queue,
            "margin": thresholds.margin,
            "knee_concurrency": thresholds.knee_concurrency,
        },
        "interrupted": run.interrupted,
        "notes": list(run.notes),
    }


def write_outputs(out_dir: Path, run: RunResult, saved_requests: tuple[Path, str] | None = None) -> WrittenOutputs:
    """result.json, report.html, (where something was measured) thresholds.yaml and `saved_requests` (its path and
    `requests_text`), all of them or none: a file that cannot be written leaves the earlier run's set as it was,
    never a new result beside an old report or old requests, and no folder made for them."""
    document = result_document(run)
    result_path, report_path = out_dir / RESULT_FILE, out_dir / REPORT_FILE
    fragment = run.thresholds.fragment()
    thresholds_path = out_dir / THRESHOLDS_FILE
    # None removes it: an earlier run's, left beside this run's result, would read as this run's thresholds.
    thresholds = (
        None if fragment is None else render_thresholds_yaml(fragment, run.settings.lead_time_seconds, _provenance(run))
    )
    texts: dict[Path, str | None] = {
        result_path: _json_text(document),
        report_path: report.render_report(document),
        thresholds_path: thresholds,
    }
    if saved_requests is not None:
        path, text = saved_requests
        texts[path] = text
    write_all_or_none(texts)
    return WrittenOutputs(
        result=result_path, report=report_path, thresholds=None if thresholds is None else thresholds_path
    )


def _saturation_document(saturation: Saturation | None) -> dict[str, Any] | None:
    if saturation is None:
        return None
    document = _step_document(saturation.step)
    del document["engine"]  # the step's samples are in `steps`
    document["signals"] = list(saturation.signals)
    document["unsaturated_below"] = saturation.below
    return document


REQUEST_FIELDS = (
    "step",
    "concurrency",
    "offered_rate",
    "sent_at",
    "ttft_seconds",
    "mean_itl_seconds",
    "e2e_seconds",
    "prompt_tokens",
    "output_tokens",
    "error",
    "good",
)


def requests_text(path: Path, step_runs: Sequence[StepRun], slos: SloSpec) -> str:
    """Every measured request, a row each (CSV) or, where `path` ends in .jsonl, a JSON object a line; `sent_at` is
    seconds since its step's warm-up ended, `step` the step's place in the run (1 = first)."""
    rows = [
        {
            "step": index,
            "concurrency": run.concurrency,
            "offered_rate": run.offered_rate,
            "sent_at": record.sent_at,
            "ttft_seconds": record.ttft_seconds,
            "mean_itl_seconds": record.mean_itl_seconds,
            "e2e_seconds": record.e2e_seconds,
            "prompt_tokens": record.prompt_tokens,
            "output_tokens": record.output_tokens,
            "error": record.error,
            "good": not misses(record, slos),
        }
        for index, run in enumerate(step_runs, start=1)
        for record in sorted(run.requests, key=lambda record: record.sent_at)
    ]
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)
    else:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=REQUEST_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        text = buffer.getvalue()
    return text


def _step_document(step: StepSummary) -> dict[str, Any]:
    document = {field.name: getattr(step, field.name) for field in fields(step) if field.name != "engine"}
    document["engine"] = [asdict(sample) for sample in step.engine]
    return document


def _json_text(document: Mapping[str, Any]) -> str:
    # allow_nan=False: a NaN would make the file unreadable to strict JSON parsers; the judge never produces one,
    # and if it ever did, failing here is better than a contract file nobody can read.
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def _provenance(run: RunResult) -> list[str]:
    settings, knee = run.settings, run.search.operating_point
    slos = settings.slos
    objectives = ", ".join(
        f"{name} <= {value * 1000:g}ms"
        for name, value in (("ttft", slos.ttft_seconds), ("itl", slos.itl_seconds))
        if value is not None
    )
    lines = [
        "Written by `plimsoll loadtest`: saturation thresholds measured at the operating point. Merge the saturation",
        "block into your Plimsoll config (or run loadtest with --config FILE --write), then run `plimsoll generate`.",
        f"Endpoint {settings.endpoint}, model {settings.model}, started {settings.started_at}.",
        f"SLOs: {objectives or 'none'} for {slos.objective:g} of requests.",
    ]
    search = run.search
    if search.knee is not None:
        lines.append(f"SLO knee: {search.knee.load_text}.")
    if search.saturation is not None:
        lines.append(f"Saturation point: {search.saturation.step.load_text} ({', '.join(search.saturation.signals)}).")
    if knee is not None:
        kv = "no reading" if knee.kv_cache_usage_ratio is None else f"{knee.kv_cache_usage_ratio:.3f}"
        waiting = "no reading" if knee.requests_waiting is None else f"{knee.requests_waiting:.2f}"
        lines.append(
            f"Operating point (the lower of the two): {knee.load_text}; KV usage there (p90) {kv}, "
            f"requests waiting (mean) {waiting}."
        )
        if knee.offered_rate is None:
            lines.append(
                f"Autoscaling: one replica holds {knee.concurrency} requests: knee_concurrency: "
                f"{knee.concurrency} in the autoscaling workload of model {settings.model} (--write sets it)."
            )
    lines.append(
        f"kv_usage = KV usage at the operating point x (1 - {settings.margin:g}), kept within [0.5, 0.99]; "
        "queue = requests waiting there, rounded up."
    )
    if run.interrupted:
        lines.append("The run was interrupted: the answers may be lower than the server's real ones.")
    return lines
