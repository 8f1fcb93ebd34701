"""Reading the config, the web config and file_sd files safely: a size cap, ${ENV} expansion, and YAML with no
tags that build objects and no aliases that expand without bound."""

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from exporter.config.model import ConfigError, Expansion
from exporter.config.validators import shown, shown_key
from exporter.files import read_regular_file

MAX_CONFIG_BYTES = 1024 * 1024
# Nodes that YAML aliases may add beyond what a document spells out. Anchors that share a deployment block
# between targets add tens; "billion laughs" (anchors of lists of aliases of anchors...) adds 10**9 from a few
# hundred bytes. PyYAML builds aliased values by reference, so the bomb only goes off when something walks the
# result (validation, a message quoting a value): counting the expansion on the composed node graph, where each
# anchor is one node, refuses it in microseconds before anything is built.
MAX_ALIAS_EXPANSION = 100_000

T = TypeVar("T")

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_text(
    text: str, environ: Mapping[str, str], problems: list[str], where: str, path: str, expansions: list[Expansion]
) -> str:
    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            expansions.append(Expansion(path, name, environ[name]))
            return environ[name]
        if default is not None:
            return default
        name = shown_key(name)  # ${AAA...} a megabyte long is not repeated twice
        field = f"{where}: {path}" if path else where
        problems.append(f"{field}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")
        return ""

    return _ENV.sub(substitute, text)


def _expand(
    value: Any, environ: Mapping[str, str], problems: list[str], where: str, path: str, expansions: list[Expansion]
) -> Any:
    if isinstance(value, str):
        return _expand_text(value, environ, problems, where, path, expansions)
    if isinstance(value, dict):
        prefix = f"{path}." if path else ""
        return {
            key: _expand(item, environ, problems, where, prefix + shown_key(key), expansions)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [
            _expand(item, environ, problems, where, f"{path}[{index}]", expansions) for index, item in enumerate(value)
        ]
    return value


def expand_env(
    value: Any, environ: Mapping[str, str], problems: list[str], where: str
) -> tuple[Any, tuple[Expansion, ...]]:
    """${NAME} and ${NAME:-default} in the string values of a parsed document, and each value taken from the
    environment with the field it went into; an unset variable without a default is an error, not an empty string.
    Expanding after parsing keeps a value a value: one holding a newline, `: ` or `#` cannot add keys or cut the
    document short, and a ${NAME} in a comment is only a comment. Keys are left as written. The walk is bounded:
    load_yaml has refused aliases that expand without bound or into themselves."""
    expansions: list[Expansion] = []
    return _expand(value, environ, problems, where, "", expansions), tuple(expansions)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's message without its snippet of the document: that line may hold a secret."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return " ".join(str(error).split())  # a reader error: the character and its position, on one line
    mark = error.problem_mark or error.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = f" ({error.context})" if error.context else ""
    return f"{where}{error.problem}{context}"


def _expanded_nodes(root: yaml.Node) -> tuple[int, int]:
    """(nodes the document spells out, nodes it holds once every alias is expanded), counted on the node graph
    in time linear in its size; an alias inside the collection it names is refused (it expands without end)."""
    sizes: dict[int, int] = {}
    open_collections: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_collections:
            raise ValueError("an alias refers to the collection that contains it")
        open_collections.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                total += size(key_node) + size(value_node)
        open_collections.discard(key)
        sizes[key] = total
        return total

    expanded = size(root)
    return len(sizes), expanded


def _refuse_expansion(spelled_out: int, expanded: int) -> None:
    if expanded - spelled_out > MAX_ALIAS_EXPANSION:
        raise ValueError(
            f"aliases expand this document to {expanded:,} values from {spelled_out:,} written "
            f"(at most {MAX_ALIAS_EXPANSION:,} more are allowed)"
        )


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_duplicate_keys(root: yaml.Node) -> None:
    """A key written twice in one map. PyYAML keeps the last without a word, so the first (a target's url, a
    threshold) would be dropped unseen; each node is looked at once, however many aliases name it."""
    looked_at: set[int] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in looked_at:
            continue
        looked_at.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            keys: set[tuple[str, str]] = set()
            for key_node, value_node in node.value:
                pending += (key_node, value_node)
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                    continue
                if (key_node.tag, key_node.value) in keys:
                    line = key_node.start_mark.line + 1
                    raise ValueError(f"line {line}: the key {shown(key_node.value)} is written twice in one map")
                keys.add((key_node.tag, key_node.value))


def _document(loader: yaml.SafeLoader) -> Any:
    node = loader.get_single_node()
    if node is None:
        return None
    _refuse_expansion(*_expanded_nodes(node))
    _refuse_duplicate_keys(node)
    return loader.construct_document(node)


def _documents(loader: yaml.SafeLoader) -> list[Any]:
    """Every document of the stream; the alias budget is the file's, or a thousand small documents each under it
    would add up to the bomb it is there to refuse."""
    documents = []
    spelled_out = expanded = 0
    while loader.check_node():
        node = loader.get_node()
        if node is None:  # check_node said there is one
            break
        written, total = _expanded_nodes(node)
        spelled_out, expanded = spelled_out + written, expanded + total
        _refuse_expansion(spelled_out, expanded)
        _refuse_duplicate_keys(node)
        documents.append(loader.construct_document(node))
    return documents


def _load(text: str, source: str, compose: Callable[[yaml.SafeLoader], T]) -> T:
    # Not libyaml's CSafeLoader, though it composes three times faster: its recursive composer overflows the C
    # stack on a few hundred kilobytes of "[[[[..." and the process dies; Python's raises RecursionError.
    loader = yaml.SafeLoader(text)
    try:
        return compose(loader)
    except yaml.YAMLError as error:
        raise ConfigError([f"{source}: not valid YAML: {_yaml_problem(error)}"]) from None
    except ValueError as error:  # too many aliases, or a value the constructor rejects (2001-13-01)
        raise ConfigError([f"{source}: not usable YAML: {error}"]) from None
    except RecursionError:
        raise ConfigError([f"{source}: not usable YAML: nested too deeply"]) from None
    finally:
        loader.dispose()


def load_yaml(text: str, source: str) -> Any:
    """One YAML document, safely: no tags that build objects, and no aliases that expand without bound."""
    return _load(text, source, _document)


def load_yaml_documents(text: str, source: str) -> list[Any]:
    """Every document of a YAML stream (`---` between them, empty ones as None), as safely as load_yaml."""
    return _load(text, source, _documents)


def read_config_text(path: str | Path, what: str = "config file") -> str:
    """The text of the config, a web config or a file_sd file, refused past MAX_CONFIG_BYTES without reading
    further: each is a few kilobytes, and a daemon that re-reads files must not load whatever lands there."""
    try:
        data = read_regular_file(path, MAX_CONFIG_BYTES)
    except OSError as error:
        raise ConfigError([f"{path}: cannot read the {what} ({error.strerror})"]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{path}: over 1 MiB; a {what} is a few kilobytes (is this the right file?)"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError([f"{path}: not UTF-8 text (byte {error.start})"]) from None
