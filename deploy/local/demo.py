"""`make demo`: Plimsoll's whole loop on this machine with no GPU, on 127.0.0.1 only, in about six minutes.

1. A real vLLM (CPU build) serves a tiny random-weight Llama with a 2 MiB KV pool (32 blocks of 128 tokens).
2. `plimsoll loadtest --write` finds the saturation point and writes the saturation threshold into the demo's config.
3. `plimsoll generate` turns that config into Prometheus rules; `plimsoll run` polls the engine every 250 ms.
4. A real Prometheus scrapes the daemon and evaluates the rules; a real Alertmanager routes their alerts with the
   example routes (deploy/alertmanager/alertmanager.yml) to a webhook receiver in this process.
5. A steady load below the threshold for a while: nobody is paged.
6. A ramp, one more client every few seconds, drives the KV cache to saturation: the narration follows headroom,
   the time to saturation, the alert pending and firing in Prometheus, the page arriving at the receiver, the
   threshold crossed and the first preemption.

The config uses short windows (lead time 1m, alert hold 10s, trend window 1m, Alertmanager waits 1s) so all of
this takes minutes; production values are 15m, 5m, 30m and 10s+. It ends with a summary (also written as JSON) and
stops everything it started. DEMO_KEEP=1 keeps the stack up and prints its URLs until Ctrl-C.

tests/integration/test_demo_loop.py runs the same loop (`run_loop`) against the test session's engine and asserts
on its summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.prometheus import (
    NotReady,
    Prometheus,
    QueryError,
    WebhookReceiver,
    prometheus_config,
    running_alertmanager,
    running_prometheus,
    wait_until,
    webhook_receiver,
    webhooks_to,
    with_short_waits,
)
from tests.support.vllm_cpu import (
    ClosedLoopLoad,
    VllmError,
    VllmServer,
    VllmUnavailable,
    ensure_vllm,
    free_port,
    start_vllm,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

DEMO_DIR = REPO_ROOT / ".cache" / "demo"
TOOLS_BIN = REPO_ROOT / ".cache" / "prometheus-tools" / "usr" / "bin"
ALERTMANAGER_CONFIG = REPO_ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
ALERT = "PlimsollKVCacheSaturationAhead"
PAGER_PATH = "/pager"  # the example routes' webhook for severity="page"
TARGET = "tiny-llama"
# The engine: 2 MiB of bf16 KV at 512 bytes per token, 32 blocks of 128 tokens.
KV_CACHE_BYTES = 2 * 1024 * 1024
MAX_MODEL_LEN = 512
BLOCK_SIZE = 128
# The load: requests of 112 prompt + 128 output tokens hold one block for their first 16 tokens and two for the
# rest, and spend most of their life decoding, so KV usage moves in steps of one client (6% of the pool) and barely
# dips while a client sends its next request. Once the pool is full, a request reaching its second block has none
# to take: the engine preempts.
PROMPT_TOKENS = 112
OUTPUT_TOKENS = 128
CLIENT_KV_SHARE = 1.9 * BLOCK_SIZE * 512 / KV_CACHE_BYTES
# The steady load sits near half the threshold the knee gave: under the alerts' gate (0.6 x threshold).
STEADY_SHARE_OF_THRESHOLD = 0.5
STEADY_SECONDS = 45.0
CLIENT_STAGGER_SECONDS = 1.0  # clients that start together end together, and usage would pulse
# The ramp climbs from the gate to the threshold in about this long: a steady rise a trend can see, slow next to
# the lead time (1m) as real traffic is next to a production lead time (15m).
RAMP_GATE_TO_THRESHOLD_SECONDS = 50.0
RAMP_MIN_STEP_SECONDS = 3.0
RAMP_MAX_CLIENTS = 40  # 32 clients fill the pool: the engine preempts before this
RAMP_LIMIT_SECONDS = 240.0  # the ramp stops here even when the engine never preempts
AFTER_SATURATION_SECONDS = 10.0  # the ramp goes on this long after requests first wait or are preempted
OBSERVE_EVERY_SECONDS = 0.25
STATUS_EVERY_SECONDS = 5.0
# Short windows, so the loop takes minutes (production: lead time 15m, hold 5m, trend 30m).
LEAD_TIME = "1m"
ALERT_HOLD = "10s"
GATE_FRACTION = 0.6  # alerting.saturation_gate_fraction's default: no trend page under 0.6 x the threshold
TREND_WINDOW = "1m"
# The search: no SLO, so the answer is the saturation point the engine's own metrics show, the same on a fast
# machine and a slow one (a fixed latency SLO is not); the workload of tests/integration/test_loadtest_vllm.py.
LOADTEST_ARGS = (
    "--objective", "0.9", "--prompt-tokens", "48", "--output-tokens", "32", "--ignore-eos",
    "--max-concurrency", "32", "--tolerance", "0.1", "--step-duration", "5s", "--warmup", "1s",
    "--request-timeout", "30s", "--max-duration", "3m",
)  # fmt: skip
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class DemoError(Exception):
    """A step of the demo failed; the message says which and where its log is."""


@dataclass
class Summary:
    """What the loop measured; times are seconds since the ramp started (None: it did not happen)."""

    knee_concurrency: int | None = None
    point_kv_usage: float | None = None  # the KV usage (p90) loadtest measured at that concurrency
    threshold_ratio: float | None = None
    steady_clients: int = 0
    steady_seconds: float = STEADY_SECONDS
    steady_kv_usage_max: float | None = None
    pages_during_steady: list[str] = field(default_factory=list)
    ramp_clients: int = 0
    alert_pending_at: float | None = None
    alert_firing_at: float | None = None
    alert_delivered_at: float | None = None
    kv_usage_at_delivery: float | None = None
    threshold_crossed_at: float | None = None
    first_preemption_at: float | None = None
    first_waiting_at: float | None = None
    pages_received: list[str] = field(default_factory=list)
    report: str | None = None
    urls: dict[str, str] = field(default_factory=dict)

    @property
    def lead_seconds(self) -> float | None:
        """How long before saturation (the threshold, a request waiting or preempted: what came first) the page
        arrived."""
        saturated = (self.threshold_crossed_at, self.first_preemption_at, self.first_waiting_at)
        ends = [t for t in saturated if t is not None]
        if self.alert_delivered_at is None or not ends:
            return None
        return min(ends) - self.alert_delivered_at


def _say(text: str) -> None:
    print(text, flush=True)


def _get_json(url: str) -> Any:
    with OPENER.open(url, timeout=5) as response:
        return json.load(response)


def _plimsoll(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s
    )


def _write_config(path: Path, listen_port: int, engine: VllmServer, model_dir: Path) -> None:
    path.write_text(
        f"""# The demo's config: short windows so the loop takes minutes (see deploy/local/demo.py).
listen: "127.0.0.1:{listen_port}"
poll_interval: 250ms
targets:
  - name: {TARGET}
    url: {engine.base_url}/metrics
    engine: vllm
    model: {model_dir}
slos:
  ttft: {{threshold: 500ms, objective: 0.99}}
saturation: {{kv_usage: 0.90, lead_time: {LEAD_TIME}}}
alerting:
  exporter_job: plimsoll
  saturation_ahead_for: {ALERT_HOLD}
  saturation_trend_window: {TREND_WINDOW}
"""
    )


def _find_knee(engine: VllmServer, config: Path, out: Path, summary: Summary) -> None:
    _say("== plimsoll loadtest: closed-loop, from where the engine's KV pool still fits every request, to saturation")
    done = _plimsoll(
        "loadtest", "--url", engine.base_url, *LOADTEST_ARGS, "--config", str(config), "--target", TARGET,
        "--write", "--out", str(out), timeout_s=240,
    )  # fmt: skip
    if done.returncode != 0:
        raise DemoError(f"plimsoll loadtest exited {done.returncode}:\n{done.stderr[-2000:]}")
    result = json.loads((out / "result.json").read_text())
    summary.knee_concurrency = result.get("operating_point")
    at_point = [step for step in result["steps"] if step["concurrency"] == summary.knee_concurrency]
    summary.point_kv_usage = at_point[-1]["kv_cache_usage_ratio"] if at_point else None
    written = yaml.safe_load(config.read_text())["saturation"]
    summary.threshold_ratio = float(written["kv_usage"])
    summary.report = str(out / "report.html")
    _say(
        f"   saturation point: {summary.knee_concurrency} concurrent requests; the saturation threshold written "
        f"to the config is KV usage {summary.threshold_ratio:.0%} (report: {summary.report})"
    )


def _generate_rules(config: Path, out: Path) -> Path:
    done = _plimsoll("generate", "--config", str(config), "--out", str(out), timeout_s=60)
    if done.returncode != 0:
        raise DemoError(f"plimsoll generate exited {done.returncode}:\n{done.stderr[-2000:]}")
    return out / "rules" / "plimsoll.rules.yaml"


@contextlib.contextmanager
def _daemon(config: Path, port: int, log: Path) -> Iterator[str]:
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "run", "--config", str(config)],
            cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool | None:
            if process.poll() is not None:
                raise DemoError(f"plimsoll run exited {process.returncode}; log: {log}")
            with contextlib.suppress(OSError), OPENER.open(url + "/readyz", timeout=2) as response:
                return response.status == 200 or None
            return None

        wait_until(ready, 30, f"plimsoll run ready at {url}")
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass(frozen=True)
class Reading:
    kv_usage: float | None
    running: float | None
    waiting: float | None
    preemptions: float | None
    eta_seconds: float | None
    headroom_tokens: float | None


def _read(daemon_url: str) -> Reading | None:
    try:
        state = _get_json(daemon_url + "/api/v1/state")
    except (OSError, ValueError):
        return None
    (target,) = state["targets"]
    if not target["up"] or not target["instances"]:
        return None
    i = target["instances"][0]

    def number(key: str) -> float | None:
        value = i.get(key)
        return float("inf") if value == "+Inf" else value

    return Reading(
        number("kv_cache_usage_ratio"),
        number("requests_running"),
        number("requests_waiting"),
        number("preemptions_total"),
        number("saturation_eta_seconds"),
        number("kv_cache_headroom_tokens"),
    )


def _status_line(at: float, r: Reading) -> str:
    eta = "never" if r.eta_seconds in (None, float("inf")) else f"{r.eta_seconds:.0f}s"
    return (
        f"  {at:5.0f}s  KV {r.kv_usage or 0:4.0%}  headroom {r.headroom_tokens or 0:5.0f} tokens  running "
        f"{r.running or 0:2.0f}  waiting {r.waiting or 0:2.0f}  time to saturation {eta}"
    )


def _alert_state(prometheus: Prometheus) -> str | None:
    samples = prometheus.query(f'ALERTS{{alertname="{ALERT}"}}')
    states = {s["metric"].get("alertstate") for s in samples}
    return "firing" if "firing" in states else "pending" if "pending" in states else None


def _pages(webhook: WebhookReceiver, since: float) -> list[tuple[float, str, str]]:
    """(arrival, alert name, status) of each alert the pager route received after `since` (monotonic)."""
    with webhook.lock:
        arrived = list(zip(webhook.arrival_times, webhook.received, strict=True))
    return [
        (at, alert["labels"].get("alertname", "?"), alert.get("status", "?"))
        for at, (path, payload) in arrived
        if path == PAGER_PATH and at >= since
        for alert in payload.get("alerts", [])
    ]


def _steady(engine: VllmServer, daemon_url: str, webhook: WebhookReceiver, summary: Summary) -> ClosedLoopLoad:
    threshold = summary.threshold_ratio or 0.9
    summary.steady_clients = max(1, int(STEADY_SHARE_OF_THRESHOLD * threshold / CLIENT_KV_SHARE))
    _say(
        f"== a steady load: {summary.steady_clients} clients for {STEADY_SECONDS:.0f}s, about half the threshold: "
        "no page expected"
    )
    load = ClosedLoopLoad(engine.base_url, OUTPUT_TOKENS, PROMPT_TOKENS)
    for _ in range(summary.steady_clients):
        load.add()
        time.sleep(CLIENT_STAGGER_SECONDS)
    started = time.monotonic()
    next_status = started
    highest = 0.0
    while (now := time.monotonic()) < started + STEADY_SECONDS:
        reading = _read(daemon_url)
        if reading is not None and reading.kv_usage is not None:
            highest = max(highest, reading.kv_usage)
            if now >= next_status:
                _say(_status_line(now - started, reading))
                next_status = now + STATUS_EVERY_SECONDS
        time.sleep(OBSERVE_EVERY_SECONDS)
    summary.steady_kv_usage_max = highest
    summary.pages_during_steady = [f"{name} {status}" for _, name, status in _pages(webhook, started)]
    verdict = "nobody was paged" if not summary.pages_during_steady else f"PAGED: {summary.pages_during_steady}"
    _say(f"   steady load held KV usage at up to {highest:.0%}: {verdict}")
    return load


def _ramp(
    load: ClosedLoopLoad, daemon_url: str, prometheus: Prometheus, webhook: WebhookReceiver, summary: Summary
) -> None:
    threshold = summary.threshold_ratio or 0.9
    clients_from_gate = (1 - GATE_FRACTION) * threshold / CLIENT_KV_SHARE
    step = max(RAMP_MIN_STEP_SECONDS, RAMP_GATE_TO_THRESHOLD_SECONDS / clients_from_gate)
    _say(f"== the ramp: one more client every {step:.0f}s until the engine preempts")
    started = time.monotonic()
    baseline = _read(daemon_url)
    preempted_before = (baseline.preemptions if baseline else None) or 0.0
    next_client = started + step
    next_status = started
    stop_at = started + RAMP_LIMIT_SECONDS
    alert_state: str | None = None

    def first(name: str, at: float, text: str) -> None:
        if getattr(summary, name) is None:
            setattr(summary, name, round(at, 2))
            _say(f"  {at:5.0f}s  {text}")

    while (now := time.monotonic()) < stop_at:
        at = now - started
        if now >= next_client and load.clients < RAMP_MAX_CLIENTS:
            load.add()
            next_client = now + step
        reading = _read(daemon_url)
        if reading is not None and reading.kv_usage is not None:
            if now >= next_status:
                _say(_status_line(at, reading) + f"  ({load.clients} clients)")
                next_status = now + STATUS_EVERY_SECONDS
            if reading.kv_usage >= threshold:
                first(
                    "threshold_crossed_at", at, f"KV usage {reading.kv_usage:.0%} crossed the {threshold:.0%} threshold"
                )
            if (reading.preemptions or 0) > preempted_before:
                first("first_preemption_at", at, "the engine preempted its first request: the KV cache is full")
                stop_at = min(stop_at, now + AFTER_SATURATION_SECONDS)
            if (reading.waiting or 0) > 0:
                first("first_waiting_at", at, "requests wait in the engine's queue: no KV room to start them")
                stop_at = min(stop_at, now + AFTER_SATURATION_SECONDS)
        state = _alert_state(prometheus)
        if state == "pending" and alert_state is None and summary.alert_pending_at is not None:
            _say(f"  {at:5.0f}s  Prometheus: {ALERT} is pending again")
        if state in ("pending", "firing"):
            first("alert_pending_at", at, f"Prometheus: {ALERT} is pending (its condition holds; hold {ALERT_HOLD})")
        if state == "firing":
            first("alert_firing_at", at, f"Prometheus: {ALERT} is firing, sent to Alertmanager")
        if state is None and alert_state is not None:
            _say(f"  {at:5.0f}s  Prometheus: {ALERT} is no longer {alert_state} (its condition stopped holding)")
        alert_state = state
        for arrived, name, status in _pages(webhook, started):
            if name == ALERT and status == "firing" and summary.alert_delivered_at is None:
                summary.kv_usage_at_delivery = reading.kv_usage if reading else None
                first("alert_delivered_at", arrived - started, f"the page arrived at the webhook receiver ({name})")
        time.sleep(OBSERVE_EVERY_SECONDS)
    summary.ramp_clients = load.clients
    summary.pages_received = sorted({f"{name} {status}" for _, name, status in _pages(webhook, started)})


def _print_summary(summary: Summary) -> None:
    def at(value: float | None) -> str:
        return "never" if value is None else f"{value:.1f}s"

    lines = [
        "",
        "== summary",
        f"  saturation (plimsoll loadtest)    {summary.knee_concurrency} concurrent requests",
        f"  saturation threshold (written)    KV usage {summary.threshold_ratio:.0%}",
        f"  steady load ({summary.steady_clients} clients)           "
        f"up to {summary.steady_kv_usage_max or 0:.0%} KV, pages: {len(summary.pages_during_steady)}",
        f"  ramp: {ALERT} pending   {at(summary.alert_pending_at)}",
        f"        firing in Prometheus        {at(summary.alert_firing_at)}",
        f"        delivered to the pager      {at(summary.alert_delivered_at)}",
        f"        KV threshold crossed        {at(summary.threshold_crossed_at)}",
        f"        first request waiting       {at(summary.first_waiting_at)}",
        f"        first preemption            {at(summary.first_preemption_at)}",
    ]
    lead = summary.lead_seconds
    if lead is not None:
        lines.append(
            f"  the page arrived {lead:.1f}s before saturation (the threshold, a queue or a preemption: the first)"
        )
    _say("\n".join(lines))


def run_loop(
    engine: VllmServer, model_dir: Path, workdir: Path, keep: Callable[[Summary], None] | None = None
) -> Summary:
    """The loop after the engine is up: knee, rules, daemon, Prometheus, Alertmanager, steady load, ramp.

    `keep`, when given, is called with the summary while everything still runs (DEMO_KEEP=1 waits there).
    """
    summary = Summary()
    shutil.rmtree(workdir, ignore_errors=True)  # a previous run's Prometheus data would replay its alerts
    workdir.mkdir(parents=True)
    tools = {name: TOOLS_BIN / name for name in ("prometheus", "alertmanager")}
    missing = [str(path) for path in tools.values() if not path.is_file()]
    if missing:
        raise DemoError(f"missing {', '.join(missing)}: run `make tools` (deploy/local/fetch-prometheus-tools.sh)")
    daemon_port = free_port()
    config = workdir / "plimsoll.yaml"
    _write_config(config, daemon_port, engine, model_dir)
    _find_knee(engine, config, workdir / "loadtest", summary)
    rules = _generate_rules(config, workdir / "generated")
    _say(f"== plimsoll generate: {rules}")
    with contextlib.ExitStack() as running:
        daemon_url = running.enter_context(_daemon(config, daemon_port, workdir / "plimsoll-run.log"))
        _say(f"== plimsoll run on {daemon_url}, polling the engine every 250 ms")
        webhook = running.enter_context(webhook_receiver())
        routes = with_short_waits(webhooks_to(yaml.safe_load(ALERTMANAGER_CONFIG.read_text()), webhook.url))
        alertmanager = running.enter_context(
            running_alertmanager(str(tools["alertmanager"]), workdir / "alertmanager", routes)
        )
        scrape = [{"job_name": "plimsoll", "static_configs": [{"targets": [daemon_url.removeprefix("http://")]}]}]
        prometheus = running.enter_context(
            running_prometheus(
                str(tools["prometheus"]),
                workdir / "prometheus",
                prometheus_config(scrape, [rules], alertmanager=alertmanager.address),
            )
        )
        _say(f"== Prometheus on {prometheus.url} (rules loaded), Alertmanager on {alertmanager.url}")
        summary.urls = {
            "status page": daemon_url + "/",
            "prometheus alerts": prometheus.url + "/api/v1/alerts",  # Debian's build serves no web UI
            "alertmanager": alertmanager.url,
            "load-test report": summary.report or "",
        }
        wait_until(
            lambda: prometheus.query(f'plimsoll_kv_cache_usage_ratio{{target="{TARGET}"}}') or None,
            30,
            "Prometheus has scraped the daemon",
        )
        load = _steady(engine, daemon_url, webhook, summary)
        try:
            _ramp(load, daemon_url, prometheus, webhook, summary)
        finally:
            _say("== stopping the load")
            load.stop()
        _print_summary(summary)
        if keep is not None:
            keep(summary)
    return summary


def _keep_running(summary: Summary) -> None:
    _say("\n== DEMO_KEEP=1: the stack stays up until Ctrl-C")
    for name, url in summary.urls.items():
        _say(f"  {name:<18} {url}")
    with contextlib.suppress(KeyboardInterrupt):
        signal.pause()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--summary", type=Path, default=DEMO_DIR / "summary.json", help="where to write the summary")
    args = parser.parse_args(argv)
    keep = _keep_running if os.environ.get("DEMO_KEEP") == "1" else None
    _say("== preparing vLLM (CPU build) and the tiny model under .cache/ (first run: a few minutes)")
    started = time.monotonic()
    try:
        install = ensure_vllm()
        port = free_port()
        _say(f"== starting vLLM on 127.0.0.1:{port} with a 2 MiB KV pool (about 35 s)")
        with start_vllm(install, port, KV_CACHE_BYTES, MAX_MODEL_LEN, BLOCK_SIZE) as engine:
            summary = run_loop(engine, install.model_dir, DEMO_DIR / "run", keep)
    except VllmUnavailable as unavailable:
        _say(f"demo cannot run here: vLLM cannot be installed on this machine: {unavailable.reason}")
        return 1
    except (DemoError, VllmError, NotReady, QueryError, OSError) as error:  # one line, not a traceback
        _say(f"demo failed: {error}")
        return 1
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps({**asdict(summary), "lead_seconds": summary.lead_seconds}, indent=2))
    _say(f"\n== done in {time.monotonic() - started:.0f}s; everything stopped; summary in {args.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
