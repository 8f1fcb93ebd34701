"""The walk over one mapping of a config-like document that collects every problem with its field path, so all
of a file's problems are reported in one pass."""

from collections.abc import Callable, Mapping
from typing import Any

from exporter.config.validators import shown_key
from exporter.core.units import value_kind


class Reader:
    """Validates one mapping, collecting problems with their field paths."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems

    def fail(self, path: str, message: str) -> None:
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
        """A list of strings under `key` (absent: empty); anything else is a problem naming what is expected."""
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
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
