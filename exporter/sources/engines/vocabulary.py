"""An engine vocabulary: the names one engine gives the normalised fields, and the reading they make.

Engines whose pages say everything through metric names (TGI, llama.cpp, LMDeploy, NIM) are a `Vocabulary`
and nothing more; the others (vLLM's cache_config_info labels, SGLang's replicas, TensorRT-LLM's block counts)
start from one and add what names cannot say.
"""

from collections.abc import Callable
from dataclasses import dataclass

from exporter.sources.engines.base import Detection, EngineReading, PageLimits
from exporter.sources.engines.domains import checked
from exporter.sources.engines.series import (
    Group,
    at_most,
    counter,
    detection,
    gauge,
    groups,
    histogram,
    totals_only,
)
from exporter.sources.promtext import ParsedPage


@dataclass(frozen=True)
class Vocabulary:
    """Each field lists aliases, current name first; the first the page has wins. Counters are listed as they
    appear on the wire (with `_total`) and, where some build drops it, without. Histogram fields name families."""

    name: str
    prefix: str  # what all its names start with; "" for NIM 1.x's unprefixed names
    instance_label: str | None = None  # the label that tells instances on one page apart
    model_label: str | None = None
    replica_labels: tuple[str, ...] = ()  # labels of copies of the same series (tensor-parallel ranks)
    # Labels that split a series into parts beside a total that carries the label empty (SGLang's `priority`
    # under priority scheduling): only the total is read, so a counter is not counted twice.
    breakdown_labels: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()  # 0..1
    preemptions: tuple[str, ...] = ()
    prompt_tokens: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    requests_finished: tuple[str, ...] = ()
    ttft: tuple[str, ...] = ()
    itl: tuple[str, ...] = ()
    e2e: tuple[str, ...] = ()
    request_prompt_tokens: tuple[str, ...] = ()
    request_generation_tokens: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # names `refine` reads itself
    # What names cannot say (vLLM's cache_config_info labels, SGLang's capacity gauges): adds to each reading.
    refine: Callable[[ParsedPage, Group, EngineReading], EngineReading] | None = None

    @property
    def needs(self) -> tuple[str, ...]:
        return (
            *self.running,
            *self.waiting,
            *self.kv_usage,
            *self.preemptions,
            *self.prompt_tokens,
            *self.generation_tokens,
            *self.requests_finished,
            *self.ttft,
            *self.itl,
            *self.e2e,
            *self.request_prompt_tokens,
            *self.request_generation_tokens,
            *self.extra,
        )

    def detect(self, page: ParsedPage) -> Detection:
        return detection(page, self.prefix, [names for names in (self.running, self.waiting, self.kv_usage) if names])

    def groups(self, page: ParsedPage) -> list[Group]:
        """The instances on the page, told apart by the load and KV gauges. A page without any of them (an older
        build, metrics partly off) is told apart by its counters and histograms instead, so that what it carries is
        still read. Not by both: server-wide series (SGLang's tokenizer-side counters under DP attention carry no
        dp_rank) would make an extra instance beside the ranks. A page with neither is told apart by the names
        `refine` reads: SGLang's page before its first request holds only its capacity gauges
        (sglang:max_total_num_tokens), and that capacity is worth reading."""
        gauges = self.running + self.waiting + self.kv_usage
        counters = self.preemptions + self.prompt_tokens + self.generation_tokens + self.requests_finished
        histograms = self.ttft + self.itl + self.e2e + self.request_prompt_tokens + self.request_generation_tokens
        others = counters + tuple(family + suffix for family in histograms for suffix in ("_count", "_bucket"))
        for names in (gauges, others, self.extra):
            found = groups(page, names, self.instance_label, self.model_label)
            if found:
                return found
        return []

    def read(self, page: ParsedPage, max_instances: int = PageLimits.max_instances) -> list[EngineReading]:
        if self.breakdown_labels:
            page = totals_only(page, self.needs, self.breakdown_labels)
        readings = [(group, self.reading(page, group)) for group in at_most(self.groups(page), max_instances)]
        if self.refine is None:
            return [reading for _, reading in readings]
        return [self.refine(page, group, reading) for group, reading in readings]

    def reading(self, page: ParsedPage, group: Group) -> EngineReading:
        where, replicas = group.where, self.replica_labels
        reading = EngineReading(
            engine=self.name,
            instance=group.instance,
            model=group.model,
            kv_cache_usage_ratio=gauge(page, self.kv_usage, where),
            requests_running=gauge(page, self.running, where),
            requests_waiting=gauge(page, self.waiting, where),
            preemptions_total=counter(page, self.preemptions, where, replicas),
            prompt_tokens_total=counter(page, self.prompt_tokens, where, replicas),
            generation_tokens_total=counter(page, self.generation_tokens, where, replicas),
            requests_finished_total=counter(page, self.requests_finished, where, replicas),
            ttft_seconds=histogram(page, self.ttft, where, replicas),
            itl_seconds=histogram(page, self.itl, where, replicas),
            e2e_seconds=histogram(page, self.e2e, where, replicas),
            request_prompt_tokens=histogram(page, self.request_prompt_tokens, where, replicas),
            request_generation_tokens=histogram(page, self.request_generation_tokens, where, replicas),
        )
        return checked(reading)
