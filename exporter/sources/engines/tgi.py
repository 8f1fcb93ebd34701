"""Hugging Face TGI (router metrics, engines.md A.3). It exports no KV-cache gauge and no TTFT histogram, and
prints counters without `_total` (the Rust `metrics` crate)."""

from exporter.sources.engines.vocabulary import Vocabulary

ADAPTER = Vocabulary(
    name="tgi",
    prefix="tgi_",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    requests_finished=("tgi_request_success", "tgi_request_success_total"),
    itl=("tgi_request_mean_time_per_token_duration",),  # a per-request mean (TPOT), the nearest it has to ITL
    e2e=("tgi_request_duration",),
    request_prompt_tokens=("tgi_request_input_length",),
    request_generation_tokens=("tgi_request_generated_tokens",),
)
