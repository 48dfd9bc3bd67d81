"""Pooling windows for Triton: MaxPool (its values) and AveragePool as values of ``Exprs``.

The window's taps are few and static, so the loop over them is unrolled: each tap's input is
computed at its coordinates (inlining the producers: a Relu before a MaxPool is computed per tap)
under a mask that adds the tap's in-bounds test to the block's, so padding is never read. Geometry
(pads, strides, dilations, auto_pad, ceil_mode) is the reference's ``window``.
"""

from __future__ import annotations

import itertools
import math
from typing import Protocol

from autofusion.codegen.errors import CodegenError
from autofusion.codegen.triton import tindex as ix
from autofusion.codegen.triton.tindex import Index
from autofusion.graph.graph import Graph, Node
from autofusion.ops.common import ints
from autofusion.ops.spatial import Window, window

WINDOW_OPS = frozenset({"MaxPool", "AveragePool"})
MAX_TAPS = 64  # the loop is unrolled: larger windows would make huge kernels


class WindowExprs(Protocol):
    """What pooling needs of :class:`autofusion.codegen.triton.exprs.Exprs` (not imported: it imports us)."""

    graph: Graph
    mask: str | None

    def value(self, tensor: str, idx: Index) -> str: ...

    def bind(self, expr: str) -> str: ...

    def error(self, message: str, node: Node | None = None) -> CodegenError: ...


def _window(ex: WindowExprs, node: Node) -> Window:
    xt = ex.graph.type_of(node.inputs[0])
    if xt.rank < 3:
        raise ex.error("pooling needs an N x C x D1 ... input", node)
    if not xt.dtype.is_float:
        raise ex.error(f"the Triton backend pools float tensors only, not {xt.dtype}", node)
    w = window(xt.shape[2:], ints(node.attr("kernel_shape")), node.attrs.get, bool(node.attr("ceil_mode", 0)))
    taps = math.prod(w.kernel)
    if taps > MAX_TAPS:
        raise ex.error(f"a window of {taps} taps exceeds the unrolled loop's {MAX_TAPS}", node)
    return w


def _bounds(idx: Index, w: Window, offs: tuple[int, ...], lo: tuple[int, ...],
            hi: tuple[int, ...]) -> tuple[list[str], list[str]]:
    """A tap's coordinates and the tests ``lo <= c < hi`` that can fail for some output position."""
    coords, tests = [], []
    for d, k in enumerate(offs):
        shift = k * w.dilations[d] - w.pad_begin[d]
        c = ix.add(ix.mul(idx[2 + d], w.strides[d]), shift)
        first, last = shift, (w.out[d] - 1) * w.strides[d] + shift
        if first < lo[d]:
            tests.append(f"({c} >= {lo[d]})")
        if last >= hi[d]:
            tests.append(f"({c} < {hi[d]})")
        coords.append(c)
    return coords, tests


def _tap(ex: WindowExprs, x: str, idx: Index, coords: list[str], inside: str | None) -> str:
    """The input at a tap, computed under the block's mask and the tap's in-bounds test."""
    saved = ex.mask
    if inside is not None:
        ex.mask = inside if saved is None else ex.bind(f"{saved} & {inside}")
    try:
        return ex.value(x, (idx[0], idx[1], *coords))
    finally:
        ex.mask = saved


def _taps(ex: WindowExprs, node: Node, idx: Index, w: Window) -> list[tuple[str, str | None]]:
    """Each tap's value and in-bounds test (None: always inside)."""
    x = node.inputs[0]
    shape = ex.graph.type_of(x).shape[2:]
    out = []
    for offs in itertools.product(*(range(k) for k in w.kernel)):
        coords, tests = _bounds(idx, w, offs, (0,) * len(shape), tuple(shape))
        inside = ex.bind(" & ".join(tests)) if tests else None
        out.append((_tap(ex, x, idx, coords, inside), inside))
    return out


def _maxpool(ex: WindowExprs, node: Node, pos: int, idx: Index) -> str:
    if pos != 0:
        raise ex.error("MaxPool's indices output is not supported by the Triton backend", node)
    best = ""
    for v, inside in _taps(ex, node, idx, _window(ex, node)):
        v = ex.bind(f"tl.where({inside}, {v}, -float('inf'))") if inside else v
        best = ex.bind(f"tl.maximum({best}, {v})") if best else v
    return best


def _avgpool(ex: WindowExprs, node: Node, idx: Index) -> str:
    w = _window(ex, node)
    shape = ex.graph.type_of(node.inputs[0]).shape[2:]
    include_pad = bool(node.attr("count_include_pad", 0))
    # the divisor counts the taps in the data, or with count_include_pad also those in the pads
    lo = tuple(-b for b in w.pad_begin) if include_pad else (0,) * len(shape)
    hi = tuple(n + e for n, e in zip(shape, w.pad_end)) if include_pad else tuple(shape)
    total, counts, fixed = "", [], 0
    for offs, (v, inside) in zip(itertools.product(*(range(k) for k in w.kernel)), _taps(ex, node, idx, w)):
        v = ex.bind(f"tl.where({inside}, {v}, 0.0)") if inside else v
        total = ex.bind(f"{total} + {v}") if total else v
        tests = _bounds(idx, w, offs, lo, hi)[1]
        if tests:
            counts.append(f"tl.where({' & '.join(tests)}, 1.0, 0.0)")
        else:
            fixed += 1
    count = " + ".join(counts + ([f"{fixed}.0"] if fixed else []))
    return ex.bind(f"{total} / ({count})")


def compute_window(ex: WindowExprs, node: Node, pos: int, idx: Index) -> str:
    """Output ``pos`` of pooling ``node`` at ``idx``; CodegenError for what the backend does not pool."""
    if node.op == "MaxPool":
        return _maxpool(ex, node, pos, idx)
    if node.op == "AveragePool":
        return _avgpool(ex, node, idx)
    raise ex.error(f"op {node.op} is not a window op of the Triton backend", node)
