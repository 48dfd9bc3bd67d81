"""Random kernels to time: pointwise chains, reductions, GEMM epilogues and broadcasts.

Every generator draws a small graph from ``rng`` whose nodes, run as one group, make one fused
kernel of the C backend. :func:`alternatives` lists other ways to split the same graph into
kernels, for comparing the plans the decider chooses between. Values stay bounded (no chain of
exponentials) so no kernel's time depends on overflow or denormals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autofusion.ir import DType, Graph, GraphBuilder

CHEAP_UNARY = ("Relu", "Neg", "Abs")
BOUNDED_UNARY = ("Tanh", "Sigmoid", "Erf", "Sin", "Cos")  # outputs in [-1, 1]: safe before Exp
BINARY = ("Add", "Mul", "Sub", "Max")
KINDS = ("chain", "reduction", "epilogue", "broadcast")


@dataclass(frozen=True)
class KernelSpec:
    """A graph to run as one kernel, and what kind of kernel it is."""

    kind: str
    graph: Graph

    @property
    def label(self) -> str:
        ops = [n.op for n in self.graph.nodes]
        return f"{self.kind} {'+'.join(ops[:4])}{'...' if len(ops) > 4 else ''}"


def _numel(rng: np.random.Generator, max_elements: int, low: int = 8) -> int:
    """A log-uniform element count between 2**low and ``max_elements``."""
    high = max(low + 1, int(np.log2(max_elements)))
    return int(2 ** rng.uniform(low, high))


def _shape(rng: np.random.Generator, numel: int) -> tuple[int, ...]:
    """A shape of rank 1 to 3 with about ``numel`` elements; the last axis at least 8 long."""
    rank = int(rng.integers(1, 4))
    if rank == 1:
        return (max(8, numel),)
    inner = int(2 ** rng.integers(3, max(4, min(12, int(np.log2(max(numel, 16))) - 1))))
    rows = max(1, numel // inner)
    if rank == 2:
        return (rows, inner)
    outer = max(1, int(2 ** rng.integers(0, 4)))
    return (outer, max(1, rows // outer), inner)


def _pointwise_tail(b: GraphBuilder, rng: np.random.Generator, t: str, length: int, shape: tuple[int, ...],
                    inputs: list[str]) -> str:
    """``length`` pointwise ops after ``t``: unary ops, binary ops with a fresh input or a constant row."""
    bounded = False
    for _ in range(length):
        r = rng.uniform()
        if r < 0.3:
            op = str(rng.choice(CHEAP_UNARY))
            t, bounded = b.op(op, t), False
        elif r < 0.6:
            t, bounded = b.op(str(rng.choice(BOUNDED_UNARY)), t), True
        elif r < 0.7 and bounded:
            t, bounded = b.op("Exp", t), False
        elif r < 0.85:
            other = b.input(f"in{len(inputs)}", shape)
            inputs.append(other)
            t, bounded = b.op(str(rng.choice(BINARY)), t, other), False
        else:
            row = rng.uniform(-1, 1, shape[-1:]).astype(np.float32)
            t, bounded = b.op(str(rng.choice(("Add", "Mul"))), t, b.const(row)), False
    return t


def chain(rng: np.random.Generator, max_elements: int) -> Graph:
    """A pointwise chain of 1 to 8 ops over one shape."""
    shape = _shape(rng, _numel(rng, max_elements))
    b = GraphBuilder("chain")
    inputs = [b.input("in0", shape)]
    t = _pointwise_tail(b, rng, inputs[0], int(rng.integers(1, 9)), shape, inputs)
    return b.build([t])


def reduction(rng: np.random.Generator, max_elements: int) -> Graph:
    """A reduction over the last axis (sum, max, mean, softmax or layer norm), with a pointwise
    prologue of 0 to 3 ops and sometimes a pointwise epilogue."""
    numel = _numel(rng, max_elements, low=8)
    inner = int(2 ** rng.integers(3, max(4, min(13, int(np.log2(numel)) - 1))))
    shape = (max(1, numel // inner), inner)
    b = GraphBuilder("reduction")
    inputs = [b.input("in0", shape)]
    t = _pointwise_tail(b, rng, inputs[0], int(rng.integers(0, 4)), shape, inputs)
    op = str(rng.choice(("ReduceSum", "ReduceMax", "ReduceMean", "Softmax", "LayerNormalization")))
    if op == "Softmax":
        t = b.op("Softmax", t, axis=-1)
    elif op == "LayerNormalization":
        scale = b.const(rng.uniform(0.5, 1.5, inner).astype(np.float32))
        bias = b.const(rng.uniform(-0.5, 0.5, inner).astype(np.float32))
        t = b.op("LayerNormalization", t, scale, bias, axis=-1)
    else:
        t = b.op(op, t, b.const(np.array([-1], np.int64)), keepdims=1)
    if rng.uniform() < 0.4:
        out_shape = b.type_of(t).shape
        t = _pointwise_tail(b, rng, t, int(rng.integers(1, 3)), out_shape, inputs)
    return b.build([t])


def epilogue(rng: np.random.Generator, max_elements: int) -> Graph:
    """A MatMul with constant weights, a bias and 0 to 3 more pointwise ops."""
    m = int(2 ** rng.uniform(0, 9))
    k = int(2 ** rng.uniform(4, 10))
    n = int(2 ** rng.uniform(4, 10))
    while m * max(k, n) > max_elements and m > 1:
        m //= 2
    while k * n > max_elements and k > 8:
        k //= 2
    # the gemm_epilogue template sizes its per-thread tile buffer for 128x512 while it takes whole
    # dimensions up to 192 rows or 768 columns as one tile: stay out of that range
    m = 128 if 128 < m <= 192 else m
    n = 512 if 512 < n <= 768 else n
    b = GraphBuilder("epilogue")
    x = b.input("in0", (m, k))
    w = b.const(rng.uniform(-0.1, 0.1, (k, n)).astype(np.float32))
    t = b.op("MatMul", x, w)
    t = b.op("Add", t, b.const(rng.uniform(-0.1, 0.1, n).astype(np.float32)))
    t = _pointwise_tail(b, rng, t, int(rng.integers(0, 4)), (m, n), [x])
    return b.build([t])


def broadcast(rng: np.random.Generator, max_elements: int) -> Graph:
    """A chain of 1 to 4 ops over a (rows, 1) or a (1, cols) tensor multiplied into a (rows, cols)
    one: fused, the small chain is evaluated for every element of the large one (a compiler may
    hoist a per-row value out of the loop over columns; a per-column one is recomputed per row)."""
    numel = _numel(rng, max_elements, low=8)
    cols = int(2 ** rng.integers(2, max(3, min(12, int(np.log2(numel)) - 1))))
    rows = max(1, numel // cols)
    b = GraphBuilder("broadcast")
    small = b.input("in0", (rows, 1) if rng.uniform() < 0.5 else (1, cols))
    big = b.input("in1", (rows, cols))
    s = small
    for _ in range(int(rng.integers(1, 5))):
        s = b.op(str(rng.choice(BOUNDED_UNARY)), s)
    t = b.op("Mul", big, s)
    t = _pointwise_tail(b, rng, t, int(rng.integers(0, 3)), (rows, cols), [small, big])
    return b.build([t])


GENERATORS: dict[str, Callable[[np.random.Generator, int], Graph]] = {
    "chain": chain, "reduction": reduction, "epilogue": epilogue, "broadcast": broadcast}


def random_kernel(rng: np.random.Generator, max_elements: int, kind: str | None = None) -> KernelSpec:
    """One kernel of ``kind`` (default: drawn, chains twice as often as the others)."""
    if kind is None:
        kind = str(rng.choice(("chain", "chain", "reduction", "epilogue", "broadcast")))
    return KernelSpec(kind, GENERATORS[kind](rng, max_elements))


def alternatives(graph: Graph) -> list[list[list[str]]]:
    """Ways to split ``graph``'s nodes into kernels: all fused, each node alone, and the two halves
    of the node order fused (when the graph has more than two nodes)."""
    names = [n.name for n in graph.nodes]
    plans = [[names], [[n] for n in names]]
    if len(names) > 2:
        half = len(names) // 2
        plans.append([names[:half], names[half:]])
    return plans


def random_feeds(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs in [-1, 1] for every graph input."""
    feeds = {}
    for name in graph.inputs:
        t = graph.types[name]
        if t.dtype is not DType.FLOAT32:
            raise ValueError(f"calibration kernels take float32 inputs, {name} is {t.dtype}")
        feeds[name] = rng.uniform(-1, 1, t.shape).astype(np.float32)
    return feeds
