"""The built-in kernel kinds, and the kind a group's op mix calls for when no rule names one."""

from __future__ import annotations

from collections.abc import Iterable

from autofusion.graph.graph import Graph, Node
from autofusion.kinds.facts import GroupFacts
from autofusion.kinds.kind import ACCEPT, Acceptance, KernelKind, ParamSpec, refuse
from autofusion.ops.common import ref_input_or_attr

C = "autofusion.codegen.kind_renderers"
TRITON = "autofusion.codegen.triton.render"
TRITON_GEMM = "autofusion.codegen.triton.gemm"
# a loop kernel (lstm_scan) computes the cores that depend on no other core of the loop (an LSTM's
# input projections) this many steps at once, so that their weight is read once per that many steps
# (codegen/lstm_cells.py; the cost model counts the reads so, decide/cost.py)
LOOKAHEAD_STEPS = 4
TILE_PARAMS = (
    ParamSpec("tile_m", int, "rows of the product per tile (default: all rows up to 192, else 128)", 1),
    ParamSpec("tile_n", int, "columns per tile (default: chosen for the thread count); a product with a "
              "packed weight rounds it up to whole 32-column panels", 1),
)


def natural_kind(facts: GroupFacts) -> str:
    """The kind a group of these ops needs: what renders it when no rule of the group names one."""
    if not facts.compute:
        return "view"
    if facts.loop:
        return "lstm_scan"
    opaque = _without_pooled_epilogue(facts)
    if not opaque:
        return "reduction" if facts.reductions else "pointwise"
    if len(opaque) > 1:
        return "horizontal_gemm"
    core = facts.defs[opaque[0]].core
    return f"{core}_epilogue" if core and len(facts.nodes) > 1 else "opaque"


def _without_pooled_epilogue(facts: GroupFacts) -> tuple[str, ...]:
    """The group's opaque ops, less a pooling op that ends a convolution's epilogue."""
    opaque = facts.opaque
    pools = [n for n in opaque if facts.defs[n].pooling]
    if len(opaque) == 2 and len(pools) == 1 and any(facts.defs[n].core == "conv" for n in opaque):
        return tuple(n for n in opaque if n not in pools)
    return opaque


def _view(facts: GroupFacts) -> Acceptance:
    return ACCEPT if not facts.compute else refuse("a view group holds only view ops")


def _loop_nest(facts: GroupFacts, reductions: range) -> Acceptance:
    if facts.opaque:
        op = facts.node(facts.opaque[0]).op
        return refuse(f"{op} has its own loop nest; it is no part of a loop-nest kernel")
    n = _row_loops(facts)
    if n > reductions.stop - 1:
        return refuse("more than one reduction in a kernel" if n > 1 else "a reduction in a pointwise kernel")
    if n < reductions.start:
        return refuse("no reduction in the group")
    return ACCEPT


def _row_loops(facts: GroupFacts) -> int:
    """The group's reductions counted as the loops over rows they need (:func:`row_families`)."""
    return len(row_families(facts, facts.reductions))


def row_families(facts: GroupFacts, reductions: Iterable[str]) -> list[list[str]]:
    """``reductions`` in families that share one loop over rows: Reduce ops over the same axes of
    inputs of one shape, none reading another's result (codegen/loopnest.py computes them in one
    pass over each row: a LayerNorm gradient's two means, a BatchNorm gradient's two sums per
    channel)."""
    families: list[tuple[object, list[str]]] = []
    for name in reductions:
        key = _reduced_rows(facts.graph, facts.node(name))
        for fkey, members in families:
            if key is not None and fkey == key and not facts.feeds_each_other([*members, name]):
                members.append(name)
                break
        else:
            families.append((key, [name]))
    return [members for _, members in families]


def _reduced_rows(g: Graph, node: Node) -> tuple[object, ...] | None:
    """(input shape, axes) of a Reduce op over axes known at build time; None otherwise."""
    if not node.op.startswith("Reduce") or not node.inputs or not node.inputs[0]:
        return None
    consts = [g.const_value(t) if t else None for t in node.inputs]
    if len(node.inputs) > 1 and node.inputs[1] and consts[1] is None:
        return None  # axes known only at run time: not matched with another
    given = ref_input_or_attr(consts, node.attrs, 1, "axes")
    if not given:  # all axes
        return None
    shape = g.types[node.inputs[0]].shape
    rank = max(len(shape), 1)
    return shape, tuple(sorted(int(a) % rank for a in given))


def _pointwise(facts: GroupFacts) -> Acceptance:
    return _loop_nest(facts, range(0, 1))


def _reduction(facts: GroupFacts) -> Acceptance:
    return _loop_nest(facts, range(1, 2))


def _multi_output(facts: GroupFacts) -> Acceptance:
    return _loop_nest(facts, range(0, 2))


def _one_core(facts: GroupFacts, core: str) -> Acceptance:
    """One ``core`` op (a Conv may end in one pooling op) with only an epilogue around it."""
    if facts.reductions and facts.opaque:
        return refuse("an opaque core and a reduction")
    if core == "conv" and len(facts.opaque) == 2 and len(_without_pooled_epilogue(facts)) == 1:
        if not facts.feeds_each_other(facts.opaque):  # (a pool before the conv: a prologue, below)
            return refuse("a pooling op apart from the convolution")
    opaque = _without_pooled_epilogue(facts)
    if len(opaque) != 1:
        return refuse("several opaque cores" if opaque else f"no {core} core in the group")
    name = opaque[0]
    op = facts.node(name).op
    if facts.defs[name].core != core:
        return refuse(f"{op} takes no epilogue" if not facts.defs[name].core else f"{op} is no {core} core")
    if any(not _strided_operand(facts, p) for p in facts.inside_producers(name)) or (
            core != "gemm" and facts.fed_from_inside(name)):  # the core reads its inputs from memory
        return refuse("prologue into an opaque core")
    return ACCEPT


def _strided_operand(facts: GroupFacts, name: str) -> bool:
    """A Transpose of a tensor the group reads from memory: a matrix product reads it in place
    through strides (codegen/views.py), so it costs no pass of its own."""
    return facts.node(name).op == "Transpose" and not facts.fed_from_inside(name)


def _gemm_epilogue(facts: GroupFacts) -> Acceptance:
    return _one_core(facts, "gemm")


def _conv_epilogue(facts: GroupFacts) -> Acceptance:
    return _one_core(facts, "conv")


def _horizontal_gemm(facts: GroupFacts) -> Acceptance:
    if facts.reductions and facts.opaque:
        return refuse("an opaque core and a reduction")
    opaque = facts.opaque
    if len(opaque) < 2 or any(facts.defs[n].core != "gemm" for n in opaque):
        return refuse("several opaque cores" if len(opaque) > 1 else "needs two or more matrix products")
    if len({facts.node(n).inputs[0] for n in opaque}) != 1 or facts.feeds_each_other(opaque):
        return refuse("several opaque cores")
    return ACCEPT


def _opaque(facts: GroupFacts) -> Acceptance:
    if len(facts.compute) == 1 and facts.opaque:
        return ACCEPT
    opaque = _without_pooled_epilogue(facts)
    if len(opaque) == 1 and facts.defs[opaque[0]].core:
        return _one_core(facts, facts.defs[opaque[0]].core)
    if len(opaque) == 1:
        return refuse(f"{facts.node(opaque[0]).op} takes no epilogue")
    return refuse("an opaque kernel holds one opaque op" if opaque else "no opaque op in the group")


def _lstm_scan(facts: GroupFacts) -> Acceptance:
    return ACCEPT if facts.loop else refuse("lstm_scan renders the recurrences loop rules find")


def _kind(name: str, summary: str, accepts, colour: str, c: str, triton: str = "",  # type: ignore[no-untyped-def]
          params: tuple[ParamSpec, ...] = ()) -> KernelKind:
    renderers = {"c": f"{C}:{c}"}
    if triton:  # a function of the Triton backend's render module, or module:function
        renderers["triton"] = triton if ":" in triton else f"{TRITON}:{triton}"
    return KernelKind(name, summary, accepts, params, renderers, colour)  # type: ignore[arg-type]


BUILTIN_KINDS: tuple[KernelKind, ...] = (
    _kind("pointwise", "a chain or tree of pointwise ops, one loop over the output", _pointwise,
          "#cfe8ff", "render_loop_nest", "render_loop_nest"),
    _kind("reduction", "a reduction with pointwise prologue and epilogue (softmax, layernorm, mean, ...)",
          _reduction, "#d9f2d0", "render_loop_nest", "render_loop_nest"),
    _kind("gemm_epilogue", "MatMul or Gemm with a pointwise epilogue applied per tile (bias, activation)",
          _gemm_epilogue, "#ffe2b8", "render_core", "render_gemm_epilogue", TILE_PARAMS),
    _kind("conv_epilogue", "Conv with folded BatchNormalization, bias, residual add and activation",
          _conv_epilogue, "#ffd6d1", "render_core", "render_conv"),
    _kind("horizontal_gemm", "several MatMuls that share their input, as one GEMM with several outputs",
          _horizontal_gemm, "#f3d9ff", "render_horizontal", f"{TRITON_GEMM}:render_horizontal",
          params=TILE_PARAMS),
    _kind("multi_output", "a branch: several pointwise or reduction consumers of one tensor, several outputs",
          _multi_output, "#fff3b0", "render_loop_nest", "render_loop_nest"),
    _kind("lstm_scan", "a recurrent cell repeated over time steps, the time loop inside the kernel",
          _lstm_scan, "#c9f0ec", "render_loop_scan", "autofusion.codegen.triton.lstm:render_lstm_scan"),
    _kind("opaque", "a single opaque op in a kernel of its own", _opaque, "#eeeeee", "render_core", "render_opaque"),
    _kind("view", "views only: no kernel, the outputs alias the input's buffer", _view, "#f7f7f7", "render_view"),
)
