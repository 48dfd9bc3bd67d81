"""The ``autofusion.kernels`` entry point: an ``rms_norm`` kernel kind with its own C template.

This is the seed's user SuperKernel (a class overriding ``GenerateCode()`` for one pattern) in
autofusion's terms: a :class:`~autofusion.kinds.KernelKind` says which groups it can render
(``accepts``), which params a rule may give it, and how to render a group for the C backend. A rule
names the kind (``rules/rms_norm.fuse``); the decider gives it the groups that rule builds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from autofusion.codegen.ctype import literal
from autofusion.codegen.kernel_context import KernelContext
from autofusion.ir import DType, Graph, Node
from autofusion.kinds import ACCEPT, Acceptance, GroupFacts, KernelKind, ParamSpec, refuse

TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
                               undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


@dataclass(frozen=True)
class RmsNorm:
    """The tensors of one matched RMSNorm: input, scale, output, and epsilon's value."""

    x: str
    g: str
    y: str
    eps: float


def match(graph: Graph, nodes: Collection[str]) -> RmsNorm | str:
    """The RMSNorm the group computes, or why it is not one: exactly
    Mul(Div(x, Sqrt(Add(ReduceMean(Mul(x, x), axes=[-1]), eps))), g), float32, g of the row's length."""
    by_op: dict[str, list[Node]] = {}
    for n in nodes:
        node = graph.node_by_name[n]
        by_op.setdefault(node.op, []).append(node)
    if sorted((op, len(v)) for op, v in by_op.items()) != [("Add", 1), ("Div", 1), ("Mul", 2), ("ReduceMean", 1),
                                                          ("Sqrt", 1)]:
        return "not the six ops of an RMSNorm"
    mean, add, sqrt, div = by_op["ReduceMean"][0], by_op["Add"][0], by_op["Sqrt"][0], by_op["Div"][0]
    square = next((m for m in by_op["Mul"] if m.outputs[0] == mean.inputs[0]), None)
    scale = next((m for m in by_op["Mul"] if div.outputs[0] in m.inputs), None)
    if square is None or scale is None or square.inputs[0] != square.inputs[1]:
        return "no x * x feeding the mean, or no scale after the division"
    x = square.inputs[0]
    t = graph.type_of(x)
    axes = tuple(mean.attrs.get("axes", ()))
    if t.dtype is not DType.FLOAT32 or axes not in ((-1,), (t.rank - 1,)) or not mean.attrs.get("keepdims", 1):
        return "the mean must be over the last axis of a float32 tensor, keeping it"
    eps_name = next((i for i in add.inputs if i != mean.outputs[0]), "")
    eps = graph.const_value(eps_name)
    g = next((i for i in scale.inputs if i != div.outputs[0]), "")
    if (eps is None or eps.size != 1 or sqrt.inputs[0] != add.outputs[0] or div.inputs != (x, sqrt.outputs[0])
            or graph.type_of(g).shape != (t.shape[-1],)):
        return "epsilon must be a scalar constant and g a vector of the row's length"
    return RmsNorm(x, g, scale.outputs[0], float(np.asarray(eps).reshape(-1)[0]))


def accepts(facts: GroupFacts) -> Acceptance:
    found = match(facts.graph, facts.compute)
    if isinstance(found, str):
        return refuse(found)
    if facts.outputs != (found.y,):  # the kernel writes y alone: no other value may leave the group
        return refuse(f"the group also writes {', '.join(o for o in facts.outputs if o != found.y)}")
    return ACCEPT


def cost(facts: GroupFacts, price: Callable[[Collection[str]], Any]) -> Any:
    """Two passes over each row, in cache: the mean once a row, then the scaled row, which is what
    the generic loop nest's price counts for a reduction and what reads its result. That price: a
    tie with the shipped reduction kind over the same ops, which the rule's priority breaks."""
    return price(set(facts.compute))


def render_c(k: KernelContext, nodes: list[Node]) -> str:
    """The kernel body: one row per iteration, the sum of squares then the scaled row."""
    found = match(k.graph, [n.name for n in nodes])
    if isinstance(found, str):
        raise k.error(f"rms_norm: {found}")
    if tuple(k.group.outputs) != (found.y,):
        raise k.error(f"rms_norm writes {found.y} alone, the group's outputs are {list(k.group.outputs)}")
    shape = k.type(found.x).shape
    cols = shape[-1]
    return TEMPLATES.get_template("rms_norm.c.j2").render(
        rows=int(np.prod(shape[:-1])), cols=cols, x=k.pointer(found.x), g=k.pointer(found.g), y=k.pointer(found.y),
        eps=literal(found.eps, DType.FLOAT32), chunk=int(k.group.params.get("rows_per_chunk", 16)))


RMS_NORM = KernelKind(
    "rms_norm", "RMSNorm over the last axis (x / sqrt(mean(x^2) + eps) * g), two passes per row",
    accepts, params=(ParamSpec("rows_per_chunk", int, "rows a thread takes at a time (default 16)", 1),),
    renderers={"c": render_c}, colour="#ffd8a8", cost=cost)


def kinds() -> list[KernelKind]:
    """The kernel kinds this plugin adds."""
    return [RMS_NORM]
