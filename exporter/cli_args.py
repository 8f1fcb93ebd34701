"""Argument types and helpers every subcommand's parser shares: the config's own validators as argparse types,
so a bad flag's message names the flag, and environment twins for flags."""

import argparse
import os
from collections.abc import Callable
from typing import Any, TypeVar

from exporter.config import validate_duration
from exporter.units import parse_duration, parse_size

T = TypeVar("T")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows a flag's default where it has a real one and its help does not already say what it is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """The config's own parser as an argparse type: its message becomes argparse's error, which names the flag."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


size_arg = flag_type(parse_size)
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


def env_twin(parser: argparse.ArgumentParser, flag: str, env: str, **kwargs: Any) -> None:
    """An option whose default comes from an environment variable, named in --help (query-exporter's way)."""
    if env in os.environ:
        # An appending flag starts from a list, which the flags given then extend.
        kwargs["default"] = [os.environ[env]] if kwargs.get("action") == "append" else os.environ[env]
    kwargs["help"] = f"{kwargs.get('help', '')} [env {env}]"
    parser.add_argument(flag, **kwargs)
