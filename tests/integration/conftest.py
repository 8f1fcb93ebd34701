"""Fixtures for integration tests: real parts started on this machine, shared by the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.vllm_cpu import (
    DEFAULT_CACHE_DIR,
    VllmServer,
    VllmUnavailable,
    ensure_vllm,
    free_port,
    start_vllm,
)

# 2 MiB of bf16 KV at 512 bytes per token is 32 blocks of 128 tokens: a dozen requests fill it.
KV_CACHE_BYTES = 2 * 1024 * 1024
MAX_MODEL_LEN = 512
BLOCK_SIZE = 128


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """One real vLLM CPU engine for the session; installed on first use (2-3 min), started in ~35 s."""
    try:
        install = ensure_vllm(DEFAULT_CACHE_DIR)
    except VllmUnavailable as unavailable:
        # Only a machine that cannot obtain vLLM skips; any other failure to install or start is an error.
        pytest.skip(f"vLLM cannot be installed on this machine: {unavailable.reason}")
    with start_vllm(install, free_port(), KV_CACHE_BYTES, MAX_MODEL_LEN, BLOCK_SIZE) as server:
        yield server
