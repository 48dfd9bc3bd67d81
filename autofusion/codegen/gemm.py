"""MatMul / Gemm with a fused epilogue (``gemm_epilogue``) and several projections of one input
(``horizontal_gemm``).

The core computes tiles of the output, tiles in parallel: products with a constant 2-D weight (of
at least PACKED_MIN_COLUMNS columns) run ``af_sgemm_packed`` on the weight packed once at build time
into column panels (``pack_weights``), other products call ``af_sgemm`` (OpenBLAS's ``sgemm``, or
its own few-row kernel) on one thread per tile. Right after a tile's product, while it is in cache,
the epilogue (bias, activation, residual, scaling, ...) runs on that tile and writes the group's
outputs. Operands that are transposed or reshaped views of a buffer are passed through
strides (no copy); other operands are computed into scratch first. Outputs that do not line up
with the tiles (a transpose after the MatMul, a reduction over it) are computed after the
tiles from the full product.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autofusion.codegen import index as ix
from autofusion.codegen.cores import GEMM_TILE_ROWS, CoreSpec, k_pass
from autofusion.codegen.ctype import literal
from autofusion.codegen.index import Index
from autofusion.codegen.inliner import Block, Inliner, Misaligned, Override
from autofusion.codegen.kernel_context import KernelContext
from autofusion.codegen.loopnest import LoopNest, op_handlers
from autofusion.codegen.names import c_comment_text
from autofusion.codegen.scatter import Landing, landing, source_of
from autofusion.codegen.sizes import TYPICAL_CALLS, TYPICAL_ROWS, all_of, at_least, ceil_div, hint, typical
from autofusion.codegen.views import StridedView, blas_layout, contiguous_view, strided_view
from autofusion.graph.dims import is_static
from autofusion.graph.graph import Node
from autofusion.graph.types import DType
from autofusion.ops.registry import broadcast_shapes

# Tiles of up to 128 x 512 keep sgemm efficient (measured here: 128x512 tiles with the epilogue beat one
# big sgemm plus a separate epilogue pass on one thread); columns are split further, down to 256, until
# there are enough tiles to share among threads.
TILE_M = GEMM_TILE_ROWS
TILE_N = 512
MIN_TILE_N = 256
MIN_TILES = 4
PARALLEL_MIN_FLOPS = 1 << 19  # smaller products run on one thread
PACK_NR = 32  # columns per panel of a packed weight: AF_PACK_NR in templates/c/af_sgemm.c.j2
# a transposed A's rows a multiple of this apart fall in at most 4 of L1's 64 sets (both ISAs' L1s)
ALIASED_ROW_BYTES = 1024
PACKED_MIN_TILES = 8  # packed products read no packed copy per tile: smaller tiles cost little
PACKED_MIN_COLUMNS = 8  # narrower weights would be mostly zero padding in a 32-column panel
SMALL_ROWS = 8  # af_sgemm's own kernel takes up to 2 x AF_SMALL_M rows (templates/c/af_sgemm.c.j2)


def pack_weights(w: np.ndarray, width: int, panel: int = PACK_NR) -> np.ndarray:
    """A [K, N] weight as af_sgemm_packed reads it: ceil(N / panel) panels, the last zero-padded,
    each panel / ``width`` slices of K rows of ``width`` columns (the micro-kernel's, see
    :func:`slice_cols`), one after another. Shape [panels * slices, K, width]. The wide
    micro-kernel's panel is one slice of its width (``panel=width``)."""
    if width < 1 or panel % width:
        raise ValueError(f"slice width {width} does not divide the {panel}-column panel")
    k, n = w.shape
    slices = -(-n // panel) * panel // width
    padded = np.zeros((k, slices * width), np.float32)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, slices, width).transpose(1, 0, 2))


def slice_cols(k: KernelContext) -> int:
    """Columns of the micro-kernel the kernel's cores run: the width its weights are packed for."""
    return k.chooser.machine.micro_kernel[1]


def packed_for(width: int, wide: bool = False) -> str:
    """The C check, at a call site of af_sgemm_packed (``wide``: af_sgemm_packed_wide) on a weight
    packed at build time, that the kernel reads the slice width the weight was packed for
    (templates/c/af_sgemm.c.j2)."""
    return f"AF_WIDE_PACKED_FOR({width});" if wide else f"AF_PACKED_FOR({width});"


def _packed_column_block(n: int, row_tiles: int, panel: int = PACK_NR) -> int:
    """Columns per tile of a packed product: whole panels, and enough tiles, a multiple of 4, for
    threads to share evenly (3 tiles on 2 threads left one idle for a third of FFN-out's time)."""
    col_tiles = max(-(-n // TILE_N), -(-PACKED_MIN_TILES // row_tiles))
    col_tiles = -(-col_tiles // 4) * 4
    per_tile = -(-n // col_tiles)
    nb = -(-per_tile // panel) * panel
    return n if nb >= n else nb


def _column_block(n: int, row_tiles: int) -> int:
    """Columns per tile: up to TILE_N (1.5 x TILE_N in one tile), halved down to MIN_TILE_N while
    there are fewer than MIN_TILES tiles to share among threads."""
    nb = max(1, n if n <= TILE_N * 3 // 2 else TILE_N)
    while row_tiles * -(-n // nb) < MIN_TILES and nb > MIN_TILE_N:
        nb = max(MIN_TILE_N, (nb // 2 + 63) // 64 * 64)
    return nb


@dataclass
class _Segment:
    """One MatMul/Gemm core and the outputs computed on its tiles."""

    node: Node
    y: str
    a: StridedView  # batch + (M, K)
    b: StridedView  # batch + (K, N)
    alpha: float
    c_input: str
    beta: float
    drop_m: bool
    drop_n: bool
    batch: tuple[int, ...] = ()
    flat: bool = False  # batch folded into M (B has no batch axes, A's rows are evenly strided)
    row_stride_a: int = 0
    targets: list[tuple[str, str]] = field(default_factory=list)
    # (output, its pointer, the tile-aligned tensor it moves, where each tile element lands in it)
    scatters: list[tuple[str, str, str, Landing]] = field(default_factory=list)
    ybuf: str = ""  # full buffer holding Y (an output, or scratch when late outputs need it)
    weight: np.ndarray | None = None  # B as a constant [K, N] weight: packed into column panels at build time
    weight_label: str = ""
    merged: bool = False  # the columns of several cores' products (horizontal GEMM)
    unpacked: np.ndarray | None = None  # merged constant weights concatenated, for sgemm (not packed)
    repack: bool = False  # B computed at run time, packed into this thread's panels per (batch, column block)
    wide: bool = False  # the packed weight runs the wide micro-kernel, in its own panels

    @property
    def rows(self) -> int:
        """Rows per sgemm call: M, or all batch rows when the batch is folded into M."""
        return self.a.shape[-2] * (math.prod(self.batch) if self.flat else 1)

    @property
    def calls(self) -> int:
        return 1 if self.flat else math.prod(self.batch)

    @property
    def n(self) -> int:
        return self.b.shape[-1]

    @property
    def k(self) -> int:
        return self.a.shape[-1]


class _Gemm:
    def __init__(self, k: KernelContext, nodes: list[Node], cores: list[Node],
                 materialized: Mapping[str, str] | None = None) -> None:
        self.k = k
        self.g = k.graph
        # tensors an earlier stage of the kernel already wrote: read from there, never recomputed
        self.materialized = dict(materialized or {})
        self.loads: dict[str, Override] = {t: self._load(t, ptr) for t, ptr in self.materialized.items()}
        self.members = frozenset(n.name for n in nodes if not self._done(n))
        self.cores = cores
        self.non_core = frozenset(n.name for n in nodes if n not in cores and not self._done(n))
        self.handlers = op_handlers(k.registry)
        self.prologue: list[str] = []
        self.epilogue: list[str] = []
        k.uses_blas = True

    def _done(self, node: Node) -> bool:
        return bool(node.outputs) and all(o in self.materialized for o in node.outputs if o)

    def _load(self, tensor: str, ptr: str) -> Override:
        shape = self.g.types[tensor].shape
        return lambda idx, block: f"{ptr}[{ix.linear(idx, shape)}]"

    def _pointer(self, tensor: str) -> str:
        return self.materialized.get(tensor) or self.k.pointer(tensor)

    def _nest(self, overrides: Mapping[str, Override] | None = None, members: frozenset[str] | None = None
              ) -> LoopNest:
        return LoopNest(self.k, self.non_core if members is None else members,
                        overrides={**self.loads, **(overrides or {})}, handlers=self.handlers)

    # -- operands ---------------------------------------------------------------------------------

    def _scratch_copy(self, tensor: str) -> StridedView:
        """Compute ``tensor`` into scratch with the loop-nest engine; its contiguous view."""
        t = self.g.types[tensor]
        off = self.k.scratch(t.nbytes)
        ptr = f"((float*)(scratch + {off}))"
        self.prologue.append(self._nest().render([(tensor, ptr)]))
        return contiguous_view(ptr, t.shape)

    def _operand(self, tensor: str) -> StridedView:
        if self.g.types[tensor].dtype != DType.FLOAT32:
            raise self.k.error(f"MatMul operands must be float32, {tensor!r} is {self.g.types[tensor].dtype}")
        view = strided_view(self.g, self.non_core, tensor, self._pointer, self.k.registry)
        return view if view is not None else self._scratch_copy(tensor)

    @staticmethod
    def _as_matrix(view: StridedView, which: str) -> StridedView:
        """A 1-D operand as a 1 x K row (A) or K x 1 column (B)."""
        if len(view.shape) != 1:
            return view
        if which == "a":
            return StridedView(view.ptr, (1,) + view.shape, (0,) + view.strides, view.offset)
        return StridedView(view.ptr, view.shape + (1,), view.strides + (0,), view.offset)

    def _oriented(self, node: Node, view: StridedView, which: str) -> StridedView:
        view = self._as_matrix(view, which)
        if node.op == "Gemm" and node.attr("transA" if which == "a" else "transB", 0):
            view = view.transposed_last2()
        return view

    def segment(self, node: Node, b_override: StridedView | None = None) -> _Segment:
        a_t, b_t = node.inputs[0], node.inputs[1]
        a = self._oriented(node, self._operand(a_t), "a")
        b = b_override or self._oriented(node, self._operand(b_t), "b")
        alpha, beta, c_input = 1.0, 1.0, ""
        if node.op == "Gemm":
            alpha = float(node.attr("alpha", 1.0))
            beta = float(node.attr("beta", 1.0))
            c_input = node.inputs[2] if len(node.inputs) > 2 else ""
        drop_m, drop_n = self.g.types[a_t].rank == 1, self.g.types[b_t].rank == 1
        seg = _Segment(node, node.outputs[0], a, b, alpha, c_input, beta, drop_m, drop_n)
        seg.batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        self._fold_batch(seg)
        weight = None if drop_n else _constant_weight(self.k, node)
        if weight is not None and weight.shape[1] >= PACKED_MIN_COLUMNS:
            seg.weight, seg.weight_label = weight, f"{node.name}_packed"
        for which, tensor in (("a", a_t), ("b", b_t)):
            if self._layout(seg, which) is None:  # strides BLAS cannot take: copy the operand first
                setattr(seg, which, self._oriented(node, self._scratch_copy(tensor), which))
                self._fold_batch(seg)
        return seg

    def _fold_batch(self, seg: _Segment) -> None:
        """Fold the batch into M when B has no batch axes and A's rows are evenly strided."""
        a, b = seg.a, seg.b
        seg.flat = False
        seg.row_stride_a = a.strides[-2]
        if not seg.batch or any(s for s, n in zip(b.strides[:-2], b.shape[:-2]) if n != 1):
            return
        lead = len(seg.batch) - (len(a.shape) - 2)
        dims = [(n, a.strides[d - lead] if d >= lead and a.shape[d - lead] != 1 else 0)
                for d, n in enumerate(seg.batch)] + [(a.shape[-2], a.strides[-2])]
        live = [(n, s) for n, s in dims if n != 1]
        if not live:
            seg.flat, seg.row_stride_a = True, max(a.shape[-1], 1)
            return
        expected = step = live[-1][1]
        for n, s in reversed(live):
            if s != expected:
                return
            expected *= n
        seg.flat, seg.row_stride_a = True, step

    def _layout(self, seg: _Segment, which: str) -> tuple[bool, int] | None:
        if which == "a":
            rows = seg.a.shape[-2] * (math.prod(seg.batch) if seg.flat else 1)
            return blas_layout(rows, seg.a.shape[-1], seg.row_stride_a, seg.a.strides[-1])
        return blas_layout(seg.b.shape[-2], seg.b.shape[-1], seg.b.strides[-2], seg.b.strides[-1])

    # -- outputs ----------------------------------------------------------------------------------

    def _depends_on(self, tensor: str, core: str, seen: dict[str, bool]) -> bool:
        if tensor in seen:
            return seen[tensor]
        node = self.g.producers.get(tensor)
        hit = False
        if node is not None and node.name in self.members:
            hit = node.name == core or any(self._depends_on(t, core, seen) for t in node.inputs if t)
        seen[tensor] = hit
        return hit

    def y_index(self, seg: _Segment) -> Index:
        return tuple("0" if n == 1 else f"i{d}" for d, n in enumerate(self.g.types[seg.y].shape))

    def _c_term(self, seg: _Segment, idx: Index, inl: Inliner, block: Block) -> str:
        if not seg.c_input:
            return ""
        c = inl.value(seg.c_input, ix.broadcast(idx, self.g.types[seg.y].shape, self.g.types[seg.c_input].shape),
                      block)
        return f" + {c}" if seg.beta == 1.0 else f" + {literal(seg.beta, DType.FLOAT32)} * {c}"

    def _tile_override(self, seg: _Segment, ldc: int, inl: Inliner) -> Override:
        expected = self.y_index(seg)

        def override(idx: Index, block: Block) -> str:
            if tuple(idx) != expected:
                raise Misaligned(seg.y)
            return f"c[mi * {ldc} + ni]" + self._c_term(seg, idx, inl, block)

        return override

    def _full_override(self, seg: _Segment) -> Override:
        shape = self.g.types[seg.y].shape
        return lambda idx, block: f"{seg.ybuf}[{ix.linear(idx, shape)}]"

    # -- rendering --------------------------------------------------------------------------------

    def render(self, segments: list[_Segment]) -> str:
        outputs = list(self.k.group.outputs)
        late: list[tuple[str, str]] = []
        early: list[tuple[str, str]] = []
        for t in outputs:
            owners = [s for s in segments if self._depends_on(t, s.node.name, {})]
            dest = self.k.pointer(t)
            if not owners:
                early.append((t, dest))
            elif len(owners) == 1 and self._aligned(owners[0], t):
                owners[0].targets.append((t, dest))
            elif len(owners) == 1 and (moved := self._scattered(owners[0], t)):
                owners[0].scatters.append((t, dest, *moved))
            else:
                late.append((t, dest))
        late_needs = {s.node.name for s in segments for t, _ in late if self._depends_on(t, s.node.name, {})}
        for s in segments:
            if s.y in outputs:
                s.ybuf = self.k.pointer(s.y)
            elif s.node.name in late_needs:
                off = self.k.scratch(self.g.types[s.y].nbytes)
                s.ybuf = f"((float*)(scratch + {off}))"
                if s.c_input:
                    s.targets.insert(0, (s.y, s.ybuf))
        if early:
            self.prologue.append(self._nest().render(early))
        if len(segments) > 1 and self._mergeable(segments):
            return self._emit_merged(segments, late)
        return self._emit(segments, late)

    @staticmethod
    def _mergeable(segments: list[_Segment]) -> bool:
        """Whether the segments are column blocks of one product: a shared A, and B either constant
        weights (packed side by side) or column ranges of one buffer, next to each other."""
        first = segments[0]
        if any(s.a != first.a or s.alpha != first.alpha or s.batch != first.batch or s.flat != first.flat
               or s.drop_m != first.drop_m or s.drop_n for s in segments):
            return False
        if all(s.weight is not None for s in segments):
            return True
        off = first.b.offset
        for s in segments:
            if (s.b.ptr != first.b.ptr or s.b.strides != first.b.strides or s.b.offset != off
                    or s.b.strides[-1] != 1):
                return False
            off += s.n
        return True

    def _emit_merged(self, segments: list[_Segment], late: list[tuple[str, str]]) -> str:
        """One sgemm over the concatenated weights; each tile's epilogue split by column range."""
        first = segments[0]
        total = sum(s.n for s in segments)
        whole = _Segment(first.node, first.y, first.a, StridedView(first.b.ptr, first.b.shape[:-1] + (total,),
                                                                   first.b.strides, first.b.offset),
                         first.alpha, "", 1.0, first.drop_m, False, first.batch, first.flat, first.row_stride_a)
        weights = [s.weight for s in segments if s.weight is not None]
        whole.merged = True
        if len(weights) == len(segments):
            whole.weight, whole.weight_label = np.concatenate(weights, axis=1), "weights_cat_packed"
        for s in segments:
            if s.ybuf and (s.y, s.ybuf) not in s.targets:
                s.targets.insert(0, (s.y, s.ybuf))  # the product goes to the tile: copy Y out
        data = self._segment_data(whole, parts=segments)
        data["comment"] = c_comment_text(
            f"one product for {', '.join(s.node.name for s in segments)}: [{data['m']} x {data['k']}] @ "
            f"[{data['k']} x {total}] (weights concatenated), outputs split by columns")
        if late:
            overrides = {s.y: self._full_override(s) for s in segments if s.ybuf}
            core_names = {s.node.name for s in segments}
            self.epilogue.append(self._nest(overrides, frozenset(self.members - core_names)).render(late))
        return self.k.templates.render(
            "gemm_epilogue.c.j2",
            comment=c_comment_text(f"horizontal sgemm tiles of {TILE_M}x{TILE_N}, epilogue per tile and output"),
            prologue=self.prologue, epilogue=self.epilogue, segments=[data],
            parallel=all_of(at_least(data["tiles"], 2), at_least(2 * whole.rows * total * whole.k, PARALLEL_MIN_FLOPS)),
            **self._per_thread_block(data["mb"] * data["nb"], data["pack_floats"], data["apack_floats"]))

    def render_core(self, core: Node, ybuf: str) -> str:
        """Only the product of ``core`` (with Gemm's C term) into the full buffer ``ybuf``."""
        seg = self.segment(core)
        seg.ybuf = ybuf
        if seg.c_input:
            seg.targets.append((seg.y, ybuf))
        return self._emit([seg], [], label="bias" if seg.c_input else "none")

    def _emit(self, segments: list[_Segment], late: list[tuple[str, str]], label: str = "") -> str:
        core_names = {s.node.name for s in segments}
        seg_data = [self._segment_data(s) for s in segments]
        # the tile buffer holds the largest tile actually used (up to 1.5 x TILE_M by 1.5 x TILE_N)
        tile_floats = max((d["mb"] * d["nb"] for s, d in zip(segments, seg_data) if not s.ybuf), default=0)
        pack_floats = max((d["pack_floats"] for d in seg_data), default=0, key=hint)
        apack_floats = max((d["apack_floats"] for d in seg_data), default=0)
        flops = sum(2 * s.rows * s.n * s.k * s.calls for s in segments)
        tiles = sum(d["tiles"] for d in seg_data)
        if late:
            overrides = {s.y: self._full_override(s) for s in segments if s.ybuf}
            self.epilogue.append(self._nest(overrides, frozenset(self.members - core_names)).render(late))
        ops = label or " -> ".join(self.g.node_by_name[n].op for n in self.k.group.nodes if n in self.members)
        return self.k.templates.render(
            "gemm_epilogue.c.j2",
            comment=c_comment_text(f"sgemm tiles of {TILE_M}x{TILE_N} with the epilogue per tile: {ops}"),
            prologue=self.prologue, epilogue=self.epilogue, segments=seg_data,
            parallel=all_of(at_least(tiles, 2), at_least(flops, PARALLEL_MIN_FLOPS)),
            **self._per_thread_block(tile_floats, pack_floats, apack_floats))

    def _per_thread_block(self, tile_floats: int, pack_floats: int = 0, apack_floats: int = 0) -> dict[str, int]:
        """gemm_epilogue.c.j2: each thread's block, its C tile, its B panels (whole panels of PACK_NR
        floats), then a pass of a transposed A (each 64-byte aligned)."""
        tile_floats = -(-tile_floats // 16) * 16 if hint(pack_floats) or apack_floats else tile_floats
        self.k.per_thread((tile_floats + pack_floats + apack_floats) * 4)
        return {"tile_floats": tile_floats, "pack_floats": pack_floats, "apack_floats": apack_floats}

    def _scattered(self, seg: _Segment, tensor: str) -> tuple[str, Landing] | None:
        """The tile-aligned tensor that ``tensor`` only moves (views, transposes, splits of it), whose
        elements each tile stores where they land in ``tensor``, and where they land; None when there
        is none, or when a tile's row would land across ``tensor``'s rows: stores a row apart each
        (K's gradient transposed, [32 x 64 x 64] per layer: 0.26 ms where the product and a transpose
        took 0.15) cost more than the pass after the tiles, which writes in order."""
        source = source_of(self.g, self.members, tensor, self.k.registry)
        if source == tensor or not self._aligned(seg, source):
            return None
        idx = self.y_index(seg)
        land = landing(self.g, self.members, source, tensor, idx, self.k.registry)
        if land is None or (idx and idx[-1] != "0" and not re.search(rf"\b{idx[-1]}\b", land.index[-1])):
            return None
        return source, land

    def _aligned(self, seg: _Segment, tensor: str) -> bool:
        if self.g.types[tensor].shape != self.g.types[seg.y].shape:
            return False
        if self._nest().reductions_behind(tensor):
            return False
        inl = Inliner(self.k, self.members - {seg.node.name}, self.handlers, overrides=dict(self.loads))
        inl.overrides[seg.y] = self._tile_override(seg, 1, inl)
        try:
            inl.value(tensor, self.y_index(seg), Block())
        except Misaligned:
            return False
        return True

    def _segment_data(self, seg: _Segment, parts: list[_Segment] | None = None) -> dict[str, Any]:
        """Template data of one sgemm tile loop; ``parts`` splits its columns among several cores."""
        y_shape = self.g.types[seg.y].shape
        m_rows = seg.a.shape[-2]
        m_total = seg.rows
        n, kk = seg.n, seg.k
        n_batch = seg.calls
        kc = self._choose_core(seg)
        tile_m, tile_n = self.k.group.params.get("tile_m"), self.k.group.params.get("tile_n")  # the rule's
        if not is_static(m_total):  # rows known at run time: whole tiles, the last one partial
            mb = tile_m or TILE_M
        else:
            mb = min(tile_m, m_total) if tile_m else max(1, m_total if m_total <= TILE_M * 3 // 2 else TILE_M)
        # symbolic rows: columns split as for a single row tile, so that few rows still give threads work
        row_tiles = hint(n_batch * ceil_div(m_total, mb)) if is_static(m_total) else typical(n_batch, TYPICAL_CALLS)
        width, panel = self._panel(seg)
        if tile_n:  # a packed weight is read in whole panels
            nb = min(hint(n), -(-tile_n // panel) * panel if seg.weight is not None else tile_n)
        else:
            nb = (_packed_column_block(n, row_tiles, panel) if seg.weight is not None
                  else _column_block(hint(n), row_tiles))
        tiles_m, tiles_n = ceil_div(m_total, mb), ceil_div(n, nb)
        ta, lda = self._layout(seg, "a") or (False, 1)
        tb, ldb = self._layout(seg, "b") or (False, 1)
        # which Y dimension is the batch axis d, the M axis, the N axis
        nbatch = len(seg.batch)
        m_dim = None if seg.drop_m else nbatch
        n_dim = None if seg.drop_n else nbatch + (0 if seg.drop_m else 1)
        batch_lines: list[str] = []
        row_lines: list[str] = []
        a_terms, b_terms, y_batch = str(seg.a.offset), str(seg.b.offset), "0"
        if seg.flat:
            sizes = list(seg.batch) + [m_rows]
            exprs = ix.delinear("r", sizes)
            row_lines.append("const int64_t r = m0 + mi;")
            for d, e in zip(list(range(nbatch)) + [m_dim], exprs):
                if d is not None and y_shape[d] != 1:
                    row_lines.append(f"const int64_t i{d} = {e};")
        else:
            for d, e in zip(range(nbatch), ix.delinear("b", list(seg.batch))):
                if seg.batch[d] != 1:
                    batch_lines.append(f"const int64_t i{d} = {e};")
            bvars = tuple("0" if nn == 1 else f"i{d}" for d, nn in enumerate(seg.batch))
            a_terms = ix.add(a_terms, self._batch_offset(bvars, seg.batch, seg.a))
            b_terms = ix.add(b_terms, self._batch_offset(bvars, seg.batch, seg.b))
            y_batch = ix.mul("b", m_rows * n)
            if m_dim is not None and y_shape[m_dim] != 1:
                row_lines.append(f"const int64_t i{m_dim} = m0 + mi;")
        a_ptr = f"{seg.a.ptr} + {ix.paren(ix.add(a_terms, ix.mul('m0', seg.row_stride_a)))}"
        b_ptr = f"{seg.b.ptr} + {ix.paren(ix.add(b_terms, ix.mul('n0', seg.b.strides[-1])))}"
        weight = seg.weight
        packed = weight is not None
        if weight is not None:  # tiles start on panel boundaries: column n0 of the packed weight is at n0 * K
            assert tiles_n == 1 or nb % panel == 0, (n, nb)
            b_ptr = f"{self.k.derived_constant(seg.weight_label, pack_weights(weight, width, panel))} + {ix.mul('n0', kk)}"
        elif seg.unpacked is not None:  # constant weights of several cores, side by side, for sgemm
            tb, ldb = False, n
            b_ptr = f"{self.k.derived_constant(seg.weight_label, seg.unpacked)} + n0"
        if seg.ybuf:
            c_ptr, ldc = f"{seg.ybuf} + {ix.paren(ix.add(y_batch, ix.add(ix.mul('m0', n), 'n0')))}", n
        else:
            c_ptr, ldc = "tile", nb
        split, offset = parts is not None, 0
        part_data = []
        for part in parts or [seg]:
            part_data.extend(self._part(part, ldc, n_dim, offset, split, direct=not split and bool(seg.ybuf)))
            offset += part.n
        # which row and column block tile t is: a B packed per call changes with the column block, so
        # there the row blocks follow each other (columns first, a thread repacked on nearly every tile)
        # a transposed A whose rows alias in L1 is kept in panels by each pass's first slice
        # (af_sgemm_packed_at): rows 1, 2, 3, 4 KiB apart ran 1.02, 1.07, 1.08, 1.13x faster with a
        # copy per pass, rows 1.5 KiB apart 1.02x (Xeon with AVX-512, alternating with the copy forced)
        keep_a = (ta and (packed or seg.repack) and not seg.wide and is_static(lda)
                  and int(lda) * 4 % ALIASED_ROW_BYTES == 0)
        tm, tn = ix.paren(str(tiles_m)), ix.paren(str(tiles_n))
        row_tile, col_tile = ((f"t % {tm}", f"(t / {tm}) % {tn}") if seg.repack else (f"(t / {tn}) % {tm}", f"t % {tn}"))
        return {
            "comment": c_comment_text(
                f"{seg.node.op} {seg.node.name}: {n_batch} x [{m_total} x {kk}] @ [{kk} x {n}] -> {seg.y}"),
            "tiles": n_batch * tiles_m * tiles_n, "tiles_m": tiles_m, "tiles_n": tiles_n, "mb": mb, "nb": nb,
            "m": m_total, "n": n, "k": kk, "alpha": literal(seg.alpha, DType.FLOAT32),
            "ta": "CblasTrans" if ta else "CblasNoTrans", "tb": "CblasTrans" if tb else "CblasNoTrans",
            "packed": packed, "packed_for": packed_for(width, seg.wide) if packed else "", "wide": seg.wide, "k_pass": kc, "a_rs": 1 if ta else lda, "a_ps": lda if ta else 1,
            "lda": lda, "ldb": ldb, "ldc": ldc, "a_ptr": a_ptr, "b_ptr": b_ptr, "c_ptr": c_ptr,
            "batch_lines": batch_lines, "row_lines": row_lines, "parts": part_data,
            "repack": seg.repack, "b_rs": seg.b.strides[-2], "b_cs": seg.b.strides[-1],
            "pack_floats": kk * -(-nb // PACK_NR) * PACK_NR if seg.repack else 0,
            "apack": keep_a, "apack_floats": (k_pass(hint(kk), kc) + 16) * mb if keep_a else 0,  # (af_sgemm_packed_at)
            "row_tile": row_tile, "col_tile": col_tile,
            "pack_key": ix.add(ix.mul("b", tiles_n), col_tile if not is_static(tiles_n) or tiles_n > 1 else "0"),
        }

    def _choose_core(self, seg: _Segment) -> int:
        """Ask the chooser how to compute the product (codegen/cores.py); K per pass when packed.
        A constant weight left to sgemm stays unpacked (concatenated when several cores share A)."""
        repackable = (seg.weight is None and not seg.drop_n and typical(seg.n, TYPICAL_ROWS) >= PACKED_MIN_COLUMNS
                      and not self._small_rows(seg))
        ta, _ = self._layout(seg, "a") or (False, 0)
        tb, _ = self._layout(seg, "b") or (False, 0)
        # chosen for a typical call when the sizes are symbolic (sizes.typical)
        spec = CoreSpec("gemm", typical(seg.rows, TYPICAL_ROWS), typical(seg.n, TYPICAL_ROWS),
                        typical(seg.k, TYPICAL_ROWS), packable=seg.weight is not None,
                        calls=typical(seg.calls, TYPICAL_CALLS),
                        repackable=repackable, a_transposed=ta, b_transposed=tb and seg.weight is None)
        choice = self.k.core(spec)
        seg.repack = choice.impl == "repack"
        seg.wide = choice.wide
        if choice.packed or seg.weight is None:
            return choice.kc
        if seg.merged:  # several weights: B is their concatenation, not one buffer
            seg.unpacked, seg.weight_label = np.ascontiguousarray(seg.weight), "weights_cat"
        seg.weight = None
        return 0

    def _panel(self, seg: _Segment) -> tuple[int, int]:
        """(slice width, panel width) of the packed weight ``seg`` reads."""
        wide = self.k.chooser.machine.wide_kernel
        if seg.wide and wide is not None:
            return wide[1], wide[1]
        return slice_cols(self.k), PACK_NR

    def _small_rows(self, seg: _Segment) -> bool:
        """Whether af_sgemm runs the product on its small-row kernel, which reads B once in place:
        packing B would cost about as much as the product."""
        ta, _ = self._layout(seg, "a") or (True, 0)
        tb, _ = self._layout(seg, "b") or (True, 0)
        return typical(seg.rows, TYPICAL_ROWS) <= SMALL_ROWS and not ta and not tb

    def _part(self, seg: _Segment, ldc: int, n_dim: int | None, offset: int, clamp: bool,
              direct: bool) -> list[dict[str, object]]:
        """Each output ``seg`` scatters, on the columns that land in it, then its epilogue on columns
        [offset, offset + N) of the tile (``clamp``: the tile's columns are cut to them)."""
        y_shape = self.g.types[seg.y].shape
        inl = Inliner(self.k, self.members - {seg.node.name}, self.handlers, overrides=dict(self.loads))
        inl.overrides[seg.y] = self._tile_override(seg, ldc, inl)
        main = Block()
        idx = self.y_index(seg)
        for t, dest in seg.targets:
            if direct and t == seg.y and not seg.c_input and dest == seg.ybuf:
                continue  # the sgemm already wrote it
            v = inl.value(t, idx, main)
            main.emit(f"{dest}[{ix.linear(idx, y_shape)}] = {v};")
        col = ix.sub("n0 + ni", offset) if offset else "n0 + ni"
        col_lines = [f"const int64_t i{n_dim} = {col};"] if n_dim is not None and y_shape[n_dim] != 1 else []
        # the scattered outputs go first: the epilogue may write Y into the tile's own memory (a
        # Gemm's C added in place where the full product is kept), which they would read again
        parts: list[dict[str, object]] = []
        for t, dest, source, land in seg.scatters:  # (landing at y_index(seg): idx)
            # a cut of the columns (a Split of the product's last axis) narrows the loop; others are tests
            lo, hi = offset, offset + seg.n
            tests: list[str] = []
            for cut in land.cuts:
                if n_dim is not None and cut.expr == f"i{n_dim}":
                    lo, hi = max(lo, offset + cut.lo), min(hi, offset + cut.hi)
                else:
                    tests.extend(cut.conditions())
            if lo >= hi:
                continue
            body = Block()
            store = f"{dest}[{ix.linear(land.index, self.g.types[t].shape)}] = {inl.value(source, idx, body)};"
            if tests:
                inner = body.child()
                inner.emit(store)
                body.nest(f"if ({' && '.join(tests)}) {{", inner)
            else:
                body.emit(store)
            parts.append({"lo": lo, "hi": hi, "clamp": True, "col_lines": col_lines, "body": body.lines})
        parts.append({"lo": offset, "hi": offset + seg.n, "clamp": clamp, "col_lines": col_lines, "body": main.lines})
        return parts

    @staticmethod
    def _batch_offset(bvars: Index, batch: tuple[int, ...], view: StridedView) -> str:
        lead = len(batch) - (len(view.shape) - 2)
        out = "0"
        for d in range(len(batch)):
            vd = d - lead
            if vd >= 0 and view.shape[vd] != 1:
                out = ix.add(out, ix.mul(bvars[d], view.strides[vd]))
        return out


def render_gemm(k: KernelContext, nodes: list[Node], core: Node) -> str:
    """Body of a ``gemm_epilogue`` group around ``core`` (MatMul or Gemm)."""
    gm = _Gemm(k, nodes, [core])
    return gm.render([gm.segment(core)])


def render_horizontal(k: KernelContext, nodes: list[Node]) -> str:
    """Body of a ``horizontal_gemm`` group: MatMuls sharing input A, weights concatenated once."""
    cores = [n for n in nodes if n.op in ("MatMul", "Gemm")]
    if not cores:
        raise k.error("template 'horizontal_gemm' needs MatMul or Gemm nodes")
    shared = {n.inputs[0] for n in cores}
    if len(shared) != 1 or any(n.op == "Gemm" and n.attr("transA", 0) for n in cores):
        raise k.error("template 'horizontal_gemm' needs MatMuls that share their first input "
                      f"(got {sorted(shared)})")
    gm = _Gemm(k, nodes, cores)
    return gm.render([gm.segment(n) for n in cores])  # constant weights: packed side by side, one product


def _constant_weight(k: KernelContext, node: Node) -> np.ndarray | None:
    """The [K, N] weight of a MatMul/Gemm when it is a 2-D constant (transposed for transB)."""
    w = k.graph.const_value(node.inputs[1])
    if w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    return w.T if node.op == "Gemm" and node.attr("transB", 0) else w
