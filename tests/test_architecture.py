"""The package's shape, checked on its source: no import circle (``TYPE_CHECKING`` imports
count: a type-only import is still a dependency a reader must hold in their head), layers that
import only from the layers above them (DESIGN.md's list), and no source file over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import rankwise

ROOT = Path(rankwise.__file__).parent
# DESIGN.md's layers, top first: a module may import from its own layer and the ones above.
LAYERS = ["distributed", "data", "augment", "parallel", "train", "launch", "models", "compat"]
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The rankwise modules ``name`` imports. ``from pkg import sub`` depends on ``pkg.sub``
    when that is a module (not on ``pkg``'s ``__init__``), as import linters count it."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            subs = [f"{base}.{a.name}" for a in node.names]
            out |= {s for s in subs if s in modules}
            if any(s not in modules for s in subs):
                out.add(base)
    return {m for m in out if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package() -> None:
    graph = _graph()
    assert len(graph) > 50  # the scan sees the package
    assert "rankwise.train.state" in graph["rankwise.train.trainer"]
    assert _cycles(graph) == []


def test_layers_import_only_from_the_layers_above() -> None:
    graph = _graph()
    wrong = []
    for name, deps in graph.items():
        layer = name.split(".")[1] if name.count(".") else None
        if layer not in LAYERS:
            continue
        allowed = LAYERS[: LAYERS.index(layer) + 1]
        for dep in deps:
            dep_layer = dep.split(".")[1] if dep.count(".") else None
            if dep_layer in LAYERS and dep_layer not in allowed:
                wrong.append(f"{name} imports {dep}")
    assert wrong == []


def test_no_source_file_is_over_400_lines() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for p in ROOT.rglob("*.py")
    }
    assert len(sizes) > 50
    assert {k: v for k, v in sizes.items() if v > MAX_LINES} == {}
