"""What one element of each pointwise op costs to compute, beyond streaming it through memory.

Flop counts say little about math routines and branchy helpers: on a CPU ``Max`` (NaN-aware) or
``Sin`` can cost tens of times a ``Relu``. Each op is timed as a one-op kernel over a tensor that
fits in the second-level cache; its cost per element is its time less that of the cheapest
kernel with as many inputs (``Neg`` for unary ops, ``Add`` for binary ones), divided by the
element count. The analytic model uses these in place of flops for the ops it has them for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from autofusion.calibrate.measure import Timer, plan_of
from autofusion.codegen.errors import CodegenError
from autofusion.ir import Graph, GraphBuilder
from autofusion.runtime import CompileError

UNARY_OPS = ("Relu", "Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Erf", "Sin", "Cos", "Sqrt", "Log", "Gelu",
             "Reciprocal", "Softplus")
BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")
BENCH_ELEMENTS = 1 << 15  # 128 KiB per operand: past L1, well inside L2


def one_op_graph(op: str, elements: int = BENCH_ELEMENTS) -> Graph:
    b = GraphBuilder(f"opcost_{op.lower()}")
    x = b.input("x", (elements,))
    y = b.op(op, x, b.input("y", (elements,))) if op in BINARY_OPS else b.op(op, x)
    return b.build([y])


def measure_op_seconds(timer: Timer, report: Callable[[str], None] | None = None,
                       elements: int = BENCH_ELEMENTS) -> dict[str, float]:
    """Seconds per element of every op in :data:`UNARY_OPS` and :data:`BINARY_OPS` (zero for the
    ones no dearer than streaming)."""
    rng = np.random.default_rng(0)
    feeds = {"x": rng.uniform(0.5, 1.5, elements).astype(np.float32),  # inside every op's domain
             "y": rng.uniform(0.5, 1.5, elements).astype(np.float32)}
    raw: dict[str, float] = {}
    for op in UNARY_OPS + BINARY_OPS:
        if report:
            report(f"op cost {op}")
        g = one_op_graph(op, elements)
        try:
            raw[op] = timer.gross(plan_of(g, [[g.nodes[0].name]]), {k: feeds[k] for k in g.inputs})
        except (CodegenError, CompileError):
            continue  # an op the backend cannot build keeps its flop-based cost
    return per_element(raw, elements)


def per_element(raw: Mapping[str, float], elements: int) -> dict[str, float]:
    """Kernel seconds by op to compute seconds per element, relative to the cheapest kernel with
    the same number of inputs."""
    out = {}
    for ops in (UNARY_OPS, BINARY_OPS):
        timed = [op for op in ops if op in raw]
        if not timed:
            continue
        base = min(raw[op] for op in timed)
        for op in timed:
            out[op] = max(0.0, raw[op] - base) / elements
    return out
