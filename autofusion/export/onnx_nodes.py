"""IR nodes as ONNX opset-18 nodes.

The IR accepts the attribute forms of several opsets (``ReduceMean(axes=...)`` from opset 17,
``Slice(starts=...)`` from opset 9, ...). ONNX 18 wants most of those as constant inputs, so each
node is normalised here: legacy attributes become ``Constant`` nodes feeding the right input,
attributes are typed by the opset-18 schema, and ops newer than opset 18 (``Gelu``) are expanded
into opset-18 ops. Every problem raises :class:`OnnxExportError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from autofusion.graph.graph import Graph, Node
from autofusion.graph.types import DType

OPSET = 18

# ops whose reduction axes moved from an attribute to input 1
_AXES_AS_INPUT = frozenset({
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
    "ReduceProd", "ReduceSum", "ReduceSumSquare", "Squeeze", "Unsqueeze",
})


class OnnxExportError(ValueError):
    """A plan cannot be written as ONNX (an op or attribute without an opset-18 form)."""


@dataclass
class NodeWriter:
    """Turns IR nodes into NodeProtos; fresh names for helper constants come from ``taken``."""

    graph: Graph
    taken: set[str] = field(default_factory=set)
    counter: int = 0

    def fresh(self, base: str) -> str:
        while True:
            self.counter += 1
            name = f"{base}__{self.counter}"
            if name not in self.taken and name not in self.graph.types:
                self.taken.add(name)
                return name

    def constant(self, value: np.ndarray, base: str, out: list[onnx.NodeProto]) -> str:
        """A ``Constant`` node holding ``value``, appended to ``out``; returns its output name."""
        name = self.fresh(base)
        out.append(helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name)))
        return name

    def nodes(self, node: Node) -> list[onnx.NodeProto]:
        """The opset-18 nodes that compute ``node`` (usually one, preceded by helper constants)."""
        expand = _EXPANSIONS.get(node.op)
        if expand is not None:
            return expand(self, node)
        out: list[onnx.NodeProto] = []
        attrs = dict(node.attrs)
        inputs = list(node.inputs)
        _LEGACY.get(node.op, _keep)(self, node, attrs, inputs, out)
        schema = _schema(node)
        typed = {k: _attribute(node, schema, k, v, self.graph) for k, v in attrs.items()}
        while inputs and inputs[-1] == "":
            inputs.pop()  # trailing omitted optional inputs are simply left out
        proto = helper.make_node(node.op, inputs, list(node.outputs), name=node.name or None)
        proto.attribute.extend(typed.values())
        out.append(proto)
        return out


def _schema(node: Node) -> onnx.defs.OpSchema:
    try:
        schema = onnx.defs.get_schema(node.op, OPSET, "")
    except onnx.defs.SchemaError:
        raise OnnxExportError(f"node {node.name!r}: op {node.op!r} has no ONNX opset-{OPSET} form") from None
    if schema.deprecated:
        raise OnnxExportError(f"node {node.name!r}: op {node.op!r} is deprecated at ONNX opset {OPSET}")
    return schema


def _attribute(node: Node, schema: onnx.defs.OpSchema, key: str, value: Any, graph: Graph) -> AttributeProto:
    spec = schema.attributes.get(key)
    if spec is None:
        raise OnnxExportError(f"node {node.name!r}: {node.op} has no attribute {key!r} at ONNX opset {OPSET}")
    kind = spec.type
    T = AttributeProto.AttributeType
    if kind == T.INT:
        return helper.make_attribute(key, int(value))
    if kind == T.FLOAT:
        return helper.make_attribute(key, float(value))
    if kind == T.STRING:
        return helper.make_attribute(key, str(value))
    if kind == T.INTS:
        return helper.make_attribute(key, [int(v) for v in _seq(value)], attr_type=T.INTS)
    if kind == T.FLOATS:
        return helper.make_attribute(key, [float(v) for v in _seq(value)], attr_type=T.FLOATS)
    if kind == T.STRINGS:
        return helper.make_attribute(key, [str(v) for v in _seq(value)], attr_type=T.STRINGS)
    if kind == T.TENSOR:  # ConstantOfShape's value: frozen to plain numbers, typed by the output
        dtype = graph.types[node.outputs[0]].dtype.numpy
        return helper.make_attribute(key, numpy_helper.from_array(np.asarray(_seq(value), dtype=dtype).reshape(1)))
    raise OnnxExportError(f"node {node.name!r}: attribute {key!r} of kind {T.Name(kind)} is not supported")


def _seq(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


# -- legacy attribute forms ---------------------------------------------------------------------------

Legacy = Callable[[NodeWriter, Node, dict[str, Any], list[str], list[onnx.NodeProto]], None]


def _keep(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    return None


def _set_input(inputs: list[str], index: int, name: str) -> None:
    while len(inputs) <= index:
        inputs.append("")
    inputs[index] = name


def _ints_input(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto],
                attr: str, index: int) -> None:
    """Attribute ``attr`` (a list of ints) as an int64 constant at input ``index``."""
    value = attrs.pop(attr, None)
    if value is None:
        return
    if len(inputs) > index and inputs[index]:
        raise OnnxExportError(f"node {node.name!r}: {node.op} has {attr!r} both as attribute and as input")
    _set_input(inputs, index, w.constant(np.asarray(_seq(value), dtype=np.int64), f"{node.name}/{attr}", out))


def _axes(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    _ints_input(w, node, attrs, inputs, out, "axes", 1)


def _slice(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    for index, attr in ((1, "starts"), (2, "ends"), (3, "axes")):
        _ints_input(w, node, attrs, inputs, out, attr, index)


def _split(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    _ints_input(w, node, attrs, inputs, out, "split", 1)


def _scalar_like(w: NodeWriter, node: Node, value: Any, what: str, out: list[onnx.NodeProto]) -> str:
    dtype = w.graph.types[node.inputs[0]].dtype.numpy
    return w.constant(np.asarray(value, dtype=dtype), f"{node.name}/{what}", out)


def _clip(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    for index, attr in ((1, "min"), (2, "max")):
        value = attrs.pop(attr, None)
        if value is not None:
            _set_input(inputs, index, _scalar_like(w, node, value, attr, out))


def _pad(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    _ints_input(w, node, attrs, inputs, out, "pads", 1)
    value = attrs.pop("value", None)
    if value is not None and float(value) != 0.0:
        _set_input(inputs, 2, _scalar_like(w, node, value, "value", out))
    if attrs.get("mode") == "wrap":
        raise OnnxExportError(f"node {node.name!r}: Pad mode 'wrap' needs ONNX opset 19")


def _dropout(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    attrs.pop("ratio", None)  # inference-mode Dropout ignores the ratio


def _cast(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    attrs.pop("saturate", None)  # opset 19's saturate concerns float8 types only, which the IR has none of


def _avg_pool(w: NodeWriter, node: Node, attrs: dict[str, Any], inputs: list[str], out: list[onnx.NodeProto]) -> None:
    dilations = attrs.pop("dilations", None)
    if dilations is not None and any(int(d) != 1 for d in _seq(dilations)):
        raise OnnxExportError(f"node {node.name!r}: dilated AveragePool needs ONNX opset 19")


_LEGACY: dict[str, Legacy] = {
    **{op: _axes for op in _AXES_AS_INPUT},
    "Slice": _slice,
    "Split": _split,
    "Clip": _clip,
    "Pad": _pad,
    "Dropout": _dropout,
    "Cast": _cast,
    "AveragePool": _avg_pool,
}


# -- ops newer than opset 18, written with opset-18 ops -------------------------------------------------


def _gelu(w: NodeWriter, node: Node) -> list[onnx.NodeProto]:
    """``0.5 x (1 + erf(x / sqrt 2))``, or the tanh form for ``approximate="tanh"``."""
    x, y = node.inputs[0], node.outputs[0]
    dtype = w.graph.types[x].dtype
    out: list[onnx.NodeProto] = []

    def const(value: float) -> str:
        return w.constant(np.asarray(value, dtype=dtype.numpy), f"{node.name}/c", out)

    def op(op_type: str, *args: str, output: str | None = None) -> str:
        name = output or w.fresh(f"{node.name}/{op_type}")
        out.append(helper.make_node(op_type, list(args), [name], name=w.fresh(f"{node.name}/{op_type}_node")))
        return name

    approximate = str(node.attr("approximate", "none"))
    if approximate == "tanh":
        cube = op("Mul", op("Mul", x, x), x)
        inner = op("Add", x, op("Mul", cube, const(0.044715)))
        core = op("Tanh", op("Mul", inner, const(math.sqrt(2.0 / math.pi))))
    elif approximate == "none":
        core = op("Erf", op("Mul", x, const(1.0 / math.sqrt(2.0))))
    else:
        raise OnnxExportError(f"node {node.name!r}: Gelu approximate={approximate!r} is unknown")
    op("Mul", op("Mul", x, const(0.5)), op("Add", core, const(1.0)), output=y)
    return out


_EXPANSIONS: Mapping[str, Callable[[NodeWriter, Node], list[onnx.NodeProto]]] = {"Gelu": _gelu}


def elem_type(dtype: DType) -> int:
    """The ONNX element-type code of an IR dtype."""
    return int(helper.np_dtype_to_tensor_dtype(dtype.numpy))
