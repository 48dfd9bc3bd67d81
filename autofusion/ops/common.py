"""Small helpers shared by the op modules: axis normalisation, int lists from inputs or attributes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.dims import Dim, is_symbolic
from autofusion.graph.types import TensorType
from autofusion.ops.registry import InferContext, ShapeError

Arrays = Sequence[np.ndarray | None]


def norm_axis(axis: int, rank: int, op: str) -> int:
    """``axis`` in ``[0, rank)``; negative axes count from the end, as in ONNX."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{op}: axis {axis} out of range for rank {rank}")
    return axis % rank


def ints(value: Any) -> list[int]:
    """A flat list of Python ints from an array, tuple or scalar."""
    return [int(v) for v in np.asarray(value).reshape(-1).tolist()]


def static_shape(t: TensorType | None) -> list[int] | None:
    """``t``'s sizes as ints, or None for no tensor or a symbolic size."""
    return [int(d) for d in t.shape] if t is not None and all(isinstance(d, int) for d in t.shape) else None


def shape_input(ctx: InferContext, index: int, what: str) -> list[Dim]:
    """The sizes in constant input ``index``, a 1-D integer tensor as ONNX has it (a float or 0-d
    one is a ShapeError, not sizes truncated from it); symbolic elements stay symbolic."""
    value = np.asarray(ctx.const(index, what))
    if value.ndim != 1 or not (np.issubdtype(value.dtype, np.integer) or value.dtype == object):
        raise ShapeError(f"{ctx.node.op}: {what} (input {index}) must be a 1-D integer tensor, not "
                         f"{value.dtype}{list(value.shape)}")
    return dims_of(value)


def dims_of(value: Any) -> list[Dim]:
    """A flat list of sizes from an array (a symbolic constant's elements stay symbolic) or scalar."""
    return [v if is_symbolic(v) else int(v) for v in np.asarray(value).reshape(-1).tolist()]


def input_or_attr(ctx: InferContext, index: int, attr: str, what: str) -> list[int] | None:
    """Ints from constant input ``index`` (newer opsets) or attribute ``attr`` (older); None if neither."""
    if ctx.has_input(index):
        return ints(ctx.const(index, what))
    value = ctx.attr(attr)
    return None if value is None else ints(value)


def ref_input_or_attr(xs: Arrays, a: Mapping[str, Any], index: int, attr: str) -> list[int] | None:
    """The reference-side twin of :func:`input_or_attr`."""
    if len(xs) > index and xs[index] is not None:
        return ints(xs[index])
    value = a.get(attr)
    return None if value is None else ints(value)


def same_dtype(ctx: InferContext, indices: Sequence[int]) -> None:
    """ONNX requires these inputs to share one element type; a mismatch is a ShapeError."""
    types = [(i, ctx.type(i)) for i in indices if ctx.has_input(i)]
    if len({t.dtype for _, t in types}) > 1:
        listed = ", ".join(f"input {i} is {t.dtype}" for i, t in types)
        raise ShapeError(f"{ctx.node.op}: element types differ ({listed})")


def first(xs: Arrays) -> np.ndarray:
    x = xs[0]
    assert x is not None
    return x


def same_as_input(ctx: InferContext) -> tuple[TensorType, ...]:
    return (ctx.type(0),)


def io_bytes(read_elems_of: Sequence[int], ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    """Bytes of the named inputs read in full plus all outputs written."""
    read = sum(ctx.type(i).nbytes for i in read_elems_of if ctx.has_input(i))
    return read + sum(t.nbytes for t in outs)


def outputs_only_bytes(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    """Ops that read only as much as they write (Slice, Gather rows): read + write of the output."""
    return 2 * sum(t.nbytes for t in outs)
