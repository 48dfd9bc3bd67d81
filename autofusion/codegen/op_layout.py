"""Reorganising ops as index mappings: views, Transpose, Slice, Concat, Split, Pad, Expand, Tile,
Gather / GatherElements / GatherND, Trilu, DepthToSpace / SpaceToDepth, and ops whose value is known
at build time (Shape, Size, Range, ConstantOfShape).

A handler maps the output index to input indices and asks the inliner for the inputs there; no data
moves until the final store of the fused loop nest.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from autofusion.codegen import index as ix
from autofusion.codegen.ctype import literal
from autofusion.codegen.index import Index
from autofusion.codegen.inliner import Block, Handler, Inliner
from autofusion.graph.graph import Node
from autofusion.ops.catalog import default_registry
from autofusion.ops.common import ref_input_or_attr

# marks a kernel that picks its source per index (Concat): compiled without if-conversion
# (AF_NO_IF_CONVERT, group_renderer.py; GCC 12 vectorised such selections wrongly, docs/reliability.md)
SELECT_SOURCE = "af:select-source"

_TABLE_LIMIT = 4096  # larger build-time tables travel as derived constants, not C arrays


def _static_input(inl: Inliner, node: Node, i: int, attr: str) -> list[int] | None:
    """Ints of constant input ``i`` or attribute ``attr`` (what shape inference used)."""
    xs = [inl.k.graph.const_value(t) if t else None for t in node.inputs]
    return ref_input_or_attr(xs, node.attrs, i, attr)


def _view(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    src = node.inputs[0]
    return inl.value(src, ix.reshape(idx, inl.shape(node.outputs[0]), inl.shape(src)), block)


def _transpose(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    rank = len(idx)
    perm = node.attr("perm")
    perm = tuple(range(rank))[::-1] if perm is None else tuple(int(p) for p in perm)
    src = ["0"] * rank
    for k, p in enumerate(perm):
        src[p] = idx[k]
    return inl.value(node.inputs[0], tuple(src), block)


def _expand(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    return inl.input_value(node, 0, idx, block)


def _tile(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    in_shape, out_shape = inl.shape(node.inputs[0]), inl.shape(node.outputs[0])
    src = tuple(e if n == o else ix.mod(e, n) for e, n, o in zip(idx, in_shape, out_shape))
    return inl.value(node.inputs[0], src, block)


def _slice(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    from autofusion.ops.reorganize import _slices

    in_shape = inl.shape(node.inputs[0])
    ends_input = node.inputs[2] if len(node.inputs) > 2 else ""
    if ends_input and inl.k.graph.constants[ends_input].is_symbolic:
        return _slice_to_run_time_end(inl, node, idx, block)
    args = [_static_input(inl, node, i, name) for i, name in enumerate(("starts", "ends", "axes", "steps"), 1)]
    starts, ends, axes, steps = args
    assert starts is not None and ends is not None
    slices = _slices(in_shape, starts, ends, axes, steps)
    src = []
    for e, n, s in zip(idx, in_shape, slices):
        r = range(n)[s]
        src.append(ix.add(ix.mul(e, r.step), r.start) if len(r) else "0")
    return inl.value(node.inputs[0], tuple(src), block)


def _slice_to_run_time_end(inl: Inliner, node: Node, idx: Index, block: Block) -> str:
    """A Slice whose end is a symbolic size (``position_ids[:, :seq]``): an element's source is
    ``start + i * step`` whatever the end, so the starts and steps, fixed, are all it needs."""
    in_shape = inl.shape(node.inputs[0])
    rank = len(in_shape)
    starts = _static_input(inl, node, 1, "starts") or []
    axes = _static_input(inl, node, 3, "axes") or list(range(len(starts)))
    steps = _static_input(inl, node, 4, "steps") or [1] * len(starts)
    start_of = {a % rank: (s, st) for a, s, st in zip(axes, starts, steps)}
    src = list(idx)
    for axis, (start, step) in start_of.items():
        n = in_shape[axis]
        if step != 1 or (start < 0 and not isinstance(n, int)):
            raise inl.k.error(f"Slice of step {step} from {start} with a symbolic end: not supported")
        first = (max(n + start, 0) if start < 0 else min(start, n)) if isinstance(n, int) else start
        src[axis] = ix.add(idx[axis], first)
    return inl.value(node.inputs[0], tuple(src), block)


def _split(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    rank = len(idx)
    axis = int(node.attr("axis", 0)) % rank
    offset = sum(inl.shape(node.outputs[k])[axis] for k in range(pos))
    src = tuple(ix.add(e, offset) if d == axis else e for d, e in enumerate(idx))
    return inl.value(node.inputs[0], src, block)


def _concat(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    rank = len(idx)
    axis = int(node.attr("axis")) % rank
    parts = [(t, inl.shape(t)[axis]) for t in node.inputs if t and inl.shape(t)[axis] > 0]
    if len(parts) == 1:
        return inl.value(parts[0][0], idx, block)
    var = inl.k.fresh()
    block.emit(f"{inl.k.ctype_of(node.outputs[0])} {var}; /* {SELECT_SOURCE} */")  # marks the kernel AF_NO_IF_CONVERT
    start = 0
    for k, (t, n) in enumerate(parts):
        inner = block.child()
        src = tuple(ix.sub(e, start) if d == axis else e for d, e in enumerate(idx))
        inner.emit(f"{var} = {inl.value(t, src, inner)};")
        if k == 0:
            block.nest(f"if ({idx[axis]} < {start + n}) {{", inner, footer=None)
        elif k < len(parts) - 1:
            block.nest(f"}} else if ({idx[axis]} < {start + n}) {{", inner, footer=None)
        else:
            block.nest("} else {", inner, footer=None)
        start += n
    block.emit("}")
    return var


def _pad(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    from autofusion.ops.reorganize import _pad_widths

    src_t = node.inputs[0]
    in_shape = inl.shape(src_t)
    widths = _pad_widths(len(in_shape), _static_input(inl, node, 1, "pads"), _static_input(inl, node, 3, "axes"))
    mode = node.attr("mode", "constant")
    src = []
    conds = []
    for e, n, (b, end) in zip(idx, in_shape, widths):
        if b == 0 and end == 0:
            src.append(e)
            continue
        # negative pads crop first; the rest pads the cropped extent (as the reference does)
        lo, hi = max(-b, 0), max(-end, 0)
        kept = n - lo - hi
        s = ix.sub(e, max(b, 0))
        if mode == "constant":
            if b > 0:
                conds.append(f"{s} >= 0")
            if end > 0:
                conds.append(f"{s} < {kept}")
        elif mode == "edge":
            s = f"({s} < 0 ? 0 : ({s} >= {kept} ? {kept - 1} : {s}))"
        elif mode == "reflect":
            s = f"af_reflect_index({s}, {kept})"
        elif mode == "wrap":
            s = f"af_wrapmod_index({s}, {kept})"
        else:
            raise inl.k.error(f"Pad mode {mode!r} is not supported", node)
        src.append(ix.add(s, lo))
    if mode != "constant" or not conds:
        return inl.value(src_t, tuple(src), block)
    dtype = inl.k.type(src_t).dtype
    if len(node.inputs) > 2 and node.inputs[2] and inl.k.type(node.inputs[2]).numel:
        fill = inl.value(node.inputs[2], ("0",) * len(inl.shape(node.inputs[2])), block)
    else:
        fill = literal(node.attr("value", 0.0) or 0, dtype)
    var = inl.k.fresh()
    block.emit(f"{inl.k.ctype_of(node.outputs[0])} {var} = {fill};")
    inner = block.child()
    inner.emit(f"{var} = {inl.value(src_t, tuple(src), inner)};")
    block.nest(f"if ({' && '.join(conds)}) {{", inner)
    return var


def _data_index(inl: Inliner, e: str, dim: int, block: Block) -> str:
    """An index read from data, wrapped (negative from the end) and clamped into ``[0, dim)``."""
    var = inl.k.fresh("g")
    block.emit(f"const int64_t {var} = af_wrap_index((int64_t){e}, {dim});")
    return var


def _gather(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    data, indices = node.inputs[0], node.inputs[1]
    d_shape, i_shape = inl.shape(data), inl.shape(indices)
    axis = int(node.attr("axis", 0)) % len(d_shape)
    k = len(i_shape)
    raw = inl.value(indices, tuple(idx[axis:axis + k]), block)
    g = _data_index(inl, raw, d_shape[axis], block)
    src = tuple(idx[:axis]) + (g,) + tuple(idx[axis + k:])
    return inl.value(data, src, block)


def _gather_elements(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    data, indices = node.inputs[0], node.inputs[1]
    d_shape = inl.shape(data)
    axis = int(node.attr("axis", 0)) % len(d_shape)
    raw = inl.value(indices, idx, block)
    g = _data_index(inl, raw, d_shape[axis], block)
    return inl.value(data, tuple(g if d == axis else e for d, e in enumerate(idx)), block)


def _gather_nd(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    data, indices = node.inputs[0], node.inputs[1]
    d_shape, i_shape = inl.shape(data), inl.shape(indices)
    b = int(node.attr("batch_dims", 0))
    last = i_shape[-1]
    q = len(i_shape) - 1  # output dims that index the tuples
    src = list(idx[:b])
    for j in range(last):
        raw = inl.value(indices, tuple(idx[:q]) + (str(j),), block)
        src.append(_data_index(inl, raw, d_shape[b + j], block))
    src.extend(idx[q:])
    return inl.value(data, tuple(src), block)


def _trilu(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    x = inl.value(node.inputs[0], idx, block)
    k = "0"
    if len(node.inputs) > 1 and node.inputs[1]:
        k = f"(int64_t){inl.value(node.inputs[1], ('0',) * len(inl.shape(node.inputs[1])), block)}"
    row, col = idx[-2], idx[-1]
    keep = f"{ix.paren(ix.sub(col, row))} >= {k}" if node.attr("upper", 1) else (
        f"{ix.paren(ix.sub(col, row))} <= {k}")
    zero = literal(0, inl.k.type(node.outputs[0]).dtype)
    return f"({keep} ? {x} : {zero})"


def _depth_to_space(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    b = int(node.attr("blocksize"))
    n, c, h, w = idx
    c_out = inl.shape(node.outputs[0])[1]
    hh, b1, ww, b2 = ix.div(h, b), ix.mod(h, b), ix.div(w, b), ix.mod(w, b)
    if node.attr("mode", "DCR") == "DCR":
        ch = ix.add(ix.mul(ix.paren(ix.add(ix.mul(b1, b), b2)), c_out), c)
    else:
        ch = ix.add(ix.add(ix.mul(c, b * b), ix.mul(b1, b)), b2)
    return inl.value(node.inputs[0], (n, ch, hh, ww), block)


def _space_to_depth(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    b = int(node.attr("blocksize"))
    n, c2, hh, ww = idx
    c_in = inl.shape(node.inputs[0])[1]
    blk, c = ix.div(c2, c_in), ix.mod(c2, c_in)
    b1, b2 = ix.div(blk, b), ix.mod(blk, b)
    return inl.value(node.inputs[0], (n, c, ix.add(ix.mul(hh, b), b1), ix.add(ix.mul(ww, b), b2)), block)


def _range(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    start = inl.value(node.inputs[0], (), block)
    delta = inl.value(node.inputs[2], (), block)
    ct = inl.k.ctype_of(node.outputs[0])
    return f"({ct})({start} + ({ct}){idx[0]} * {delta})"


def _static_value(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    """Ops whose value is fixed at build time (Shape, Size, ConstantOfShape): evaluated now."""
    g = inl.k.graph
    dtype = inl.k.type(node.outputs[pos]).dtype
    if node.op == "ConstantOfShape":  # every element is the fill value, whatever the (maybe symbolic) shape
        fill = node.attr("value")
        return literal(np.asarray(fill).reshape(-1)[0] if fill is not None else 0, dtype)
    args = []
    for t in node.inputs:
        v = g.const_value(t) if t else None
        if t and v is None:  # Shape/Size only need the static type of a computed input
            v = np.zeros(g.types[t].shape, dtype=g.types[t].dtype.numpy)
        args.append(v)
    value = np.asarray(inl.k.registry[node.op].reference(args, node.attrs)[pos])
    out = node.outputs[pos]
    flat = value.reshape(-1)
    if flat.size == 0 or np.all(flat == flat[0]):
        return literal(flat[0] if flat.size else 0, dtype)
    offset = ix.linear(idx, value.shape)
    if flat.size > _TABLE_LIMIT:
        ptr = inl.k.derived_constant(f"{node.name}_{pos}_value", value)
        return f"{ptr}[{offset}]"
    table = inl.k.fresh("tbl")
    values = ", ".join(literal(v, dtype) for v in flat)
    block.emit(f"static const {inl.k.ctype_of(out)} {table}[{flat.size}] = {{{values}}};")
    return f"{table}[{offset}]"


def handlers() -> Mapping[str, Handler]:
    """Handlers of every reorganising op, by op name."""
    registry = default_registry()
    table: dict[str, Handler] = {op: _view for op in registry.names if registry[op].view}
    table.update({
        "Transpose": _transpose, "Expand": _expand, "Tile": _tile, "Slice": _slice, "Split": _split,
        "Concat": _concat, "Pad": _pad, "Gather": _gather, "GatherElements": _gather_elements,
        "GatherND": _gather_nd, "Trilu": _trilu, "DepthToSpace": _depth_to_space,
        "SpaceToDepth": _space_to_depth, "Range": _range, "Shape": _static_value, "Size": _static_value,
        "ConstantOfShape": _static_value,
    })
    return MappingProxyType(table)

