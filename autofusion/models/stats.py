"""Size statistics of a graph: op histogram, op classes, parameters and activation memory."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autofusion.graph.dims import Dim
from autofusion.ir import Graph, TensorType
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry


@dataclass(frozen=True)
class GraphStats:
    """What ``autofusion info`` reports about a graph.

    Parameters are the floating-point constants of rank >= 1 (weights, biases, norms; also constant
    float tensors such as an unrolled LSTM's zero initial state); the other constants (scalars,
    shape vectors, index tensors, boolean masks) are counted apart. Activation
    bytes sum the sizes of every non-constant tensor: the graph inputs and every node output.
    """

    nodes: int
    op_histogram: tuple[tuple[str, int], ...]  # most frequent first, ties by name
    op_classes: tuple[tuple[str, int], ...]
    parameter_count: int
    parameter_bytes: int
    other_constant_count: int
    other_constant_bytes: int
    activation_bytes: Dim  # an expression over the sizes of a graph with symbolic ones
    inputs: tuple[tuple[str, TensorType], ...]
    outputs: tuple[tuple[str, TensorType], ...]


def _is_parameter(t: TensorType) -> bool:
    return t.dtype.is_float and t.rank >= 1


def _ranked(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def op_histogram(graph: Graph) -> dict[str, int]:
    """Node count per op type, most frequent first."""
    return dict(_ranked(Counter(n.op for n in graph.nodes)))


def parameter_count(graph: Graph) -> int:
    """Elements in the graph's parameters (floating-point constants of rank >= 1)."""
    return sum(c.type.numel for c in graph.constants.values() if _is_parameter(c.type))


def graph_stats(graph: Graph, registry: OpRegistry | None = None) -> GraphStats:
    """Statistics of ``graph``; op classes come from ``registry`` (``unknown`` for ops it lacks)."""
    registry = registry or default_registry()
    ops = Counter(n.op for n in graph.nodes)
    classes: Counter[str] = Counter()
    for op, k in ops.items():
        opdef = registry.get(op)
        classes[str(opdef.op_class) if opdef else "unknown"] += k
    params = [c.type for c in graph.constants.values() if _is_parameter(c.type)]
    others = [c.type for c in graph.constants.values() if not _is_parameter(c.type)]
    activations = sum(t.nbytes for name, t in graph.types.items() if name not in graph.constants)
    return GraphStats(
        nodes=len(graph.nodes),
        op_histogram=_ranked(ops),
        op_classes=_ranked(classes),
        parameter_count=sum(t.numel for t in params),
        parameter_bytes=sum(t.nbytes for t in params),
        other_constant_count=len(others),
        other_constant_bytes=sum(t.nbytes for t in others),
        activation_bytes=activations,
        inputs=tuple((n, graph.types[n]) for n in graph.inputs),
        outputs=tuple((n, graph.types[n]) for n in graph.outputs),
    )
