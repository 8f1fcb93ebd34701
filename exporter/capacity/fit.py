"""Fits the capacity model's overhead terms to what real startup logs printed, and measures how far they miss.

The fitted terms are non-torch memory (one value at one GPU, one per GPU above), vLLM's CUDA-graph estimate, and
a per-version scale on the text passes of the activation peak that `activation.activation_passes` predicts from the
model's shape (1.0 where the shipped constants already match the logs; a vision tower's pass is never scaled).
Each is the median of what the logs printed: medians, because a few logs per source disagree by a factor (one
harness's activation figures, V0's non-torch memory).
The bench fits them on all logs (to check the constants in `assumptions`) and on all sources but one (to score
the left-out source honestly); `term_spreads` turns the misses into the ranges `uncertainty` gives every plan.
"""

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from exporter.capacity.activation import ActivationPasses
from exporter.capacity.uncertainty import UNQUANTIZED, Spread, TermSpreads, Version
from exporter.core.units import GIB

# A version needs this many logs printing a term before its own median and spread are used instead of those of
# all versions together: two logs of one source often agree by accident of the harness.
MIN_LOGS_PER_VERSION = 3


@dataclass(frozen=True)
class TermObservation:
    """What one startup log printed about the estimated terms, beside the model's prediction where one exists."""

    version: Version | None  # None where the log does not say
    gpus: int  # tensor x pipeline parallel
    non_torch_bytes: int | None = None
    activation_bytes: tuple[int, int] | None = None  # (the text passes predicted from the shape, unscaled; logged)
    weights_bytes: tuple[int, int] | None = None  # (predicted, logged)
    cuda_graph_bytes: int | None = None  # vLLM's own printed estimate
    weights_format: str = UNQUANTIZED  # uncertainty.weights_format of the checkpoint
    encoder_pass_bytes: int = 0  # the vision tower's predicted pass (activation.ActivationPasses), 0 without one


@dataclass(frozen=True)
class FittedTerms:
    non_torch_single_gpu_bytes: int
    non_torch_multi_gpu_bytes: int
    cuda_graph_bytes: int
    activation_scale: float  # over all versions
    activation_scale_by_version: tuple[tuple[Version, float], ...]

    def non_torch(self, gpus: int) -> int:
        return self.non_torch_single_gpu_bytes if gpus == 1 else self.non_torch_multi_gpu_bytes

    def activation(self, predicted_bytes: int, version: Version | None) -> int:
        scale = self.activation_scale
        if version is not None:
            scale = dict(self.activation_scale_by_version).get(version, scale)
        return round(predicted_bytes * scale)

    def scaled(self, passes: ActivationPasses, version: Version | None) -> ActivationPasses:
        """The profiling run's passes as these terms predict them: the scale on the text passes only, since it is
        fitted to peaks the text passes set; a vision tower's pass keeps its prediction and its own spread."""
        return replace(passes, text=self.activation(passes.text, version))


class FitError(ValueError):
    """The logs given print nothing for a term, so it cannot be fitted."""


def _median(values: Sequence[float], term: str) -> float:
    if not values:
        raise FitError(f"no log prints {term}")
    return statistics.median(values)


def _by_version(pairs: Iterable[tuple[Version | None, float]]) -> dict[Version, list[float]]:
    grouped: dict[Version, list[float]] = defaultdict(list)
    for version, value in pairs:
        if version is not None:
            grouped[version].append(value)
    return {v: values for v, values in sorted(grouped.items()) if len(values) >= MIN_LOGS_PER_VERSION}


def fit_terms(observations: Sequence[TermObservation]) -> FittedTerms:
    single = [o.non_torch_bytes for o in observations if o.non_torch_bytes is not None and o.gpus == 1]
    multi = [o.non_torch_bytes for o in observations if o.non_torch_bytes is not None and o.gpus > 1]
    graphs = [o.cuda_graph_bytes for o in observations if o.cuda_graph_bytes is not None]
    # A log whose vision tower is predicted to set the peak measures the tower, not the text passes the scale is for.
    ratios = [
        (o.version, logged / text)
        for o in observations
        if o.activation_bytes
        for text, logged in [o.activation_bytes]
        if text >= o.encoder_pass_bytes
    ]
    return FittedTerms(
        non_torch_single_gpu_bytes=round(_median(single, "non-torch memory at one GPU")),
        non_torch_multi_gpu_bytes=round(_median(multi, "non-torch memory at more than one GPU")),
        cuda_graph_bytes=round(_median(graphs, "a CUDA-graph estimate")),
        activation_scale=round(_median([r for _, r in ratios], "an activation peak"), 3),
        activation_scale_by_version=tuple(
            (version, round(statistics.median(values), 3)) for version, values in _by_version(ratios).items()
        ),
    )


def spread(errors: Sequence[float], rounding: Callable[[float], float] = float) -> Spread:
    """The errors' range widened by one mean gap between neighbouring errors on each side, so that thin data
    (two or three logs) gives a wide range and many logs a range close to what was seen; zero always inside."""
    if not errors:
        raise FitError("no log prints this term")
    low, high = min(errors), max(errors)
    gap = (high - low) / (len(errors) - 1) if len(errors) > 1 else abs(low)
    return Spread(rounding(min(0.0, low - gap)), rounding(max(0.0, high + gap)), len(errors))


def _fraction(value: float) -> float:
    return round(value, 3)


def _bytes(value: float) -> float:
    return round(value / GIB, 2) * GIB  # as vLLM prints memory


def term_spreads(observations: Sequence[TermObservation], fitted: FittedTerms) -> TermSpreads:
    """How far each fitted term (and the weights) missed the logs, by version where enough logs allow."""
    weights = [
        logged / predicted - 1 for o in observations if o.weights_bytes for predicted, logged in [o.weights_bytes]
    ]
    weights_by_format: dict[str, list[float]] = {}
    for o in observations:
        if o.weights_bytes:
            predicted, logged = o.weights_bytes
            weights_by_format.setdefault(o.weights_format, []).append(logged / predicted - 1)
    # Each printed peak beside the passes the fitted terms predict (`FittedTerms.scaled`, as the bench's refit plans
    # do): the text passes' miss where they set the peak, and a vision-language log's miss, in units of its tower's
    # predicted pass, for the tower's own spread.
    peaks = [
        (o.version, fitted.scaled(ActivationPasses(text, o.encoder_pass_bytes), o.version), logged)
        for o in observations
        if o.activation_bytes
        for text, logged in [o.activation_bytes]
    ]
    activation = [(v, logged / passes.peak - 1) for v, passes, logged in peaks if passes.text >= passes.encoder]
    encoder = [(logged - passes.peak) / passes.encoder for _, passes, logged in peaks if passes.encoder]
    non_torch = [
        (o.gpus > 1, o.version, o.non_torch_bytes - fitted.non_torch(o.gpus))
        for o in observations
        if o.non_torch_bytes is not None
    ]
    graphs = [o.cuda_graph_bytes - fitted.cuda_graph_bytes for o in observations if o.cuda_graph_bytes is not None]
    non_torch_by_version = [
        ((multi, version), spread(errors, _bytes))
        for multi in (False, True)
        for version, errors in _by_version((v, e) for m, v, e in non_torch if m == multi).items()
    ]
    return TermSpreads(
        weights=spread(weights, _fraction),
        activation=spread([e for _, e in activation], _fraction),
        activation_by_version=tuple((v, spread(errors, _fraction)) for v, errors in _by_version(activation).items()),
        non_torch_single_gpu=spread([e for m, _, e in non_torch if not m], _bytes),
        non_torch_multi_gpu=spread([e for m, _, e in non_torch if m], _bytes),
        non_torch_by_version=tuple(non_torch_by_version),
        cuda_graphs=spread(graphs, _bytes),
        weights_by_format=tuple((f, spread(e, _fraction)) for f, e in sorted(weights_by_format.items())),
        encoder=spread(encoder, _fraction) if encoder else None,
    )
