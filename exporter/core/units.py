"""Human-friendly sizes and durations, parsed strictly.

Sizes follow the convention people type on the command line: binary suffixes (KiB, MiB, GiB, TiB) are powers
of 1024, decimal ones (KB, MB, GB, TB) powers of 1000, and a plain number is bytes. "80GB" therefore is not
"80GiB": GPU vendors print decimal gigabytes on the box and the CUDA runtime reports binary ones. Kubernetes
quantities mean the same (80G is 80GB, 80Gi is 80GiB), so sizes copied from a pod spec read as written.
"""

import math
import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    # Kubernetes quantities: k, M, G, T decimal and Ki, Mi, Gi, Ti binary. Case is not significant here, since
    # the sizes are bytes and a milli-byte ("m") means nothing.
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}
# The longest bare number whose message repeats it twice ("5 has no unit: write 5s"); a longer one is quoted once,
# cut short.
_UNITLESS_CHARS = 40
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ms|s|m|h|d|w)")

GIB = 1024**3


def value_kind(value: object) -> str:
    """What a parsed YAML or JSON value is, in the words of someone who wrote it: "a list", not "list"."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return type(value).__name__


_QUOTED_CHARS = 80  # of a bad value quoted in a message: a 1 MiB label value is not repeated whole


def quoted(value: object) -> str:
    """A bad value as a message quotes it: repr, cut short (text keeps its closing quote)."""
    text = repr(value)
    if len(text) <= _QUOTED_CHARS:
        return text
    return f"{text[:_QUOTED_CHARS]}...{text[-1] if isinstance(value, str) else ''}"


def parse_size(text: object) -> int:
    """Bytes from "80GiB", "80GB", "81920MiB", "80Gi", "80G", "1.5e9" or a plain number of bytes."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"expected a size such as 80GiB, got {value_kind(text)}")
    if isinstance(text, int | float):
        try:
            value, unit = float(text), ""
        except OverflowError:  # an integer of hundreds of digits, which YAML reads whole
            raise ValueError(f"{quoted(text)} is too large a size") from None
    else:
        match = _SIZE.match(text)
        if match is None:
            raise ValueError(f"{quoted(text)} is not a size (expected e.g. 80GiB, 80GB, 81920MiB or bytes)")
        value, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(
            f"{quoted(text)} has an unknown unit {quoted(unit)} "
            "(use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, or Kubernetes' G, Gi)"
        )
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{quoted(text)} is not a non-negative size")
    size = value * _SIZE_UNITS[unit]
    if not math.isfinite(size):  # 1e308GiB: a finite number, but its bytes are beyond what a float holds
        raise ValueError(f"{quoted(text)} is too large a size")
    return round(size)


def parse_duration(text: object) -> float:
    """Seconds from Prometheus-style durations ("500ms", "15m", "1h30m"). A bare number is refused: whether "5"
    meant seconds or minutes is exactly the mistake nobody notices until an alert fires late."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if isinstance(text, float) and not math.isfinite(text):
            raise ValueError(f"{text} is not a duration (expected e.g. 500ms, 5s, 15m, 1h30m)")
        raise _no_unit(repr(text))
    if not isinstance(text, str):
        raise ValueError(f"expected a duration such as 5s, got {value_kind(text)}")
    stripped = text.strip()
    if re.fullmatch(r"[0-9]*\.?[0-9]+", stripped):
        raise _no_unit(stripped)
    parts = _DURATION_PART.findall(stripped)
    if not parts or "".join(number + unit for number, unit in parts) != stripped:
        raise ValueError(f"{quoted(text)} is not a duration (expected e.g. 500ms, 5s, 15m, 1h30m)")
    seconds = sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)
    if not math.isfinite(seconds):  # "9999...9s", hundreds of digits: more seconds than a float holds
        raise ValueError(f"{quoted(text)} is too long a duration")
    return seconds


def _no_unit(number: str) -> ValueError:
    if len(number) <= _UNITLESS_CHARS:
        return ValueError(f"{number} has no unit: write {number}s")
    return ValueError(f"{quoted(number)} has no unit (expected e.g. 500ms, 5s, 15m, 1h30m)")


_FORMATTED_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 0.001))


def duration(seconds: float) -> str:
    """A Prometheus duration: "5m", "1d", "2m30s", "500ms"."""
    if seconds <= 0:
        raise ValueError(f"duration {seconds!r} is not positive")
    milliseconds = round(seconds * 1000)
    parts = []
    for unit, size in _FORMATTED_UNITS:
        size_ms = round(size * 1000)
        if milliseconds >= size_ms:
            count, milliseconds = divmod(milliseconds, size_ms)
            parts.append(f"{count}{unit}")
    if not parts:
        raise ValueError(f"duration {seconds!r} is shorter than a millisecond")
    return "".join(parts)


def format_gib(num_bytes: float) -> str:
    """ "12.34 GiB": the unit people compare with nvidia-smi and vLLM's logs."""
    return f"{num_bytes / GIB:.2f} GiB"


def counted(count: int, noun: str) -> str:
    """ "1 target", "0 SLOs": a count with its noun, plural where the count is not 1."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
