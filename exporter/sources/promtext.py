"""A fast, forgiving reader of the Prometheus text exposition format (and the OpenMetrics text it resembles).

Engines' /metrics pages are mostly noise for Plimsoll (python_*, process_*, http_* and histograms nobody asked
for), so `parse` takes a `keep(sample_name)` filter and looks at a line's labels only when the name is kept.
A bad line never stops the page: it is counted in `skipped_lines` and the next line is read. Timestamps and
exemplars after the value are ignored; `# HELP` and other comments are skipped; `# EOF` ends the page.
What one page may cost is bounded. Past `max_series` kept samples the parse stops and raises `TooManySeries`, and
past `LABELS_PER_SAMPLE` labels a sample among them `TooManyLabels` (counted before a line's labels are split: one
line can hold a page of them). The text is split a block at a time, and at most `MAX_NAMES` distinct names are
remembered (declared types, keep verdicts): split whole, a page of short lines held 15 times its size (120 MiB for
8 MiB, past the DaemonSet's 128 MiB). So a hostile page costs one pass over its text, no more than `max_series`
samples of work, and a few MiB beyond its text and the samples kept.

prometheus_client's own parser takes about 12 times as long on a vLLM page as this one filtered for the engine
adapters (5 times unfiltered; bench/parse_bench.py), renames counters written without `_total`, and raises on
the first malformed line, which a daemon polling third-party servers cannot afford.
"""

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

# Whether a name is valid is checked only for kept lines.
_VALID_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Commas are required between pairs (a trailing one is allowed) so a run of blanks can be split only one way,
# and quantifiers are possessive: a long label block that fails to close must not backtrack. Values are matched
# a run of plain characters at a time, which is what makes this fast.
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*+[ \t]*+=[ \t]*+"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_LABEL_BLOCK = re.compile(
    r"[ \t]*+\{[ \t]*+((?:" + _PAIR + r"(?:[ \t]*+,[ \t]*+" + _PAIR + r")*+)?+)[ \t]*+,?+[ \t]*+\}"
)
_LABEL_PAIRS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*+)[ \t]*+=[ \t]*+"([^"\\]*+(?:\\.[^"\\]*+)*+)"')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}
_BLOCK_CHARS = 1 << 16  # a block's lines take about 15 times its size: about a MiB
# A real page names a few hundred metrics; a page naming more is remembered this far (the rest of its # TYPE lines
# are ignored, and keep() is asked again for each line of the rest of its names).
MAX_NAMES = 10_000
# Engines' samples carry about 3 labels (vLLM's cache_config_info, the most, 37 once per engine).
LABELS_PER_SAMPLE = 8


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


_Index = dict[tuple[str | None, ...], list[Sample]]  # samples of one name by their values of some label keys


class TooManySeries(Exception):
    """The page has more samples of the kept names than the parse was allowed to keep."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} samples")
        self.limit = limit


class TooManyLabels(TooManySeries):
    """The kept samples carry more labels than LABELS_PER_SAMPLE for each of the `limit` samples allowed."""


@dataclass(frozen=True)
class ParsedPage:
    samples: Mapping[str, tuple[Sample, ...]]  # by sample name, e.g. "vllm:time_to_first_token_seconds_bucket"
    # family name -> TYPE as the page declares it (builds disagree; kept as written): the first MAX_NAMES declared
    types: Mapping[str, str]
    skipped_lines: int  # malformed lines among those read (lines the keep filter dropped are not inspected)
    # A page is read one engine instance at a time, each selecting its series by the same label keys: a name selected
    # a second time by the same keys is indexed by them, so reading every instance of a page costs time linear in
    # its samples (scanning every sample of a name for each instance made a page of many instances quadratic),
    # while a page of one instance pays for no index. The memo belongs to this page, which one read builds and
    # uses; it holds nothing a second read of the same page would compute differently.
    _indexes: dict[tuple[str, tuple[str, ...]], _Index | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def get(self, name: str) -> tuple[Sample, ...]:
        return self.samples.get(name, ())

    def select(self, name: str, where: Mapping[str, str]) -> Sequence[Sample]:
        """The samples of `name` whose labels include every pair in `where`, in page order."""
        samples = self.get(name)
        if not where or not samples:
            return samples
        keys = tuple(sorted(where))
        slot = name, keys
        if slot not in self._indexes:
            self._indexes[slot] = None  # selected once: index on the next selection
            wanted = where.items()
            return [sample for sample in samples if wanted <= sample.labels.items()]
        index = self._indexes[slot]
        if index is None:
            index = {}
            for sample in samples:
                index.setdefault(tuple(map(sample.labels.get, keys)), []).append(sample)
            self._indexes[slot] = index
        return index.get(tuple(map(where.__getitem__, keys)), ())


class _Verdict(Enum):
    READ = 1
    DROP = 2  # the keep filter does not want it
    MALFORMED = 3  # not a metric name


def parse(text: str, keep: Callable[[str], bool] | None = None, max_series: int | None = None) -> ParsedPage:
    """The samples of the names `keep` accepts (all without it); raises TooManySeries past `max_series` of them,
    TooManyLabels past LABELS_PER_SAMPLE labels for each."""
    samples: dict[str, list[Sample]] = {}
    types: dict[str, str] = {}
    skipped = 0
    kept = 0
    quotes = 0  # in the lines read: two a label
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    verdicts: dict[str, _Verdict] = {}  # by name: a name repeats (a line per bucket) and keep() costs a call
    # Most lines carry the name of the line above: checking for "name{" or "name " is cheaper than finding it.
    run, name, verdict = ("\n", "\n"), "", _Verdict.DROP
    for raw in _lines(text):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith(run):
            if line[0] == "#":
                if line.startswith("# TYPE"):
                    words = line.split()
                    if len(words) >= 4 and len(types) < MAX_NAMES:
                        types[words[2]] = words[3]
                elif line == "# EOF":
                    break
                continue
            head = line.split(None, 1)[0]
            brace = head.find("{")
            name = head if brace == -1 else head[:brace]
            run = (name + "{", name + " ")
            verdict = verdicts.get(name) or _verdict(name, keep)
            if len(verdicts) < MAX_NAMES:
                verdicts[name] = verdict
        if verdict is _Verdict.DROP:
            continue
        sample = None
        if verdict is _Verdict.READ:
            quotes += line.count('"')
            if max_series is not None and quotes > 2 * LABELS_PER_SAMPLE * max_series:
                raise TooManyLabels(max_series)
            sample = _sample(line, name)
        if sample is None:
            skipped += 1
        elif kept == max_series:
            raise TooManySeries(kept)
        else:
            kept += 1
            samples.setdefault(name, []).append(sample)
    return ParsedPage(
        samples={name: tuple(found) for name, found in samples.items()},
        types=types,
        skipped_lines=skipped,
    )


def _lines(text: str) -> Iterator[str]:
    """The lines of `text`, split a block of about _BLOCK_CHARS at a time (each block ends at a line's end)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + _BLOCK_CHARS)
        if end == -1:
            end = len(text)
        yield from text[start:end].split("\n")
        start = end + 1


def _verdict(name: str, keep: Callable[[str], bool] | None) -> _Verdict:
    if keep is not None and not keep(name):
        return _Verdict.DROP
    return _Verdict.READ if _VALID_NAME.fullmatch(name) else _Verdict.MALFORMED


def _sample(line: str, name: str) -> Sample | None:
    pos = len(name)
    labels: dict[str, str] = {}
    block = _LABEL_BLOCK.match(line, pos)
    if block is not None:
        labels = _labels(block.group(1))
        pos = block.end()
    words = line[pos:].split(None, 1)
    if not words:
        return None
    value = _number(words[0])
    return None if value is None else Sample(name, labels, value)


def _labels(pairs: str) -> dict[str, str]:
    """The pairs of a label block already checked by _LABEL_BLOCK."""
    if "\\" in pairs:
        return {key: _unescape(value) for key, value in _LABEL_PAIRS.findall(pairs)}
    # With no escapes every quote opens or closes a value, so splitting on quotes is exact, and 2x faster.
    parts = pairs.split('"')
    return {parts[i].strip(", \t="): parts[i + 1] for i in range(0, len(parts) - 1, 2)}


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda found: _UNESCAPED.get(found.group(1), found.group()), value)


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        # Windows C runtimes print NaN as "-nan(ind)" (llama.cpp on Windows does, for idle averages).
        return math.nan if word.lower().lstrip("+-").startswith("nan") else None
