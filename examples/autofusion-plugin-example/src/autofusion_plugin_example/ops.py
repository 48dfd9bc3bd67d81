"""The ``autofusion.ops`` entry point: ``Swish(x) = x * sigmoid(x)``, a pointwise op.

Being in the pointwise class, Swish is fused by every class rule over ``pointwise`` with no rule
written for it. Its ``spelling`` tells the C and Triton backends how to compute it, so the SuperKernel
runs it inside whatever kernel it was fused into.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.ir import TensorType
from autofusion.ops import InferContext, OpClass, OpDef, ShapeError


def _infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if not x.dtype.is_float:
        raise ShapeError(f"Swish: input must be a float tensor, got {x.dtype}")
    return (x,)


def _reference(xs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    assert x is not None
    return ((x / (1 + np.exp(-x))).astype(x.dtype),)


# how the C and Triton backends compute it, from the expression of its input ({0}); af_expf is the
# runtime's float exp (templates/c/af_runtime.h)
SPELLING = {"c": "{0} / (1.0f + af_expf(-{0}))", "triton": "{0} * tl.sigmoid({0})"}


def ops() -> list[OpDef]:
    """The ops this plugin adds to the registry."""
    return [OpDef("Swish", OpClass.POINTWISE, ("X",), _infer, _reference, flops_per_element=4.0,
                  doc="Swish (SiLU): x * sigmoid(x).", spelling=SPELLING)]
