"""The IR verifier: well-formed, acyclic, every type consistent with inference. Tests run it after
every pass."""

from __future__ import annotations

from autofusion.graph.graph import Graph
from autofusion.ir.infer import infer_node
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry, ShapeError, UnknownOpError


class VerifyError(ValueError):
    """The graph breaks an IR invariant; the message lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def problems(graph: Graph, registry: OpRegistry | None = None) -> list[str]:
    """Every invariant the graph breaks (empty when it is well-formed)."""
    registry = registry or default_registry()
    found: list[str] = []
    defined: set[str] = set()
    for name in graph.inputs:
        if name in defined:
            found.append(f"input {name!r} is declared twice")
        if name not in graph.types:
            found.append(f"input {name!r} has no type")
        defined.add(name)
    for name, const in graph.constants.items():
        if name in defined:
            found.append(f"constant {name!r} shadows an input")
        if graph.types.get(name) != const.type:
            found.append(f"constant {name!r}: type {graph.types.get(name)} differs from its value's {const.type}")
        defined.add(name)
    names: set[str] = set()
    for node in graph.nodes:
        if node.name in names:
            found.append(f"node name {node.name!r} is used twice")
        names.add(node.name)
        if node.op not in registry:
            found.append(f"node {node.name!r}: unknown op {node.op!r}")
            defined.update(o for o in node.outputs if o)
            continue
        missing = [i for i in node.inputs if i and i not in defined]
        if missing:
            # a use before its definition: either a cycle or nodes out of topological order
            found.append(f"node {node.name!r} ({node.op}) uses {missing} before they are defined (cycle or bad order)")
        else:
            try:
                inferred = infer_node(node, graph.types, graph.constants, registry)
            except (ShapeError, UnknownOpError) as e:
                found.append(str(e))
                inferred = ()
            for o, t in zip(node.outputs, inferred):
                if o and graph.types.get(o) != t:
                    found.append(f"node {node.name!r}: output {o!r} typed {graph.types.get(o)}, inference says {t}")
        for o in node.outputs:
            if not o:
                continue
            if o in defined:
                found.append(f"tensor {o!r} is defined twice")
            defined.add(o)
    for o in graph.outputs:
        if o not in defined:
            found.append(f"graph output {o!r} is never defined")
    extra = set(graph.types) - defined
    if extra:
        found.append(f"types given for undefined tensors {sorted(extra)[:5]}")
    return found


def verify(graph: Graph, registry: OpRegistry | None = None) -> Graph:
    """Return ``graph`` unchanged, or raise VerifyError listing every broken invariant."""
    found = problems(graph, registry)
    if found:
        raise VerifyError(found)
    return graph
