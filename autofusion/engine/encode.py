"""Graphs as e-graph terms, in egglog's text language.

A tensor is an ``Expr``. ``(Op op attrs args)`` applies an op (attributes as canonical text, inputs
as a ``Cons`` list); ops with several outputs are read through ``(Proj op i)``. Leaves: graph
inputs ``(In name)``, named constants ``(Cst name)``, scalar constants ``(Num value dtype shape)``
and small integer vectors ``(Vec text)`` (shapes, axes). Every term the engine creates is
``let``-bound to a handle ``$hN`` and recorded in the ``handle`` relation, so a row of the
serialized e-graph can always be named again in a later command.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from autofusion.ir.graph import FrozenMap, Graph, Node, freeze_attrs
from autofusion.ops.registry import OpRegistry

DECLARATIONS = """
(datatype*
  (Expr
    (Op String String Args)
    (Proj Expr i64)
    (In String)
    (Cst String)
    (Num f64 String String)
    (Vec String))
  (Args (Nil) (Cons Expr Args)))
(relation handle (Expr String))
(relation in-class (String String))
"""

# constants up to this many elements become Num/Vec leaves so literal patterns can match them
SMALL_VECTOR = 16


def attrs_text(attrs: Mapping[str, Any]) -> str:
    """Canonical text of attributes: sorted ``name=json`` joined by ``;``."""
    return ";".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(attrs.items()))


def parse_attrs(text: str) -> FrozenMap[str, Any]:
    if not text:
        return FrozenMap()
    out = {}
    for part in text.split(";"):
        name, _, value = part.partition("=")
        out[name] = json.loads(value)
    return freeze_attrs(out)


def quote(text: str) -> str:
    """An egglog string literal."""
    return json.dumps(text)


def f64(value: float) -> str:
    text = repr(float(value))
    return text if any(c in text for c in ".e") else text + ".0"


def uniform_value(array: np.ndarray) -> float | None:
    """The single value of a constant whose elements are all equal (None otherwise)."""
    if array.size == 0 or array.dtype == np.bool_:
        return None
    flat = array.reshape(-1)
    first = flat[0]
    if not np.all(flat == first):
        return None
    v = float(first)
    return v if math.isfinite(v) else None


def multi_output(registry: OpRegistry, op: str) -> bool:
    opdef = registry.get(op)
    return opdef is None or opdef.num_outputs != 1


class Encoder:
    """Builds the commands that put a graph into the e-graph and names every tensor's handle."""

    def __init__(self, registry: OpRegistry) -> None:
        self.registry = registry
        self.commands: list[str] = [DECLARATIONS]
        self.handle_of: dict[str, str] = {}  # tensor name -> handle
        self._count = 0

    def fresh(self) -> str:
        self._count += 1
        return f"$h{self._count}"

    def bind(self, expr: str) -> str:
        """``let``-bind ``expr`` to a new handle and record it; returns the handle."""
        h = self.fresh()
        self.commands.append(f"(let {h} {expr})")
        self.commands.append(f"(handle {h} {quote(h)})")
        return h

    def classes(self, classes: Mapping[str, frozenset[str]]) -> None:
        for cls, ops in sorted(classes.items()):
            for op in sorted(ops):
                self.commands.append(f"(in-class {quote(op)} {quote(cls)})")

    def leaf_for_constant(self, name: str, array: np.ndarray) -> str:
        h = self.bind(f"(Cst {quote(name)})")
        v = uniform_value(array)
        if v is not None:
            shape = json.dumps(list(array.shape), separators=(",", ":"))
            self.commands.append(f"(union {h} (Num {f64(v)} {quote(str(array.dtype))} {quote(shape)}))")
        if array.ndim <= 1 and array.size <= SMALL_VECTOR and np.issubdtype(array.dtype, np.integer):
            text = json.dumps([int(x) for x in array.reshape(-1)], separators=(",", ":"))
            self.commands.append(f"(union {h} (Vec {quote(text)}))")
        return h

    def op_expr(self, node: Node, args: list[str]) -> str:
        cons = "(Nil)"
        for a in reversed(args):
            cons = f"(Cons {a} {cons})"
        return f"(Op {quote(node.op)} {quote(attrs_text(node.attrs))} {cons})"

    def graph(self, graph: Graph) -> None:
        for name in graph.inputs:
            self.handle_of[name] = self.bind(f"(In {quote(name)})")
        for name, const in graph.constants.items():
            self.handle_of[name] = self.leaf_for_constant(name, const.array)
        for node in graph.nodes:
            args = [self.handle_of[i] if i else self._absent() for i in node.inputs]
            op = self.bind(self.op_expr(node, args))
            if multi_output(self.registry, node.op):
                for k, out in enumerate(node.outputs):
                    if out:
                        self.handle_of[out] = self.bind(f"(Proj {op} {k})")
            else:
                self.handle_of[node.outputs[0]] = op

    def _absent(self) -> str:
        """An omitted optional input: one shared leaf."""
        h = self.handle_of.get("")
        if h is None:
            h = self.bind('(In "")')
            self.handle_of[""] = h
        return h
