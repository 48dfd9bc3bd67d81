"""Random graphs for checking the strategies beyond the shapes of real models.

Each graph works on ``[rows, hidden]`` tensors: GEMMs with bias, pointwise chains, softmax and
layer norm, with operands drawn from the last few tensors so values fan out and join again
(branches, diamonds, residuals). Seeded: the same seed gives the same graph.
"""

from __future__ import annotations

import numpy as np

from autofusion.ir import DType, Graph, GraphBuilder

_UNARY = ("Relu", "Tanh", "Sigmoid", "Erf", "Neg", "Abs")
_BINARY = ("Add", "Mul", "Sub")
RECENT = 4  # operands come from this many latest tensors


def random_graph(seed: int, ops: int = 24, rows: int = 32, hidden: int = 64) -> Graph:
    """About ``ops`` nodes; outputs are the last tensor and every tensor nobody consumed."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"random{seed}")
    pool = [b.input("x", (rows, hidden), DType.FLOAT32)]
    used: set[str] = set()
    gamma = b.const(np.ones(hidden, np.float32), "gamma")
    beta = b.const(np.zeros(hidden, np.float32), "beta")
    count = 0
    while count < ops:
        x = pool[-1 - int(rng.integers(0, min(RECENT, len(pool))))]
        kind = rng.choice(["gemm", "unary", "binary", "binary", "softmax", "layernorm", "bias"],
                          p=[0.2, 0.25, 0.2, 0.1, 0.08, 0.07, 0.1])
        if kind == "gemm":
            w = b.const((rng.standard_normal((hidden, hidden)) * 0.1).astype(np.float32))
            y = b.op("MatMul", x, w)
            count += 1
        elif kind == "unary":
            y = b.op(str(rng.choice(_UNARY)), x)
            count += 1
        elif kind == "binary":
            other = pool[-1 - int(rng.integers(0, min(RECENT, len(pool))))]
            y = b.op(str(rng.choice(_BINARY)), x, other)
            used.add(other)
            count += 1
        elif kind == "bias":
            y = b.op("Add", x, b.const((rng.standard_normal(hidden) * 0.1).astype(np.float32)))
            count += 1
        elif kind == "softmax":
            y = b.op("Softmax", x, axis=-1)
            count += 1
        else:
            y = b.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=1e-5)
            count += 1
        used.add(x)
        pool.append(y)
    outputs = [t for t in pool[1:] if t not in used]
    return b.build(outputs or [pool[-1]])
