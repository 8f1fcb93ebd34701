"""The house rules of `exporter/`, read from the source with `ast`: no import cycles, the pure core imports nothing
above it, and no command package imports a sibling command.

Every import counts, those inside functions too: a lazy import still ties two modules together. `from X import Y`
is an edge to the module X.Y where there is one, else to X.
"""

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "exporter"

PURE = ("exporter.core", "exporter.capacity")
COMMANDS = (
    "exporter.daemon",
    "exporter.plan",
    "exporter.status",
    "exporter.probe",
    "exporter.generate",
    "exporter.loadtest",
    "exporter.autoscale",
)
ABOVE_THE_CORE = ("exporter.sources", *COMMANDS)

Graph = Mapping[str, frozenset[str]]


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_package: bool, modules: set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


def import_graph(root: Path) -> dict[str, frozenset[str]]:
    """Each module of the package under `root` -> the package's modules it imports."""
    files = {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {
            target
            for node in ast.walk(tree)
            for target in _imported(node, name, path.name == "__init__.py", modules)
            if target in modules and target != name
        }
        graph[name] = frozenset(targets)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycle_through(graph: Graph, component: list[str]) -> str:
    """One cycle inside a strongly connected component, as `a -> b -> a`: the shortest back to its first module."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return " -> ".join([*paths[node], start])
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"{component} is not a cycle")


def _within(module: str, packages: tuple[str, ...]) -> str | None:
    return next((p for p in packages if module == p or module.startswith(p + ".")), None)


def forbidden_imports(graph: Graph, importers: tuple[str, ...], imported: tuple[str, ...]) -> list[str]:
    """`a -> b` for each module a in `importers` importing a module b in `imported`."""
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        if _within(module, importers)
        for target in sorted(targets)
        if _within(target, imported)
    ]


def sibling_commands(graph: Graph) -> list[str]:
    """`a -> b` for each module of one command package importing a module of another."""
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if (own := _within(module, COMMANDS)) and (other := _within(target, COMMANDS)) and own != other
    ]


@pytest.fixture(scope="module")
def graph() -> dict[str, frozenset[str]]:
    return import_graph(PACKAGE)


def test_the_graph_sees_imports_inside_functions(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("from pkg.a import f\n")
    found = import_graph(tmp_path / "pkg")
    assert found["pkg.a"] == {"pkg.b"} and found["pkg.b"] == {"pkg.a"}
    assert cycles(found) == [["pkg.a", "pkg.b"]]
    assert cycle_through(found, ["pkg.a", "pkg.b"]) == "pkg.a -> pkg.b -> pkg.a"


def test_the_rules_name_what_breaks_them() -> None:
    broken = {
        "exporter.core.units": frozenset({"exporter.sources.http"}),
        "exporter.plan.command": frozenset({"exporter.status.format"}),
        "exporter.status.format": frozenset(),
        "exporter.sources.http": frozenset(),
    }
    assert forbidden_imports(broken, PURE, ABOVE_THE_CORE) == ["exporter.core.units -> exporter.sources.http"]
    assert sibling_commands(broken) == ["exporter.plan.command -> exporter.status.format"]


def test_no_import_cycles(graph: Graph) -> None:
    found = [cycle_through(graph, component) for component in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_pure_core_imports_nothing_above_it(graph: Graph) -> None:
    found = forbidden_imports(graph, PURE, ABOVE_THE_CORE)
    assert not found, "the pure core imports from above it:\n" + "\n".join(found)


def test_no_command_package_imports_a_sibling(graph: Graph) -> None:
    found = sibling_commands(graph)
    assert not found, "a command imports a sibling command (move the shared code lower):\n" + "\n".join(found)


def test_every_package_says_what_it_owns(graph: Graph) -> None:
    silent = [
        str(init.relative_to(PACKAGE.parent))
        for init in sorted(PACKAGE.rglob("__init__.py"))
        if not ast.get_docstring(ast.parse(init.read_text()))
    ]
    assert not silent, "packages without a docstring saying what they own and may import: " + ", ".join(silent)
