"""Opaque ops: compute-heavy cores with their own loop nests (MatMul, Gemm, Conv, LSTM, pools)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.ir.types import TensorType
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError, broadcast_shapes

Arrays = Sequence[np.ndarray | None]


def _matmul_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    a, b = ctx.type(0), ctx.type(1)
    if a.rank == 0 or b.rank == 0:
        raise ShapeError("MatMul: inputs must have rank >= 1")
    sa = a.shape if a.rank > 1 else (1,) + a.shape
    sb = b.shape if b.rank > 1 else b.shape + (1,)
    if sa[-1] != sb[-2]:
        raise ShapeError(f"MatMul: inner dimensions differ: {a.shape} @ {b.shape}")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    shape = batch + (sa[-2], sb[-1])
    if a.rank == 1:
        shape = shape[:-2] + shape[-1:]
    if b.rank == 1:
        shape = shape[:-1]
    return (TensorType(shape, a.dtype),)


def _matmul_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, y = xs[0], xs[1]
    assert x is not None and y is not None
    return (np.matmul(x, y).astype(x.dtype, copy=False),)


def _matmul_flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    k = ctx.type(0).shape[-1]
    return 2 * k * outs[0].numel


def ops() -> list[OpDef]:
    return [
        OpDef("MatMul", OpClass.OPAQUE, ("A", "B"), _matmul_infer, _matmul_ref, flops=_matmul_flops),
    ]
