"""A fast, forgiving reader of the Prometheus text exposition format (and the OpenMetrics text it resembles).

Engines' /metrics pages are mostly noise for Plimsoll (python_*, process_*, http_* and histograms nobody asked
for), so `parse` takes a `keep(sample_name)` filter and looks at a line's labels only when the name is kept.
A bad line never stops the page: it is counted in `skipped_lines` and the next line is read. Timestamps and
exemplars after the value are ignored; `# HELP` and other comments are skipped; `# EOF` ends the page.
What one page may cost is bounded by `max_series`: past that many kept samples the parse stops and raises
`TooManySeries`, so a hostile page costs one split of its text and no more than `max_series` samples of work.

prometheus_client's own parser takes about 12 times as long on a vLLM page as this one filtered for the engine
adapters (5 times unfiltered; bench/parse_bench.py), renames counters written without `_total`, and raises on
the first malformed line, which a daemon polling third-party servers cannot afford.
"""

import math
import re
from collections.abc import Callable, Mapping, Sequence
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


@dataclass(frozen=True)
class ParsedPage:
    samples: Mapping[str, tuple[Sample, ...]]  # by sample name, e.g. "vllm:time_to_first_token_seconds_bucket"
    types: Mapping[str, str]  # family name -> TYPE as the page declares it (builds disagree; kept as written)
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
    """The samples of the names `keep` accepts (all without it); raises TooManySeries past `max_series` of them."""
    samples: dict[str, list[Sample]] = {}
    types: dict[str, str] = {}
    skipped = 0
    kept = 0
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    verdicts: dict[str, _Verdict] = {}  # by name: a name repeats (a line per bucket) and keep() costs a call
    # Most lines carry the name of the line above: checking for "name{" or "name " is cheaper than finding it.
    run, name, verdict = ("\n", "\n"), "", _Verdict.DROP
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith(run):
            if line[0] == "#":
                if line.startswith("# TYPE"):
                    words = line.split()
                    if len(words) >= 4:
                        types[words[2]] = words[3]
                elif line == "# EOF":
                    break
                continue
            head = line.split(None, 1)[0]
            brace = head.find("{")
            name = head if brace == -1 else head[:brace]
            run = (name + "{", name + " ")
            if name not in verdicts:
                verdicts[name] = _verdict(name, keep)
            verdict = verdicts[name]
        if verdict is _Verdict.DROP:
            continue
        sample = _sample(line, name) if verdict is _Verdict.READ else None
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
