"""Backward-pass graphs as the torch backend spells them, shared by the C and Triton tests."""

from __future__ import annotations

import numpy as np

from autofusion.ir import GraphBuilder


def layernorm_gradient(b: GraphBuilder, dy: str, x: str, mean: str, rstd: str, w: str) -> tuple[str, str, str]:
    """dx of a LayerNorm over the last axis (frontends/fx_aten.py), with x-hat and dy * w: two means
    over each row, and dx reading both at every element."""
    xhat = b.op("Mul", b.op("Sub", x, mean), rstd)
    gw = b.op("Mul", dy, w)
    axes = b.const(np.array([-1], np.int64))
    mean_g = b.op("ReduceMean", gw, axes, keepdims=1)
    mean_gx = b.op("ReduceMean", b.op("Mul", gw, xhat), axes, keepdims=1)
    dx = b.op("Mul", rstd, b.op("Sub", b.op("Sub", gw, mean_g), b.op("Mul", xhat, mean_gx)))
    return dx, xhat, gw
