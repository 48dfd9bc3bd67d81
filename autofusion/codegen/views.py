"""Strided views: a tensor computed by views, transposes and slices of a buffer, as pointer + strides.

BLAS reads a matrix through a pointer, a leading dimension and a transpose flag, so a MatMul operand
that is a transposed or reshaped view of a group input needs no copy. ``strided_view`` follows the
producers of a tensor inside the group back to memory; ``None`` means the chain is not affine
(the operand is then materialised into scratch first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autofusion.codegen import index as ix
from autofusion.graph.dims import Dim, compare
from autofusion.graph.graph import Graph, Node
from autofusion.ops.registry import OpRegistry


@dataclass(frozen=True)
class StridedView:
    """Element ``idx`` of the view is ``ptr[offset + sum(idx[d] * strides[d])]``."""

    ptr: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def contiguous(self) -> bool:
        return all(n == 1 or s == c for n, s, c in zip(self.shape, self.strides, ix.strides(self.shape)))

    def transposed_last2(self) -> StridedView:
        shape = self.shape[:-2] + (self.shape[-1], self.shape[-2])
        strides = self.strides[:-2] + (self.strides[-1], self.strides[-2])
        return StridedView(self.ptr, shape, strides, self.offset)


def contiguous_view(ptr: str, shape: tuple[int, ...]) -> StridedView:
    return StridedView(ptr, shape, ix.strides(shape), 0)


def strided_view(graph: Graph, members: frozenset[str], tensor: str, pointer: Callable[[str], str],
                 registry: OpRegistry) -> StridedView | None:
    """The strided view of ``tensor`` over a buffer read from memory, or None."""
    node = graph.producers.get(tensor)
    shape = graph.types[tensor].shape
    if node is None or node.name not in members:
        return contiguous_view(pointer(tensor), shape)
    reshape = registry[node.op].view  # the same elements, in order, under a new shape
    if not reshape and node.op not in ("Transpose", "Slice", "Expand", "Dropout"):
        return None
    if node.op == "Dropout" and node.outputs.index(tensor) != 0:
        return None
    src = strided_view(graph, members, node.inputs[0], pointer, registry)
    if src is None:
        return None
    if reshape or node.op == "Dropout":
        if not src.contiguous:
            return None
        return StridedView(src.ptr, shape, ix.strides(shape), src.offset)
    if node.op == "Transpose":
        perm = node.attr("perm")
        perm = tuple(range(len(shape)))[::-1] if perm is None else tuple(int(p) for p in perm)
        return StridedView(src.ptr, shape, tuple(src.strides[p] for p in perm), src.offset)
    if node.op == "Expand":
        lead = len(shape) - len(src.shape)
        strides = tuple(0 if d < lead or src.shape[d - lead] == 1 else src.strides[d - lead] for d in range(len(shape)))
        return StridedView(src.ptr, shape, strides, src.offset)
    slices = static_slices(graph, node)
    if slices is None:
        return None
    offset, steps = src.offset, []
    for n, st, sl in zip(src.shape, src.strides, slices):
        r = range(n)[sl]
        if len(r):
            offset += r.start * st
        steps.append(st * r.step)
    return StridedView(src.ptr, shape, tuple(steps), offset)


def static_slices(graph: Graph, node: Node) -> tuple[slice, ...] | None:
    """What a Slice node keeps of each axis of its input, when its starts and ends are constants."""
    from autofusion.ops.common import ref_input_or_attr
    from autofusion.ops.reorganize import _slices

    xs = [graph.const_value(t) if t else None for t in node.inputs]
    starts, ends, axes, steps = (ref_input_or_attr(xs, node.attrs, i, n)
                                 for i, n in enumerate(("starts", "ends", "axes", "steps"), 1))
    if starts is None or ends is None:
        return None
    return _slices(graph.types[node.inputs[0]].shape, starts, ends, axes, steps)


def blas_layout(rows: Dim, cols: Dim, row_stride: Dim, col_stride: Dim) -> tuple[bool, Dim] | None:
    """(transposed, leading dimension) describing a rows x cols matrix to row-major BLAS, or None.
    A symbolic size may be 1 or more: it takes the general case, which holds for 1 too."""
    if _one(rows) and _one(cols):
        return False, 1
    if (col_stride == 1 or _one(cols)) and (_one(rows) or _at_least(row_stride, cols)):
        return False, row_stride if not _one(rows) else _at_least_1(cols)
    if (row_stride == 1 or _one(rows)) and (_one(cols) or _at_least(col_stride, rows)):
        return True, col_stride if not _one(cols) else _at_least_1(rows)
    return None


def _one(n: Dim) -> bool:
    return isinstance(n, int) and n <= 1


def _at_least_1(n: Dim) -> Dim:
    return max(n, 1) if isinstance(n, int) else n  # a symbolic size is at least 1


def _at_least(stride: Dim, n: Dim) -> bool:
    """``stride >= max(n, 1)`` for every binding."""
    return stride >= max(n, 1) if isinstance(stride, int) and isinstance(n, int) else compare(">=", stride, n) is True
