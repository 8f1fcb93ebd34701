"""Argument types and helpers every subcommand's parser shares: the config's own validators as argparse types,
so a bad flag's message names the flag, and environment twins for flags."""

import argparse
import functools
import os
import re
from collections.abc import Callable
from typing import Any, NoReturn, TypeAlias, TypeVar

from exporter.config import validate_duration
from exporter.core.units import parse_duration, parse_size

T = TypeVar("T")

EXIT_OK = 0  # an answer (a plan that does not fit is an answer)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
# What each command package's `add_...` is given to add its subcommand to (a string: argparse's class takes no
# type argument at run time).
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows a flag's default where it has a real one and its help does not already say what it is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


# argparse's refusal of a flag whose value it took for a flag ("--pp-layer-partition -1,33": only a plain negative
# number such as -1 or -0.5 reads as a value).
_VALUE_READ_AS_FLAG = re.compile(r"argument (?P<flag>-[^/:\s]+)(?:/[^:]*)?: expected one argument")


class Parser(argparse.ArgumentParser):
    """argparse, its refusals one line (its own print the whole usage above them: 23 lines for `plan`), saying what
    a flag takes and how to give a value that starts with '-' where it found none."""

    def error(self, message: str) -> NoReturn:
        missing = _VALUE_READ_AS_FLAG.fullmatch(message)
        if missing:
            flag = missing["flag"]
            takes = next((a.help for a in self._actions if flag in a.option_strings and a.help), None)
            if takes and "%" not in takes:  # a help string with argparse's %-formatting is left out, not garbled
                message += f" ({takes})"
            message += f"; a value that starts with '-' reads as a flag: write {flag}=VALUE"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """The config's own parser as an argparse type: its message becomes argparse's error, which names the flag."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


size_arg = flag_type(parse_size)

# Below this a size without a unit is a unit forgotten, not a number of bytes anyone means ("--gpu-memory 80").
_SMALLEST_UNITLESS_SIZE = 1024**2
_SMALLEST_GPU = 1024**3


def memory_size_arg(text: str) -> int:
    """A size as `size_arg` reads it, refusing a small number without a unit (bytes nobody meant)."""
    size = size_arg(text)
    if text.strip().replace(".", "", 1).isdigit() and size < _SMALLEST_UNITLESS_SIZE:
        raise argparse.ArgumentTypeError(f"{text} is {size} bytes (did you mean {text.strip()}GiB?)")
    return size


def gpu_memory_arg(text: str) -> int:
    """A GPU's total memory: at least 1 GiB, so "80MB" for "80GB" is caught rather than planned."""
    size = memory_size_arg(text)
    if size < _SMALLEST_GPU:
        raise argparse.ArgumentTypeError(f"{text} is less than 1 GiB, too small for a GPU (e.g. 80GiB, 79.19GiB)")
    return size


# vLLM's human_readable_int (vllm/utils/argparse_utils.py): lower-case k, m, g, t are decimal, upper-case K, M,
# G, T binary, so "--max-model-len 32K" pasted from a vLLM command means 32768 here as it does there.
_ENGINE_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT])")
_ENGINE_MULTIPLIERS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def engine_int(text: str) -> int:
    """A count or byte size as vLLM reads it: 4096, 32k (32000), 32K (32768), 8G (8 GiB)."""
    stripped = text.strip()
    match = _ENGINE_INT.fullmatch(stripped)
    if match is None:
        if not stripped.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r} is not a count such as 4096, 32k (32000) or 32K (32768)")
        value = int(stripped)
    else:
        number, suffix = match.groups()
        value = int(float(number) * _ENGINE_MULTIPLIERS[suffix])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def context_length_arg(text: str) -> int:
    """A context length as vLLM and SGLang read it. vLLM's -1 and "auto" are no length: they shrink the context at
    startup to what the KV cache holds (_auto_fit_max_model_len in vllm/v1/core/kv_cache_utils.py)."""
    if text.strip().lower() in {"auto", "-1"}:
        raise argparse.ArgumentTypeError(
            "-1 and auto are vLLM's auto-fit (the context shrunk at startup to what the KV cache holds), which "
            "Plimsoll does not plan: leave the flag out to plan the model's maximum (a plan that does not fit names "
            "the longest --max-model-len that does), or give a length"
        )
    return engine_int(text)


duration_arg = flag_type(validate_duration)
duration_or_zero_arg = flag_type(parse_duration)


def ratio_arg(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        hint = f" (did you mean {value / 100:g}?)" if 1 < value <= 100 else ""
        raise argparse.ArgumentTypeError(f"{text} is not a ratio in (0, 1]{hint}")
    return value


def version_arg(text: str) -> tuple[int, int]:
    parts = text.lstrip("v").split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a version like 0.10 or 0.10.1")
    return int(parts[0]), int(parts[1])


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


class _FromEnvironment(str):
    """An environment twin's value, as argparse hands it to the flag's type: a bad one is then said to come from the
    variable, not from a flag nobody typed."""


def _typed_from_environment(convert: Callable[[str], T], env: str) -> Callable[[str], T]:
    @functools.wraps(convert)  # argparse names the type in its message for a bad value typed on the command line
    def converted(text: str) -> T:
        try:
            return convert(text)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as error:
            if not isinstance(text, _FromEnvironment):
                raise
            raise argparse.ArgumentTypeError(f"{env}={text!r} (the environment): {error}") from None

    return converted


def env_twin(parser: argparse.ArgumentParser, flag: str, env: str, **kwargs: Any) -> None:
    """An option whose default comes from an environment variable, named in --help (query-exporter's way). An
    empty variable counts as unset: a manifest writes an optional value it leaves out as `value: ""`."""
    if os.environ.get(env):
        value = _FromEnvironment(os.environ[env])
        # An appending flag starts from a list, which the flags given then extend.
        kwargs["default"] = [value] if kwargs.get("action") == "append" else value
        kwargs["required"] = False  # the environment gives it
        if "type" in kwargs:
            kwargs["type"] = _typed_from_environment(kwargs["type"], env)
    kwargs["help"] = f"{kwargs.get('help', '')} [env {env}]"
    parser.add_argument(flag, **kwargs)
