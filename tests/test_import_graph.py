"""memrl's modules import each other without a circle, counting imports inside functions.

A lazy import inside a function hides a cycle from the interpreter but not from the design: two modules that
need each other are one idea split in two, or a third idea both should depend on. The graph here has an edge for
every ``import`` / ``from ... import`` anywhere in a module (relative imports resolved; ``from pkg import name``
counts the submodule ``pkg.name`` when there is one, else ``pkg`` itself); a package's ``__init__`` re-exports are
edges of the package module only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import memrl

ROOT = Path(memrl.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """``{module: modules of memrl it imports}`` for every module under ``memrl/``."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name, path.name == "__init__.py")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # ``import a.b.c`` of a package path
                    target = target.rpartition(".")[0]
                if target.startswith("memrl") and target != name:
                    deps.add(target)
        graph[name] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_package_init(name: str) -> bool:
    return (ROOT.parent / name.replace(".", "/") / "__init__.py").exists()


def test_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    # memrl.episode.runner imports memrl.memory.embedder inside a function (_infra_errors)
    assert "memrl.registry" in graph["memrl.episode.credit"]
    assert len(graph) > 100 and all(m.startswith("memrl") for deps in graph.values() for m in deps)


def test_find_cycles_reports_a_circle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_memrl():
    graph = import_graph()
    # A package's __init__ that re-exports its submodules points down into them; a submodule importing its own
    # package's __init__ would close a loop through that re-export, so those edges count like any other.
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in memrl/ (counting imports inside functions):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )
