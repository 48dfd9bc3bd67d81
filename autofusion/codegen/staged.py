"""Groups with several MatMul/Gemm/Conv cores in one kernel: ``lstm_scan`` (an LSTM cell unrolled
over time steps, the recurrence inside one kernel) and any other multi-core group.

Nodes are ordered by *level*: the number of cores on the longest path to them. Level by level the
kernel runs the cores of that level (sgemm into a buffer) and then one fused loop-nest phase for
the elementwise nodes of that level. A value is written to memory only when a later level or a core
reads it (an LSTM's hidden and cell states between steps) or when it is a group output; everything
else stays inlined. Materialised values live in the group's scratch memory.
"""

from __future__ import annotations

from autofusion.codegen.conv import render_conv_core
from autofusion.codegen.gemm import _Gemm
from autofusion.codegen.inliner import Override
from autofusion.codegen.kernel import KernelContext
from autofusion.codegen.loopnest import LoopNest, op_handlers
from autofusion.codegen.names import c_comment_text
from autofusion.codegen.reductions import REDUCTION_OPS
from autofusion.ir.graph import Node

CORE_OPS = frozenset({"MatMul", "Gemm", "Conv"})


def render_staged(k: KernelContext, nodes: list[Node]) -> str:
    """Body of a kernel running the cores of ``nodes`` level by level with fused elementwise phases."""
    g = k.graph
    handlers = op_handlers()
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

    materialized: dict[str, str] = {}
    outputs = set(k.group.outputs)

    def buffer_for(tensor: str) -> str:
        if tensor in outputs:
            return k.pointer(tensor)
        return f"(({k.ctype_of(tensor)}*)(scratch + {k.scratch(g.types[tensor].nbytes)}))"

    def loads() -> dict[str, Override]:
        out: dict[str, Override] = {}
        for t, ptr in materialized.items():
            shape = g.types[t].shape
            out[t] = (lambda p, sh: (lambda idx, block: f"{p}[{_linear(idx, sh)}]"))(ptr, shape)
        return out

    parts: list[str] = []
    top = max(level.values(), default=0)
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
    missing = [t for t in k.group.outputs if t not in materialized]
    if missing:
        raise k.error(f"outputs {missing} were not produced by any stage (inconsistent plan)")
    return "\n".join(parts)


def _linear(idx: tuple[str, ...], shape: tuple[int, ...]) -> str:
    from autofusion.codegen.index import linear

    return linear(idx, shape)
