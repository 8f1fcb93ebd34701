"""LMDeploy's api_server (lmdeploy/metrics/loggers.py, modelled on vLLM V1; engines.md A.7). One reading per
`engine` label (the DP rank). LMDeploy reports no KV capacity or preemptions."""

from exporter.sources.engines.vocabulary import Vocabulary

ADAPTER = Vocabulary(
    name="lmdeploy",
    prefix="lmdeploy:",
    instance_label="engine",
    model_label="model_name",
    running=("lmdeploy:num_requests_running",),
    waiting=("lmdeploy:num_requests_waiting",),
    kv_usage=("lmdeploy:gpu_cache_usage_perc",),  # 0..1 despite the name
    prompt_tokens=("lmdeploy:prompt_tokens_total",),
    generation_tokens=("lmdeploy:generation_tokens_total",),
    requests_finished=("lmdeploy:request_success_total",),
    ttft=("lmdeploy:time_to_first_token_seconds",),
    itl=("lmdeploy:time_per_output_token_seconds",),  # observed per output step, like vLLM's ITL
    e2e=("lmdeploy:e2e_request_latency_seconds",),
    request_prompt_tokens=("lmdeploy:request_prompt_tokens",),
    request_generation_tokens=("lmdeploy:request_generation_tokens",),
)
