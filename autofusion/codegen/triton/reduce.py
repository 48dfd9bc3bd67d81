"""Row-wise reductions for Triton: ReduceSum/Mean/Max/Min, Softmax, LogSoftmax, LayerNormalization,
GlobalAveragePool and GlobalMaxPool (a mean or max over the spatial axes).

One program per row (the axes not reduced); one block covers the reduced axes. The reduction's
input is computed inline (the pointwise prologue), the statistics with ``tl.sum``/``tl.max``, and
every output that lines up with the row (the epilogue) is computed from them and stored.
"""

from __future__ import annotations

import math

from autofusion.codegen.names import NameTable, c_comment_text
from autofusion.codegen.reductions import _axes_of, is_identity_reduce
from autofusion.codegen.triton import tindex as ix
from autofusion.codegen.triton.exprs import Exprs
from autofusion.codegen.triton.tindex import Index
from autofusion.graph.graph import Node

REDUCE_STATS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min"}
GLOBAL_POOLS = {"GlobalAveragePool": "mean", "GlobalMaxPool": "max"}  # reductions over the spatial axes
ROW_OPS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization"})
MAX_BLOCK = 1 << 14  # one block per row: longer rows would need a loop over blocks


def find_reduction(ex: Exprs) -> Node | None:
    """The group's one reduction node (None when there is none); two are a CodegenError."""
    found = [ex.graph.node_by_name[n] for n in ex.group.nodes
             if (ex.graph.node_by_name[n].op in REDUCE_STATS and not is_identity_reduce(ex.graph, ex.graph.node_by_name[n]))
             or ex.graph.node_by_name[n].op in ROW_OPS or ex.graph.node_by_name[n].op in GLOBAL_POOLS]
    if len(found) > 1:
        raise ex.error(f"{len(found)} reductions in one group; the Triton backend renders one per kernel")
    return found[0] if found else None


def _axes(ex: Exprs, node: Node) -> tuple[int, ...]:
    rank = ex.graph.type_of(node.inputs[0]).rank
    if node.op in REDUCE_STATS:
        return _axes_of(ex.graph, node, rank) or tuple(range(rank))
    if node.op in GLOBAL_POOLS:
        return tuple(range(2, rank))
    axis = int(node.attr("axis", -1)) % rank
    return tuple(range(axis, rank)) if node.op == "LayerNormalization" else (axis,)


def render_reduction(ex: Exprs, names: NameTable) -> dict[str, object]:
    node = find_reduction(ex)
    assert node is not None
    x = node.inputs[0]
    shape = ex.graph.type_of(x).shape
    axes = _axes(ex, node)
    row_dims = [d for d in range(len(shape)) if d not in axes]
    rows = math.prod(shape[d] for d in row_dims)
    length = math.prod(shape[d] for d in axes)
    block = 1 << max(0, (length - 1).bit_length())
    if block > MAX_BLOCK:
        raise ex.error(f"rows of {length} elements exceed one block ({MAX_BLOCK})", node)
    ex.mask, ex.vector = "mask", {"j", "mask"}
    index_lines: list[str] = []
    x_idx = ["0"] * len(shape)
    for dims, flat in ((row_dims, "row"), (list(axes), "j")):
        for d, e in zip(dims, ix.delinear(flat, [shape[d] for d in dims])):
            if not ix.cix.is_int(e):
                index_lines.append(f"i{d} = {e}")
                if flat == "j":
                    ex.vector.add(f"i{d}")
                e = f"i{d}"
            x_idx[d] = e
    full = tuple(x_idx)
    keep = tuple("0" if d in axes else e for d, e in enumerate(full))
    drop = tuple(full[d] for d in row_dims)
    results = _statistics(ex, node, full, length)

    def aligned(idx: Index, want: Index, out_shape: tuple[int, ...]) -> bool:
        return all(n == 1 or a == b for a, b, n in zip(idx, want, out_shape))

    for pos, out in enumerate(node.outputs):
        if not out:
            continue
        out_shape = ex.graph.type_of(out).shape
        want = full if out_shape == shape else keep if len(out_shape) == len(shape) else drop

        def override(idx: Index, want: Index = want, out_shape: tuple[int, ...] = out_shape,
                     value: str = results[pos]) -> str:
            if not aligned(idx, want, out_shape):
                raise ex.error("the reduction is read away from its own row", node)
            return value
        ex.overrides[out] = override
    stores = []
    for t in ex.group.outputs:
        out_shape = ex.graph.type_of(t).shape
        if out_shape == shape:
            lane = " + 0 * j" if length == 1 else ""  # rows of one element: the index has no j, the mask has
            stores.append(f"tl.store({names(t)} + {ix.linear(full, shape)}{lane}, {ex.value(t, full)}, mask=mask)")
        elif out_shape == tuple(1 if d in axes else n for d, n in enumerate(shape)):
            stores.append(f"tl.store({names(t)} + {ix.linear(keep, out_shape)}, {ex.value(t, keep)})")
        elif out_shape == tuple(shape[d] for d in row_dims):
            stores.append(f"tl.store({names(t)} + {ix.linear(drop, out_shape)}, {ex.value(t, drop)})")
        else:
            raise ex.error(f"output {t!r} {list(out_shape)} does not line up with the rows of {x!r} {list(shape)}")
    summary = f"{node.op} {node.name} over axes {list(axes)} of {x} {list(shape)}"
    return dict(template="reduction.py.j2", summary=c_comment_text(summary), rows=rows, length=length,
                grid=[rows], index_lines=index_lines, body=ex.lines, stores=stores, meta=[("BLOCK", block)])


def _statistics(ex: Exprs, node: Node, full: Index, length: int) -> list[str]:
    """The values of the node's outputs: blocks for full-shape outputs, scalars for reduced ones."""
    xv = ex.value(node.inputs[0], full)
    if not ex.graph.type_of(node.inputs[0]).dtype.is_float:
        raise ex.error("the Triton backend reduces float tensors only", node)
    b = ex.bind
    if node.op in REDUCE_STATS or node.op in GLOBAL_POOLS:
        stat = REDUCE_STATS.get(node.op) or GLOBAL_POOLS[node.op]
        if stat in ("sum", "mean"):
            s = b(f"tl.sum(tl.where(mask, {xv}, 0.0), axis=0)")
            return [b(f"{s} / {length}") if stat == "mean" else s]
        fill = "-float('inf')" if stat == "max" else "float('inf')"
        return [b(f"tl.{stat}(tl.where(mask, {xv}, {fill}), axis=0)")]
    if node.op in ("Softmax", "LogSoftmax"):
        m = b(f"tl.max(tl.where(mask, {xv}, -float('inf')), axis=0)")
        e = b(f"tl.exp({xv} - {m})")
        s = b(f"tl.sum(tl.where(mask, {e}, 0.0), axis=0)")
        return [b(f"{e} / {s}") if node.op == "Softmax" else b(f"{xv} - {m} - tl.log({s})")]
    shape = ex.graph.type_of(node.inputs[0]).shape
    eps = float(node.attr("epsilon", 1e-5))
    mean = b(f"tl.sum(tl.where(mask, {xv}, 0.0), axis=0) / {length}")
    cen = b(f"tl.where(mask, {xv} - {mean}, 0.0)")
    rstd = b(f"1.0 / tl.sqrt(tl.sum({cen} * {cen}, axis=0) / {length} + {eps!r})")
    scale = ex.value(node.inputs[1], ix.broadcast(full, shape, ex.graph.type_of(node.inputs[1]).shape))
    y = b(f"{cen} * {rstd} * {scale}")
    if len(node.inputs) > 2 and node.inputs[2]:
        bias = ex.value(node.inputs[2], ix.broadcast(full, shape, ex.graph.type_of(node.inputs[2]).shape))
        y = b(f"{y} + {bias}")
    return [y, mean, rstd]
