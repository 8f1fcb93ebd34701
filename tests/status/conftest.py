"""One real `plimsoll run` for the status tests, polling three targets every 500 ms: a vLLM page whose KV usage the
test sets (with its model, so drift is known), SGLang's sample with no model given, and a port that refuses."""

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.status.engine import SettableEngine
from tests.support.daemon_process import DaemonProcess, app_in_thread, running_daemon
from tests.support.recorded_fleet import TINY_LLAMA

POLL = "500ms"
FIRST_USAGE = 0.30


@dataclass
class Fleet:
    daemon: DaemonProcess
    engine: SettableEngine
    pages: str  # the engines' base URL

    def set_usage(self, usage: float) -> None:
        """Set the vLLM engine's KV usage and wait until the daemon's state shows it."""
        self.engine.set_usage(usage)

        def shown(state: dict[str, Any]) -> bool:
            target = next(t for t in state["targets"] if t["target"] == "vllm-tiny")
            return bool(target["instances"]) and target["instances"][0]["kv_cache_usage_ratio"] == usage

        self.daemon.wait_for_state(shown, 10.0, f"the daemon reading KV usage {usage}")


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    engine = SettableEngine(FIRST_USAGE)
    dead = socket.socket()  # bound, never listening: connections are refused
    dead.bind(("127.0.0.1", 0))
    try:
        with app_in_thread(engine.app()) as pages:
            config = {
                "poll_interval": POLL,
                "targets": [
                    {
                        "name": "vllm-tiny",
                        "url": f"{pages}/vllm/metrics",
                        "model": TINY_LLAMA,
                        "deployment": {"kv_cache_memory": "2MiB"},
                    },
                    {"name": "sglang-no-model", "url": f"{pages}/sglang/metrics"},
                    {"name": "refused", "url": f"http://127.0.0.1:{dead.getsockname()[1]}/metrics"},
                ],
            }
            with running_daemon(tmp_path_factory.mktemp("status"), config) as daemon:
                daemon.wait_for_state(lambda state: state["ready"], 20.0, "the first poll")
                yield Fleet(daemon, engine, pages)
    finally:
        dead.close()
