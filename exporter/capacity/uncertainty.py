"""How sure a plan's KV-token figure is: a range from how far each estimated term strayed in real startup logs.

The KV budget is what is left of the GPU after the weights, the activation peak, non-torch memory and CUDA graphs.
Each of those is an estimate, and each missed the real vLLM logs by a measured spread. A term measured on logs of
the plan's vLLM version (and GPU count, for non-torch memory) uses that version's spread; a version without enough
logs gets the spread over all versions, which is wider. The weights' spread is kept per format (16-bit, or the
quantization method), since each format's scales, packing and unquantized modules miss by their own amount: a format
uses the wider of its own spread and the one over all logs, and a quantized format no log shows uses the widest any
format showed. The terms are treated as independent, so their spreads add
in quadrature rather than all at their worst at once.

A multimodal model's activation peak is the larger of two passes of vLLM's profiling run, the vision tower's over
the dummy images and the text passes: each pass gets its own spread (the tower's from the vision-language logs, as
a fraction of its predicted pass; the text's the activation spread above), and the peak moves by whichever pass
ends up larger, so the text's spread never lands on the tower's bytes.

`SHIPPED_SPREADS` is what `exporter.capacity.fit.term_spreads` derives from bench/data/vllm_startup_logs.yaml
(`python -m bench.model_accuracy` prints it; tests/capacity/test_uncertainty.py checks it is current).
"""

import math
from dataclasses import dataclass
from typing import Protocol

from exporter.capacity.activation import ActivationPasses
from exporter.capacity.deployment import Deployment
from exporter.capacity.kv import KvLayout, KvPool
from exporter.capacity.quantization import Quantization
from exporter.capacity.weights import WeightBreakdown
from exporter.core.units import GIB

Version = tuple[int, int]

UNQUANTIZED = "16-bit"


def weights_format(quantization: Quantization | None) -> str:
    """What the weights' spread is kept under: the quantization method, or 16-bit."""
    return quantization.method if quantization is not None else UNQUANTIZED


@dataclass(frozen=True)
class Spread:
    """Bounds on one term's error (logged minus predicted) in the logs, `low <= 0 <= high`.

    In bytes for the additive terms, as a fraction of the prediction for the proportional ones."""

    low: float
    high: float
    samples: int


@dataclass(frozen=True)
class TermSpreads:
    weights: Spread  # fraction of the predicted weights
    activation: Spread  # fraction of the predicted activation peak, over all versions
    activation_by_version: tuple[tuple[Version, Spread], ...]
    non_torch_single_gpu: Spread  # bytes, over all versions
    non_torch_multi_gpu: Spread
    non_torch_by_version: tuple[tuple[tuple[bool, Version], Spread], ...]  # keyed by (more than one GPU, version)
    cuda_graphs: Spread  # bytes
    weights_by_format: tuple[tuple[str, Spread], ...] = ()  # fraction of the predicted weights, per format
    # Fraction of the vision tower's predicted pass, over all versions; None where no vision-language log prints
    # an activation peak, and then the tower is as unsure as the activation over all versions.
    encoder: Spread | None = None

    def weights_for(self, fmt: str) -> Spread:
        by_format = dict(self.weights_by_format)
        if fmt in by_format:
            seen = [by_format[fmt]]
        elif fmt != UNQUANTIZED:  # no log of this format: as unsure as the least certain format
            seen = list(by_format.values())
        else:
            seen = []
        low = min([self.weights.low] + [s.low for s in seen])
        high = max([self.weights.high] + [s.high for s in seen])
        return Spread(low, high, by_format[fmt].samples if fmt in by_format else 0)

    def activation_for(self, version: Version | None) -> Spread:
        return dict(self.activation_by_version).get(version, self.activation) if version else self.activation

    def encoder_pass(self) -> Spread:
        return self.encoder if self.encoder is not None else self.activation

    def non_torch_for(self, multi_gpu: bool, version: Version | None) -> Spread:
        pooled = self.non_torch_multi_gpu if multi_gpu else self.non_torch_single_gpu
        return dict(self.non_torch_by_version).get((multi_gpu, version), pooled) if version else pooled


def _gib(low: float, high: float, samples: int) -> Spread:
    return Spread(low * GIB, high * GIB, samples)


SHIPPED_SPREADS = TermSpreads(
    weights=Spread(-0.003, 0.067, 63),
    activation=Spread(-0.62, 2.572, 37),
    activation_by_version=(((0, 19), Spread(-0.028, 0.134, 23)), ((0, 29), Spread(0.0, 2.721, 3))),
    non_torch_single_gpu=_gib(-0.22, 0.50, 31),
    non_torch_multi_gpu=_gib(-2.13, 0.39, 8),
    non_torch_by_version=(
        ((False, (0, 19)), _gib(-0.02, 0.22, 18)),
        ((True, (0, 19)), _gib(-0.06, 0.15, 5)),
    ),
    cuda_graphs=_gib(-0.83, 1.06, 31),
    weights_by_format=(
        (UNQUANTIZED, Spread(-0.004, 0.066, 34)),
        ("awq", Spread(0.0, 0.003, 2)),
        ("bitsandbytes", Spread(-0.006, 0.012, 2)),
        ("fp8", Spread(-0.001, 0.022, 14)),
        ("gptq", Spread(0.0, 0.002, 3)),
        ("int", Spread(-0.002, 0.008, 3)),
        ("mxfp4", Spread(-0.019, 0.083, 5)),
    ),
    encoder=Spread(-0.049, 0.555, 8),
)


class PlannedMemory(Protocol):
    """What the range is worked out from: the figures of a plan (`exporter.capacity.plan.CapacityPlan`), which
    imports this module for its own `to_dict`."""

    @property
    def deployment(self) -> Deployment: ...
    @property
    def weights(self) -> WeightBreakdown: ...
    @property
    def activation_bytes(self) -> int: ...
    @property
    def non_torch_bytes(self) -> int: ...
    @property
    def cuda_graph_bytes(self) -> int: ...
    @property
    def kv_cache_bytes(self) -> int: ...
    @property
    def activation_passes(self) -> ActivationPasses: ...
    @property
    def layout(self) -> KvLayout: ...
    @property
    def pool(self) -> KvPool: ...


def _activation_error(result: PlannedMemory, text: Spread, tower: Spread) -> tuple[float, float]:
    """(low, high) bytes the activation peak may really differ by. With a vision tower the peak is the larger of
    its pass and the text passes, each moved by its own spread; without one, the activation's spread applies."""
    passes = result.activation_passes
    if not passes.encoder:
        return text.low * result.activation_bytes, text.high * result.activation_bytes
    low = max(passes.encoder * (1 + tower.low), passes.text * (1 + text.low))
    high = max(passes.encoder * (1 + tower.high), passes.text * (1 + text.high))
    return low - passes.peak, high - passes.peak


def kv_cache_tokens_range(result: PlannedMemory, spreads: TermSpreads = SHIPPED_SPREADS) -> tuple[int, int]:
    """The KV tokens the deployment may really get: (low, high), whole blocks, around `result.pool.tokens`."""
    d = result.deployment
    tokens = result.pool.tokens
    if d.kv_cache_memory_bytes is not None:
        return tokens, tokens  # given, not estimated: only the block arithmetic remains, which is exact
    version = d.vllm_version
    weights = spreads.weights_for(weights_format(d.quantization))
    activation = spreads.activation_for(version)
    non_torch = spreads.non_torch_for(d.tensor_parallel * d.pipeline_parallel > 1, version)
    terms = [
        (weights.low * result.weights.per_gpu_bytes, weights.high * result.weights.per_gpu_bytes),
        _activation_error(result, activation, spreads.encoder_pass()),
        (non_torch.low, non_torch.high) if result.non_torch_bytes else (0.0, 0.0),
        (spreads.cuda_graphs.low, spreads.cuda_graphs.high) if result.cuda_graph_bytes else (0.0, 0.0),
    ]
    # A term that took more memory than predicted leaves fewer tokens, and the other way round.
    fewer_bytes = math.hypot(*(high for _, high in terms))
    more_bytes = math.hypot(*(low for low, _ in terms))
    budget = result.kv_cache_bytes
    per_byte = tokens / budget if tokens and budget > 0 else 1 / result.layout.bytes_per_token
    block = result.pool.block_size
    low = math.floor(max(0.0, budget - fewer_bytes) * per_byte / block) * block
    high = math.ceil(max(0.0, budget + more_bytes) * per_byte / block) * block
    return min(low, tokens), max(high, tokens)
