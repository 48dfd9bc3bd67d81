"""Row-wise reductions for Triton: ReduceSum/Mean/Max/Min, Softmax, LogSoftmax, LayerNormalization,
GlobalAveragePool and GlobalMaxPool (a mean or max over the spatial axes).

One program per row (the axes not reduced); one block covers the reduced axes. The reduction's
input is computed inline (the pointwise prologue), the statistics with ``tl.sum``/``tl.max``, and
every output that lines up with the row (the epilogue) is computed from them and stored.

A row longer than MAX_BLOCK is walked in blocks of BLOCK instead (configs.LOOP_BLOCKS): one loop per statistic that
depends on the one before (a softmax's maximum, then its sum of exponentials; a layer norm's mean,
then its variance), each accumulating a block of partial results, and a last loop computing and
storing the outputs that line up with the row; the prologue is computed again in each loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from autofusion.codegen.names import NameTable, c_comment_text
from autofusion.codegen.reductions import _axes_of, is_identity_reduce
from autofusion.codegen.triton import tindex as ix
from autofusion.codegen.triton.configs import loop_configs, row_configs
from autofusion.codegen.triton.exprs import Exprs
from autofusion.codegen.triton.tindex import Index
from autofusion.graph.graph import Node

REDUCE_STATS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min"}
GLOBAL_POOLS = {"GlobalAveragePool": "mean", "GlobalMaxPool": "max"}  # reductions over the spatial axes
ROW_OPS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization"})
MAX_BLOCK = 1 << 14  # one block per row up to this length; longer rows loop over blocks


def find_reductions(ex: Exprs) -> list[Node]:
    """The group's reduction nodes, in graph order: none, one, or siblings over the same rows (the
    same axes of inputs of one shape: the kinds group such Reduce ops, a LayerNorm gradient's two
    means); any other mix is a CodegenError."""
    found = [ex.graph.node_by_name[n] for n in ex.group.nodes
             if (ex.graph.node_by_name[n].op in REDUCE_STATS and not is_identity_reduce(ex.graph, ex.graph.node_by_name[n]))
             or ex.graph.node_by_name[n].op in ROW_OPS or ex.graph.node_by_name[n].op in GLOBAL_POOLS]
    order = ex.graph.node_index
    found.sort(key=lambda n: order[n.name])
    rows = {(ex.graph.type_of(n.inputs[0]).shape, _axes(ex, n)) for n in found}
    if len(found) > 1 and (len(rows) > 1 or any(n.op not in REDUCE_STATS for n in found)):
        raise ex.error(f"{len(found)} reductions over different rows in one group; the Triton backend "
                       "renders one row loop per kernel")
    return found


def find_reduction(ex: Exprs) -> Node | None:
    """The group's first reduction node (None when there is none); see :func:`find_reductions`."""
    found = find_reductions(ex)
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
    nodes = find_reductions(ex)
    node = nodes[0]
    x = node.inputs[0]
    shape = ex.graph.type_of(x).shape
    axes = _axes(ex, node)
    row_dims = [d for d in range(len(shape)) if d not in axes]
    rows = math.prod(shape[d] for d in row_dims)
    length = math.prod(shape[d] for d in axes)
    block = 1 << max(0, (length - 1).bit_length())
    if block > MAX_BLOCK:
        if len(nodes) > 1:
            raise ex.error("sibling reductions over rows longer than one block; the Triton backend loops over one")
        return _render_looped(ex, names, node, shape, axes, row_dims, rows, length)
    idx = _rows(ex, shape, axes, row_dims)
    for each in nodes:  # siblings over the same rows: each a statistic of the block
        _install(ex, each, idx, _statistics(ex, each, idx.full, length))
    stores = []
    for t in ex.group.outputs:
        if ex.graph.type_of(t).shape == shape:
            lane = " + 0 * j" if length == 1 else ""  # rows of one element: the index has no j, the mask has
            stores.append(f"tl.store({names(t)} + {ix.linear(idx.full, shape)}{lane}, {ex.value(t, idx.full)}, "
                          "mask=mask)")
        else:
            stores.append(idx.reduced_store(ex, names, t, x))
    summary = f"{node.op} {node.name} over axes {list(axes)} of {x} {list(shape)}"
    return dict(template="reduction.py.j2", summary=c_comment_text(summary), rows=rows, length=length,
                grid=[rows], index_lines=idx.row_lines + idx.j_lines, body=ex.lines, stores=stores,
                configs=row_configs(block))


def _install(ex: Exprs, node: Node, idx: _Rows, results: list[str]) -> None:
    """Read ``node``'s outputs as ``results`` where a reader lines up with the row."""
    for pos, out in enumerate(node.outputs):
        if not out:
            continue
        out_shape = ex.graph.type_of(out).shape
        want = idx.want(out_shape)

        def override(at: Index, want: Index = want, out_shape: tuple[int, ...] = out_shape,
                     value: str = results[pos]) -> str:
            if not _aligned(at, want, out_shape):
                raise ex.error("the reduction is read away from its own row", node)
            return value
        ex.overrides[out] = override


@dataclass(frozen=True)
class _Rows:
    """A reduction's indices: the axes kept (one row per program, ``row``) and the reduced ones (the
    lanes of a block, ``j``), with the lines that name each axis's index."""

    shape: tuple[int, ...]
    axes: tuple[int, ...]
    row_dims: list[int]
    full: Index  # an element of the input
    keep: Index  # its row's element of a reduced output that keeps the reduced axes as 1
    drop: Index  # ... of one that drops them
    row_lines: list[str]
    j_lines: list[str]

    def want(self, out_shape: tuple[int, ...]) -> Index:
        """Where an output of ``out_shape`` holds the row's value(s)."""
        return self.full if out_shape == self.shape else self.keep if len(out_shape) == len(self.shape) else self.drop

    def reduced_store(self, ex: Exprs, names: NameTable, t: str, x: str) -> str:
        """The store of output ``t``, one value per row; a CodegenError if it does not line up."""
        out_shape = ex.graph.type_of(t).shape
        if out_shape == tuple(1 if d in self.axes else n for d, n in enumerate(self.shape)):
            return f"tl.store({names(t)} + {ix.linear(self.keep, out_shape)}, {ex.value(t, self.keep)})"
        if out_shape == tuple(self.shape[d] for d in self.row_dims):
            return f"tl.store({names(t)} + {ix.linear(self.drop, out_shape)}, {ex.value(t, self.drop)})"
        raise ex.error(f"output {t!r} {list(out_shape)} does not line up with the rows of {x!r} {list(self.shape)}")


def _rows(ex: Exprs, shape: tuple[int, ...], axes: tuple[int, ...], row_dims: list[int]) -> _Rows:
    """The indices of a row and its block; the block's names become vectors (masked by ``mask``)."""
    ex.mask, ex.vector = "mask", {"j", "mask"}
    lines: dict[str, list[str]] = {"row": [], "j": []}
    x_idx = ["0"] * len(shape)
    for dims, flat in ((row_dims, "row"), (list(axes), "j")):
        for d, e in zip(dims, ix.delinear(flat, [shape[d] for d in dims])):
            if not ix.cix.is_int(e):
                lines[flat].append(f"i{d} = {e}")
                if flat == "j":
                    ex.vector.add(f"i{d}")
                e = f"i{d}"
            x_idx[d] = e
    full = tuple(x_idx)
    return _Rows(shape, axes, row_dims, full, tuple("0" if d in axes else e for d, e in enumerate(full)),
                 tuple(full[d] for d in row_dims), lines["row"], lines["j"])


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
    return [_affine(ex, node, shape, full, f"{cen} * {rstd}"), mean, rstd]


def _aligned(idx: Index, want: Index, out_shape: tuple[int, ...]) -> bool:
    return all(n == 1 or a == b for a, b, n in zip(idx, want, out_shape))


def _render_looped(ex: Exprs, names: NameTable, node: Node, shape: tuple[int, ...], axes: tuple[int, ...],
                   row_dims: list[int], rows: int, length: int) -> dict[str, object]:
    """A row too long for one block: loops over its blocks (see the module doc)."""
    x = node.inputs[0]
    if not ex.graph.type_of(x).dtype.is_float:
        raise ex.error("the Triton backend reduces float tensors only", node)
    idx = _rows(ex, shape, axes, row_dims)
    full = idx.full
    loops: list[dict[str, list[str]]] = []

    def fresh() -> None:  # values inside a loop are the loop's own: nothing computed elsewhere is reused
        ex.memo, ex.lines = {}, []

    def accumulate(init: str, step: str, finish: str) -> str:
        """A loop adding each block of the input (``step`` of acc and {x}) into acc; the scalar ``finish``."""
        fresh()
        xv = ex.value(x, full)
        n = len(loops)
        body = ex.lines + [f"acc{n} = " + step.format(acc=f"acc{n}", x=xv)]
        loops.append(dict(before=[f"acc{n} = {init}"], body=body, after=[f"s{n} = " + finish.format(acc=f"acc{n}")]))
        return f"s{n}"

    zeros, lowest = "tl.zeros([BLOCK], dtype=tl.float32)", "tl.full([BLOCK], float('-inf'), tl.float32)"
    total = "{acc} + tl.where(mask, {x}, 0.0)"
    results: list[str | None] = []  # scalars; None: the output lines up with the row, computed per block
    per_block: dict[int, str] = {}  # output position -> expression of the block, {x} the input
    if node.op in REDUCE_STATS or node.op in GLOBAL_POOLS:
        stat = REDUCE_STATS.get(node.op) or GLOBAL_POOLS[node.op]
        if stat in ("sum", "mean"):
            sv = accumulate(zeros, total, "tl.sum({acc}, axis=0)")
            results.append(f"({sv} / {length})" if stat == "mean" else sv)
        elif stat == "max":
            results.append(accumulate(lowest, "tl.maximum({acc}, tl.where(mask, {x}, -float('inf')))",
                                      "tl.max({acc}, axis=0)"))
        else:
            results.append(accumulate("tl.full([BLOCK], float('inf'), tl.float32)",
                                      "tl.minimum({acc}, tl.where(mask, {x}, float('inf')))", "tl.min({acc}, axis=0)"))
    elif node.op in ("Softmax", "LogSoftmax"):
        m = accumulate(lowest, "tl.maximum({acc}, tl.where(mask, {x}, -float('inf')))", "tl.max({acc}, axis=0)")
        sv = accumulate(zeros, "{acc} + tl.where(mask, tl.exp({x} - " + m + "), 0.0)", "tl.sum({acc}, axis=0)")
        results.append(None)
        per_block[0] = f"tl.exp({{x}} - {m}) / {sv}" if node.op == "Softmax" else f"{{x}} - {m} - tl.log({sv})"
    else:  # LayerNormalization: the mean, then the variance about it
        eps = float(node.attr("epsilon", 1e-5))
        mean = accumulate(zeros, total, "tl.sum({acc}, axis=0) / " + str(length))
        var = accumulate(zeros, "{acc} + tl.where(mask, ({x} - " + mean + ") * ({x} - " + mean + "), 0.0)",
                         "tl.sum({acc}, axis=0) / " + str(length))
        loops[-1]["after"].append(f"rstd = 1.0 / tl.sqrt({var} + {eps!r})")
        results += [None, mean, "rstd"]
        per_block[0] = f"({{x}} - {mean}) * rstd"

    def override_for(pos: int, out_shape: tuple[int, ...], want: Index) -> Callable[[Index], str]:
        def override(idx: Index) -> str:
            if not _aligned(idx, want, out_shape):
                raise ex.error("the reduction is read away from its own row", node)
            value = results[pos]
            if value is None:
                value = ex.bind(per_block[pos].format(x=ex.value(x, full)))
                if node.op == "LayerNormalization":
                    value = _affine(ex, node, shape, full, value)
            return value
        return override

    for pos, out in enumerate(node.outputs):
        if out:
            out_shape = ex.graph.type_of(out).shape
            ex.overrides[out] = override_for(pos, out_shape, idx.want(out_shape))
    # the outputs that line up with the row: a last loop computes and stores them block by block
    fresh()
    stores = []
    for t in ex.group.outputs:
        if ex.graph.type_of(t).shape == shape:
            stores.append(f"tl.store({names(t)} + {ix.linear(full, shape)}, {ex.value(t, full)}, mask=mask)")
    if stores:
        loops.append(dict(before=[], body=ex.lines + stores, after=[]))
    # one value per row: after the loops
    fresh()
    stores = [idx.reduced_store(ex, names, t, x) for t in ex.group.outputs if ex.graph.type_of(t).shape != shape]
    summary = f"{node.op} {node.name} over axes {list(axes)} of {x} {list(shape)}, in blocks of BLOCK"
    return dict(template="reduction_loop.py.j2", summary=c_comment_text(summary), rows=rows, length=length,
                grid=[rows], row_lines=idx.row_lines, j_lines=idx.j_lines, loops=loops, body=ex.lines, stores=stores,
                configs=loop_configs())


def _affine(ex: Exprs, node: Node, shape: tuple[int, ...], full: Index, y: str) -> str:
    """A layer norm's normalised block times its scale, plus its bias."""
    scale = ex.value(node.inputs[1], ix.broadcast(full, shape, ex.graph.type_of(node.inputs[1]).shape))
    y = ex.bind(f"{y} * {scale}")
    if len(node.inputs) > 2 and node.inputs[2]:
        bias = ex.value(node.inputs[2], ix.broadcast(full, shape, ex.graph.type_of(node.inputs[2]).shape))
        y = ex.bind(f"{y} + {bias}")
    return y
