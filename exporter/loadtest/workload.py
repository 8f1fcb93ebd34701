"""What the load generator sends: prompt and output lengths, fixed, drawn from a distribution, or from a trace.

Synthetic prompts are words drawn at random from a list of common short words (roughly one token each), seeded so
that a second run draws the same lengths and words. The real token count is whatever the server's usage says.

A run draws one stream of requests for all its steps, and each prompt opens with a marker of the run and the
request's number (`unique_prompts`): no step, no request and no later run sends a prefix the engine has cached, so
prefix caching (on by default in vLLM and SGLang) never shortens a prefill the test means to measure. A trace whose
requests share a system prompt on purpose is sent as written with `unique_prompts` off.
"""

import json
import random
import reprlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from typing import Any

from exporter.files import read_capped
from exporter.loadtest.client import Message, Prompt

_WORD_LIST = (
    "the of and to in is for on that with as at by it from be this are or an was not but all can had one "
    "we her has his they more will you if our out up new time so its two may day year first use work way "
    "part back good long only over well very just last own same home life world day hand place case week "
    "point group number fact water book line city name price light state field order"
)
_WORDS = tuple(_WORD_LIST.split())

# A trace larger than this is refused rather than read into memory whole.
MAX_TRACE_BYTES = 64 << 20
# Llama 4 Scout's context, among the longest any engine serves: a longer length is more likely a typo, and drawing
# one would build a prompt of gigabytes in memory before anything is sent.
MAX_TOKENS = 10_000_000


class WorkloadError(ValueError):
    """A workload that cannot be used; the message names the flag or file, the field and what to do."""


@dataclass(frozen=True)
class Lengths:
    """Token counts drawn from a normal distribution around `mean`, clamped to [minimum, maximum]; spread 0: fixed."""

    mean: int
    spread: float = 0.0  # standard deviation
    minimum: int = 1
    maximum: int | None = None

    def draw(self, rng: random.Random) -> int:
        value = round(rng.gauss(self.mean, self.spread)) if self.spread > 0 else self.mean
        return min(self.maximum or MAX_TOKENS, max(self.minimum, value))

    def describe(self) -> dict[str, Any]:
        return {"mean": self.mean, "spread": self.spread, "min": self.minimum, "max": self.maximum}


@dataclass(frozen=True)
class WorkRequest:
    prompt: Prompt
    max_tokens: int


@dataclass(frozen=True)
class SyntheticWorkload:
    prompt_tokens: Lengths
    output_tokens: Lengths
    seed: int = 0

    @property
    def fixed_lengths(self) -> bool:
        """Every request has the same prompt and output length: one request's footprint is every request's."""
        return self.prompt_tokens.spread == 0 and self.output_tokens.spread == 0


@dataclass(frozen=True)
class TraceWorkload:
    requests: tuple[WorkRequest, ...]
    source: str  # the file it came from

    @property
    def has_messages(self) -> bool:
        return any(not isinstance(request.prompt, str) for request in self.requests)


Workload = SyntheticWorkload | TraceWorkload


def check_lengths(flag: str, lengths: Lengths) -> Lengths:
    """The lengths as given, or WorkloadError naming the flag."""
    if lengths.mean < 1:
        raise WorkloadError(f"{flag}: {lengths.mean} tokens is not a length (expected a whole number of at least 1)")
    if max(lengths.mean, lengths.minimum, lengths.maximum or 0) > MAX_TOKENS:
        raise WorkloadError(f"{flag}: longer than a model's context (at most {MAX_TOKENS:,} tokens)")
    if not 0 <= lengths.spread <= MAX_TOKENS:  # NaN too
        raise WorkloadError(f"{flag}: a spread of {lengths.spread:g} is not one (0 to {MAX_TOKENS:,} tokens)")
    if lengths.minimum < 1 or (lengths.maximum is not None and lengths.maximum < lengths.minimum):
        raise WorkloadError(f"{flag}: min {lengths.minimum} and max {lengths.maximum} do not bound any length")
    return lengths


def requests(workload: Workload, marker: str | None = None) -> Iterator[WorkRequest]:
    """An endless sequence of requests; each prompt opens with `{marker}-{number}: ` where a marker is given."""
    numbered = enumerate(_drawn(workload))
    if marker is None:
        yield from (request for _, request in numbered)
        return
    for number, request in numbered:
        yield WorkRequest(_marked(request.prompt, f"{marker}-{number}: "), request.max_tokens)


def run_marker() -> str:
    """A marker no earlier run has used, so its prompts share no prefix with theirs."""
    return secrets.token_hex(4)


def _drawn(workload: Workload) -> Iterator[WorkRequest]:
    """The workload's own sequence: the trace in a loop, or seeded draws (the same seed, the same sequence)."""
    if isinstance(workload, TraceWorkload):
        yield from cycle(workload.requests)
        return
    rng = random.Random(workload.seed)
    while True:
        prompt_tokens = workload.prompt_tokens.draw(rng)
        yield WorkRequest(" ".join(rng.choices(_WORDS, k=prompt_tokens)), workload.output_tokens.draw(rng))


def _marked(prompt: Prompt, mark: str) -> Prompt:
    """The prompt with `mark` in front of its first message (the one a prefix cache matches first)."""
    if isinstance(prompt, str):
        return mark + prompt
    first, *rest = prompt
    return ({**first, "content": mark + first["content"]}, *rest)


def describe(workload: Workload) -> dict[str, Any]:
    """The workload as result.json records it."""
    if isinstance(workload, TraceWorkload):
        return {"kind": "trace", "source": workload.source, "requests": len(workload.requests)}
    return {
        "kind": "synthetic",
        "prompt_tokens": workload.prompt_tokens.describe(),
        "output_tokens": workload.output_tokens.describe(),
        "seed": workload.seed,
    }


def load_trace(path: Path, default_max_tokens: int) -> TraceWorkload:
    """Read a JSONL trace of {"prompt": str | "messages": [...], "max_tokens": int} records (max_tokens optional:
    `default_max_tokens` where a record has none). Every problem names the file and line."""
    try:
        # A FIFO or a device (/dev/zero) would wait or read without end: only a regular file is read, and bounded.
        data = read_capped(str(path), MAX_TRACE_BYTES, "--dataset", "use a sample of the trace")
    except ValueError as error:
        raise WorkloadError(str(error)) from None
    try:
        # A record ends at \n only (JSON Lines): a prompt may hold U+2028 or U+0085 as written, which splitlines()
        # would split it at. A byte-order mark (Windows tools write one) is no part of the first record.
        lines = data.decode("utf-8-sig").split("\n")
    except UnicodeDecodeError:
        raise WorkloadError(f"--dataset {path}: not UTF-8 text (expected JSON lines)") from None
    found = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            found.append(_trace_record(f"{path}:{number}", line, default_max_tokens))
    if not found:
        raise WorkloadError(f"--dataset {path}: no records (expected one JSON object per line)")
    return TraceWorkload(tuple(found), str(path))


def _trace_record(where: str, line: str, default_max_tokens: int) -> WorkRequest:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise WorkloadError(f"{where}: not JSON ({error.msg})") from None
    except ValueError:  # Python reads no integer of over 4,300 digits
        raise WorkloadError(f"{where}: a number too long to read (no field takes one that long)") from None
    except RecursionError:
        raise WorkloadError(f"{where}: nested too deeply to read (expected a flat JSON object)") from None
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected a JSON object with prompt or messages")
    max_tokens = record.get("max_tokens", default_max_tokens)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS:
        raise WorkloadError(
            f"{where}: max_tokens {reprlib.repr(max_tokens)} is not a whole number from 1 to {MAX_TOKENS:,}"
        )
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise WorkloadError(f"{where}: prompt must be a non-empty string")
        return WorkRequest(record["prompt"], max_tokens)
    if "messages" in record:
        return WorkRequest(_messages(where, record["messages"]), max_tokens)
    raise WorkloadError(f"{where}: neither prompt nor messages (expected one of them)")


def _messages(where: str, value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
    for index, message in enumerate(value):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise WorkloadError(f"{where}: messages[{index}] needs a string role and a string content")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)
