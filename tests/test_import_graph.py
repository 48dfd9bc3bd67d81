"""The package's import graph, counting function-local imports: no module imports itself through
others, no two packages import each other's modules, and no stage of the pipeline imports a later
one (the IR's data sits below the op registry, the IR's tools above it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "autofusion"
# the pipeline, bottom up: a package imports only packages at its level or below (the CLI, the
# API, the torch backend and the tools beside them sit on top and may import any)
PIPELINE = {"autofusion.graph": 0, "autofusion.ops": 1, "autofusion.ir": 2, "autofusion.kinds": 2,
            "autofusion.frontends": 3, "autofusion.dsl": 4, "autofusion.engine": 5, "autofusion.decide": 6,
            "autofusion.codegen": 7, "autofusion.runtime": 8}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autofusion"):
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("autofusion")]
            edges[module].update(t for t in map(resolve, targets) if t and t != module)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_module_imports_itself_through_others() -> None:
    assert _cycles(_imports()) == []


def test_no_two_packages_import_each_other() -> None:
    packages: dict[str, set[str]] = {}
    for a, targets in _imports().items():
        for b in targets:
            pa, pb = ".".join(a.split(".")[:2]), ".".join(b.split(".")[:2])
            if pa != pb:
                packages.setdefault(pa, set()).add(pb)
    assert _cycles(packages) == []


def test_no_stage_of_the_pipeline_imports_a_later_one() -> None:
    upward = sorted({(".".join(a.split(".")[:2]), ".".join(b.split(".")[:2])) for a, targets in _imports().items()
                     for b in targets
                     if PIPELINE.get(".".join(b.split(".")[:2]), -1) > PIPELINE.get(".".join(a.split(".")[:2]), 99)})
    assert upward == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
