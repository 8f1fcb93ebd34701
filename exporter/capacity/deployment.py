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
    # vLLM's --no-async-scheduling turns it off; vLLM enables it unless an option it cannot run with is set.
    async_scheduling: bool = True
    quantization: Quantization | None = None
    vllm_version: tuple[int, int] | None = None  # None: current vLLM
    # Layers per pipeline stage as vLLM's VLLM_PP_LAYER_PARTITION gives them; None: vLLM's own split.
    pp_layer_partition: tuple[int, ...] | None = None
    # Items per prompt by modality, vLLM's --limit-mm-per-prompt ({"image": 0} -> (("image", 0),)); a modality not
    # named keeps vLLM's default.
    mm_limits: tuple[tuple[str, int], ...] = ()
    # vLLM's --mm-encoder-tp-mode: "weights" splits the vision tower over TP, "data" gives each rank a whole copy.
    mm_encoder_tp_mode: str = "weights"

    @property
    def gpus(self) -> int:
        """GPUs of one replica: DP engines of TP x PP GPUs each."""
        return self.data_parallel * self.tensor_parallel * self.pipeline_parallel

    @property
    def v0_engine(self) -> bool:
        """vLLM before v0.8 ran the V0 engine (A.VLLM_V1_SINCE); an unknown version is current vLLM."""
        return self.engine == "vllm" and self.vllm_version is not None and self.vllm_version < A.VLLM_V1_SINCE

    @property
    def in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled, which a sliding-window layer keeps beyond its window: one batch of
        max_num_batched_tokens before vLLM v0.26, then one per batch in flight (A.VLLM_IN_FLIGHT_SLIDING_RESERVE_SINCE
        cites the source): PP stages each run one, async scheduling one more."""
        assert self.max_num_batched_tokens is not None
        old = self.vllm_version is not None and self.vllm_version < A.VLLM_IN_FLIGHT_SLIDING_RESERVE_SINCE
        if self.engine != "vllm" or old:
            return self.max_num_batched_tokens
        batches = self.pipeline_parallel + (1 if self.async_scheduling else 0)
        return batches * self.max_num_batched_tokens

    @property
    def cuda_graphs_in_budget(self) -> bool:
        """vLLM subtracts its CUDA-graph estimate from the KV budget since v0.21, unless graphs are off."""
        if self.enforce_eager or self.engine != "vllm":
            return False
        return self.vllm_version is None or self.vllm_version >= A.VLLM_CUDA_GRAPHS_IN_BUDGET_SINCE


@dataclass(frozen=True)
class PipelineStage:
    """The layers one pipeline stage holds; the first stage also holds the embedding, the last the LM head."""

    first_layer: int
    layers: int
    first: bool = True
    last: bool = True

    @property
    def whole_model(self) -> bool:
        return self.first and self.last


def pipeline_stages(num_layers: int, pp: int, partition: tuple[int, ...] | None = None) -> tuple[PipelineStage, ...]:
    """The stages vLLM splits the layers into (`get_pp_indices` in vllm/distributed/utils.py). Each stage gets
    layers // PP; the remainder goes one layer each to the stages before the last, counting back from the
    second-to-last (94 layers over 4 stages: 23, 24, 24, 23), as the first stage holds the embedding and the last
    the LM head and the final norm. VLLM_PP_LAYER_PARTITION (`partition`) gives the counts instead."""
    if partition is None:
        counts = [num_layers // pp] * pp
        for back in range(2, num_layers % pp + 2):
            counts[-back] += 1
    else:
        counts = list(partition)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return tuple(
        PipelineStage(start, count, first=i == 0, last=i == len(counts) - 1)
        for i, (start, count) in enumerate(zip(starts, counts, strict=True))
    )
