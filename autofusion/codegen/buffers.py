"""The buffer planner: where every tensor of a plan lives while the SuperKernel runs.

Graph inputs and outputs live in the caller's arrays and constants in the context; a view group's
output aliases its input's buffer. Every other materialised tensor, and each group's scratch, gets
an offset in one workspace: live ranges are measured in group steps (from the producing group to
the last group reading it or any view of it) and offsets are chosen greedily, largest tensor first,
in the smallest gap that fits among the tensors whose live ranges overlap (best fit). The peak of
the workspace is the plan's activation memory.

>>> # plan_buffers(plan, scratch={"k0_matmul_add": 0}).workspace_bytes
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autofusion.decide.plan import Plan
from autofusion.graph.graph import FrozenMap

ALIGN = 64  # a cache line: every buffer, scratch block and build-time constant starts on one


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """An uninitialised byte buffer whose data pointer is ``align``-aligned."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    shift = (-raw.ctypes.data) % align
    return raw[shift:shift + nbytes]


def cache_line_aligned(array: np.ndarray) -> np.ndarray:
    """``array``, C-contiguous, with its data on a cache line (a copy when it is not): a packed
    weight at numpy's 16-byte offset has each 64-byte slice row straddle two lines (8 x 3072 @
    3072 x 768 streamed from L3, 2 threads, Zen 3: 0.645 against 0.535 ms in the model)."""
    if array.flags.c_contiguous and array.ctypes.data % ALIGN == 0:
        return array
    out = aligned_empty(array.nbytes).view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


@dataclass(frozen=True)
class Placement:
    """Where one tensor lives: ``kind`` is input, output, const, workspace or alias."""

    tensor: str
    kind: str
    index: int = 0  # input/output/const position, or workspace byte offset
    base: str = ""  # for an alias: the tensor whose buffer it shares
    nbytes: int = 0


@dataclass(frozen=True)
class Interval:
    """A workspace block: ``nbytes`` live from group step ``start`` to ``end`` (inclusive)."""

    name: str
    nbytes: Any  # an int, or an expression of symbolic sizes (blocks placed at run time)
    start: int
    end: int


@dataclass(frozen=True)
class BufferPlan:
    """Every tensor's placement, each group's scratch offset, and the workspace size (peak)."""

    placements: FrozenMap[str, Placement]
    scratch: FrozenMap[str, int]  # group name -> workspace offset of its scratch
    workspace_bytes: int
    view_copies: FrozenMap[str, tuple[tuple[str, int], ...]]  # group -> (source tensor, output index)
    final_copies: tuple[tuple[str, int], ...]  # (source tensor, output index) after the last group
    thread_bytes: int = 0  # the largest set of blocks one thread of one kernel allocates (im2col, tiles)
    # sizes known only at run time: the workspace blocks, placed by each call (af_best_fit); then a
    # workspace placement's and a scratch's index is its block's position here, not a byte offset
    blocks: tuple[Interval, ...] = ()

    @property
    def peak_bytes(self) -> int:
        """Peak activation memory: intermediate tensors and scratch, excluding inputs, outputs, weights."""
        return self.workspace_bytes

    def footprint(self, threads: int) -> int:
        """What a run holds at most besides inputs, outputs and weights: the workspace and, while the
        kernel with the largest per-thread blocks runs, ``threads`` sets of them."""
        return self.workspace_bytes + threads * self.thread_bytes


def _aligned(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)


def best_fit(blocks: list[Interval]) -> tuple[dict[str, int], int]:
    """Offsets for ``blocks`` so that blocks live at the same time never overlap; and the peak."""
    order = sorted(blocks, key=lambda b: (-b.nbytes, b.start, b.name))
    placed: list[tuple[Interval, int]] = []
    offsets: dict[str, int] = {}
    peak = 0
    for b in order:
        size = _aligned(b.nbytes)
        busy = sorted((off, off + _aligned(p.nbytes)) for p, off in placed if p.start <= b.end and b.start <= p.end)
        best: tuple[int, int] | None = None  # (gap size, offset)
        cursor = 0
        for lo, hi in busy:
            if lo - cursor >= size and (best is None or lo - cursor < best[0]):
                best = (lo - cursor, cursor)
            cursor = max(cursor, hi)
        offset = best[1] if best is not None else cursor
        offsets[b.name] = offset
        placed.append((b, offset))
        peak = max(peak, offset + size)
    return offsets, peak


def _view_roots(plan: Plan) -> dict[str, str]:
    """Each view group's output -> the tensor whose buffer it shares (through chains of views)."""
    g = plan.graph
    root: dict[str, str] = {}
    for group in plan.groups:
        if group.template == "view":
            for name in group.nodes:
                node = g.node_by_name[name]
                for out in (o for o in node.outputs if o):
                    root[out] = root.get(node.inputs[0], node.inputs[0])
    return root


def _outputs_adopted_by_view_bases(plan: Plan, root: Mapping[str, str], out_index: Mapping[str, int],
                                   placed: Mapping[str, Placement]) -> dict[str, str]:
    """Tensors computed straight into a graph output's array, because that output is a view of
    them (a training graph's forward returns reshaped activations for the backward): base ->
    output. The view then costs no copy. A base adopts one output, and only when it is computed
    by a kernel and is no graph output itself."""
    g = plan.graph
    adopted: dict[str, str] = {}
    for out, src in root.items():  # in plan order
        if (out in out_index and src not in out_index and src not in placed and src not in adopted
                and src in g.producers and g.types[src].nbytes == g.types[out].nbytes):
            adopted[src] = out
    return adopted


def plan_buffers(plan: Plan, scratch: Mapping[str, Any], thread_bytes: Mapping[str, int] | None = None,
                 at_run_time: bool = False) -> BufferPlan:
    """Place every tensor of ``plan``; ``scratch`` gives each group's scratch bytes, ``thread_bytes``
    the blocks each of its threads allocates. ``at_run_time`` (symbolic sizes): the workspace blocks
    are listed for the library to place at each call."""
    g = plan.graph
    place: dict[str, Placement] = {}
    for i, t in enumerate(g.inputs):
        place[t] = Placement(t, "input", i, nbytes=g.types[t].nbytes)
    for i, t in enumerate(g.constants):
        place[t] = Placement(t, "const", i, nbytes=g.types[t].nbytes)
    out_index: dict[str, int] = {}
    final_copies: list[tuple[str, int]] = []
    for i, t in enumerate(g.outputs):
        if t in out_index or t in place:
            final_copies.append((t, i))  # duplicate output, or an input/constant returned as is
        else:
            out_index[t] = i

    start: dict[str, int] = {}
    view_copies: dict[str, list[tuple[str, int]]] = {}
    root = _view_roots(plan)
    adopted = _outputs_adopted_by_view_bases(plan, root, out_index, place)
    for step, group in enumerate(plan.groups):
        if group.template == "view":
            for name in group.nodes:
                for out in (o for o in g.node_by_name[name].outputs if o):
                    if out in out_index and adopted.get(root[out]) != out:
                        view_copies.setdefault(group.name, []).append((out, out_index[out]))
            continue
        for t in group.outputs:
            if t in out_index or t in adopted:
                index = out_index[t] if t in out_index else out_index[adopted[t]]
                place[t] = Placement(t, "output", index, nbytes=g.types[t].nbytes)
            else:
                start[t] = step

    last: dict[str, int] = dict(start)
    for step, group in enumerate(plan.groups):
        reads = list(group.inputs)
        if group.template == "view":
            reads = [g.node_by_name[n].inputs[0] for n in group.nodes]
        for t in reads:
            r = root.get(t, t)
            if r in last:
                last[r] = max(last[r], step)

    blocks = [Interval(t, g.types[t].nbytes, start[t], last[t]) for t in start]
    blocks += [Interval(f"scratch:{grp.name}", scratch.get(grp.name, 0), i, i)
               for i, grp in enumerate(plan.groups) if scratch.get(grp.name, 0) != 0]
    if at_run_time:
        offsets, peak = {b.name: i for i, b in enumerate(blocks)}, 0
    else:
        offsets, peak = best_fit(blocks)
    for t in start:
        place[t] = Placement(t, "workspace", offsets[t], nbytes=g.types[t].nbytes)
    for t, r in root.items():
        if t in out_index:
            place[t] = Placement(t, "output", out_index[t], base=r, nbytes=g.types[t].nbytes)
        else:
            place[t] = Placement(t, "alias", 0, base=r, nbytes=g.types[t].nbytes)
    return BufferPlan(
        FrozenMap(place),
        FrozenMap((grp.name, offsets[f"scratch:{grp.name}"]) for grp in plan.groups
                  if f"scratch:{grp.name}" in offsets),
        peak,
        FrozenMap((k, tuple(v)) for k, v in view_copies.items()),
        tuple(final_copies),
        max((thread_bytes or {}).values(), default=0),
        tuple(blocks) if at_run_time else (),
    )
