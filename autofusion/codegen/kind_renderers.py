"""The C renderers of the built-in kernel kinds (``autofusion/kinds/builtin.py`` names them): each
takes the group's KernelContext and nodes and returns the kernel's body."""

from __future__ import annotations

from autofusion.codegen import conv, gemm, lstm, lstm_cells
from autofusion.codegen.errors import CodegenError
from autofusion.codegen.kernel_context import KernelContext, group_error
from autofusion.codegen.loopnest import LoopNest, op_handlers
from autofusion.codegen.reductions import REDUCTION_OPS
from autofusion.codegen.staged import render_staged
from autofusion.graph.graph import Node


def render_view(k: KernelContext, nodes: list[Node]) -> None:
    """No kernel: a view group only aliases a buffer."""
    bad = [n for n in nodes if not k.registry[n.op].view]
    if bad:
        raise group_error(k.group, "a view group may hold only view ops", bad[0])


def render_loop_nest(k: KernelContext, nodes: list[Node]) -> str:
    """One loop nest over the outputs, with the group's ops inlined (pointwise, reduction, multi_output)."""
    group = k.group
    handlers = op_handlers(k.registry)
    for node in nodes:
        if node.op not in handlers and node.op not in REDUCTION_OPS:
            raise group_error(group, f"op {node.op} cannot be computed by the {group.template!r} template", node)
    engine = LoopNest(k, frozenset(group.nodes), handlers=handlers)
    try:
        return engine.render([(t, k.pointer(t)) for t in group.outputs])
    except CodegenError as e:
        if str(e).startswith("group "):
            raise
        raise group_error(group, str(e)) from None


def render_core(k: KernelContext, nodes: list[Node]) -> str:
    """A compute core (MatMul/Gemm, Conv, LSTM) with its epilogue; an opaque op of its own."""
    group, template = k.group, k.group.template
    cores = [n for n in nodes if k.registry[n.op].core == "gemm"]
    convs = [n for n in nodes if k.registry[n.op].core == "conv"]
    lstms = [n for n in nodes if n.op == "LSTM"]
    if len(cores) + len(convs) > 1 and not lstms:
        return render_staged(k, nodes)
    if lstms and len(nodes) > 1:
        raise group_error(group, "LSTM is rendered on its own, not fused with other ops", lstms[0])
    if cores:
        return gemm.render_gemm(k, nodes, cores[0])
    if convs:
        return conv.render_conv(k, nodes, convs[0])
    if lstms:
        return lstm.render_lstm(k, lstms[0])
    if template == "gemm_epilogue":
        raise group_error(group, "template 'gemm_epilogue' needs a MatMul or Gemm node")
    if template == "conv_epilogue":
        raise group_error(group, "template 'conv_epilogue' needs a Conv node")
    if len(nodes) != 1:
        raise group_error(group, f"template 'opaque' renders one op, the group has {len(nodes)}")
    return render_loop_nest(k, nodes)


def render_horizontal(k: KernelContext, nodes: list[Node]) -> str:
    """Several products of one input as one GEMM with several outputs."""
    return gemm.render_horizontal(k, nodes)


def render_loop_scan(k: KernelContext, nodes: list[Node]) -> str:
    """A recurrence with its time loop inside: the LSTM cell kernel, else level by level."""
    body = lstm_cells.render_lstm_cells(k, nodes)
    return body if body is not None else render_staged(k, nodes)
