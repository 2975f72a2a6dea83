"""The package's layers import one way, as docs/design/architecture.md draws them.

Read from the source (imports as written, those inside functions too), so that a layer
reaching upward, or two reaching into each other, fails here before it grows.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rag_lookahead"

# What each part of the package may import (besides itself and the modules at the bottom:
# `BOTTOM`). A part not listed is a top-level module or an application layer checked by
# the cycle test alone.
BOTTOM = {"config", "files", "lazy", "progress", "streaming", "structured"}
MAY_IMPORT: Mapping[str, set[str]] = {
    "decoding": set(),
    "drafting": {"decoding"},
    "planning": {"decoding", "drafting"},
    "runtime": {"decoding"},
    "tuning": {"decoding", "planning", "runtime"},
    "engine": {
        "decoding",
        "drafting",
        "planning",
        "runtime",
        "tuning",
        "interface",
        "models",
        "prompts",
        "loading",
    },
}


def package_graph(root: Path, sources: Iterable[tuple[str, str]] | None = None) -> dict[str, set[str]]:
    """For each part of the package (a subpackage, or a top-level module), the other parts
    it imports: read from ``sources`` (path relative to the package, text) or the files under
    ``root``."""
    files = sources if sources is not None else _files(root)
    graph: dict[str, set[str]] = {}
    for relative, text in files:
        part = relative.split("/")[0].removesuffix(".py")
        package = ("rag_lookahead", *relative.removesuffix(".py").split("/")[:-1])
        imported = graph.setdefault(part, set())
        for name in _imports(ast.parse(text), package):
            parts = name.split(".")
            if parts[0] == "rag_lookahead" and len(parts) > 1 and parts[1] != part:
                imported.add(parts[1])
    return graph


def _files(root: Path) -> Iterable[tuple[str, str]]:
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root).as_posix(), path.read_text(encoding="utf-8")


def _imports(tree: ast.Module, package: tuple[str, ...]) -> Iterable[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            yield module
            if not node.module:  # `from . import x`: the modules named
                yield from (f"{module}.{alias.name}" for alias in node.names)


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles among the parts (each as a path back to its start)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_parts_import_one_another_without_a_cycle() -> None:
    assert cycles(package_graph(ROOT)) == []


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_each_layer_imports_only_below_it(part: str) -> None:
    graph = package_graph(ROOT)
    assert graph[part] - MAY_IMPORT[part] - BOTTOM == set(), f"{part} reaches upward"


def test_the_reader_sees_relative_and_function_level_imports() -> None:
    sources = [
        ("runtime/a.py", "def f():\n    from rag_lookahead.planning import costs\n"),
        ("runtime/b.py", "from ..engine import step\nfrom . import a\n"),
        ("planning/c.py", "import rag_lookahead.runtime.b\n"),
    ]
    graph = package_graph(ROOT, sources)
    assert graph == {"runtime": {"planning", "engine"}, "planning": {"runtime"}}
    assert cycles(graph) == [["planning", "runtime", "planning"]]
