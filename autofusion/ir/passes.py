"""Graph-to-graph passes shared by several stages. Each returns a new graph (or the same one)."""

from __future__ import annotations

import numpy as np

from autofusion.graph.graph import Const, FrozenMap, Graph
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

# folding a constant larger than this would bloat the graph (e.g. an Expand to a huge shape)
MAX_FOLDED_ELEMENTS = 1 << 22


def fold_constants(graph: Graph, registry: OpRegistry | None = None) -> Graph:
    """Evaluate every node whose inputs are all constants and replace it by its value."""
    registry = registry or default_registry()
    consts = dict(graph.constants)
    kept = []
    for node in graph.nodes:
        args = [i for i in node.inputs if i]
        foldable = args and all(i in consts and not consts[i].is_symbolic for i in args) and all(
            graph.types[o].is_static and graph.types[o].numel <= MAX_FOLDED_ELEMENTS for o in node.outputs if o)
        if not foldable:
            kept.append(node)
            continue
        values = registry[node.op].reference([consts[i].array if i else None for i in node.inputs], node.attrs)
        for name, value in zip(node.outputs, values):
            if name:
                consts[name] = Const(np.asarray(value))
    if len(kept) == len(graph.nodes):
        return graph
    return dead_code(graph.replace(nodes=tuple(kept), constants=FrozenMap(consts)))


def dead_code(graph: Graph) -> Graph:
    """Drop nodes and constants no output depends on."""
    needed = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs):
            kept.append(node)
            needed.update(i for i in node.inputs if i)
    kept.reverse()
    consts = {k: v for k, v in graph.constants.items() if k in needed}
    live = set(graph.inputs) | set(consts) | {o for n in kept for o in n.outputs if o}
    types = {k: v for k, v in graph.types.items() if k in live}
    return graph.replace(nodes=tuple(kept), constants=FrozenMap(consts), types=FrozenMap(types))
