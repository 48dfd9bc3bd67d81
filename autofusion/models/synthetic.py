"""A synthetic transformer-like graph of any size, for engine scaling benchmarks (not a real model)."""

from __future__ import annotations

import numpy as np

from autofusion.ir import DType, Graph, GraphBuilder


def synthetic_graph(target_ops: int = 20_000, hidden: int = 64, rows: int = 16, seed: int = 0) -> Graph:
    """Blocks of MatMul + bias + GELU (erf form) + residual + LayerNorm + Softmax, repeated until the
    graph has about ``target_ops`` nodes."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"synthetic{target_ops}")
    x = b.input("x", (rows, hidden), DType.FLOAT32)
    half = b.const(np.array(0.5, np.float32), "half")
    one = b.const(np.array(1.0, np.float32), "one")
    root2 = b.const(np.array(1.4142135, np.float32), "root2")
    gamma = b.const(np.ones(hidden, np.float32), "gamma")
    beta = b.const(np.zeros(hidden, np.float32), "beta")
    nodes = 0
    while nodes < target_ops:
        w = b.const(rng.standard_normal((hidden, hidden), dtype=np.float32) * 0.05)
        bias = b.const(rng.standard_normal(hidden, dtype=np.float32) * 0.02)
        h = b.op("Add", b.op("MatMul", x, w), bias)
        gelu = b.op("Mul", b.op("Mul", h, half), b.op("Add", b.op("Erf", b.op("Div", h, root2)), one))
        r = b.op("Add", gelu, x)
        n = b.op("LayerNormalization", r, gamma, beta, axis=-1, epsilon=1e-5)
        x = b.op("Add", b.op("Softmax", n, axis=-1), n)
        nodes += 11
    return b.build([x])
