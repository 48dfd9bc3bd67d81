"""GEMM with an epilogue for Triton: ``tl.dot`` over K tiles, the epilogue on the accumulator tile."""

from __future__ import annotations

import math

from autofusion.codegen.names import NameTable, c_comment_text
from autofusion.codegen.triton import tindex as ix
from autofusion.codegen.triton.exprs import Exprs
from autofusion.codegen.triton.tindex import Index


def _tile(n: int, cap: int) -> int:
    return min(cap, max(16, 1 << max(0, (n - 1).bit_length())))  # tl.dot needs 16 or more


def render_gemm(ex: Exprs, names: NameTable) -> dict[str, object]:
    g = ex.graph
    cores = [g.node_by_name[n] for n in ex.group.nodes if ex.registry[g.node_by_name[n].op].core == "gemm"]
    if len(cores) != 1:
        raise ex.error(f"template 'gemm_epilogue' needs exactly one MatMul or Gemm node, found {len(cores)}")
    core = cores[0]
    a, bt = core.inputs[0], core.inputs[1]
    for t in (a, bt):
        if t in ex.group.outputs or (g.producers.get(t) is not None and g.producers[t].name in ex.group.nodes):
            raise ex.error(f"operand {t!r} is computed inside the group; the Triton GEMM reads operands from memory",
                           core)
    at, btt, out_t = g.type_of(a), g.type_of(bt), g.type_of(core.outputs[0])
    if at.rank < 2 or btt.rank < 2 or not at.dtype.is_float or not btt.dtype.is_float:
        raise ex.error("the Triton GEMM needs float operands of rank 2 or more", core)
    trans_a = core.op == "Gemm" and bool(core.attr("transA", 0))
    trans_b = core.op == "Gemm" and bool(core.attr("transB", 0))
    m, n = out_t.shape[-2], out_t.shape[-1]
    k = at.shape[-2] if trans_a else at.shape[-1]
    batch = out_t.shape[:-2]
    ex.mask, ex.vector = "mask", {"rm", "rn", "mask", "acc"}
    batch_lines, bidx = [], []
    for d, e in enumerate(ix.delinear("pid_b", batch)):
        if not ix.cix.is_int(e):
            batch_lines.append(f"b{d} = {e}")
            e = f"b{d}"
        bidx.append(e)

    def base(shape: tuple[int, ...]) -> str:
        lead = ix.broadcast(tuple(bidx), batch, shape[:-2])
        return ix.mul(ix.paren(ix.linear(lead, shape[:-2])), shape[-2] * shape[-1])

    sam, sak = (1, at.shape[-1]) if trans_a else (at.shape[-1], 1)
    sbk, sbn = (1, btt.shape[-1]) if trans_b else (btt.shape[-1], 1)
    a_off = ix.add(base(at.shape), f"rm[:, None] * {sam} + kk[None, :] * {sak}")
    b_off = ix.add(base(btt.shape), f"kk[:, None] * {sbk} + rn[None, :] * {sbn}")
    tile: Index = tuple(bidx) + ("rm[:, None]", "rn[None, :]")
    value = "acc"
    if core.op == "Gemm":
        alpha, beta = float(core.attr("alpha", 1.0)), float(core.attr("beta", 1.0))
        value = ex.bind(f"acc * {alpha!r}") if alpha != 1.0 else value
        if len(core.inputs) > 2 and core.inputs[2] and beta != 0.0:
            c = ex.value(core.inputs[2], ix.broadcast(tile, out_t.shape, g.type_of(core.inputs[2]).shape))
            value = ex.bind(f"{value} + {c} * {beta!r}" if beta != 1.0 else f"{value} + {c}")

    def override(idx: Index) -> str:
        if not all(s == 1 or x == y for x, y, s in zip(idx, tile, out_t.shape)):
            raise ex.error("the GEMM result is read away from its own tile", core)
        return value
    ex.overrides[core.outputs[0]] = override
    stores = []
    for t in ex.group.outputs:
        if g.type_of(t).shape != out_t.shape:
            raise ex.error(f"output {t!r} {list(g.type_of(t).shape)} is not of the GEMM's shape {list(out_t.shape)}")
        off = ix.add(base(out_t.shape), f"rm[:, None] * {n} + rn[None, :]")  # every tile row, even when M is 1
        stores.append(f"tl.store({names(t)} + {off}, {ex.value(t, tile)}, mask=mask)")
    bm, bn, bk = _tile(m, 64), _tile(n, 64), _tile(k, 32)
    return dict(template="gemm_epilogue.py.j2", summary=c_comment_text(f"{core.op} {core.name}: {list(out_t.shape)}, K={k}"),
                batch_lines=batch_lines, k=k, m=m, n=n, a_ptr=names(a), b_ptr=names(bt), a_off=a_off, b_off=b_off,
                body=ex.lines, stores=stores, grid=[max(1, math.prod(batch)), -(-m // bm), -(-n // bn)],
                meta=[("BM", bm), ("BN", bn), ("BK", bk)])
