"""GPUs as the capacity model sees them: the total memory the CUDA runtime reports.

That total is what vLLM multiplies by gpu_memory_utilization. It is less than the box says (80 GB is not
80 GiB) and less than nvidia-smi's total, because the driver reserves some memory for itself.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    aliases: tuple[str, ...] = ()
    evidence: str = ""

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
