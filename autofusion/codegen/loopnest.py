"""The loop-nest engine behind the pointwise, reduction and multi-output templates.

Given the nodes of a group and the tensors to write, it emits:

1. one *stage* per reduction the targets depend on (topological order): a loop over rows, in
   parallel, that runs the reduction's passes over the row (the prologue inlined per element, kept
   in a per-thread row buffer when it is not a plain load), then writes every target that lines
   up with the row: outputs of the input's shape (the epilogue: normalised values, residual adds,
   the prologue's values when they are materialised) and outputs of the reduced shape. A
   reduction over the same rows as the one before it, independent of it, rides in that stage's
   pass (a LayerNorm gradient's two means: each row read once);
2. one plain loop nest per shape for the remaining targets, several outputs of one shape sharing
   one nest and its common subexpressions (multi-output fusion).

A reduction read away from its own row (through a transpose, say) is taken from per-row
statistics kept in scratch memory, so every placement of targets is correct; the aligned one is
merely the fast one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autofusion.codegen import index as ix
from autofusion.codegen.index import Index
from autofusion.codegen.inliner import Block, Handler, Inliner, Misaligned, Override
from autofusion.codegen.kernel_context import KernelContext
from autofusion.codegen.names import c_comment_text
from autofusion.codegen.op_layout import SELECT_SOURCE
from autofusion.codegen.reductions import (
    REDUCTION_OPS,
    OutputArgs,
    ReductionSpec,
    Stat,
    is_identity_reduce,
    reduction_spec,
)
from autofusion.codegen.sizes import all_of, at_least, hint, per_chunk
from autofusion.graph.dims import Dim
from autofusion.graph.graph import Node
from autofusion.ops.registry import OpClass, OpRegistry

PARALLEL_MIN_ELEMENTS = 1 << 15  # below this a loop nest runs on one thread (fork/join costs more)
COLUMN_BLOCK = 256  # rows reduced side by side (their accumulators stay in L1)
COLUMN_MIN_ROWS = 16  # fewer rows side by side would not fill a vector
SHARED_MIN_ROWS = 16  # a stage of fewer rows leaves the prologue's outputs to a plain nest, in parallel
CHUNKS_PER_LOOP = 32  # dynamic scheduling in this many chunks: a descheduled thread holds up little
MERGED_MIN_INNER = 256  # trailing dimensions are run as one loop until it is this long
CHANNEL_INDEXED = frozenset({"BatchNormalization"})  # pointwise, but reads its parameters at index 1, not broadcast


def chunk(iterations: Dim) -> int | str:
    """Iterations per dynamically scheduled chunk of a parallel loop (a C expression when symbolic)."""
    return per_chunk(iterations, CHUNKS_PER_LOOP)
_NO_STAGE = 1 << 30


def op_handlers(registry: OpRegistry | None = None) -> Mapping[str, Handler]:
    """Every op the loop-nest engine computes elementwise, by op name: the built-in handlers, and
    the ops of ``registry`` that spell their own C (plugin ops)."""
    from autofusion.codegen import op_layout, op_math, op_window

    table: dict[str, Handler] = {}
    table.update(op_math.handlers())
    table.update(op_layout.handlers())
    table.update(op_window.handlers())
    for opdef in registry or ():
        c = opdef.spelling.get("c")
        if c and opdef.name not in table:
            table[opdef.name] = op_math.spelled_handler(opdef.name, c)
    return table


def _identity(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    return inl.value(node.inputs[0], idx, block)


def loop_vars(shape: Sequence[int]) -> Index:
    """Loop variables ``i<d>`` of a shape; size-1 dimensions are the constant 0."""
    return tuple("0" if n == 1 else f"i{d}" for d, n in enumerate(shape))


@dataclass
class _Stage:
    k: int
    spec: ReductionSpec
    xrow: bool = False
    store: bool = False
    stat_offsets: dict[str, int] = field(default_factory=dict)
    full: list[tuple[str, str]] = field(default_factory=list)  # (tensor, destination pointer)
    reduced: list[tuple[str, str]] = field(default_factory=list)
    riders: list[_Stage] = field(default_factory=list)  # sibling stages computed in this one's pass
    host: _Stage | None = None  # the stage whose pass computes this one (_join_siblings)

    @property
    def prefix(self) -> str:
        return f"s{self.k}_"


class LoopNest:
    """Renders loop nests computing ``targets`` of a group; see the module docstring."""

    def __init__(self, k: KernelContext, members: frozenset[str], overrides: Mapping[str, Override] | None = None,
                 handlers: Mapping[str, Handler] | None = None) -> None:
        self.k = k
        self.inl = Inliner(k, members, handlers or op_handlers(k.registry), overrides=dict(overrides or {}))
        self._deps: dict[str, frozenset[str]] = {}
        self.stages: list[_Stage] = []
        self._stage_of: dict[str, _Stage] = {}
        self._current_stage = _NO_STAGE  # stages before this one have complete statistics

    # -- analysis ---------------------------------------------------------------------------------

    def _is_reduction(self, node: Node) -> bool:
        return node.op in REDUCTION_OPS and not is_identity_reduce(self.k.graph, node)

    def reductions_behind(self, tensor: str) -> frozenset[str]:
        """Reduction nodes of the group that ``tensor`` depends on."""
        hit = self._deps.get(tensor)
        if hit is not None:
            return hit
        out: set[str] = set()
        if tensor not in self.inl.overrides and self.inl.computed_here(tensor):
            node = self.k.producer(tensor)
            assert node is not None
            if self._is_reduction(node):
                out.add(node.name)
            for t in node.inputs:
                if t:
                    out |= self.reductions_behind(t)
        self._deps[tensor] = frozenset(out)
        return self._deps[tensor]

    # -- entry point ------------------------------------------------------------------------------

    def render(self, targets: Sequence[tuple[str, str]]) -> str:
        """C statements writing each ``(tensor, destination pointer)`` of ``targets``."""
        for node in self.k.graph.nodes:
            if node.name in self.inl.members and self._is_reduction(node):
                if any(node.name in self.reductions_behind(t) for t, _ in targets):
                    self._add_stage(node)
        for stage in self.stages:  # identity reduces and all others are computed elementwise
            self.inl.node_handlers[stage.spec.node.name] = self._buffer_handler(stage)
        for node in self.k.graph.nodes:
            if node.name in self.inl.members and node.op in REDUCTION_OPS and node.name not in self._stage_of:
                if is_identity_reduce(self.k.graph, node):
                    self.inl.node_handlers[node.name] = _identity
        generic: list[tuple[str, str]] = []
        for tensor, dest in targets:
            if not self._assign_to_stage(tensor, dest):
                generic.append((tensor, dest))
        # generate everything first: later code decides whether a stage must store its statistics;
        # a target written by an earlier stage is loaded, not recomputed, by the code after it
        self._join_siblings()
        stage_parts: list[dict[str, Any]] = [{} for _ in self.stages]
        for stage in self.stages:
            if stage.host is not None:
                continue
            members = [stage, *stage.riders]
            for member in members:
                stage_parts[member.k] = self._generate_stage(member)
            # (after the riders: their pass runs before the host's outputs are written)
            for member in members:
                for tensor, dest in member.full + member.reduced:
                    self.inl.overrides.setdefault(tensor, self._load_override(tensor, dest))
        by_shape: dict[tuple[int, ...], list[tuple[str, str]]] = {}
        for tensor, dest in generic:
            by_shape.setdefault(self.k.type(tensor).shape, []).append((tensor, dest))
        nests = [self._render_nest(shape, outs) for shape, outs in by_shape.items()]
        stages = [self._finish_stage(s, parts, stage_parts) for s, parts in zip(self.stages, stage_parts)
                  if s.host is None]
        return "\n".join(stages + nests)

    def _load_override(self, tensor: str, dest: str) -> Override:
        shape = self.k.type(tensor).shape
        return lambda idx, block: f"{dest}[{ix.linear(idx, shape)}]"

    # -- stages -----------------------------------------------------------------------------------

    def _add_stage(self, node: Node) -> None:
        stage = _Stage(len(self.stages), reduction_spec(self.k.graph, node, f"s{len(self.stages)}_"))
        self._decide_row_buffer(stage)
        self.stages.append(stage)
        self._stage_of[node.name] = stage

    def _decide_row_buffer(self, stage: _Stage) -> None:
        """Keep the row of X in a buffer when X is computed (not a plain load) and read again."""
        x = stage.spec.x
        stage.xrow = self.inl.computed_here(x) and x not in self.inl.overrides and (
            len(stage.spec.passes) > 1 or any(lay == "full" for lay in stage.spec.layouts))

    def _x_index(self, stage: _Stage) -> Index:
        return loop_vars(stage.spec.x_shape)

    def _row_matches(self, stage: _Stage, dims: Mapping[int, str]) -> bool:
        spec = stage.spec
        return all(spec.x_shape[d] == 1 or dims.get(d) == f"i{d}" for d in spec.row_dims)

    def _row_linear(self, stage: _Stage, dims: Mapping[int, str]) -> str:
        spec = stage.spec
        return ix.linear(tuple(dims[d] for d in spec.row_dims), [spec.x_shape[d] for d in spec.row_dims])

    def _inner_linear(self, stage: _Stage, dims: Mapping[int, str]) -> str:
        spec = stage.spec
        return ix.linear(tuple(dims.get(d, "0") for d in spec.axes), [spec.x_shape[d] for d in spec.axes])

    def _output_expr(self, stage: _Stage, pos: int, idx: Index, stats: Mapping[str, str], block: Block,
                     in_row: bool = False) -> str:
        spec = stage.spec
        dims = spec.x_dims_of_output(pos, idx)
        x_idx = tuple(dims.get(d, "0") for d in range(len(spec.x_shape)))
        node = spec.node

        def x_value() -> str:
            return self.inl.value(spec.x, x_idx, block)

        def input_value(i: int, at: Index) -> str:
            return self.inl.value(node.inputs[i], at, block)

        row = spec.row_buffer if in_row else None
        return spec.output(OutputArgs(pos, idx, x_value, self._inner_linear(stage, dims), stats, input_value, row))

    def _buffer_handler(self, stage: _Stage) -> Handler:
        def handle(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
            if stage.k >= self._current_stage:
                raise Misaligned(node.name)  # its statistics are not complete yet
            stage.store = True
            dims = stage.spec.x_dims_of_output(pos, idx)
            row = self._row_linear(stage, dims)
            stats = {}
            for st in stage.spec.stats:
                off = self._stat_offset(stage, st)
                var = self.k.fresh()
                block.emit(f"const {st.ctype} {var} = (({st.ctype}*)(scratch + {off}))[{row}];")
                stats[st.var] = var
            return self._output_expr(stage, pos, idx, stats, block)

        return handle

    def _stat_offset(self, stage: _Stage, st: Stat) -> int:
        if st.var not in stage.stat_offsets:
            stage.stat_offsets[st.var] = self.k.scratch(st.size * stage.spec.rows)
        return stage.stat_offsets[st.var]

    def _aligned_handler(self, stage: _Stage) -> Handler:
        def handle(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
            dims = stage.spec.x_dims_of_output(pos, idx)
            if not self._row_matches(stage, dims):
                raise Misaligned(node.name)
            return self._output_expr(stage, pos, idx, {s.var: s.var for s in stage.spec.stats}, block, in_row=True)

        return handle

    def _xrow_override(self, stage: _Stage) -> Override:
        def override(idx: Index, block: Block) -> str:
            dims = dict(enumerate(idx))
            if not self._row_matches(stage, dims):
                return self.inl.compute_default(stage.spec.x, idx, block)
            return f"{stage.prefix}xrow[{self._inner_linear(stage, dims)}]"

        return override

    def _in_stage(self, stage: _Stage) -> tuple[dict[str, Handler], dict[str, Override]]:
        """Install the aligned handlers of ``stage``; returns what to restore."""
        saved_h, saved_o = dict(self.inl.node_handlers), dict(self.inl.overrides)
        self._current_stage = stage.k
        self.inl.node_handlers[stage.spec.node.name] = self._aligned_handler(stage)
        if stage.xrow:
            self.inl.overrides[stage.spec.x] = self._xrow_override(stage)
        return saved_h, saved_o

    def _leave_stage(self, saved: tuple[dict[str, Handler], dict[str, Override]]) -> None:
        self.inl.node_handlers, self.inl.overrides = saved
        self._current_stage = _NO_STAGE

    def _layout_of(self, stage: _Stage, tensor: str) -> str | None:
        shape = self.k.type(tensor).shape
        spec = stage.spec
        if shape == spec.x_shape:
            return "full"
        keep = tuple(1 if d in spec.axes else n for d, n in enumerate(spec.x_shape))
        if shape == keep:
            return "keep"
        if shape == tuple(spec.x_shape[d] for d in spec.row_dims):
            return "drop"
        return None

    def _target_index(self, stage: _Stage, layout: str) -> Index:
        full = self._x_index(stage)
        if layout == "full":
            return full
        if layout == "keep":
            return tuple("0" if d in stage.spec.axes else e for d, e in enumerate(full))
        return tuple(full[d] for d in stage.spec.row_dims)

    def _assign_to_stage(self, tensor: str, dest: str) -> bool:
        behind = self.reductions_behind(tensor)
        if behind:
            candidates = [max((self._stage_of[n] for n in behind), key=lambda s: s.k)]
        else:  # X itself, else any value of X's shape the rows' loop can write while they are in cache
            candidates = sorted(self.stages, key=lambda s: s.spec.x != tensor)
            # (not a loop of few rows, a loss's sum over everything: the threads share a plain nest better)
            candidates = [s for s in candidates if s.spec.x == tensor or (
                self._layout_of(s, tensor) == "full" and hint(s.spec.rows) >= SHARED_MIN_ROWS)]
        return any(self._assigned(stage, tensor, dest) for stage in candidates)

    def _assigned(self, stage: _Stage, tensor: str, dest: str) -> bool:
        """Whether ``stage``'s row loop can write ``tensor`` (it lines up with the rows); if so it does."""
        layout = self._layout_of(stage, tensor)
        if layout is None:
            return False
        saved = self._in_stage(stage)
        try:
            self.inl.value(tensor, self._target_index(stage, layout), Block())
        except Misaligned:
            return False
        finally:
            self._leave_stage(saved)
        (stage.full if layout == "full" else stage.reduced).append((tensor, dest))
        return True

    def _generate_stage(self, stage: _Stage) -> dict[str, object]:
        spec = stage.spec
        self._decide_row_buffer(stage)
        x_idx = self._x_index(stage)
        xct = self.k.ctype_of(spec.x)
        saved = self._in_stage(stage)
        try:
            row_block = Block()
            passes = []
            for p, ps in enumerate(spec.passes):
                body = row_block.child()
                if p == 0 or not stage.xrow:
                    if stage.xrow:
                        del self.inl.overrides[spec.x]
                    x = self.inl.value(spec.x, x_idx, body)
                    if stage.xrow:
                        self.inl.overrides[spec.x] = self._xrow_override(stage)
                        body.emit(f"{stage.prefix}xrow[j] = {x};")
                        for tensor, dest in stage.full:  # X written as it is computed, in one stream
                            if tensor == spec.x:
                                body.emit(f"{dest}[{ix.linear(x_idx, spec.x_shape)}] = {x};")
                else:
                    x = f"{stage.prefix}xrow[j]"
                updates = [a.update.replace("{x}", x).replace("{j}", "j") for a in ps.accs if a.update]
                simd = [a for a in ps.accs if a.simd]
                clause = (f"reduction({simd[0].simd}:{simd[0].var})"
                          if len(simd) == 1 and len(ps.accs) == 1 and not _has_branches(body.lines) else None)
                passes.append({
                    "init": [f"{a.ctype} {a.var} = {a.init};" for a in ps.accs],
                    "body": body.lines + updates,
                    "simd": clause,
                    "after": list(ps.after),
                    "accs": [(a.ctype, a.var) for a in ps.accs],
                })
            reduced = row_block.child()
            for tensor, dest in stage.reduced:
                idx = self._target_index(stage, self._layout_of(stage, tensor) or "keep")
                v = self.inl.value(tensor, idx, reduced)
                reduced.emit(f"{dest}[{ix.linear(idx, self.k.type(tensor).shape)}] = {v};")
            full = row_block.child()
            for tensor, dest in stage.full:
                if stage.xrow and tensor == spec.x:
                    continue  # stored by the first pass
                v = self.inl.value(tensor, x_idx, full)
                full.emit(f"{dest}[{ix.linear(x_idx, spec.x_shape)}] = {v};")
        finally:
            self._leave_stage(saved)
        row_dims = [d for d in spec.row_dims if spec.x_shape[d] != 1]
        row_sizes = [spec.x_shape[d] for d in spec.row_dims]
        row_exprs = ix.delinear("row", row_sizes)
        inner_dims = [d for d in spec.axes if spec.x_shape[d] != 1]
        merged = self._run_as_one(stage, inner_dims)
        inner_exprs = ix.delinear("j", [spec.x_shape[d] for d in spec.axes])
        comment = (f"stage {stage.k}: {spec.node.op} {spec.node.name} over axes {list(spec.axes)} of "
                   f"{spec.x} {list(spec.x_shape)}: {spec.rows} rows x {spec.length}")
        columns = self._column_block(stage, passes)
        if columns:
            comment += f", {columns} rows side by side (the reduced axes lead: rows are contiguous)"
        return dict(
            columns=columns,
            comment=c_comment_text(comment),
            rows=spec.rows,
            length=spec.length,
            parallel=all_of(at_least(spec.rows, 2), at_least(spec.rows * spec.length, PARALLEL_MIN_ELEMENTS // 4)),
            chunk=chunk(spec.rows),
            xrow=self._per_thread_row(stage, spec.length),
            xct=xct,
            erow=self._per_thread_buffer(stage, spec.length),
            prefix=stage.prefix,
            row_lines=[f"const int64_t i{d} = {e};" for d, e in zip(spec.row_dims, row_exprs) if d in row_dims],
            # rows side by side over several kept axes: their indices found once per row block, not
            # by a division per element
            row_table=[(f"i{d}", e) for d, e in zip(spec.row_dims, row_exprs) if d in row_dims]
            if any("/" in e or "%" in e for e in row_exprs) else [],
            inner_lines=[f"const int64_t i{d} = {e};" for d, e in zip(spec.axes, inner_exprs) if d in inner_dims],
            # several reduced axes: one loop each, so that no element pays a division to find its index
            nest=self._reduced_nest(spec.x_shape, inner_dims, merged),
            nest_fixed=[f"const int64_t i{d} = 0; (void)i{d};" for d in merged[:-1]],
            nest_j=ix.linear(tuple(f"i{d}" if d in inner_dims else "0" for d in spec.axes),
                             tuple(spec.x_shape[d] for d in spec.axes)),
            passes=passes,
            reduced=reduced.lines,
            full=full.lines,
        )

    @staticmethod
    def _reduced_nest(shape: tuple[Dim, ...], inner_dims: Sequence[int], merged: Sequence[int]) -> list[tuple[str, Dim]]:
        """The loops over a row's elements, one per reduced axis (none for a single axis: ``j`` is
        the index), the trailing ones in ``merged`` (:meth:`_run_as_one`) as one loop."""
        if len(inner_dims) < 2:
            return []
        loops = [(f"i{d}", shape[d]) for d in inner_dims if d not in merged]  # symbolic sizes stay symbolic
        return loops + ([(f"i{merged[-1]}", math.prod(int(shape[d]) for d in merged))] if merged else [])

    def _run_as_one(self, stage: _Stage, inner_dims: Sequence[int]) -> list[int]:
        """Trailing reduced axes (of more than size 1) that one loop walks in order, the others of
        them held at 0: where every value the row's loops read takes them whole or not at all. A
        BatchNorm gradient's sums over N, H and W of [16, 32, 32, 32] reduced each 32-element run
        on its own, its four accumulators summed across the vector every 32 elements (0.39 ms)."""
        shape, axes = stage.spec.x_shape, set(stage.spec.axes)
        rank = len(shape)
        if not all(isinstance(n, int) for n in shape) or rank - 1 not in axes:
            return []
        first = rank - 1
        while first > 0 and first - 1 in axes:
            first -= 1
        family = [stage, *stage.riders]
        reads = self._elementwise_reads([s.spec.x for s in family] + [t for s in family for t, _ in s.full],
                                        statistics=True)
        if reads is None:
            return []
        while first < rank - 1 and not all(_whole_or_none(self.k.type(t).shape, shape, first) for t in reads):
            first += 1
        merged = [d for d in inner_dims if d >= first]
        return merged if len(merged) > 1 else []

    def _column_block(self, stage: _Stage, passes: Sequence[object]) -> int:
        """Rows reduced side by side, when the reduced axes all precede the kept ones (a bias
        gradient: a sum over the batch rows of [M, N]). A row is then a column of X: reduced
        one at a time it reads X at a stride of N (2 GB/s here); side by side, each step of the
        reduction reads a contiguous run of rows. 0 where a row must be reduced alone (several
        passes, a copy of the row, outputs of X's shape that need the row's statistics)."""
        spec = stage.spec
        if (len(passes) != 1 or stage.xrow or hint(spec.rows) < COLUMN_MIN_ROWS or max(spec.axes) > min(spec.row_dims)
                or any(spec.node.name in self.reductions_behind(t) for t, _ in stage.full)):
            return 0
        block = hint(spec.rows) // 8 // 16 * 16  # eight blocks or more for the threads to share
        return max(16, min(COLUMN_BLOCK, block))

    def _per_thread_row(self, stage: _Stage, length: int) -> bool:
        if stage.xrow:  # reduction_stage.c.j2: each thread's copy of the row it reduces
            self.k.per_thread(length * self.k.type(stage.spec.x).dtype.itemsize)
        return stage.xrow

    def _per_thread_buffer(self, stage: _Stage, length: int) -> str:
        """The spec's row buffer (reduction_stage.c.j2: after the row copy in the thread's block)."""
        if stage.spec.row_buffer:  # (the one block holds both rows)
            self.k.per_thread((2 if stage.xrow else 1) * length * self.k.type(stage.spec.x).dtype.itemsize)
        return stage.spec.row_buffer

    def _finish_stage(self, stage: _Stage, parts: Mapping[str, Any], all_parts: Sequence[Mapping[str, Any]]) -> str:
        stores = []
        for member in (stage, *stage.riders):
            if member.store:
                for st in member.spec.stats:
                    stores.append(f"(({st.ctype}*)(scratch + {self._stat_offset(member, st)}))[row] = {st.var};")
        if stage.riders:
            parts = _joined(parts, [all_parts[r.k] for r in stage.riders],
                            [f"{r.spec.node.op} {r.spec.node.name}" for r in stage.riders])
        return self.k.templates.render("reduction_stage.c.j2", stores=stores, **parts)

    def _join_siblings(self) -> None:
        """A stage is computed in the pass of the stage before it where both reduce the same axes of
        rows of one shape in one pass, neither reads the other's result, and neither keeps a copy
        of its row: the rows are read once for both (a LayerNorm gradient's two means over each
        row). Its outputs follow the host's, after the host's statistics are stored, so they may
        read those."""
        for stage in self.stages[1:]:
            host = self.stages[stage.k - 1]
            host = host.host or host
            a, b = host.spec, stage.spec
            columns = self._column_block(stage, b.passes)
            if (a.x_shape != b.x_shape or a.axes != b.axes or len(a.passes) != 1 or len(b.passes) != 1
                    or host.xrow or stage.xrow or a.row_buffer or b.row_buffer
                    or any(m.spec.node.name in self.reductions_behind(b.x) for m in (host, *host.riders))
                    or columns != self._column_block(host, a.passes)
                    or (columns and any(m.full for m in (host, *host.riders, stage)))):
                continue
            host.riders.append(stage)
            stage.host = host

    # -- plain nests ------------------------------------------------------------------------------

    def _render_nest(self, shape: tuple[int, ...], outs: list[tuple[str, str]]) -> str:
        loops = self._merged_loops(shape, outs)
        idx = loop_vars(loops)
        body = Block()
        for tensor, dest in outs:
            v = self.inl.value(tensor, idx, body)
            body.emit(f"{dest}[{ix.linear(idx, shape)}] = {v};")
        loop_dims = [d for d, n in enumerate(loops) if n != 1]
        numel = math.prod(shape)
        outer_dims = loop_dims[:-1]
        inner: list[int | None] = list(loop_dims[-1:]) or [None]
        outer_sizes = [loops[d] for d in outer_dims]
        outer_exprs = ix.delinear("o", outer_sizes) if outer_dims else ()
        names = ", ".join(t for t, _ in outs)
        return self.k.templates.render(
            "loop_nest.c.j2",
            comment=c_comment_text(f"{names}: {list(shape)}"),
            parallel=at_least(numel, PARALLEL_MIN_ELEMENTS),
            outer=math.prod(outer_sizes) if outer_dims else None,
            outer_lines=[f"const int64_t i{d} = {e};" for d, e in zip(outer_dims, outer_exprs)],
            inner_var=f"i{inner[0]}" if inner[0] is not None else None,
            inner=loops[inner[0]] if inner[0] is not None else 1,
            chunk=chunk(math.prod(outer_sizes) if outer_dims else loops[inner[0]] if inner[0] is not None else 1),
            # GCC 12 unrolls an inner loop of 8 or 16 iterations completely and then leaves it scalar
            # (a ReLU backward over [16, 64, 16, 16]: 3.8x slower on one thread); a branchy body or a
            # kernel that selects its source per index (compiled without if-conversion) is left to it
            simd=not _has_branches(body.lines) and not any(SELECT_SOURCE in line for line in body.lines),
            body=body.lines,
        )

    def _merged_loops(self, shape: tuple[int, ...], outs: list[tuple[str, str]]) -> tuple[int, ...]:
        """The nest's loop sizes: ``shape`` with its trailing dimensions run as one loop (the others
        of them 1) where every tensor the nest reads through elementwise ops alone takes them whole
        or not at all, so that one index walks them in order for every operand. A [16, 64, 16, 16]
        ReLU backward of a per-channel gradient ran 16-iteration inner loops at 0.6x the speed of
        256-iteration ones (C harness, Zen 3)."""
        # (the merged index runs on the last dimension: of size 1 it would read as a broadcast one)
        if (self.stages or self.inl.overrides or len(shape) < 2 or not all(isinstance(n, int) for n in shape)
                or not 1 < shape[-1] < MERGED_MIN_INNER):
            return shape
        tensors = self._elementwise_reads([t for t, _ in outs])
        if tensors is None:
            return shape
        first = len(shape) - 1
        while first > 0 and math.prod(shape[first:]) < MERGED_MIN_INNER and all(
                _whole_or_none(self.k.type(t).shape, shape, first - 1) for t in tensors):
            first -= 1
        if first == len(shape) - 1:
            return shape
        return (*shape[:first], *(1 for _ in shape[first:-1]), math.prod(shape[first:]))

    def _elementwise_reads(self, tensors: Sequence[str], statistics: bool = False) -> set[str] | None:
        """Every tensor computed or read on the way to ``tensors``, when all of it is computed by
        pointwise ops and Expand (which read their inputs at the output's index, broadcast), and with
        ``statistics``, reductions (a row loop reads their results at the row's index); else None."""
        seen: set[str] = set()
        todo = list(tensors)
        while todo:
            tensor = todo.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            if not self.inl.computed_here(tensor):
                continue
            node = self.k.producer(tensor)
            assert node is not None
            if statistics and self.k.registry[node.op].op_class is OpClass.REDUCTION:
                continue
            expand = node.op == "Expand"
            if node.op in CHANNEL_INDEXED or (not expand and self.k.registry[node.op].op_class is not OpClass.POINTWISE):
                return None
            todo.extend(t for t in (node.inputs[:1] if expand else node.inputs) if t)
        return seen


def _joined(host: Mapping[str, Any], riders: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Template data of a stage with its riders' pass folded into its own: one loop over each row
    updating every accumulator, then every statistic, then the outputs of all."""
    first = dict(host["passes"][0])
    clauses = [first["simd"]] + [r["passes"][0]["simd"] for r in riders]
    for r in riders:
        for key in ("init", "body", "after", "accs"):
            first[key] = [*first[key], *r["passes"][0][key]]
    first["simd"] = " ".join(clauses) if all(clauses) else None  # each accumulator's own clause, or none
    return {**host, "passes": [first],
            "reduced": [*host["reduced"], *(line for r in riders for line in r["reduced"])],
            "full": [*host["full"], *(line for r in riders for line in r["full"])],
            "comment": c_comment_text(f"{host['comment']}; in the same pass: {', '.join(names)}")}


def _whole_or_none(tensor_shape: tuple[int, ...], shape: tuple[int, ...], first: int) -> bool:
    """Whether a tensor broadcast to ``shape`` has, from dimension ``first`` on, every dimension whole
    or every one of size 1 (right-aligned, as broadcasting reads it)."""
    lead = len(shape) - len(tensor_shape)
    sizes = [tensor_shape[d - lead] if d >= lead else 1 for d in range(first, len(shape))]
    return sizes == list(shape[first:]) or all(n == 1 for n in sizes)


def _has_branches(lines: Sequence[str]) -> bool:
    return any(line.lstrip().startswith(("if", "}", "for")) for line in lines)
