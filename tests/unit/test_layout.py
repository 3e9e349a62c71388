"""No import cycles between trtpd's packages (STYLE.md: "mend the corridors that run both ways").

A node is a subpackage of trtpd (build, lint, repo, ...) or a top-level module (catalog, errors, ...).
An edge A -> B is any `import` of trtpd.B... in a module of A, read with `ast` (nothing is imported).

What counts: module-level imports and function-level (lazy) imports alike. A lazy import defers the
failure to call time but is still a dependency a reader has to follow, and a lazy import that closes a
cycle is how the build<->repo<->lint corridor used to hide. A cycle made of module-level imports is
never allowed. A cycle that needs a lazy import is allowed only while it is listed in KNOWN_LAZY_CYCLES
with its reason; the list must shrink, never grow, and an entry goes as soon as its cycle is gone.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import trtpd

ROOT = Path(trtpd.__file__).parent

KNOWN_LAZY_CYCLES: set[frozenset[str]] = set()   # none left: keep it that way


def _node(module: str) -> str:
    return module.split(".")[1]


def import_edges(root: Path = ROOT) -> list[tuple[str, str, bool, str]]:
    """(importing node, imported node, lazy, 'file:line') for every trtpd import between two nodes."""
    edges = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        package = parts if rel.name == "__init__" else parts[:-1]
        where = str(path.relative_to(root.parent))

        def visit(node: ast.AST, lazy: bool) -> None:
            for child in ast.iter_child_nodes(node):
                targets = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = package[:len(package) - child.level + 1] if child.level else []
                    module = ".".join(base + ([child.module] if child.module else []))
                    # `from trtpd import resources` imports the module trtpd.resources
                    targets = [f"{module}.{a.name}" for a in child.names] if module == "trtpd" else [module]
                for target in targets:
                    if target.startswith("trtpd.") and len(parts) > 1 and _node(target) != parts[1]:
                        edges.append((parts[1], _node(target), lazy, f"{where}:{child.lineno}"))
                visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(path.read_text(), str(path)), False)
    return edges


def package_cycles(edges: list[tuple[str, str, bool, str]], *, include_lazy: bool) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst, lazy, _ in edges:
        if include_lazy or not lazy:
            graph[src].add(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def _describe(cycle: list[str], edges: list[tuple[str, str, bool, str]]) -> str:
    members = set(cycle)
    lines = [f"{src} -> {dst} ({'lazy' if lazy else 'module-level'}) at {where}"
             for src, dst, lazy, where in edges if src in members and dst in members]
    return f"cycle among {', '.join(cycle)}:\n    " + "\n    ".join(lines)


def test_no_module_level_cycle_between_packages():
    edges = import_edges()
    cycles = package_cycles(edges, include_lazy=False)
    assert not cycles, ("import cycles between trtpd packages; move the shared fact into a neutral module "
                        "both sides import (e.g. trtpd.schema):\n" + "\n".join(_describe(c, edges) for c in cycles))


def test_no_cycle_through_lazy_imports_beyond_the_known_ones():
    edges = import_edges()
    cycles = {frozenset(c) for c in package_cycles(edges, include_lazy=True)}
    new = [sorted(c) for c in cycles - KNOWN_LAZY_CYCLES]
    assert not new, ("a function-level import closes a cycle between trtpd packages:\n"
                     + "\n".join(_describe(c, edges) for c in new))
    gone = [sorted(c) for c in KNOWN_LAZY_CYCLES - cycles]
    assert not gone, f"these cycles are gone; delete them from KNOWN_LAZY_CYCLES: {gone}"


def test_the_cycle_check_sees_a_cycle(tmp_path):
    pkg = tmp_path / "trtpd"
    for sub, text in {"a": "from trtpd.b.y import Y\n", "b": "def f():\n    from trtpd.a.x import X\n"}.items():
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
        (pkg / sub / ("x.py" if sub == "a" else "y.py")).write_text(text)
    edges = import_edges(pkg)
    assert package_cycles(edges, include_lazy=True) == [["a", "b"]]
    assert package_cycles(edges, include_lazy=False) == []
