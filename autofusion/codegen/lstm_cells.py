"""An LSTM cell unrolled over time steps (``lstm_scan``, torch.nn.LSTMCell in a Python loop) as one
recurrent kernel whose gates are never stored.

At build time both weights' columns are interleaved by gate, eight hidden units at a time, and
packed: a 32-column panel holds the input, forget, candidate and output gate of hidden units
8p..8p+7. Per step, a thread computes h W_hh^T for its panels and, from that tile, the step's input
projection x_t W_ih^T and the bias, those units' next cell and hidden state; the cell state is
updated in place and the hidden state goes to the other half of a double buffer (other panels still
read this step's h). One barrier per step. A thread computes the same panels at every step. The
input projections depend on no state: where W_ih is too large to stay in L2 from one step to the
next, a thread computes its panels' projections for LOOKAHEAD_STEPS steps at once, into its own
block, so that W_ih is read from beyond L2 once per LOOKAHEAD_STEPS steps, not once per step.

Only the exact cell of rules/rnn.fuse (Gemm + Gemm -> Add -> Split in four -> Sigmoid, Sigmoid,
Tanh, Sigmoid -> c' = f c + i g, h' = o tanh(c')) with shared constant weights is rendered this way;
anything else (another activation, a gate read outside the kernel, a hidden size that is not a
multiple of 8) returns None and the group goes to the generic multi-core renderer (``staged``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autofusion.codegen.gemm import PACK_NR, pack_weights, packed_for, slice_cols
from autofusion.codegen.kernel_context import KernelContext
from autofusion.codegen.names import c_comment_text
from autofusion.graph.graph import Graph, Node
from autofusion.graph.types import DType
from autofusion.kinds.builtin import LOOKAHEAD_STEPS

UNITS = PACK_NR // 4  # hidden units per panel: four gates each
MAX_BATCH = 256  # each thread's tile of gates, batch x 32 floats, lives on its stack
# input projections are computed LOOKAHEAD_STEPS steps at once when W_ih is larger than half of L2
# (the built-in lstm, hidden 512: 6 -> 4.5 MiB of weights streamed per step; 8 or 16 steps were not
# measurably faster and hold 2-4x the block), unless a thread's block would exceed this
MAX_PROJECTION_BYTES = 1 << 20


@dataclass(frozen=True)
class CellStep:
    x: str  # the step's input [batch, D]
    h_in: str
    c_in: str
    h_out: str
    c_out: str
    gemm_x: Node
    gemm_h: Node
    nodes: frozenset[str]


def _only_consumer(g: Graph, tensor: str, op: str, members: set[str]) -> Node | None:
    users = g.consumers.get(tensor, ())
    if len(users) != 1 or users[0].op != op or users[0].name not in members:
        return None
    return users[0]


def _plain_gemm(g: Graph, node: Node | None) -> bool:
    """A Gemm A @ W^T + b with a constant [4H, K] weight and no other attribute."""
    if node is None or node.op != "Gemm" or len(node.inputs) < 2:
        return False
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, **dict(node.attrs)}
    if attrs["transB"] != 1 or attrs["transA"] != 0 or attrs["alpha"] != 1.0 or attrs["beta"] != 1.0:
        return False
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    return g.is_const(node.inputs[1]) and (not bias or (g.is_const(bias) and len(g.types[bias].shape) == 1))


def _step(g: Graph, split: Node, members: set[str]) -> tuple[str, str, CellStep] | None:
    """The cell around ``split``: (one Gemm's A, the other's, the step) with h_in/gemm_h undecided."""
    outs = list(split.outputs)
    axis = int(split.attr("axis", 0))
    if len(outs) != 4 or not all(outs) or axis not in (1, -1) or len(g.types[split.inputs[0]].shape) != 2:
        return None
    if len({g.types[o].shape for o in outs}) != 1:
        return None  # four equal gates
    add = g.producers.get(split.inputs[0])
    if add is None or add.op != "Add" or add.name not in members or len(g.consumers.get(add.outputs[0], ())) != 1:
        return None
    gemms = [g.producers.get(t) for t in add.inputs]
    if not all(_plain_gemm(g, n) and n is not None and n.name in members for n in gemms):
        return None
    acts = [_only_consumer(g, o, op, members) for o, op in zip(outs, ("Sigmoid", "Sigmoid", "Tanh", "Sigmoid"))]
    if any(a is None for a in acts):
        return None
    gi, gf, gc, go = (a.outputs[0] for a in acts if a is not None)
    f_mul = _only_consumer(g, gf, "Mul", members)
    ig_mul = _only_consumer(g, gi, "Mul", members)
    if f_mul is None or ig_mul is None or set(ig_mul.inputs) != {gi, gc} or ig_mul.inputs[0] == ig_mul.inputs[1]:
        return None
    if _only_consumer(g, gc, "Mul", members) is not ig_mul:
        return None
    c_in = f_mul.inputs[1] if f_mul.inputs[0] == gf else f_mul.inputs[0]
    c_add = _only_consumer(g, f_mul.outputs[0], "Add", members)
    if c_add is None or set(c_add.inputs) != {f_mul.outputs[0], ig_mul.outputs[0]} or c_in == gf:
        return None
    c_out = c_add.outputs[0]
    tanh_c = next((u for u in g.consumers.get(c_out, ()) if u.op == "Tanh" and u.name in members), None)
    if tanh_c is None:
        return None
    h_mul = _only_consumer(g, go, "Mul", members)
    if h_mul is None or set(h_mul.inputs) != {go, tanh_c.outputs[0]}:
        return None
    if _only_consumer(g, tanh_c.outputs[0], "Mul", members) is not h_mul:
        return None
    nodes = frozenset(n.name for n in [*gemms, add, split, *acts, f_mul, ig_mul, c_add, tanh_c, h_mul]
                      if n is not None)
    a, b = gemms
    assert a is not None and b is not None
    return a.inputs[0], b.inputs[0], CellStep("", "", c_in, h_mul.outputs[0], c_out, a, b, nodes)


def _chain(g: Graph, nodes: list[Node]) -> list[CellStep] | None:
    """Every step of the group in order, each reading the h and c the step before produced."""
    members = {n.name for n in nodes}
    found = []
    for split in (n for n in nodes if n.op == "Split"):
        cell = _step(g, split, members)
        if cell is None:
            return None
        found.append(cell)
    if len(found) < 2:
        return None
    steps: list[CellStep] = []
    for i, (a, b, s) in enumerate(found):
        if i + 1 < len(found):  # h is what the next step's product reads from this step
            nxt_a, nxt_b, _ = found[i + 1]
            if s.h_out not in (nxt_a, nxt_b):
                return None
        prev = steps[-1] if steps else None
        if prev is not None:
            if prev.h_out not in (a, b) or s.c_in != prev.c_out:
                return None
            h_in = prev.h_out
        else:  # the first step: h is the input of the Gemm that uses the weight the next steps use for h
            nxt_a, nxt_b, nxt = found[1]
            w_h = (nxt.gemm_x if nxt_a == s.h_out else nxt.gemm_h).inputs[1]
            h_in = a if s.gemm_x.inputs[1] == w_h else b
        gemm_h, gemm_x = (s.gemm_x, s.gemm_h) if h_in == a else (s.gemm_h, s.gemm_x)
        x = gemm_x.inputs[0]
        if x == h_in:
            return None
        gather = g.producers.get(x)
        step_nodes = s.nodes | ({gather.name} if gather is not None and gather.name in members else set())
        steps.append(CellStep(x, h_in, s.c_in, s.h_out, s.c_out, gemm_x, gemm_h, frozenset(step_nodes)))
    if sum(len(step.nodes) for step in steps) != len(nodes):
        return None
    return steps


def step_input(g: Graph, s: CellStep, members: set[str]) -> tuple[str, int, int] | None:
    """Where step ``s`` reads row b of its input: (tensor, offset of row 0, elements from one row to
    the next). A Gather of the step's slice of a model input inside the group is an offset into that
    input."""
    batch, d = g.types[s.x].shape
    node = g.producers.get(s.x)
    if node is None or node.name not in members:
        return s.x, 0, d
    if node.op != "Gather" or len(node.inputs) != 2:
        return None
    data = g.types[node.inputs[0]].shape
    index = g.const_value(node.inputs[1])
    axis = int(node.attr("axis", 0)) % max(1, len(data))
    if len(data) != 3 or axis not in (0, 1) or index is None:
        return None
    t = int(np.asarray(index).reshape(()))
    t = t + data[axis] if t < 0 else t
    if not 0 <= t < data[axis]:
        return None
    if axis == 0:  # [T, B, D]: step t's rows are contiguous
        return node.inputs[0], t * data[1] * data[2], data[2]
    return node.inputs[0], t * data[2], data[1] * data[2]  # [B, T, D]


def _same_weights(g: Graph, steps: list[CellStep]) -> bool:
    def key(node: Node) -> tuple[str, ...]:
        return tuple(node.inputs[1:3])

    first = steps[0]
    return all(key(s.gemm_x) == key(first.gemm_x) and key(s.gemm_h) == key(first.gemm_h) for s in steps)


def cell_steps(g: Graph, nodes: list[Node]) -> list[CellStep] | None:
    """The steps of an unrolled LSTM cell with one pair of weights, in order; None for anything else."""
    steps = _chain(g, nodes)
    return steps if steps is not None and _same_weights(g, steps) else None


def render_lstm_cells(k: KernelContext, nodes: list[Node]) -> str | None:
    """The kernel body, or None when the group is not exactly an unrolled LSTM cell (see the module doc)."""
    g = k.graph
    steps = cell_steps(g, nodes)
    if steps is None:
        return None
    first = steps[0]
    batch, d = g.types[first.x].shape
    hb, hidden = g.types[first.h_in].shape
    w_x = g.const_value(first.gemm_x.inputs[1])
    w_h = g.const_value(first.gemm_h.inputs[1])
    if w_x is None or w_h is None or hidden % UNITS or hb != batch or batch > MAX_BATCH:
        return None
    if w_x.shape != (4 * hidden, d) or w_h.shape != (4 * hidden, hidden):
        return None
    members = {n.name for n in nodes}
    sources = [step_input(g, s, members) for s in steps]
    inputs = [(f"({k.pointer(src[0])} + {src[1]})" if src[1] else k.pointer(src[0]), src[2])
              for src in sources if src is not None]
    if len(inputs) != len(steps):
        return None
    tensors = [t for s in steps for t in (s.x, s.h_in, s.c_in, s.h_out, s.c_out)]
    if any(g.types[t].dtype != DType.FLOAT32 for t in tensors):
        return None
    if any(g.types[s.x].shape != (batch, d) or g.types[s.c_in].shape != (batch, hidden) for s in steps):
        return None
    states = {s.h_out for s in steps} | {s.c_out for s in steps}
    if not set(k.group.outputs) <= states:
        return None  # a gate or an intermediate value is needed outside: the generic renderer stores it

    panels = hidden // UNITS
    # column p*32 + gate*8 + u of a packed weight is gate `gate` of hidden unit 8p + u
    perm = np.array([gate * hidden + p * UNITS + u for p in range(panels) for gate in range(4) for u in range(UNITS)])
    wx_ptr, wh_ptr = (k.derived_constant(f"{gemm.name}_cell_packed",
                                         pack_weights(np.asarray(w, np.float32).T[:, perm], slice_cols(k)))
                      for gemm, w in ((first.gemm_x, w_x), (first.gemm_h, w_h)))
    bias = np.zeros(4 * hidden, np.float32)
    for gemm in (first.gemm_x, first.gemm_h):
        if len(gemm.inputs) > 2 and gemm.inputs[2]:
            b = g.const_value(gemm.inputs[2])
            assert b is not None
            bias = bias + np.broadcast_to(np.asarray(b, np.float32), (4 * hidden,))
    b_ptr = k.derived_constant(f"{first.gemm_x.name}_cell_bias", bias[perm].astype(np.float32))
    step_bytes = batch * 4 * hidden * 4  # one step's input projections, every panel
    ahead_stride = _ahead_row_stride(sources, batch)
    together = min(len(steps), LOOKAHEAD_STEPS) if w_x.size * 4 > k.chooser.machine.l2 // 2 else 1
    if together * step_bytes > MAX_PROJECTION_BYTES:
        together = 1
    if together > 1:  # each thread's panels' projections (all panels where it is the only thread)
        k.per_thread(together * step_bytes)
    off_h = k.scratch(2 * batch * hidden * 4)
    off_c = k.scratch(batch * hidden * 4)
    outputs = set(k.group.outputs)
    k.uses_blas = True
    return k.templates.render(
        "lstm_cells.c.j2",
        comment=c_comment_text(f"LSTM cell over {len(steps)} steps: batch {batch}, input {d}, hidden {hidden}; "
                               f"gates interleaved {UNITS} hidden units per {PACK_NR}-column panel"),
        steps=len(steps), together=together, ahead_stride=ahead_stride, batch=batch, d=d, hidden=hidden,
        gates=4 * hidden, panels=panels, units=UNITS, nr=PACK_NR,
        kc=k.chooser.machine.default_kc(), packed_for=packed_for(slice_cols(k)),
        xs=[i[0] for i in inputs if i is not None], x_strides=[i[1] for i in inputs if i is not None],
        h_out=[k.pointer(s.h_out) if s.h_out in outputs else "NULL" for s in steps],
        c_out=[k.pointer(s.c_out) if s.c_out in outputs else "NULL" for s in steps],
        h0=_initial(k, first.h_in), c0=_initial(k, first.c_in), wx=wx_ptr, wh=wh_ptr, bias=b_ptr, off_h=off_h,
        off_c=off_c)


def _ahead_row_stride(sources: list[tuple[str, int, int] | None], batch: int) -> int:
    """Elements from one row to the next where the steps' input rows follow each other at one stride
    in one tensor ([T, B, D], or any layout at batch 1), so that the input projections of several
    steps are one product of that many rows (a 1-row product per step ran at the FMA latency's pace,
    2 accumulators a step); else 0."""
    if len(sources) < 2 or any(src is None for src in sources):
        return 0
    first, second = sources[0], sources[1]
    assert first is not None and second is not None
    tensor, offset, stride = first
    step = second[1] - offset
    row = step if batch == 1 else stride
    if step <= 0 or (batch > 1 and step != batch * stride):
        return 0
    return row if all(src == (tensor, offset + i * step, stride) for i, src in enumerate(sources)) else 0


def _initial(k: KernelContext, tensor: str) -> str:
    """Element [b, j] of an initial state: a literal when every element is the same constant."""
    literal = k.uniform_literal(tensor)
    hidden = k.graph.types[tensor].shape[1]
    return literal if literal is not None else f"{k.pointer(tensor)}[b * {hidden} + j]"
