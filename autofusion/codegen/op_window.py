"""Ops whose output element is a small loop over a window or a contraction: MaxPool, AveragePool,
LRN, CumSum, Einsum, ConvTranspose.

Each handler emits the loop into the current block (so the op fuses with its producers and
consumers like any elementwise op: a Relu before a MaxPool is computed inside the window loop) and
returns the accumulated value. Sums accumulate in double where the reference does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from types import MappingProxyType

from autofusion.codegen import index as ix
from autofusion.codegen.ctype import ctype, lowest
from autofusion.codegen.index import Index
from autofusion.codegen.inliner import Block, Handler, Inliner
from autofusion.graph.graph import Node
from autofusion.ops.common import ints
from autofusion.ops.spatial import Window, window


def _taps(inl: Inliner, kernel: tuple[int, ...], block: Block) -> tuple[str, list[str], Block]:
    """A loop over every kernel tap: (tap variable, per-axis offset expressions, loop body block)."""
    tap = inl.k.fresh("tap")
    body = block.child()
    offs = ix.delinear(tap, list(kernel))
    names = []
    for e in offs:
        v = inl.k.fresh("kk")
        body.emit(f"const int64_t {v} = {e};")
        names.append(v)
    return tap, names, body


def _window_coords(inl: Inliner, idx: Index, w: Window, offs: list[str], body: Block) -> list[str]:
    """Input coordinates (one local per spatial axis) of the tap with kernel offsets ``offs``."""
    coords = []
    for d, k in enumerate(offs):
        pos = inl.k.fresh("at")
        start = ix.add(ix.mul(idx[2 + d], w.strides[d]), -w.pad_begin[d])
        body.emit(f"const int64_t {pos} = {ix.add(start, ix.mul(k, w.dilations[d]))};")
        coords.append(pos)
    return coords


def _maxpool(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    x = node.inputs[0]
    xs = inl.shape(x)
    w = window(xs[2:], ints(node.attr("kernel_shape")), node.attrs.get, bool(node.attr("ceil_mode", 0)))
    dtype = inl.k.type(x).dtype
    ct = ctype(dtype)
    best, which = inl.k.fresh("best"), inl.k.fresh("which")
    block.emit(f"{ct} {best} = {lowest(dtype)};")
    block.emit(f"int64_t {which} = 0;")
    tap, offs, body = _taps(inl, w.kernel, block)
    coords = _window_coords(inl, idx, w, offs, body)
    inside = " && ".join(f"{c} >= 0 && {c} < {n}" for c, n in zip(coords, xs[2:]))
    load = body.child()
    v = inl.value(x, (idx[0], idx[1], *coords), load)
    load.emit(f"if ({v} > {best}) {{ {best} = {v}; {which} = {tap}; }}")
    body.nest(f"if ({inside}) {{", load)
    block.nest(f"for (int64_t {tap} = 0; {tap} < {math.prod(w.kernel)}; ++{tap}) {{", body)
    block.memo[(node.outputs[0], tuple(idx))] = best
    if len(node.outputs) > 1 and node.outputs[1]:
        # flat index of the maximum in the input (row-major, or column-major spatial with storage_order)
        ks = ix.delinear(which, list(w.kernel))
        spatial = []
        for d, k in enumerate(ks):
            spatial.append(ix.add(ix.mul(idx[2 + d], w.strides[d]), ix.add(ix.mul(k, w.dilations[d]), -w.pad_begin[d])))
        plane = ix.add(ix.mul(idx[0], xs[1]), idx[1])
        if node.attr("storage_order", 0):
            flat = "0"
            for d in reversed(range(len(spatial))):
                flat = ix.add(ix.mul(ix.paren(flat), xs[2 + d]), ix.paren(spatial[d]))
            expr = ix.add(ix.mul(ix.paren(plane), math.prod(xs[2:])), ix.paren(flat))
        else:
            expr = plane
            for d, s in enumerate(spatial):
                expr = ix.add(ix.mul(ix.paren(expr), xs[2 + d]), ix.paren(s))
        at = inl.k.fresh("argmax")
        block.emit(f"const int64_t {at} = {expr};")
        block.memo[(node.outputs[1], tuple(idx))] = at
        if pos == 1:
            return at
    return best


def _avgpool(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    x = node.inputs[0]
    xs = inl.shape(x)
    w = window(xs[2:], ints(node.attr("kernel_shape")), node.attrs.get, bool(node.attr("ceil_mode", 0)))
    total, count = inl.k.fresh("sum"), inl.k.fresh("count")
    block.emit(f"double {total} = 0.0;")
    block.emit(f"double {count} = 0.0;")
    tap, offs, body = _taps(inl, w.kernel, block)
    coords = _window_coords(inl, idx, w, offs, body)
    inside = " && ".join(f"{c} >= 0 && {c} < {n}" for c, n in zip(coords, xs[2:]))
    load = body.child()
    v = inl.value(x, (idx[0], idx[1], *coords), load)
    load.emit(f"{total} += (double){v};")
    load.emit(f"{count} += 1.0;")
    body.nest(f"if ({inside}) {{", load, footer=None)
    if node.attr("count_include_pad", 0):
        padded = " && ".join(f"{c} >= {-b} && {c} < {n + e}"
                             for c, n, b, e in zip(coords, xs[2:], w.pad_begin, w.pad_end))
        pad_block = body.child()
        pad_block.emit(f"{count} += 1.0;")
        body.nest(f"}} else if ({padded}) {{", pad_block)
    else:
        body.emit("}")
    block.nest(f"for (int64_t {tap} = 0; {tap} < {math.prod(w.kernel)}; ++{tap}) {{", body)
    return f"({ctype(inl.k.type(x).dtype)})({total} / {count})"


def _lrn(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    x = node.inputs[0]
    channels = inl.shape(x)[1]
    size = int(node.attr("size"))
    before = (size - 1) // 2
    acc, i = inl.k.fresh("sq"), inl.k.fresh("ch")
    block.emit(f"double {acc} = 0.0;")
    body = block.child()
    c = inl.k.fresh("c")
    body.emit(f"const int64_t {c} = {ix.sub(idx[1], before)} + {i};")
    load = body.child()
    v = inl.value(x, (idx[0], c, *idx[2:]), load)
    load.emit(f"{acc} += (double){v} * (double){v};")
    body.nest(f"if ({c} >= 0 && {c} < {channels}) {{", load)
    block.nest(f"for (int64_t {i} = 0; {i} < {size}; ++{i}) {{", body)
    xv = inl.value(x, idx, block)
    alpha = repr(float(node.attr("alpha", 1e-4)))
    beta = repr(float(node.attr("beta", 0.75)))
    bias = repr(float(node.attr("bias", 1.0)))
    denom = f"pow({bias} + {alpha} / {size} * {acc}, {beta})"
    return f"({ctype(inl.k.type(x).dtype)})((double){xv} / {denom})"


def _cumsum(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    x = node.inputs[0]
    xs = inl.shape(x)
    axis_value = inl.k.graph.const_value(node.inputs[1])
    if axis_value is None:
        raise inl.k.error("CumSum axis must be a constant", node)
    axis = int(axis_value.reshape(())) % len(xs)
    n = xs[axis]
    ct = inl.k.ctype_of(x)
    acc, s = inl.k.fresh("run"), inl.k.fresh("s")
    block.emit(f"{ct} {acc} = 0;")
    reverse = bool(node.attr("reverse", 0))
    body = block.child()
    src = tuple(s if d == axis else e for d, e in enumerate(idx))
    v = inl.value(x, src, body)
    body.emit(f"{acc} += {v};")
    if reverse:
        block.nest(f"for (int64_t {s} = {n - 1}; {s} >= {idx[axis]}; --{s}) {{", body)
    else:
        block.nest(f"for (int64_t {s} = 0; {s} <= {idx[axis]}; ++{s}) {{", body)
    if node.attr("exclusive", 0):
        return f"{acc} - {inl.value(x, idx, block)}"
    return acc


def _einsum(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    from autofusion.ops.opaque import _einsum_terms

    operands = [t for t in node.inputs if t]
    shapes = [inl.shape(t) for t in operands]
    terms, out_labels = _einsum_terms(str(node.attrs["equation"]), [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for lab, n in zip(term, shape):
            sizes[lab] = max(sizes.get(lab, 1), n)
    var: dict[str, str] = dict(zip(out_labels, idx))
    summed = [lab for lab in dict.fromkeys(itertools.chain(*terms)) if lab not in var]
    for lab in summed:
        var[lab] = inl.k.fresh("e")
    acc = inl.k.fresh("dot")
    block.emit(f"double {acc} = 0.0;")

    def loops(level: int, blk: Block) -> None:
        if level == len(summed):
            factors = []
            for t, term, shape in zip(operands, terms, shapes):
                at = tuple("0" if n == 1 else var[lab] for lab, n in zip(term, shape))
                factors.append(f"(double){inl.value(t, at, blk)}")
            blk.emit(f"{acc} += {' * '.join(factors)};")
            return
        v = var[summed[level]]
        inner = blk.child()
        loops(level + 1, inner)
        blk.nest(f"for (int64_t {v} = 0; {v} < {sizes[summed[level]]}; ++{v}) {{", inner)

    loops(0, block)
    return f"({inl.k.ctype_of(node.outputs[0])}){acc}"


def _conv_transpose(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    from autofusion.ops.spatial import _deconv_geometry

    x, w = node.inputs[0], node.inputs[1]
    xs, ws = inl.shape(x), inl.shape(w)
    spatial = xs[2:]
    kernel = ws[2:]
    groups = int(node.attr("group", 1))
    cg, mg = xs[1] // groups, ws[1]
    _, begin = _deconv_geometry(spatial, kernel, node.attrs.get)
    strides = ints(node.attr("strides") or [1] * len(spatial))
    dil = ints(node.attr("dilations") or [1] * len(spatial))
    acc, c = inl.k.fresh("acc"), inl.k.fresh("c")
    block.emit(f"double {acc} = 0.0;")
    grp = ix.div(idx[1], mg)
    m_in = ix.mod(idx[1], mg)
    body = block.child()
    ch = inl.k.fresh("ch")
    body.emit(f"const int64_t {ch} = {ix.add(ix.mul(ix.paren(grp), cg), c)};")
    tap, offs, taps = _taps(inl, tuple(kernel), body)
    ins, conds = [], []
    for d, k in enumerate(offs):
        num = inl.k.fresh("num")
        taps.emit(f"const int64_t {num} = {ix.add(idx[2 + d], begin[d])} - {ix.mul(k, dil[d])};")
        src = inl.k.fresh("src")
        taps.emit(f"const int64_t {src} = {num} / {strides[d]};")
        conds.append(f"{num} >= 0 && {num} % {strides[d]} == 0 && {src} < {spatial[d]}")
        ins.append(src)
    load = taps.child()
    xv = inl.value(x, (idx[0], ch, *ins), load)
    wv = inl.value(w, (ch, m_in, *offs), load)
    load.emit(f"{acc} += (double){xv} * (double){wv};")
    taps.nest(f"if ({' && '.join(conds)}) {{", load)
    body.nest(f"for (int64_t {tap} = 0; {tap} < {math.prod(kernel)}; ++{tap}) {{", taps)
    block.nest(f"for (int64_t {c} = 0; {c} < {cg}; ++{c}) {{", body)
    out = acc
    if len(node.inputs) > 2 and node.inputs[2]:
        out = f"{acc} + (double){inl.value(node.inputs[2], (idx[1],), block)}"
    return f"({inl.k.ctype_of(node.outputs[0])})({out})"


def handlers() -> Mapping[str, Handler]:
    """Handlers of the window and contraction ops, by op name."""
    return MappingProxyType({
        "MaxPool": _maxpool, "AveragePool": _avgpool, "LRN": _lrn, "CumSum": _cumsum, "Einsum": _einsum,
        "ConvTranspose": _conv_transpose,
    })

