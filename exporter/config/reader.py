"""The walk over one mapping of a config-like document that collects every problem with its field path, so all
of a file's problems are reported in one pass."""

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePath
from typing import Any

from exporter.config.model import Expansion
from exporter.config.validators import shown_key
from exporter.core.units import value_kind

# A value this short ("5", "a") is no secret, and would match the message's own words ("is not a URL"): it is hidden
# only where it is quoted whole.
_SHORT_VALUE_CHARS = 4


def _written_as(value: str) -> list[str]:
    """The ways a message may hold a value, longest first: escaped as repr writes it inside '...' (and inside "...",
    which repr picks for a text holding ' but no "), as is, stripped (a duration's "30 has no unit"), and as a path
    names it (a token in bearer_token_file's place, "a//b/" read as a/b)."""
    forms = {repr('"' + value)[2:-1], value, value.strip(), str(PurePath(value))}
    if '"' not in value:
        forms.add(repr("'" + value)[2:-1])
    return sorted((form for form in forms if form), key=len, reverse=True)


def _hidden(message: str, name: str, value: str) -> str:
    """The message with the variable's value written as ${NAME}: quoted whole, as part of a longer text, or cut
    short by shown() ("'abc...")."""
    variable = f"${{{name}}}"
    for form in _written_as(value):
        for quote in "'\"":
            message = message.replace(f"{quote}{form}{quote}", f"the value of {variable}")
        if len(form) < _SHORT_VALUE_CHARS:
            continue
        message = message.replace(form, variable)
        for length in range(min(len(form), len(message)) if "..." in message else 0, 0, -1):
            message = message.replace(f"{form[:length]}...", f"{variable}...")
    return message


class Reader:
    """Validates one mapping, collecting problems with their field paths."""

    def __init__(self, source: str, problems: list[str], expansions: Iterable[Expansion] = ()):
        self.source = source
        self.problems = problems
        # By path, so the variables of one field are found in log time: a config may hold thousands of targets.
        self._expansions = sorted(expansions, key=lambda expansion: expansion.path)
        self._paths = [expansion.path for expansion in self._expansions]

    def _variables(self, path: str) -> set[tuple[str, str]]:
        """(name, value) of each variable written into the field at `path` or below it, or anywhere in the list
        entry it is part of (a duplicate name may come from the entry's URL)."""
        entry = path[: path.index("]") + 1] if "]" in path else path
        found = set()
        index = bisect_left(self._paths, entry)
        while index < len(self._paths) and self._paths[index].startswith(entry):
            expansion = self._expansions[index]
            if expansion.path[len(entry) : len(entry) + 1] in ("", ".", "["):
                found.add((expansion.name, expansion.value))
            index += 1
        return found

    def fail(self, path: str, message: str) -> None:
        """Every problem passes here: a value an environment variable gave is named as ${NAME}, never quoted."""
        for name, value in sorted(self._variables(path), key=lambda variable: len(variable[1]), reverse=True):
            message = _hidden(message, name, value)
        self.problems.append(f"{self.source}: {path}: {message}")

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"expected a map, got {value_kind(value)}")
            return {}
        return value

    def unknown(self, data: Mapping[str, Any], path: str, known: tuple[str, ...]) -> None:
        for key in data:
            if key not in known:
                prefix = f"{path}." if path else ""
                self.fail(f"{prefix}{shown_key(key)}", f"unknown field (expected one of: {', '.join(known)})")

    def strings(self, data: Mapping[str, Any], key: str, path: str, expected: str) -> list[str]:
        """A list of names or paths under `key` (absent: empty), each one line of text; anything else (an empty text
        or a 0 included, which are no list) is a problem naming what is expected."""
        value = data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(
            isinstance(item, str) and item.isprintable() and item for item in value
        ):
            self.fail(f"{path}{key}", f"expected {expected}")
            return []
        return value

    def convert(self, data: Mapping[str, Any], key: str, path: str, convert: Callable[[Any], Any], default: Any) -> Any:
        if data.get(key) is None:
            return default
        try:
            return convert(data[key])
        except ValueError as error:
            self.fail(f"{path}{key}", str(error))
            return default
