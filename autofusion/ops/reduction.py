"""Reductions and normalisations: ops that reduce one or more axes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.ir.types import TensorType
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError

Arrays = Sequence[np.ndarray | None]


def _reduce_axes(ctx: InferContext) -> tuple[int, ...] | None:
    """Axes from the ``axes`` input (opset >= 13/18) or attribute; None means all axes."""
    rank = ctx.type(0).rank
    axes: Any = None
    if ctx.has_input(1):
        axes = ctx.const(1, "axes")
    elif ctx.attr("axes") is not None:
        axes = ctx.attr("axes")
    if axes is None or len(np.atleast_1d(axes)) == 0:
        return None
    out = []
    for a in np.atleast_1d(axes).tolist():
        if not -rank <= a < rank:
            raise ShapeError(f"{ctx.node.op}: axis {a} out of range for rank {rank}")
        out.append(a % rank)
    return tuple(sorted(set(out)))


def _reduce_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    axes = _reduce_axes(ctx)
    if axes is None:
        if ctx.attr("noop_with_empty_axes", 0):
            return (x,)
        axes = tuple(range(x.rank))
    keep = ctx.attr("keepdims", 1)
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keep else [
        d for i, d in enumerate(x.shape) if i not in axes]
    return (x.with_shape(tuple(shape)),)


def _reduce_ref_axes(xs: Arrays, a: Mapping[str, Any]) -> tuple[int, ...] | None:
    x = xs[0]
    assert x is not None
    axes: Any = xs[1] if len(xs) > 1 and xs[1] is not None else a.get("axes")
    if axes is None or len(np.atleast_1d(axes)) == 0:
        return None
    return tuple(int(v) % x.ndim for v in np.atleast_1d(axes).tolist())


def reduce_op(name: str, fn: Any, flops: float = 1.0) -> OpDef:
    def reference(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        x = xs[0]
        assert x is not None
        axes = _reduce_ref_axes(xs, a)
        if axes is None and a.get("noop_with_empty_axes", 0):
            return (x.copy(),)
        out = fn(x, axis=axes, keepdims=bool(a.get("keepdims", 1)))
        return (np.asarray(out).astype(x.dtype, copy=False),)

    def count(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
        return int(flops * ctx.type(0).numel)

    return OpDef(name, OpClass.REDUCTION, ("data", "axes?"), _reduce_infer, reference,
                 attrs={"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}, flops=count,
                 const_inputs=(1,))


def ops() -> list[OpDef]:
    return [
        reduce_op("ReduceMean", np.mean),
        reduce_op("ReduceSum", np.sum),
        reduce_op("ReduceMax", np.max),
        reduce_op("ReduceMin", np.min),
    ]
