"""GEMMs for Triton: ``tl.dot`` over K tiles, the epilogue on the accumulator tile; one product
(gemm_epilogue, opaque) or several sharing their input in one launch (horizontal_gemm)."""

from __future__ import annotations

import math

from autofusion.codegen.names import NameTable, c_comment_text
from autofusion.codegen.scatter import landing, source_of
from autofusion.codegen.triton import tindex as ix
from autofusion.codegen.triton.configs import tile_configs
from autofusion.codegen.triton.exprs import Exprs
from autofusion.codegen.triton.tindex import Index
from autofusion.graph.graph import Node


def _operand(ex: Exprs, tensor: str, idx: Index, mask: str, k_lines: list[str]) -> str:
    """The operand's tile for one step of K, as lines of the K loop: loaded, or computed from what the
    group reads (a Transpose or view of an input: attention's K^T and heads). Values of the loop stay
    out of the memo, so the epilogue computes its own."""
    saved_lines, saved_mask, saved_memo = ex.lines, ex.mask, dict(ex.memo)
    ex.lines, ex.mask = [], mask
    try:
        value = ex.value(tensor, idx)
        if not ex.is_vector(value):  # a tile, even where the operand is one broadcast value
            value = ex.bind(f"tl.zeros({mask}.shape, dtype=tl.float32) + {value}")
        k_lines += ex.lines
    finally:
        ex.lines, ex.mask, ex.memo = saved_lines, saved_mask, saved_memo
    return value


def _batch(out_shape: tuple[int, ...]) -> tuple[list[str], list[str]]:
    """(lines, index) of the batch axes of the program ``pid_b``."""
    batch_lines, bidx = [], []
    for d, e in enumerate(ix.delinear("pid_b", out_shape[:-2])):
        if not ix.cix.is_int(e):
            batch_lines.append(f"b{d} = {e}")
            e = f"b{d}"
        bidx.append(e)
    return batch_lines, bidx


def _segment(ex: Exprs, names: NameTable, core: Node, outputs: list[str], bidx: list[str]) -> dict[str, object]:
    """One product and the outputs computed from it: its K loop, epilogue and stores (what the
    templates' K loop and epilogue hold), from a fresh memo (``rn`` is this product's)."""
    g = ex.graph
    a, bt = core.inputs[0], core.inputs[1]
    at, btt, out_t = g.type_of(a), g.type_of(bt), g.type_of(core.outputs[0])
    if at.rank < 2 or btt.rank < 2 or not at.dtype.is_float or not btt.dtype.is_float:
        raise ex.error("the Triton GEMM needs float operands of rank 2 or more", core)
    trans_a = core.op == "Gemm" and bool(core.attr("transA", 0))
    trans_b = core.op == "Gemm" and bool(core.attr("transB", 0))
    m, n = out_t.shape[-2], out_t.shape[-1]
    k = at.shape[-2] if trans_a else at.shape[-1]
    batch = out_t.shape[:-2]
    ex.lines, ex.memo, ex.mask = [], {}, "mask"
    ex.vector |= {"rm", "rn", "mask", "acc", "kk", "amask", "bmask"}
    lead = tuple(bidx)
    a_idx = ("kk[None, :]", "rm[:, None]") if trans_a else ("rm[:, None]", "kk[None, :]")
    b_idx = ("rn[None, :]", "kk[:, None]") if trans_b else ("kk[:, None]", "rn[None, :]")
    k_lines = [f"amask = (rm[:, None] < {m}) & (kk[None, :] < {k})",
               f"bmask = (kk[:, None] < {k}) & (rn[None, :] < {n})"]
    a_val = _operand(ex, a, ix.broadcast(lead, batch, at.shape[:-2]) + a_idx, "amask", k_lines)
    b_val = _operand(ex, bt, ix.broadcast(lead, batch, btt.shape[:-2]) + b_idx, "bmask", k_lines)
    tile: Index = lead + ("rm[:, None]", "rn[None, :]")
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
    base = ix.mul(ix.paren(ix.linear(lead, batch)), m * n)
    stores = []
    for t in outputs:
        shape = g.type_of(t).shape
        if shape == out_t.shape:
            off = ix.add(base, f"rm[:, None] * {n} + rn[None, :]")  # every tile row, even when M is 1
            stores.append(f"tl.store({names(t)} + {off}, {ex.value(t, tile)}, mask=mask)")
        else:
            stores.append(_scatter_store(ex, names(t), t, tile, out_t.shape)
                          or _broadcast_store(ex, names(t), t, tile, out_t.shape))
    return dict(summary=c_comment_text(f"{core.op} {core.name}: {list(out_t.shape)}, K={k}"), k=k, m=m, n=n,
                k_lines=k_lines, a_val=a_val, b_val=b_val, body=ex.lines, stores=stores)


def _scatter_store(ex: Exprs, pointer: str, tensor: str, tile: Index, gemm_shape: tuple[int, ...]) -> str:
    """The store of an output that only moves a tensor of the GEMM's shape (heads split off a QKV
    product, transposed): each tile element where it lands (codegen/scatter.py); "" for any other."""
    g = ex.graph
    members = frozenset(ex.group.nodes)
    source = source_of(g, members, tensor, ex.registry)
    if source == tensor or g.type_of(source).shape != gemm_shape:
        return ""
    land = landing(g, members, source, tensor, tile, ex.registry, reshape=ix.reshape)
    if land is None:
        return ""
    mask = " & ".join(["mask", *(f"({c})" for c in land.conditions())])
    return f"tl.store({pointer} + {ix.linear(land.index, g.type_of(tensor).shape)}, {ex.value(source, tile)}, mask={mask})"


def _broadcast_store(ex: Exprs, pointer: str, tensor: str, tile: Index, gemm_shape: tuple[int, ...]) -> str:
    """The store of an output of a shape the GEMM's broadcasts (attention's mask, [1, 1, S, S] beside
    scores of [1, H, S, S]): each element once, by the programs and tile lanes at index 0 of the axes
    it is broadcast along."""
    shape = ex.graph.type_of(tensor).shape
    aligned = (1,) * (len(gemm_shape) - len(shape)) + tuple(shape)
    if len(shape) > len(gemm_shape) or any(s not in (1, o) for s, o in zip(aligned, gemm_shape)):
        raise ex.error(f"output {tensor!r} {list(shape)} is not of the GEMM's shape {list(gemm_shape)} "
                       "nor broadcast to it")
    idx = ix.broadcast(tile, gemm_shape, shape)
    lanes = "0 * (rm[:, None] + rn[None, :])"  # makes a program's scalar a tile (the interpreter's masks must be)
    guards = [f"({e} == 0)" if "[" in e else f"({e} + {lanes} == 0)"
              for e, s, o in zip(tile, aligned, gemm_shape) if s == 1 and o > 1 and e != "0"]
    off = ix.add(ix.linear(idx, shape), lanes)  # a tile of lanes, even for one element
    return f"tl.store({pointer} + {off}, {ex.value(tensor, idx)}, mask={' & '.join(['mask', *guards])})"


def render_gemm(ex: Exprs, names: NameTable) -> dict[str, object]:
    """One product and its epilogue: a program per (batch, BM x BN tile)."""
    g = ex.graph
    cores = [g.node_by_name[n] for n in ex.group.nodes if ex.registry[g.node_by_name[n].op].core == "gemm"]
    if len(cores) != 1:
        raise ex.error(f"template 'gemm_epilogue' needs exactly one MatMul or Gemm node, found {len(cores)}")
    out_shape = g.type_of(cores[0].outputs[0]).shape
    batch_lines, bidx = _batch(out_shape)
    seg = _segment(ex, names, cores[0], list(ex.group.outputs), bidx)
    m, n, k = (int(seg[key]) for key in ("m", "n", "k"))  # type: ignore[call-overload]
    return dict(template="gemm_epilogue.py.j2", batch_lines=batch_lines, **seg,
                grid=[max(1, math.prod(out_shape[:-2])), f"triton.cdiv({m}, BM)", f"triton.cdiv({n}, BN)"],
                configs=tile_configs(m, n, k))


def _made_from(ex: Exprs, tensor: str, source: str) -> bool:
    """Whether ``tensor`` is ``source`` or computed from it inside the group."""
    if tensor == source:
        return True
    node = ex.graph.producers.get(tensor)
    return node is not None and node.name in ex.group.nodes and any(
        _made_from(ex, t, source) for t in node.inputs if t)


def render_horizontal(ex: Exprs, names: NameTable) -> dict[str, object]:
    """Products that share their input A, one launch: the column tiles of every product in one grid
    axis, each program computing the product its tile falls in (with that product's epilogue)."""
    g = ex.graph
    cores = [g.node_by_name[n] for n in ex.group.nodes if ex.registry[g.node_by_name[n].op].core == "gemm"]
    shapes = [g.type_of(c.outputs[0]).shape for c in cores]
    if len(cores) < 2 or len({s[:-1] for s in shapes}) != 1:
        raise ex.error("template 'horizontal_gemm' needs two or more products with the same rows and batch")
    batch_lines, bidx = _batch(shapes[0])
    owners = {t: [c for c in cores if _made_from(ex, t, c.outputs[0])] for t in ex.group.outputs}
    for t, found in owners.items():
        if len(found) != 1:
            raise ex.error(f"output {t!r} is computed from {len(found)} of the products, not one")
    m = shapes[0][-2]
    k_max = max(g.type_of(c.inputs[0]).shape[-1] for c in cores)
    # the products' column tiles are laid out along one grid axis: BN is fixed, BM and BK are tuned
    configs = tile_configs(m, max(s[-1] for s in shapes), k_max)
    bn = dict(configs[0])["BN"]
    configs = tile_configs(m, bn, k_max, fixed_bn=bn)
    segments, start = [], 0
    for core, shape in zip(cores, shapes):
        seg = _segment(ex, names, core, [t for t, found in owners.items() if found[0] is core], bidx)
        tiles = -(-shape[-1] // bn)
        segments.append(dict(seg, start=start, end=start + tiles))
        start += tiles
    return dict(template="horizontal_gemm.py.j2", batch_lines=batch_lines, segments=segments,
                grid=[max(1, math.prod(shapes[0][:-2])), f"triton.cdiv({m}, BM)", start], configs=configs)
