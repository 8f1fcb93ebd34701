"""`make demo`: the whole system on this machine with no GPU.

A real vLLM (CPU build) serves a tiny random-weight Llama with a 2 MiB KV pool (4096 tokens); `plimsoll run`
polls it every second; a burst of requests fills the pool. Headroom is printed live from Plimsoll's own API, then
the interesting lines of its /metrics. Everything listens on 127.0.0.1 and stops when the demo ends.
"""

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.support.vllm_cpu import ensure_vllm, free_port, send_load, start_vllm  # noqa: E402

DEMO_DIR = REPO_ROOT / ".cache" / "demo"
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str) -> str:
    with OPENER.open(url, timeout=5) as response:
        return response.read().decode()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"plimsoll run exited with {process.returncode}")
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"plimsoll run did not become ready at {url}")


def _line(state: dict, started: float) -> str:
    (target,) = state["targets"]
    if not target["up"]:
        return f"{time.monotonic() - started:5.1f}s  target down: {target['last_failure']}"
    (i,) = target["instances"]
    eta = i["saturation_eta_seconds"]
    eta_text = "never" if eta == "+Inf" else f"{eta:.0f}s"
    return (
        f"{time.monotonic() - started:5.1f}s  KV {i['kv_cache_usage_ratio']:6.1%} of {i['kv_cache_capacity_tokens']} "
        f"(model: {i['model_kv_cache_capacity_tokens']})  headroom {i['kv_cache_headroom_tokens']:6.0f} tokens  "
        f"running {i['requests_running']:3.0f}  waiting {i['requests_waiting']:3.0f}  "
        f"preempted {i['preemptions_total']:3.0f}  saturation in {eta_text}"
    )


def _waves(base_url: str, waves: int = 16, per_wave: int = 2) -> None:
    """Load that grows: each wave adds long requests (16 prompt + 480 output tokens, nearly the 512-token
    context) while the earlier ones still hold their KV blocks, until the pool saturates and vLLM preempts."""
    threads = []
    for _ in range(waves):
        thread = threading.Thread(target=send_load, args=(base_url, per_wave, 480, 16, per_wave), daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(0.5)
    for thread in threads:
        thread.join(timeout=240)


def main() -> int:
    print("== preparing vLLM (CPU build) and the tiny model under .cache/ (first run: a few minutes)", flush=True)
    install = ensure_vllm()
    vllm_port, plimsoll_port = free_port(), free_port()
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    config = DEMO_DIR / "plimsoll.yaml"
    config.write_text(
        f"""listen: "127.0.0.1:{plimsoll_port}"
poll_interval: 250ms
targets:
  - name: tiny-llama
    url: http://127.0.0.1:{vllm_port}/metrics
    model: {install.model_dir}
slos:
  ttft: {{threshold: 500ms, objective: 0.99}}
saturation: {{kv_usage: 0.9, lead_time: 15m}}
"""
    )
    print(f"== starting vLLM on 127.0.0.1:{vllm_port} with a 2 MiB KV pool", flush=True)
    with start_vllm(install, vllm_port) as engine:
        print(f"== starting plimsoll run on 127.0.0.1:{plimsoll_port} (config {config})", flush=True)
        daemon = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config", str(config)], cwd=REPO_ROOT)
        try:
            base = f"http://127.0.0.1:{plimsoll_port}"
            _wait_ready(base + "/readyz", daemon)
            print("== two long requests every half second: watch the headroom go", flush=True)
            load = threading.Thread(target=_waves, args=(engine.base_url,), daemon=True)
            started = time.monotonic()
            load.start()
            while load.is_alive() or time.monotonic() - started < 12:
                print(_line(json.loads(_get(base + "/api/v1/state")), started), flush=True)
                time.sleep(0.5)
                if time.monotonic() - started > 240:
                    break
            print("\n== plimsoll /metrics (engine series)")
            for line in _get(base + "/metrics").splitlines():
                if line.startswith(("plimsoll_kv", "plimsoll_headroom", "plimsoll_model_capacity", "plimsoll_slo")):
                    print(line)
            print(f"\n== status page: {base}/  (the demo stops now)")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
