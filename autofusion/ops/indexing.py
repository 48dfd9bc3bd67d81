"""Indexing and shape-producing ops (reorganize class): Gather*, Shape, ConstantOfShape, Range, Trilu."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autofusion.graph.dims import Dim, decide, is_symbolic
from autofusion.graph.types import DType, TensorType
from autofusion.ops.common import Arrays, dims_of, first, norm_axis
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError


def _gather_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    data, idx = ctx.type(0), ctx.type(1)
    if idx.dtype not in (DType.INT64, DType.INT32):
        raise ShapeError(f"Gather: indices must be int32/int64, got {idx.dtype}")
    axis = norm_axis(ctx.attr("axis", 0), data.rank, "Gather")
    return (data.with_shape(data.shape[:axis] + idx.shape + data.shape[axis + 1:]),)


def _gather_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    data, idx = first(xs), xs[1]
    assert idx is not None
    axis = int(a.get("axis", 0)) % data.ndim
    dim = data.shape[axis]
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise IndexError(f"Gather: index out of range [-{dim}, {dim})")
    return (np.take(data, np.where(idx < 0, idx + dim, idx), axis=axis),)


def _gather_bytes(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    return 2 * outs[0].nbytes + ctx.type(1).nbytes  # gathered rows read and written, plus the indices


def _gather_nd_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    data, idx = ctx.type(0), ctx.type(1)
    b = int(ctx.attr("batch_dims", 0))
    if idx.rank < 1 or b >= min(data.rank, idx.rank):
        raise ShapeError(f"GatherND: batch_dims {b} too large for data {data.shape}, indices {idx.shape}")
    last = idx.shape[-1]
    if data.shape[:b] != idx.shape[:b] or last > data.rank - b:
        raise ShapeError(f"GatherND: indices {idx.shape} do not fit data {data.shape} (batch_dims {b})")
    return (data.with_shape(idx.shape[:-1] + data.shape[b + last:]),)


def _gather_nd_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    data, idx = first(xs), xs[1]
    assert idx is not None
    b = int(a.get("batch_dims", 0))
    last = idx.shape[-1]
    batch = int(np.prod(data.shape[:b]))
    d = data.reshape((batch,) + data.shape[b:])
    ind = idx.reshape((batch, -1, last))
    ind = np.where(ind < 0, ind + np.asarray(data.shape[b:b + last]), ind)
    rows = np.arange(batch)[:, None]
    picked = d[(rows,) + tuple(ind[..., k] for k in range(last))]
    return (picked.reshape(idx.shape[:-1] + data.shape[b + last:]),)


def _gather_elements_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    data, idx = ctx.type(0), ctx.type(1)
    if data.rank != idx.rank:
        raise ShapeError(f"GatherElements: ranks differ: {data.shape} vs {idx.shape}")
    norm_axis(ctx.attr("axis", 0), data.rank, "GatherElements")
    return (data.with_shape(idx.shape),)


def _gather_elements_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    data, idx = first(xs), xs[1]
    assert idx is not None
    axis = int(a.get("axis", 0)) % data.ndim
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return (np.take_along_axis(data, idx, axis=axis),)


def shape_range(rank: int, a: Any) -> slice:
    start, end = int(a("start", 0)), a("end", None)
    return slice(start, None if end is None else int(end))  # ONNX clamps like Python slicing


def _shape_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    n = len(range(x.rank)[shape_range(x.rank, ctx.attr)])
    return (TensorType((n,), DType.INT64),)


def _shape_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    return (np.asarray(x.shape, dtype=np.int64)[shape_range(x.ndim, a.get)],)


def _size_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    return (np.asarray(first(xs).size, dtype=np.int64),)


def _fill_value(value: Any) -> np.ndarray:
    """ConstantOfShape's ``value``: an ONNX one-element tensor (array) or a plain scalar."""
    if value is None:
        return np.zeros((), np.float32)
    if isinstance(value, np.ndarray):
        return value.reshape(())
    if isinstance(value, (tuple, list)):
        value = value[0]
    if isinstance(value, bool):
        return np.asarray(value)
    if isinstance(value, int):
        return np.asarray(value, np.int64)
    return np.asarray(value, np.float32)


def _const_of_shape_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    shape = tuple(dims_of(ctx.const(0, "shape")))
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ShapeError(f"ConstantOfShape: negative dimension in {shape}")
    return (TensorType(shape, DType.of(_fill_value(ctx.attr("value")))),)


def _const_of_shape_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    v = _fill_value(a.get("value"))
    return (np.full(tuple(int(d) for d in first(xs).reshape(-1)), v, dtype=v.dtype),)


def _range_len(start: Any, limit: Any, delta: Any) -> Dim:
    if delta == 0:
        raise ShapeError("Range: delta is 0")
    if any(is_symbolic(v) for v in (start, limit, delta)):
        if not isinstance(delta, int) or delta <= 0 or not isinstance(start, int):
            raise ShapeError(f"Range({start}, {limit}, {delta}): a symbolic range counts up from a fixed start")
        length = (limit - start + delta - 1) // delta
        if decide(length >= 0) is not True:
            raise ShapeError(f"Range({start}, {limit}, {delta}) may be empty, depending on the sizes")
        return length
    return max(int(np.ceil((limit - start) / delta)), 0)


def _range_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    vals = [ctx.const(i, n).reshape(()).item() for i, n in enumerate(("start", "limit", "delta"))]
    return (ctx.type(0).with_shape((_range_len(*vals),)),)


def _range_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    start, limit, delta = (x.reshape(()) for x in xs if x is not None)
    n = _range_len(start.item(), limit.item(), delta.item())
    return ((start + np.arange(n).astype(start.dtype) * delta).astype(start.dtype),)


def _trilu_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    k = int(xs[1].reshape(())) if len(xs) > 1 and xs[1] is not None else 0
    return ((np.triu(x, k) if a.get("upper", 1) else np.tril(x, k)).astype(x.dtype, copy=False),)


def _trilu_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    if ctx.type(0).rank < 2:
        raise ShapeError("Trilu: input must have rank >= 2")
    return (ctx.type(0),)


def _shape_bytes(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    return sum(t.nbytes for t in outs)  # reads metadata only


def ops() -> list[OpDef]:
    r = OpClass.REORGANIZE
    return [
        OpDef("Gather", r, ("data", "indices"), _gather_infer, _gather_ref, attrs={"axis": 0},
              flops_per_element=0, bytes_moved=_gather_bytes, doc="Picks slices along axis by index."),
        OpDef("GatherND", r, ("data", "indices"), _gather_nd_infer, _gather_nd_ref, attrs={"batch_dims": 0},
              flops_per_element=0, bytes_moved=_gather_bytes, doc="Picks slices by index tuples."),
        OpDef("GatherElements", r, ("data", "indices"), _gather_elements_infer, _gather_elements_ref,
              attrs={"axis": 0}, flops_per_element=0, bytes_moved=_gather_bytes,
              doc="Picks single elements along axis by index."),
        OpDef("Shape", r, ("data",), _shape_infer, _shape_ref, attrs={"start": 0, "end": None},
              flops_per_element=0, bytes_moved=_shape_bytes, doc="The input's shape as int64."),
        OpDef("Size", r, ("data",), lambda ctx: (TensorType((), DType.INT64),), _size_ref,
              flops_per_element=0, bytes_moved=_shape_bytes, doc="The input's element count as int64."),
        OpDef("ConstantOfShape", r, ("input",), _const_of_shape_infer, _const_of_shape_ref,
              attrs={"value": None}, flops_per_element=0, const_inputs=(0,),
              doc="A tensor of the given shape filled with value (default float 0)."),
        OpDef("Range", r, ("start", "limit", "delta"), _range_infer, _range_ref, flops_per_element=1,
              const_inputs=(0, 1, 2), doc="start, start+delta, ... up to limit (exclusive)."),
        OpDef("Trilu", r, ("input", "k?"), _trilu_infer, _trilu_ref, attrs={"upper": 1},
              flops_per_element=0, doc="Keeps the upper (or lower) triangle of the last two axes."),
    ]

