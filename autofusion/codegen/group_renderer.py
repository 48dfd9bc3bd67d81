"""From a fused group to a kernel: picks the renderer for the group's template and content."""

from __future__ import annotations

from autofusion.codegen.cores import CoreChooser
from autofusion.codegen.errors import CodegenError
from autofusion.codegen.kernel_context import KernelContext, KernelSource, group_comment, group_error
from autofusion.codegen.loopnest import LoopNest, op_handlers
from autofusion.codegen.names import c_ident
from autofusion.codegen.reductions import REDUCTION_OPS
from autofusion.codegen.templates import TemplateSet
from autofusion.decide.plan import FusedGroup
from autofusion.dsl.templates import known_templates
from autofusion.ir.graph import Graph, Node
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

# every kernel kind a rule may name (one list, dsl/templates.py), and "view" for groups of views
TEMPLATES = known_templates() | {"view"}
LOOP_TEMPLATES = frozenset({"pointwise", "reduction", "multi_output"})


def kernel_name(group: FusedGroup) -> str:
    """The C function name of a group (the plan's name, made safe)."""
    return c_ident(group.name, "")


def render_group(graph: Graph, group: FusedGroup, templates: TemplateSet,
                 registry: OpRegistry | None = None, chooser: CoreChooser | None = None) -> KernelSource | None:
    """The kernel of ``group``; None for a view group (it only aliases a buffer). ``chooser``
    decides how its matrix products run (default: untuned, from what this machine reports)."""
    registry = registry or default_registry()
    if group.template not in TEMPLATES:
        raise group_error(group, f"unknown template {group.template!r}; the C backend has "
                          + ", ".join(sorted(TEMPLATES)))
    nodes = [graph.node_by_name[n] for n in group.nodes]
    for node in nodes:
        if node.op not in registry:
            raise group_error(group, "op is not in the op registry", node)
    if group.template == "view":
        bad = [n for n in nodes if not registry[n.op].view]
        if bad:
            raise group_error(group, "a view group may hold only view ops", bad[0])
        return None
    k = KernelContext(graph, registry, group, templates)
    if chooser is not None:
        k.chooser = chooser
    body = _render_body(k, nodes)
    name = kernel_name(group)
    params = k.params()
    code = templates.render("kernel.c.j2", comment=group_comment(graph, group), name=name, params=params,
                            body=body.splitlines())
    return KernelSource(name, group, code, params, k.scratch_bytes,
                        tuple((ident, arr) for _, ident, arr in k.derived), k.uses_blas, k.thread_bytes,
                        tuple(k.cores))


def _render_body(k: KernelContext, nodes: list[Node]) -> str:
    group = k.group
    cores = [n for n in nodes if k.registry[n.op].core == "gemm"]
    convs = [n for n in nodes if n.op == "Conv"]
    lstms = [n for n in nodes if n.op == "LSTM"]
    template = group.template
    if template == "lstm_scan":
        from autofusion.codegen.lstm_cells import render_lstm_cells

        body = render_lstm_cells(k, nodes)
        if body is not None:
            return body
    if template == "lstm_scan" or (template in ("gemm_epilogue", "conv_epilogue", "opaque")
                                   and len(cores) + len(convs) > 1 and not lstms):
        from autofusion.codegen.staged import render_staged

        return render_staged(k, nodes)
    if template == "horizontal_gemm":
        from autofusion.codegen import gemm

        return gemm.render_horizontal(k, nodes)
    if template in ("gemm_epilogue", "conv_epilogue", "opaque") and (cores or convs or lstms):
        if lstms and len(nodes) > 1:
            raise group_error(group, "LSTM is rendered on its own, not fused with other ops", lstms[0])
        if cores:
            from autofusion.codegen import gemm

            return gemm.render_gemm(k, nodes, cores[0])
        if convs:
            from autofusion.codegen import conv

            return conv.render_conv(k, nodes, convs[0])
        from autofusion.codegen import lstm

        return lstm.render_lstm(k, lstms[0])
    if template == "gemm_epilogue":
        raise group_error(group, "template 'gemm_epilogue' needs a MatMul or Gemm node")
    if template == "conv_epilogue":
        raise group_error(group, "template 'conv_epilogue' needs a Conv node")
    handlers = op_handlers()
    for node in nodes:
        if node.op not in handlers and node.op not in REDUCTION_OPS:
            raise group_error(group, f"op {node.op} cannot be computed by the {template!r} template", node)
    if template == "opaque" and len(nodes) != 1:
        raise group_error(group, f"template 'opaque' renders one op, the group has {len(nodes)}")
    engine = LoopNest(k, frozenset(group.nodes), handlers=handlers)
    try:
        return engine.render([(t, k.pointer(t)) for t in group.outputs])
    except CodegenError as e:
        if str(e).startswith("group "):
            raise
        raise group_error(group, str(e)) from None
