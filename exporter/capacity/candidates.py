"""The replica layouts and precisions that planning searches: for a load (`exporter.capacity.fleet`) and for the
changes that would make a deployment fit (`exporter.capacity.plan`)."""

from dataclasses import dataclass, replace

from exporter.capacity import assumptions as A
from exporter.capacity.architecture import ModelArchitecture
from exporter.capacity.deployment import Deployment
from exporter.capacity.gpus import Fp8Weights, GpuSpec
from exporter.capacity.quantization import from_flag
from exporter.capacity.weights import weight_dtype_bytes

# Layouts are of nodes of 8 GPUs: tensor parallelism inside a node, pipeline stages across nodes, data-parallel
# engines (MoE models, with expert parallelism) up to 16 GPUs, and no replica larger than 4 nodes.
GPUS_PER_NODE = 8
PIPELINE_PARALLEL_CHOICES = (1, 2, 3, 4)
DATA_PARALLEL_CHOICES = (1, 2, 4, 8, 16)
MAX_GPUS_PER_REPLICA = 4 * GPUS_PER_NODE


@dataclass(frozen=True)
class Layout:
    """How one replica spreads over GPUs."""

    tensor_parallel: int
    pipeline_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def flags(self) -> str:
        out = f"--tp {self.tensor_parallel}"
        if self.pipeline_parallel > 1:
            out += f" --pp {self.pipeline_parallel}"
        if self.data_parallel > 1:
            out += f" --dp {self.data_parallel}"
        if self.expert_parallel:
            out += " --enable-expert-parallel"
        return out

    def applied(self, d: Deployment) -> Deployment:
        same_stages = self.pipeline_parallel == d.pipeline_parallel
        return replace(
            d,
            tensor_parallel=self.tensor_parallel,
            pipeline_parallel=self.pipeline_parallel,
            data_parallel=self.data_parallel,
            expert_parallel=self.expert_parallel,
            # A layer partition lists one count per stage: it holds for the PP size it was given with only.
            pp_layer_partition=d.pp_layer_partition if same_stages else None,
        )


def layouts(
    arch: ModelArchitecture,
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
    data_parallel: int | None = None,
) -> list[Layout]:
    """Layouts to try, fewest GPUs first; a given size is kept as it is. Pipeline parallelism is tried across
    nodes (TP 8 x PP stages), data parallelism for MoE models only (with expert parallelism, as vLLM serves
    them; for a dense model DP engines are just replicas)."""
    tps = (
        [tensor_parallel]
        if tensor_parallel
        else [t for t in A.TENSOR_PARALLEL_CHOICES if not arch.num_attention_heads % t]
    )
    pps = [pipeline_parallel] if pipeline_parallel else [p for p in PIPELINE_PARALLEL_CHOICES if p <= arch.num_layers]
    dps = [data_parallel] if data_parallel else list(DATA_PARALLEL_CHOICES) if arch.moe is not None else [1]
    found = [
        Layout(tp, pp, dp, expert_parallel=arch.moe is not None and dp > 1)
        for tp in tps
        for pp in pps
        for dp in dps
        if tp * pp * dp <= MAX_GPUS_PER_REPLICA or (tp, pp, dp) == (tps[0], pps[0], dps[0])
        # Pipeline stages are for crossing nodes: only once TP fills one, unless the sizes were given.
        if pp == 1 or tp == GPUS_PER_NODE or tensor_parallel or pipeline_parallel
    ]
    return sorted(found, key=lambda layout: (layout.gpus, layout.pipeline_parallel, layout.data_parallel))


@dataclass(frozen=True)
class Precision:
    """Online fp8 for weights and/or KV cache: fewer bytes, and a change to what the model computes."""

    fp8_weights: bool = False
    fp8_kv_cache: bool = False
    # How the GPU runs fp8 weights: with fp8 arithmetic, or stored in fp8 and multiplied in 16-bit (Marlin).
    weights_path: Fp8Weights = Fp8Weights.HARDWARE

    @property
    def changes(self) -> tuple[str, ...]:
        return tuple(
            label
            for label, on in ((self.weights_path.value, self.fp8_weights), ("fp8 KV cache", self.fp8_kv_cache))
            if on
        )

    @property
    def flags(self) -> str:
        parts = ["--quantization fp8"] * self.fp8_weights + ["--kv-cache-dtype fp8"] * self.fp8_kv_cache
        return " ".join(parts)

    def applied(self, d: Deployment) -> Deployment:
        if self.fp8_weights:
            d = replace(d, quantization=from_flag("fp8"))
        if self.fp8_kv_cache:
            d = replace(d, kv_cache_dtype="fp8")
        return d


def precisions(arch: ModelArchitecture, d: Deployment, gpu: GpuSpec) -> list[Precision]:
    """The deployment's own precision first, then fp8 where it would save bytes, the user left it open and the GPU
    runs it: fp8 weights for a 16-bit checkpoint with no --quantization (weight-only on GPUs without fp8
    arithmetic), fp8 KV for --kv-cache-dtype auto on GPUs with fp8 arithmetic."""
    dtype_bytes = weight_dtype_bytes(arch, d.dtype)
    path = gpu.fp8_weights
    weights = d.quantization is None and arch.quantization is None and dtype_bytes >= 2 and path != Fp8Weights.NONE
    kv = d.kv_cache_dtype == "auto" and dtype_bytes >= 2 and gpu.fp8_kv_cache
    return [Precision(w, k, path) for w in (False, True) for k in (False, True) if (weights or not w) and (kv or not k)]
