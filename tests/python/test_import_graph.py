"""The modules of ``python/reprolm`` import each other without a cycle.

The graph is read from the source (the AST), not from a running interpreter: an edge A -> B
for every ``import``/``from ... import`` in module A that names module B of the package,
at module level or inside a function or class alike (a function-level import still ties the
two modules together; it only hides the cycle from the interpreter). Imports under
``if TYPE_CHECKING:`` are left out: they run only for the type checker, never at run time.
``from . import x`` is an edge to the module ``x`` when ``x`` is a module of the package, else
to the package's ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "python" / "reprolm"
PACKAGE = "reprolm"


def module_names() -> dict[str, Path]:
    """Every module of the package by its dotted name (``reprolm.server._app``, ...): its
    Python sources, and its extension modules (``reprolm._core``), known by their ``.pyi``
    stubs, which import nothing of the package at run time."""
    names = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi") or (path.suffix == ".pyi" and path.with_suffix(".py").exists()):
            continue
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` but those in the body of ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> Optional[str]:
    """The absolute name of the module a ``from`` import reads from."""
    if node.level == 0:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        if path.suffix == ".pyi":
            continue
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = _resolve(name, is_package, node)
                if source is None:
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.append(submodule if submodule in modules else source)
            for target in targets:
                # `import reprolm.x.y` imports its parents too; the deepest module of the
                # package it names is the edge.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] == PACKAGE:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """A cycle of ``graph`` as the list of its modules (the first repeated at the end), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    path: list[str] = []

    def visit(node: str) -> Optional[list[str]]:
        colour[node] = GREY
        path.append(node)
        for target in sorted(graph[node]):
            if colour[target] == GREY:
                return path[path.index(target):] + [target]
            if colour[target] == WHITE and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_graph_is_read():
    """The graph holds the package's modules and edges the source visibly has (so an empty or
    wrongly resolved graph cannot pass the cycle check)."""
    graph = import_graph()
    assert "reprolm._model" in graph and "reprolm.server._app" in graph
    assert graph["reprolm._core"] == set()  # the extension imports nothing of the package
    assert "reprolm._core" in graph["reprolm._model"]
    assert "reprolm.errors" in graph["reprolm._model"]
    assert "reprolm._model" in graph["reprolm"]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    """Module imports of the package form no cycle (``if TYPE_CHECKING:`` imports excluded)."""
    graph = import_graph()
    # The package's __init__ imports every public module; a module importing the package
    # itself (`from reprolm import X`, `from . import X` for a name of __init__) closes a cycle.
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
