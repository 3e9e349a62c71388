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


# ---- the rooms' import rules (docs/architecture.md) -------------------------------------------------
IO_MODULES = ("subprocess", "socket", "http.client", "urllib.request", "httpx", "requests", "grpc", "tritonclient",
              "sqlite3", "fastapi", "uvicorn")
SERVER_FRAMEWORKS = ("fastapi", "uvicorn", "starlette")
PURE_CORES = ("routing", "sched", "planner", "sim", "perf", "schema", "catalog.py", "controller/reconcile.py",
              "controller/rollout.py", "autoscale", "percentiles.py", "orchestration", "admission.py")
ADAPTERS = {   # modules beside the pure cores that do reach out, each named with its reason
    "schema/pbtxt.py": "parses config.pbtxt with tritonclient's protobuf message classes; no I/O",
    "perf/aiconfigurator.py": "runs NVIDIA's AIConfigurator in its own venv (numpy 2) as a subprocess",
}
STUB_MODULES = ("serving", "engine", "kv")     # serving/ is the stub's package, whole (host control is in fleet/)
GATEWAY = ("gateway",)


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """Every absolute module an `import` in `path` names (module level and lazy), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, node.lineno))
    return found


def _files(root: Path, places: tuple[str, ...]) -> list[Path]:
    out = []
    for place in places:
        target = root / place
        out += [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))
    return out


def violations(root: Path, places: tuple[str, ...], banned: tuple[str, ...], allowed: dict[str, str] = {}) -> list[str]:
    bad = []
    for path in _files(root, places):
        rel = str(path.relative_to(root))
        if rel in allowed:
            continue
        for module, line in imported_modules(path):
            if any(module == b or module.startswith(b + ".") for b in banned):
                bad.append(f"{rel}:{line} imports {module}")
    return bad


def test_pure_cores_import_no_process_socket_or_client_module():
    assert not violations(ROOT, PURE_CORES, IO_MODULES, ADAPTERS), "move the I/O to a shell (executor, CLI)"


def test_stub_code_imports_no_server_framework_and_no_host_control():
    """...nor the gateway: the fleet's Triton entry sends its requests to the gateway process (fleet_bridge.py)."""
    banned = SERVER_FRAMEWORKS + ("trtpd.cli", "trtpd.controller", "trtpd.fleet", "trtpd.gateway")
    assert not violations(ROOT, STUB_MODULES, banned)


def test_the_gateway_imports_no_host_control_and_no_stub_code():
    banned = ("trtpd.cli", "trtpd.controller", "trtpd.fleet", "trtpd.serving")
    assert not violations(ROOT, GATEWAY, banned)


TRANSPORTS = ("transports",)


def test_transports_run_in_the_gateway_and_in_the_stub_so_import_neither_side():
    """A RoleTransport runs wherever its orchestrator runs: the gateway process and the single server's python
    stub. So it may import neither room's code, nor a server framework (the stub's rule), nor host control."""
    banned = SERVER_FRAMEWORKS + ("trtpd.cli", "trtpd.controller", "trtpd.fleet", "trtpd.gateway", "trtpd.serving")
    assert not violations(ROOT, TRANSPORTS, banned)


SERVE_TWIN = ("serve_twin",)


def test_the_serve_twin_is_a_worker_of_its_own_so_imports_no_other_room():
    """A trtllm-serve twin worker is its own process, a peer of a tritonserver instance: it runs the reference
    engine and moves KV (engine/, kv/), and imports nothing of the gateway, the Triton stub, the fleet's host
    control, the controller or the CLI (which start it as a process)."""
    banned = ("trtpd.cli", "trtpd.controller", "trtpd.fleet", "trtpd.gateway", "trtpd.serving", "trtpd.transports",
              "trtpd.orchestration")
    assert not violations(ROOT, SERVE_TWIN, banned)


def test_a_planted_violation_is_caught(tmp_path):
    """The checks above are not vacuous: a pure core that starts a process, stub code that imports uvicorn lazily,
    and a gateway module that reaches into the fleet are each reported with file and line."""
    (tmp_path / "routing").mkdir()
    (tmp_path / "routing" / "core.py").write_text("import math\nimport subprocess\n")
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "role_model.py").write_text("def f():\n    from uvicorn import Server\n")
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "app.py").write_text("from trtpd.fleet.records import load_fleet\n")
    assert violations(tmp_path, ("routing",), IO_MODULES) == ["routing/core.py:2 imports subprocess"]
    assert violations(tmp_path, ("serving/role_model.py",), SERVER_FRAMEWORKS) == [
        "serving/role_model.py:2 imports uvicorn"]
    assert violations(tmp_path, GATEWAY, ("trtpd.fleet",)) == ["gateway/app.py:1 imports trtpd.fleet.records"]
    (tmp_path / "transports").mkdir()
    (tmp_path / "transports" / "triton_grpc.py").write_text("from trtpd.gateway.config import GatewayConfig\n")
    assert violations(tmp_path, TRANSPORTS, ("trtpd.gateway",)) == [
        "transports/triton_grpc.py:1 imports trtpd.gateway.config"]
    (tmp_path / "serve_twin").mkdir()
    (tmp_path / "serve_twin" / "app.py").write_text("def f():\n    from trtpd.serving.pb import tensor\n")
    assert violations(tmp_path, SERVE_TWIN, ("trtpd.serving",)) == ["serve_twin/app.py:2 imports trtpd.serving.pb"]


# ---- names: no two public classes share a name with different meanings ------------------------------------
KNOWN_SHARED_CLASS_NAMES: dict[str, set[str]] = {}   # none left (Admission was two designs: now trtpd/admission.py)


def shared_class_names(root: Path = ROOT) -> dict[str, set[str]]:
    """Public top-level class name -> the modules defining it, for every name defined in more than one."""
    where: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].add(str(path.relative_to(root)))
    return {name: files for name, files in where.items() if len(files) > 1}


def test_no_two_classes_share_a_name():
    """RoleSpec (a deployment's role, a TensorRT-LLM engine's role), MpiWorld (the live MPI runtime, a rank
    layout), RoleMetrics, Verdict and Target each meant two things; the second of each was renamed."""
    shared = shared_class_names()
    assert {n: f for n, f in shared.items() if KNOWN_SHARED_CLASS_NAMES.get(n) != f} == {}


def test_a_planted_shared_class_name_is_caught(tmp_path):
    (tmp_path / "a.py").write_text("class Verdict:\n    pass\n\n\nclass _Private:\n    pass\n")
    (tmp_path / "b.py").write_text("class Verdict:\n    pass\n\n\nclass _Private:\n    pass\n")
    assert shared_class_names(tmp_path) == {"Verdict": {"a.py", "b.py"}}
