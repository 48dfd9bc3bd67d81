"""A small builder so any graph compiler can construct an IR graph without ONNX.

>>> from autofusion.ir import GraphBuilder, DType
>>> import numpy as np
>>> b = GraphBuilder("mlp")
>>> x = b.input("x", (4, 8), DType.FLOAT32)
>>> w = b.const(np.ones((8, 16), np.float32), "w")
>>> y = b.op("Relu", b.op("MatMul", x, w))
>>> g = b.build([y])
>>> g.types[y].shape
(4, 16)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.dims import Dim, as_dim, bounded
from autofusion.graph.graph import Const, FrozenMap, Graph, Node, freeze_attrs
from autofusion.graph.types import DType, TensorType
from autofusion.ir.infer import infer_node
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry


class GraphBuilder:
    """Adds inputs, constants and ops one at a time, inferring every output type as it goes."""

    def __init__(self, name: str = "graph", registry: OpRegistry | None = None) -> None:
        self.name = name
        self.registry = registry or default_registry()
        self._inputs: list[str] = []
        self._nodes: list[Node] = []
        self._types: dict[str, TensorType] = {}
        self._consts: dict[str, Const] = {}
        self._counter = 0

    def _fresh(self, base: str) -> str:
        base = re.sub(r"\W", "_", base) or "t"
        while True:
            self._counter += 1
            name = f"{base}_{self._counter}"
            if name not in self._types:
                return name

    def _claim(self, name: str) -> str:
        if name in self._types:
            raise ValueError(f"tensor name {name!r} is already defined")
        return name

    def input(self, name: str, shape: Sequence[Dim], dtype: DType | str = DType.FLOAT32) -> str:
        """A graph input; a size may be symbolic (``autofusion.graph.dims.symbol("seq")``)."""
        self._claim(name)
        self._types[name] = TensorType(tuple(as_dim(d) for d in shape), DType.of(dtype))
        self._inputs.append(name)
        return name

    def const(self, value: np.ndarray | float | int | Sequence[Any], name: str | None = None) -> str:
        arr = np.asarray(value)
        if arr.dtype == np.float64 and not isinstance(value, np.ndarray):
            arr = arr.astype(np.float32)  # Python floats mean fp32 unless the array says otherwise
        name = self._claim(name) if name else self._fresh("const")
        c = Const(arr)
        self._consts[name] = c
        self._types[name] = c.type
        return name

    def const_array(self, name: str) -> np.ndarray:
        """The value of constant ``name``: the builder's own read-only copy."""
        return self._consts[name].array

    def op(self, op: str, *inputs: str, name: str | None = None, **attrs: Any) -> str:
        """Add one single-output op and return its output tensor's name."""
        return self.op_multi(op, list(inputs), 1, name=name, **attrs)[0]

    def op_multi(
        self,
        op: str,
        inputs: Sequence[str],
        num_outputs: int,
        name: str | None = None,
        output_names: Sequence[str] | None = None,
        attrs: Mapping[str, Any] | None = None,
        **more_attrs: Any,
    ) -> list[str]:
        """Add an op with ``num_outputs`` outputs (e.g. Split) and return their names.

        Attributes come as keywords, or in ``attrs`` for names that clash with the parameters
        (Split's ``num_outputs``).
        """
        attrs = {**(attrs or {}), **more_attrs}
        node_name = name or self._fresh(op.lower())
        outs = list(output_names) if output_names else [
            self._fresh(node_name) if num_outputs > 1 else node_name + "_out" for _ in range(num_outputs)]
        for o in outs:
            self._claim(o)
        node = Node(op, tuple(inputs), tuple(outs), freeze_attrs(attrs), node_name)
        types = infer_node(node, self._types, self._consts, self.registry)
        for o, t in zip(outs, types):
            self._types[o] = t
        self._nodes.append(node)
        return outs

    def type_of(self, tensor: str) -> TensorType:
        return self._types[tensor]

    def build(self, outputs: Sequence[str], name: str | None = None) -> Graph:
        """The graph with ``outputs``; unused constants are dropped."""
        used = {i for n in self._nodes for i in n.inputs} | set(outputs)
        consts = {k: v for k, v in self._consts.items() if k in used}
        types = {k: v for k, v in self._types.items() if k not in self._consts or k in consts}
        return Graph(
            name or self.name,
            tuple(self._inputs),
            tuple(outputs),
            tuple(self._nodes),
            FrozenMap(types),
            FrozenMap(consts),
        )


def graph_from_nodes(
    name: str,
    inputs: Mapping[str, TensorType],
    constants: Mapping[str, np.ndarray | Const],
    nodes: Sequence[Node],
    outputs: Sequence[str],
    registry: OpRegistry | None = None,
    bounds: Mapping[str, int] | None = None,
) -> Graph:
    """A graph from nodes in topological order, inferring every type (used by frontends and
    rewriting); ``bounds`` are what symbolic sizes take for granted (see ``Graph.bounds``)."""
    registry = registry or default_registry()
    types: dict[str, TensorType] = dict(inputs)
    consts = {k: v if isinstance(v, Const) else Const(v) for k, v in constants.items()}
    for k, c in consts.items():
        types[k] = c.type
    with bounded(bounds or {}):
        for node in nodes:
            for o, t in zip(node.outputs, infer_node(node, types, consts, registry)):
                if o:
                    types[o] = t
    return Graph(name, tuple(inputs), tuple(outputs), tuple(nodes), FrozenMap(types), FrozenMap(consts),
                 FrozenMap(sorted((bounds or {}).items())))
