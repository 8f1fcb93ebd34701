"""TensorRT-LLM, through either of its two exporters (engines.md A.4), as one engine.

- Triton with the TensorRT-LLM backend (metrics port 8002): a few gauge families whose series are told apart by
  a label (`request_type`, `kv_cache_block_type`), one set per Triton model.
- `trtllm-serve` (/prometheus/metrics): vLLM-like `trtllm_*` names (tensorrt_llm/metrics/collector.py).

A page is read with whichever of the two vocabularies it scores higher on.
"""

import math

from exporter.sources.engines.base import Detection, EngineReading, PageLimits
from exporter.sources.engines.domains import checked, size_product, with_counts
from exporter.sources.engines.series import Group, at_most, detection, gauge, groups
from exporter.sources.engines.vocabulary import Vocabulary
from exporter.sources.promtext import ParsedPage

TRITON_REQUESTS = "nv_trt_llm_request_metrics"
TRITON_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"

SERVE_MAX_BLOCKS = "trtllm_kv_cache_max_blocks"
SERVE_TOKENS_PER_BLOCK = "trtllm_kv_cache_tokens_per_block"

SERVE = Vocabulary(
    name="trtllm",
    prefix="trtllm_",
    model_label="model_name",
    running=("trtllm_num_requests_running",),
    waiting=("trtllm_num_requests_waiting",),
    kv_usage=("trtllm_kv_cache_utilization",),  # used / max blocks
    prompt_tokens=("trtllm_prompt_tokens_total",),
    generation_tokens=("trtllm_generation_tokens_total",),
    requests_finished=("trtllm_request_success_total",),
    ttft=("trtllm_time_to_first_token_seconds",),
    itl=("trtllm_time_per_output_token_seconds",),  # a per-request mean (TPOT), the nearest it has to ITL
    e2e=("trtllm_e2e_request_latency_seconds",),
    extra=(SERVE_MAX_BLOCKS, SERVE_TOKENS_PER_BLOCK),
)


class TensorRtLlm:
    name = "trtllm"
    needs = (TRITON_REQUESTS, TRITON_KV_BLOCKS, *SERVE.needs)

    def detect(self, page: ParsedPage) -> Detection:
        triton, serve = self._detections(page)
        best, exporter = (triton, "Triton backend") if triton.score >= serve.score else (serve, "trtllm-serve")
        return Detection(score=best.score, evidence=tuple(f"{exporter}: {line}" for line in best.evidence))

    def read(self, page: ParsedPage, max_instances: int = PageLimits.max_instances) -> list[EngineReading]:
        triton, serve = self._detections(page)
        if triton.score >= serve.score:
            models = groups(page, (TRITON_REQUESTS, TRITON_KV_BLOCKS), None, "model")
            return [_triton_reading(page, group) for group in at_most(models, max_instances)]
        return [_serve_reading(page, group) for group in at_most(SERVE.groups(page), max_instances)]

    def _detections(self, page: ParsedPage) -> tuple[Detection, Detection]:
        return detection(page, "nv_trt_llm_", [(TRITON_REQUESTS,), (TRITON_KV_BLOCKS,)]), SERVE.detect(page)


def _triton_reading(page: ParsedPage, group: Group) -> EngineReading:
    def blocks(kind: str) -> float | None:
        return gauge(page, (TRITON_KV_BLOCKS,), {**group.where, "kv_cache_block_type": kind})

    def requests(kind: str) -> float | None:
        return gauge(page, (TRITON_REQUESTS,), {**group.where, "request_type": kind})

    usage, used, most, tokens_per = blocks("fraction"), blocks("used"), blocks("max"), blocks("tokens_per")
    if usage is None and used is not None and most is not None and math.isfinite(most) and most > 0:
        usage = used / most  # builds before the "fraction" series was added
    reading = EngineReading(
        engine="trtllm",
        instance=group.instance,
        model=group.model,
        kv_cache_usage_ratio=usage,
        requests_running=requests("active"),
        requests_waiting=requests("waiting"),
    )
    return with_counts(
        checked(reading), kv_cache_capacity_tokens=size_product(most, tokens_per), kv_block_size=tokens_per
    )


def _serve_reading(page: ParsedPage, group: Group) -> EngineReading:
    most = gauge(page, (SERVE_MAX_BLOCKS,), group.where)
    tokens_per = gauge(page, (SERVE_TOKENS_PER_BLOCK,), group.where)
    return with_counts(
        SERVE.reading(page, group), kv_cache_capacity_tokens=size_product(most, tokens_per), kv_block_size=tokens_per
    )


ADAPTER = TensorRtLlm()
