"""From a fused group to a Triton kernel module: the group's kind names the renderer (the built-in
kinds with one here: pointwise, reduction, multi_output, gemm_epilogue, horizontal_gemm,
conv_epilogue and opaque matrix products and convolutions).

Each kernel is one Python module rendered from ``templates/triton``: a ``@triton.jit`` function and
a ``launch`` function holding its (static) grid. Inputs and outputs are contiguous tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autofusion.codegen.names import NameTable
from autofusion.codegen.triton import reduce as red
from autofusion.codegen.triton import tindex as ix
from autofusion.codegen.triton.configs import Config, config, pointwise_configs
from autofusion.codegen.triton.conv import render_conv
from autofusion.codegen.triton.exprs import Exprs
from autofusion.codegen.triton.gemm import render_gemm
from autofusion.codegen.triton.lstm import render_lstm
from autofusion.codegen.triton.templates import TritonTemplates
from autofusion.codegen.triton.text import py_comment, py_ident
from autofusion.decide.plan import FusedGroup
from autofusion.graph.graph import Graph
from autofusion.kinds import KindRegistry, default_kinds
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

BACKEND = "triton"


@dataclass(frozen=True)
class TritonKernel:
    """One rendered kernel: ``source`` defines ``name`` (the jit function) and ``launch(*params,
    **config)``, which runs with any configuration of ``configs`` (the first when none is given)."""

    name: str
    group: FusedGroup
    source: str
    params: tuple[str, ...]  # tensor names, in the order launch() takes them
    configs: tuple[Config, ...]  # block sizes and warps it can launch with, the default first

    @property
    def default(self) -> Config:
        return self.configs[0]


def group_comment(group: FusedGroup) -> str:
    rules = ", ".join(str(r) for r in group.rules) or "none recorded"
    return py_comment(f"group {group.name} [{group.template}]: {len(group.nodes)} nodes; rules: {rules}")


def triton_kinds(kinds: KindRegistry | None = None) -> tuple[str, ...]:
    """The kinds the Triton backend renders."""
    return tuple(k.name for k in kinds or default_kinds() if k.renderers.get(BACKEND) is not None)


def render_triton_group(graph: Graph, group: FusedGroup, templates: TritonTemplates | None = None,
                        registry: OpRegistry | None = None, kinds: KindRegistry | None = None) -> TritonKernel:
    """The Triton kernel of ``group``, or CodegenError naming the template it cannot render."""
    registry = registry or default_registry()
    kinds = kinds or default_kinds()
    templates = templates or TritonTemplates()
    names = NameTable("t_")
    params = tuple(dict.fromkeys(t for t in group.inputs + group.outputs if t))
    idents = [names(t) for t in params]
    ex = Exprs(graph, group, registry, names)
    kind = kinds.get(group.template)
    renderer = kind.renderer(BACKEND) if kind is not None else None
    if renderer is None:
        raise ex.error("the Triton backend renders only " + ", ".join(sorted(triton_kinds(kinds))))
    for n in group.nodes:
        if graph.node_by_name[n].op not in registry:
            raise ex.error("op is not in the op registry", graph.node_by_name[n])
    ctx: dict[str, object] = dict(comment=group_comment(group), name=py_ident(group.name, "k_"), params=idents)
    ctx.update(renderer(ex, names))
    # a renderer that returns only ``meta`` (a plugin's, written before configurations) has one
    configs: tuple[Config, ...] = ctx.pop("configs", None) or (config(ctx.pop("meta", ())),)  # type: ignore[assignment,arg-type]
    default = dict(configs[0])
    ctx["warps"] = default.pop("num_warps")
    ctx["meta"] = list(default.items())
    return TritonKernel(str(ctx["name"]), group, templates.render(str(ctx.pop("template")), **ctx), params, configs)


def render_loop_nest(ex: Exprs, names: NameTable) -> dict[str, object]:
    """Pointwise, reduction and multi_output groups: one reduction's rows, else flat blocks."""
    if red.find_reduction(ex) is not None:
        return red.render_reduction(ex, names)
    return _render_pointwise(ex, names)


def render_gemm_epilogue(ex: Exprs, names: NameTable) -> dict[str, object]:
    return render_gemm(ex, names)


def render_opaque(ex: Exprs, names: NameTable) -> dict[str, object]:
    """A group of one opaque op: a matrix product or convolution renders as its kernel (no epilogue),
    an LSTM as its recurrent kernel, any other op (a pooling window, a Gather) as a loop over its output, where Exprs computes it."""
    node = ex.graph.node_by_name[ex.group.nodes[0]]
    core = ex.registry[node.op].core
    if core == "gemm":
        return render_gemm(ex, names)
    if core == "conv":
        return render_conv(ex, names)
    if node.op == "LSTM":
        return render_lstm(ex, names)
    return render_loop_nest(ex, names)


def _render_pointwise(ex: Exprs, names: NameTable) -> dict[str, object]:
    """One program per block of the flattened outputs; outputs of other shapes need the same element count."""
    shapes = list(dict.fromkeys(ex.graph.type_of(t).shape for t in ex.group.outputs))
    counts = {math.prod(s) for s in shapes}
    if len(counts) != 1:
        raise ex.error(f"outputs of different sizes {shapes} need separate loop nests")
    numel = counts.pop()
    ex.mask, ex.vector = "mask", {"offs", "mask"}
    index_lines = []
    index_of: dict[tuple[int, ...], tuple[str, ...]] = {}
    for k, shape in enumerate(shapes):  # each output shape indexes the flat block its own way
        idx = []
        for d, e in enumerate(ix.delinear("offs", shape)):
            if ix.cix.is_int(e):
                idx.append(e)
                continue
            var = f"i{d}" if k == 0 else f"i{k}_{d}"
            index_lines.append(f"{var} = {e}")
            ex.vector.add(var)
            idx.append(var)
        index_of[shape] = tuple(idx)
    stores = [f"tl.store({names(t)} + offs, {ex.value(t, index_of[ex.graph.type_of(t).shape])}, mask=mask)"
              for t in ex.group.outputs]
    return dict(template="pointwise.py.j2", numel=numel, grid=[f"triton.cdiv({numel}, BLOCK)"],
                index_lines=index_lines, body=ex.lines, stores=stores, configs=pointwise_configs(numel))
