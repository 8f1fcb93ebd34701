"""Picking one engine instance's numbers out of a parsed page.

The rules every adapter shares:
- a page can hold several instances (vLLM data-parallel engines, SGLang dp ranks, several Triton models); a
  `Group` is one of them, and its `where` labels select its series;
- names come as alias lists, current name first: the first name with a matching series wins;
- a gauge that appears more than once for one instance is a replica (SGLang repeats it per TP rank): take the
  largest, never the sum;
- counter series split by a label (vLLM's finished_reason) add up to the whole, but replicas count once;
- histogram series that differ only in `le` are one histogram.
NaN values say nothing: beside numbers they are dropped; a field whose series hold only NaN reads NaN, which
the field's domain check (domains.py) turns into a reason rather than a silent absence.

Series are selected through `ParsedPage.select`, which indexes each name once, so reading every instance of a
page costs time linear in its samples however many instances it has.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from exporter.sources.engines.base import Detection, Histogram, TooManyInstances
from exporter.sources.promtext import ParsedPage, Sample

# A page whose names carry an engine's prefix is that engine's more likely than not; the rest of the score
# comes from the engine's load and KV gauges.
_PREFIX_WEIGHT = 0.5

_Key = frozenset[tuple[str, str]]  # a series' labels


@dataclass(frozen=True)
class Group:
    """One engine instance on a page."""

    instance: str  # the engine's instance label value, "" when it has none
    model: str | None
    where: Mapping[str, str]  # the labels its series carry


def groups(page: ParsedPage, names: Iterable[str], instance_label: str | None, model_label: str | None) -> list[Group]:
    """One group per distinct (instance, model) among the samples of `names`, in page order."""
    found: dict[tuple[str, str | None], Group] = {}
    for name in names:
        for sample in page.get(name):
            instance = sample.labels.get(instance_label, "") if instance_label else ""
            model = sample.labels.get(model_label) if model_label else None
            if (instance, model) not in found:
                where: dict[str, str] = {}
                if instance_label and instance_label in sample.labels:
                    where[instance_label] = instance
                if model_label and model is not None:
                    where[model_label] = model
                found[instance, model] = Group(instance, model, where)
    return list(found.values())


def at_most(found: list[Group], max_instances: int) -> list[Group]:
    """The groups, or TooManyInstances when there are more than max_instances of them."""
    if len(found) > max_instances:
        raise TooManyInstances(len(found), max_instances)
    return found


def totals_only(page: ParsedPage, names: Iterable[str], breakdown_labels: Sequence[str]) -> ParsedPage:
    """The page with the series of `names` that carry a breakdown label with a value left out."""
    samples = dict(page.samples)
    for name in names:
        kept = tuple(s for s in page.get(name) if not any(s.labels.get(label) for label in breakdown_labels))
        if len(kept) != len(page.get(name)):
            samples[name] = kept
    return replace(page, samples=samples)


def first_series(page: ParsedPage, names: Sequence[str], where: Mapping[str, str]) -> Sequence[Sample]:
    for name in names:
        found = page.select(name, where)
        if found:
            return found
    return ()


def gauge(page: ParsedPage, names: Sequence[str], where: Mapping[str, str]) -> float | None:
    series = first_series(page, names, where)
    values = [s.value for s in series if not math.isnan(s.value)]
    if values:
        return max(values)
    return math.nan if series else None


def counter(
    page: ParsedPage, names: Sequence[str], where: Mapping[str, str], replica_labels: Sequence[str] = ()
) -> float | None:
    largest: dict[_Key, float] = {}
    series = first_series(page, names, where)
    for sample in series:
        if not math.isnan(sample.value):
            key = _series_key(sample.labels, replica_labels)
            largest[key] = max(largest.get(key, -math.inf), sample.value)
    if largest:
        return sum(largest.values())
    return math.nan if series else None


def histogram(
    page: ParsedPage, families: Sequence[str], where: Mapping[str, str], replica_labels: Sequence[str] = ()
) -> Histogram | None:
    for family in families:
        buckets = page.select(family + "_bucket", where)
        counts = page.select(family + "_count", where)
        if buckets or counts:
            return _assemble(buckets, counts, page.select(family + "_sum", where), where, replica_labels)
    return None


def whole(value: float | None) -> int | None:
    """A count the engine reports as a float (prometheus_client prints 4096 as 4096.0)."""
    return int(value) if value is not None and math.isfinite(value) else None


def label_number(labels: Mapping[str, str], key: str) -> float | None:
    """A numeric label value; None when missing or not a number (vLLM prints unset config fields as "None")."""
    try:
        return float(labels[key])
    except (KeyError, ValueError):
        return None


def label_int(labels: Mapping[str, str], key: str) -> int | None:
    """An integer label value; vLLM prints unset config fields as "None"."""
    return whole(label_number(labels, key))


def detection(page: ParsedPage, prefix: str, signature: Sequence[Sequence[str]]) -> Detection:
    """Score a page by its names: the engine's prefix, and each signature entry (aliases of one metric) found.

    Engines without a prefix (NIM 1.x) are scored on the signature alone, so a page must show most of it.
    """
    names = page.samples.keys() | page.types.keys()
    found = [aliases for aliases in signature if any(name in names for name in aliases)]
    evidence = []
    score = len(found) / len(signature) if signature else 0.0
    if prefix:
        prefixed = len([name for name in names if name.startswith(prefix)])
        evidence.append(f"{prefixed} names start with {prefix!r}")
        score = (_PREFIX_WEIGHT if prefixed else 0.0) + (1 - _PREFIX_WEIGHT) * score
    evidence.extend(f"has {_present(aliases, names)}" for aliases in found)
    evidence.extend(f"lacks {aliases[0]}" for aliases in signature if aliases not in found)
    return Detection(score=score, evidence=tuple(evidence))


def _present(aliases: Sequence[str], names: Iterable[str]) -> str:
    return next(name for name in aliases if name in names)


def _series_key(labels: Mapping[str, str], dropped: Sequence[str]) -> _Key:
    return frozenset(labels.items()).difference([(name, labels[name]) for name in dropped if name in labels])


def _assemble(
    buckets: Sequence[Sample],
    counts: Sequence[Sample],
    sums: Sequence[Sample],
    where: Mapping[str, str],
    replica_labels: Sequence[str],
) -> Histogram | None:
    # Every sample carries `where`; one that carries nothing else (but `le`) is the series `where` names, which
    # spares working out a key per bucket in the usual case of a single series.
    named, size = frozenset(where.items()), len(where)
    bucket_sets: dict[_Key, dict[float, float]] = {}
    for sample in buckets:
        bound = _bound(sample.labels.get("le"))
        if bound is not None:
            key = named if len(sample.labels) == size + 1 else _series_key(sample.labels, ("le",))
            bucket_sets.setdefault(key, {})[bound] = sample.value
    count_of = {named if len(s.labels) == size else _series_key(s.labels, ()): s.value for s in counts}
    sum_of = {named if len(s.labels) == size else _series_key(s.labels, ()): s.value for s in sums}
    # Replicas (the same histogram once per TP rank) count once: keep the fullest. Other splits (SGLang's
    # is_streaming) are disjoint sets of requests and add up.
    kept: dict[_Key, Histogram] = {}
    for key in dict.fromkeys([*bucket_sets, *count_of]):
        one = _histogram(bucket_sets.get(key, {}), count_of.get(key), sum_of.get(key))
        if one is not None:
            family = _series_key(dict(key), replica_labels)
            if family not in kept or one.count > kept[family].count:
                kept[family] = one
    return _merge(list(kept.values()))


def _bound(le: str | None) -> float | None:
    """A bucket's upper bound; None when `le` is missing or not a number."""
    if le is None:
        return None
    try:
        bound = float(le)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound


def _histogram(buckets: dict[float, float], count: float | None, total: float | None) -> Histogram | None:
    if count is None:
        count = buckets.get(math.inf)
    if count is None:
        return None
    pairs = sorted(buckets.items())
    if not pairs or pairs[-1][0] != math.inf:
        # Some pages leave the +Inf bucket out; by definition it holds every observation, as _count does.
        pairs.append((math.inf, count))
    return Histogram(buckets=tuple(pairs), count=count, sum=math.nan if total is None else total)


def _merge(histograms: list[Histogram]) -> Histogram | None:
    if len(histograms) <= 1:
        return histograms[0] if histograms else None
    bounds = [bound for bound, _ in histograms[0].buckets]
    if any([bound for bound, _ in h.buckets] != bounds for h in histograms[1:]):
        return max(histograms, key=lambda h: h.count)  # splits with different buckets cannot be added
    counts = [sum(h.buckets[i][1] for h in histograms) for i in range(len(bounds))]
    return Histogram(
        buckets=tuple(zip(bounds, counts, strict=True)),
        count=sum(h.count for h in histograms),
        sum=sum(h.sum for h in histograms),
    )
