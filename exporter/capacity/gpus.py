"""GPUs as the capacity model sees them: the total memory the CUDA runtime reports, and what fp8 runs on them.

That total is what vLLM multiplies by gpu_memory_utilization. It is less than the box says (80 GB is not
80 GiB) and less than nvidia-smi's total, because the driver reserves some memory for itself.
"""

from dataclasses import dataclass
from enum import Enum

# vLLM's fp8 paths by compute capability (docs/features/quantization/fp8.md, "FP8 computation is supported on
# NVIDIA GPUs with compute capability >= 8.9 ... FP8 models will run on compute capability >= 7.5 (Turing) as
# weight-only W8A16, utilizing FP8 Marlin"; `is_fp8_marlin_supported` in
# vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py checks 7.5 as of v0.30, 8.0 in older releases).
# An fp8 KV cache needs fp8 arithmetic too: below 8.9 vLLM's Triton attention backend refuses it ("native FP8
# requires SM89+", vllm/v1/attention/backends/triton_attn.py) and the default FlashAttention 2 cannot read it.
FP8_ARITHMETIC_SINCE = (8, 9)
FP8_MARLIN_SINCE = (7, 5)


class Fp8Weights(Enum):
    HARDWARE = "fp8 weights"
    MARLIN = "weight-only fp8 (Marlin)"  # stored in fp8, multiplied in 16-bit: the same memory, slower kernels
    NONE = "no fp8 path"


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    aliases: tuple[str, ...] = ()
    evidence: str = ""
    # torch.cuda.get_device_capability(); None where unknown (a GPU given only by its memory), which is planned as
    # if it had fp8 arithmetic rather than hiding fp8 from a GPU that may well have it.
    compute_capability: tuple[int, int] | None = None

    @property
    def fp8_weights(self) -> Fp8Weights:
        cc = self.compute_capability
        if cc is None or cc >= FP8_ARITHMETIC_SINCE:
            return Fp8Weights.HARDWARE
        return Fp8Weights.MARLIN if cc >= FP8_MARLIN_SINCE else Fp8Weights.NONE

    @property
    def fp8_kv_cache(self) -> bool:
        return self.compute_capability is None or self.compute_capability >= FP8_ARITHMETIC_SINCE

    @property
    def is_a100(self) -> bool:
        """vLLM keeps its smaller batch defaults on A100s whatever their memory."""
        return "a100" in self.name.lower()

    def matches(self, query: str) -> bool:
        wanted = _normalise(query)
        return any(_normalise(name) == wanted for name in (self.name, *self.aliases))

    def is_variant_of(self, query: str) -> bool:
        """ "A100" for A100-40GB and A100-80GB: the query is the name up to a memory size."""
        wanted = _normalise(query)
        name = _normalise(self.name)
        return name != wanted and name.startswith(wanted) and name[len(wanted) :].rstrip("gb").isdigit()


def _normalise(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())
