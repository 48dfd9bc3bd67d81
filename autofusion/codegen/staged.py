"""Groups with several MatMul/Gemm/Conv cores in one kernel: ``lstm_scan`` (an LSTM cell unrolled
over time steps, the recurrence inside one kernel) and any other multi-core group.

Nodes are ordered by *level*: the number of cores on the longest path to them (a core is then moved
as late as its readers allow). Level by level the kernel runs the cores of that level (sgemm into a
buffer) and then one fused loop-nest phase for the elementwise nodes of that level. A value is written
to memory only when a later level or a core reads it (an LSTM's hidden and cell states between
steps) or when it is a group output; everything else stays inlined. Materialised values live in the
group's scratch memory, a slot reused once every level that reads its value has run.
"""

from __future__ import annotations

from autofusion.codegen.conv import render_conv_core
from autofusion.codegen.gemm import _Gemm
from autofusion.codegen.inliner import Override
from autofusion.codegen.kernel_context import KernelContext
from autofusion.codegen.loopnest import LoopNest, op_handlers
from autofusion.codegen.names import c_comment_text
from autofusion.codegen.reductions import REDUCTION_OPS
from autofusion.graph.graph import Node

CORE_OPS = frozenset({"MatMul", "Gemm", "Conv"})


def render_staged(k: KernelContext, nodes: list[Node]) -> str:
    """Body of a kernel running the cores of ``nodes`` level by level with fused elementwise phases."""
    g = k.graph
    handlers = op_handlers(k.registry)
    for node in nodes:
        if node.op not in CORE_OPS and node.op not in handlers and node.op not in REDUCTION_OPS:
            raise k.error(f"op {node.op} cannot be part of a multi-core ({k.group.template!r}) kernel", node)
    member = {n.name for n in nodes}
    level: dict[str, int] = {}
    for node in nodes:  # topological order
        preds = [level[p.name] for t in node.inputs if t and (p := g.producers.get(t)) is not None
                 and p.name in member]
        level[node.name] = max(preds, default=0) + (1 if node.op in CORE_OPS else 0)
    consumers: dict[str, list[Node]] = {}
    for node in nodes:
        for t in node.inputs:
            if t:
                consumers.setdefault(t, []).append(node)
    outputs = set(k.group.outputs)
    # a core runs as late as its readers allow (a phase reads it at its own level, a core one level
    # later): an LSTM's input projection of step t is computed at step t, not all sixteen up front
    for node in reversed(nodes):
        if node.op not in CORE_OPS or any(t in outputs for t in node.outputs):
            continue
        bounds = [level[c.name] - (1 if c.op in CORE_OPS else 0)
                  for t in node.outputs if t for c in consumers.get(t, ())]
        if bounds:
            level[node.name] = max(level[node.name], min(bounds))

    materialized: dict[str, str] = {}
    top = max(level.values(), default=0)
    # scratch slots are reused by level: a value's slot is free once every level that reads it has
    # run (an LSTM unrolled over 16 steps needs two steps' worth, not sixteen)
    free: list[tuple[int, int]] = []  # (bytes, offset) of slots free for the levels to come
    released: dict[int, list[tuple[int, int]]] = {}  # level -> slots free after it

    def buffer_for(tensor: str) -> str:
        if tensor in outputs:
            return k.pointer(tensor)
        nbytes = g.types[tensor].nbytes
        fits = [slot for slot in free if slot[0] >= nbytes]
        if fits:
            slot = min(fits)
            free.remove(slot)
        else:
            slot = (nbytes, k.scratch(nbytes))
        last = max((level[c.name] for c in consumers.get(tensor, ())), default=top + 1)
        released.setdefault(last, []).append(slot)
        return f"(({k.ctype_of(tensor)}*)(scratch + {slot[1]}))"

    def loads() -> dict[str, Override]:
        out: dict[str, Override] = {}
        for t, ptr in materialized.items():
            shape = g.types[t].shape
            out[t] = (lambda p, sh: (lambda idx, block: f"{p}[{_linear(idx, sh)}]"))(ptr, shape)
        return out

    parts: list[str] = []
    for lvl in range(top + 1):
        for core in (n for n in nodes if n.op in CORE_OPS and level[n.name] == lvl):
            ybuf = buffer_for(core.outputs[0])
            if core.op == "Conv":
                parts.append(render_conv_core(k, nodes, core, ybuf, dict(materialized)))
            else:
                parts.append(_Gemm(k, nodes, [core], materialized).render_core(core, ybuf))
            materialized[core.outputs[0]] = ybuf
        phase = [n for n in nodes if n.op not in CORE_OPS and level[n.name] == lvl]
        targets = []
        for node in phase:
            for t in node.outputs:
                if not t:
                    continue
                later = any(c.op in CORE_OPS or level[c.name] > lvl for c in consumers.get(t, ()))
                if t in outputs or later:
                    targets.append((t, buffer_for(t)))
        if targets:
            nest = LoopNest(k, frozenset(n.name for n in phase), overrides=loads(), handlers=handlers)
            parts.append(f"/* {c_comment_text(f'level {lvl}: {len(phase)} elementwise ops')} */\n"
                         + nest.render(targets))
            materialized.update(targets)
        free.extend(released.pop(lvl, ()))
    missing = [t for t in k.group.outputs if t not in materialized]
    if missing:
        raise k.error(f"outputs {missing} were not produced by any stage (inconsistent plan)")
    return "\n".join(parts)


def _linear(idx: tuple[str, ...], shape: tuple[int, ...]) -> str:
    from autofusion.codegen.index import linear

    return linear(idx, shape)
