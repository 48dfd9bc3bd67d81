"""Reductions and normalisations: ops that reduce one or more axes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autofusion.graph.types import DType, TensorType
from autofusion.ops.common import Arrays, first, norm_axis
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError, broadcast_shapes


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
    return tuple(sorted({int(v) % x.ndim for v in np.atleast_1d(axes).tolist()}))  # as inference: [-1, 1] is one axis


def reduce_op(name: str, fn: Any, flops: float = 1.0) -> OpDef:
    """A Reduce* op; ``fn(x, axis=..., keepdims=...)`` computes it, ``flops`` per input element."""

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
                 const_inputs=(1,), doc=f"{name} over the given axes (input or attribute; all by default).")


def _logsumexp(x: np.ndarray, axis: tuple[int, ...] | None, keepdims: bool) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis if axis is not None else tuple(range(x.ndim)))


def _l2(x: np.ndarray, axis: tuple[int, ...] | None, keepdims: bool) -> np.ndarray:
    return np.sqrt(np.sum(np.square(x), axis=axis, keepdims=keepdims))


def _one_axis(ctx: InferContext, default: int) -> int:
    return norm_axis(int(ctx.attr("axis", default)), ctx.type(0).rank, ctx.node.op)


def _softmax_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    axis = int(a.get("axis", -1)) % x.ndim
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return ((e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype, copy=False),)


def _log_softmax_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    axis = int(a.get("axis", -1)) % x.ndim
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return ((shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))).astype(x.dtype, copy=False),)


def _hardmax_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    axis = int(a.get("axis", -1)) % x.ndim
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=axis)
    return (out,)


def _axis_infer(default: int) -> Any:
    def infer(ctx: InferContext) -> tuple[TensorType, ...]:
        _one_axis(ctx, default)
        return (ctx.type(0),)

    return infer


def _layernorm_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    axis = _one_axis(ctx, -1)
    normalized = x.shape[axis:]
    for i in (1, 2):
        if ctx.has_input(i):
            broadcast_shapes(ctx.type(i).shape, normalized)
    stats = TensorType(x.shape[:axis] + (1,) * (x.rank - axis), DType.FLOAT32)
    return (x, stats, stats)


def _layernorm_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, scale = first(xs), xs[1]
    assert scale is not None
    axis = int(a.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    xf = x.astype(np.promote_types(x.dtype, np.float32))  # stash type float32, or wider for wider inputs
    mean = np.mean(xf, axis=axes, keepdims=True)
    centered = xf - mean
    inv_std = 1.0 / np.sqrt(np.mean(centered * centered, axis=axes, keepdims=True) + np.float32(a.get("epsilon", 1e-5)))
    y = centered * inv_std * scale
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2]
    return (y.astype(x.dtype), mean.astype(np.float32), inv_std.astype(np.float32))


def _instancenorm_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if x.rank < 3:
        raise ShapeError("InstanceNormalization: input must be N x C x D1 ...")
    for i in (1, 2):
        if ctx.type(i).shape != (x.shape[1],):
            raise ShapeError(f"InstanceNormalization: input {i} must have shape ({x.shape[1]},)")
    return (x,)


def _instancenorm_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, scale, bias = first(xs), xs[1], xs[2]
    assert scale is not None and bias is not None
    axes = tuple(range(2, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.var(x, axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean) / np.sqrt(var + a.get("epsilon", 1e-5)) * scale.reshape(shape) + bias.reshape(shape)
    return (y.astype(x.dtype),)


def _global_pool_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if x.rank < 3:
        raise ShapeError(f"{ctx.node.op}: input must be N x C x D1 ...")
    return (x.with_shape(x.shape[:2] + (1,) * (x.rank - 2)),)


def _global_pool(fn: Any) -> Any:
    def reference(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        x = first(xs)
        return (fn(x, axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype),)

    return reference


def _arg_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    axis = _one_axis(ctx, 0)
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape)) if ctx.attr("keepdims", 1) else (
        x.shape[:axis] + x.shape[axis + 1:])
    return (TensorType(shape, DType.INT64),)


def _arg_ref(fn: Any) -> Any:
    def reference(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        x = first(xs)
        axis = int(a.get("axis", 0)) % x.ndim
        if a.get("select_last_index", 0):
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        if a.get("keepdims", 1):
            idx = np.expand_dims(idx, axis)
        return (np.asarray(idx, dtype=np.int64),)

    return reference


def _cumsum_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, ax = first(xs), xs[1]
    assert ax is not None
    axis = int(ax.reshape(())) % x.ndim
    y = np.flip(x, axis) if a.get("reverse", 0) else x
    out = np.cumsum(y, axis=axis, dtype=x.dtype)
    if a.get("exclusive", 0):
        out = out - y
    return ((np.flip(out, axis) if a.get("reverse", 0) else out).astype(x.dtype, copy=False),)


def _per_input(flops: float) -> Any:
    def count(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
        return int(flops * ctx.type(0).numel)

    return count


def ops() -> list[OpDef]:
    r = OpClass.REDUCTION
    axis_last = {"axis": -1}
    return [
        reduce_op("ReduceMean", np.mean),
        reduce_op("ReduceSum", np.sum),
        reduce_op("ReduceMax", np.max),
        reduce_op("ReduceMin", np.min),
        reduce_op("ReduceProd", np.prod),
        reduce_op("ReduceL1", lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims), 2),
        reduce_op("ReduceL2", _l2, 2),
        reduce_op("ReduceSumSquare", lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims), 2),
        reduce_op("ReduceLogSum", lambda x, axis, keepdims: np.log(np.sum(x, axis=axis, keepdims=keepdims)), 1),
        reduce_op("ReduceLogSumExp", _logsumexp, 10),
        OpDef("Softmax", r, ("input",), _axis_infer(-1), _softmax_ref, attrs=axis_last, flops=_per_input(5),
              doc="exp(x - max) / sum(exp(x - max)) along axis."),
        OpDef("LogSoftmax", r, ("input",), _axis_infer(-1), _log_softmax_ref, attrs=axis_last,
              flops=_per_input(5), doc="x - max - log(sum(exp(x - max))) along axis."),
        OpDef("Hardmax", r, ("input",), _axis_infer(-1), _hardmax_ref, attrs=axis_last,
              flops=_per_input(1), doc="One at the first maximum along axis, zero elsewhere."),
        OpDef("LayerNormalization", r, ("X", "Scale", "B?"), _layernorm_infer, _layernorm_ref,
              attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 1}, num_outputs=None, flops=_per_input(8),
              doc="Normalises over the axes from axis on, then scales and shifts; Mean/InvStdDev optional."),
        OpDef("InstanceNormalization", r, ("input", "scale", "B"), _instancenorm_infer, _instancenorm_ref,
              attrs={"epsilon": 1e-5}, flops=_per_input(8), doc="Normalises each (n, c) over its spatial axes."),
        OpDef("GlobalAveragePool", r, ("X",), _global_pool_infer, _global_pool(np.mean), flops=_per_input(1),
              doc="Mean over all spatial axes."),
        OpDef("GlobalMaxPool", r, ("X",), _global_pool_infer, _global_pool(np.max), flops=_per_input(1),
              doc="Max over all spatial axes."),
        OpDef("ArgMax", r, ("data",), _arg_infer, _arg_ref(np.argmax), flops=_per_input(1),
              attrs={"axis": 0, "keepdims": 1, "select_last_index": 0}, doc="Index of the maximum along axis."),
        OpDef("ArgMin", r, ("data",), _arg_infer, _arg_ref(np.argmin), flops=_per_input(1),
              attrs={"axis": 0, "keepdims": 1, "select_last_index": 0}, doc="Index of the minimum along axis."),
        OpDef("CumSum", r, ("x", "axis"), lambda ctx: (ctx.type(0),), _cumsum_ref, flops=_per_input(1),
              attrs={"exclusive": 0, "reverse": 0}, doc="Running sum along axis (exclusive/reverse variants)."),
    ]
