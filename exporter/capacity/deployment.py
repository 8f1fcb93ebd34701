"""The engine flags that decide a deployment's memory: what `exporter.capacity.plan` plans, and what the searches
in `exporter.capacity.candidates` vary."""

from dataclasses import dataclass

from exporter.capacity import assumptions as A
from exporter.capacity.quantization import Quantization


@dataclass(frozen=True)
class Deployment:
    """The engine flags that decide memory; None means the engine's default."""

    engine: str = "vllm"
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    # Engines of one replica, each with its own attention and KV cache (vLLM --data-parallel-size, SGLang --dp).
    data_parallel: int = 1
    # MoE experts split over data_parallel x tensor_parallel GPUs instead of tensor-sliced on each
    # (vLLM --enable-expert-parallel).
    expert_parallel: bool = False
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    quantization: Quantization | None = None
    vllm_version: tuple[int, int] | None = None  # None: current vLLM

    @property
    def gpus(self) -> int:
        """GPUs of one replica: DP engines of TP x PP GPUs each."""
        return self.data_parallel * self.tensor_parallel * self.pipeline_parallel

    @property
    def cuda_graphs_in_budget(self) -> bool:
        """vLLM subtracts its CUDA-graph estimate from the KV budget since v0.21, unless graphs are off."""
        if self.enforce_eager or self.engine != "vllm":
            return False
        return self.vllm_version is None or self.vllm_version >= A.VLLM_CUDA_GRAPHS_IN_BUDGET_SINCE
