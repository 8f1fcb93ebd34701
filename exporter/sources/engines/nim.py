"""NVIDIA NIM for LLMs 1.x (engines.md A.5): vLLM V0's names with the `vllm:` prefix stripped.

Having no prefix, a NIM page is recognised by its gauges alone; a vLLM page never matches, since its names all
carry `vllm:`. NIM 2.x images that pass vLLM's own names through are read as vLLM.
"""

from exporter.sources.engines.vocabulary import Vocabulary

ADAPTER = Vocabulary(
    name="nim",
    prefix="",
    model_label="model_name",
    running=("num_requests_running",),
    waiting=("num_requests_waiting",),
    kv_usage=("gpu_cache_usage_perc",),
    prompt_tokens=("prompt_tokens_total",),
    generation_tokens=("generation_tokens_total",),
    requests_finished=("request_success_total",),
    ttft=("time_to_first_token_seconds",),
    itl=("time_per_output_token_seconds",),  # vLLM V0's per-token interval
    e2e=("e2e_request_latency_seconds",),
    request_prompt_tokens=("request_prompt_tokens",),
    request_generation_tokens=("request_generation_tokens",),
)
