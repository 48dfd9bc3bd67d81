"""A fusion plan as an ONNX model: every fused kernel a model-local function, called once.

>>> import numpy as np
>>> from autofusion.api import optimize
>>> from autofusion.ir import GraphBuilder
>>> b = GraphBuilder("mlp")
>>> x = b.input("x", (2, 4))
>>> y = b.op("Relu", b.op("MatMul", x, b.const(np.ones((4, 4), np.float32), "w")))
>>> model = to_onnx(optimize(b.build([y]), rules=[]))
>>> [n.op_type for n in model.graph.node]
['MatMul', 'Relu']

``plan.graph`` (the graph after algebraic rewrites, with the source's input and output names) is
written at ONNX opset 18. A group of more than one node becomes a ``FunctionProto`` in the
``autofusion`` domain named after its kernel, whose doc string names the rules (file:line) that
allowed it; the main graph calls it once. Single-node groups stay plain nodes. IR constants become
initializers (a kernel receives the weights it reads as inputs).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autofusion import __version__
from autofusion.decide.plan import FusedGroup, Plan
from autofusion.export.onnx_nodes import OPSET, NodeWriter, OnnxExportError, elem_type
from autofusion.export.onnx_sizes import SizeWriter
from autofusion.graph.graph import Graph

DOMAIN = "autofusion"
DOMAIN_VERSION = 1
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifier(name: str, taken: set[str]) -> str:
    """``name`` as an identifier (letters, digits, ``_``; not starting with a digit), unique in ``taken``."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", name) or "kernel"
    if not _IDENTIFIER.fullmatch(base):
        base = f"_{base}"
    candidate, k = base, 1
    while candidate in taken:
        k += 1
        candidate = f"{base}_{k}"
    taken.add(candidate)
    return candidate


def _value_info(graph: Graph, name: str) -> onnx.ValueInfoProto:
    t = graph.types[name]
    shape = [d if isinstance(d, int) else str(d) for d in t.shape]  # a symbolic size as its dim_param
    return helper.make_tensor_value_info(name, elem_type(t.dtype), shape)


def _doc(plan: Plan, group: FusedGroup) -> str:
    ops = " ".join(plan.graph.node_by_name[n].op for n in group.nodes)
    rules = "; ".join(f"{r.name} ({r.file}:{r.line})" if r.file else r.name for r in group.rules) or "none"
    return (f"autofusion kernel {group.name}: template {group.template}, kind {group.kind}; ops: {ops}; "
            f"fused by rules: {rules}")


def _function(plan: Plan, group: FusedGroup, name: str, writer: NodeWriter) -> onnx.FunctionProto:
    graph = plan.graph
    body: list[onnx.NodeProto] = []
    for node_name in group.nodes:
        body.extend(writer.nodes(graph.node_by_name[node_name]))
    return helper.make_function(
        DOMAIN, name, inputs=list(group.inputs), outputs=list(group.outputs), nodes=body,
        opset_imports=[helper.make_opsetid("", OPSET)], doc_string=_doc(plan, group))


def _used_constants(graph: Graph) -> Iterable[str]:
    used = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
    return [name for name in graph.constants if name in used]


def to_onnx(plan: Plan, producer: str = "autofusion") -> onnx.ModelProto:
    """The plan as an ONNX model (opset 18 plus the ``autofusion`` function domain).

    Raises :class:`OnnxExportError` for an op or attribute without an opset-18 form.
    """
    graph = plan.graph
    _check_plan(plan)
    writer = NodeWriter(graph, taken={n.name for n in graph.nodes})
    names: set[str] = set()
    functions: list[onnx.FunctionProto] = []
    nodes: list[onnx.NodeProto] = SizeWriter(graph, writer.fresh).constants()  # symbolic constants
    for group in plan.groups:
        if not group.fused:
            nodes.extend(writer.nodes(graph.node_by_name[group.nodes[0]]))
            continue
        fname = identifier(group.name, names)
        functions.append(_function(plan, group, fname, writer))
        call = helper.make_node(fname, list(group.inputs), list(group.outputs), name=group.name, domain=DOMAIN)
        call.doc_string = functions[-1].doc_string
        nodes.append(call)
    initializers = [numpy_helper.from_array(np.array(graph.constants[c].array, order="C"), c)
                    for c in _used_constants(graph) if not graph.constants[c].is_symbolic]
    outer = {o for n in nodes for o in n.output} - set(graph.outputs)
    value_info = [_value_info(graph, t) for t in graph.types if t in outer]
    proto = helper.make_graph(
        nodes, graph.name or "model",
        inputs=[_value_info(graph, i) for i in graph.inputs],
        outputs=[_value_info(graph, o) for o in graph.outputs],
        initializer=initializers, value_info=value_info,
        doc_string=f"fused by autofusion ({plan.strategy or 'default'} strategy): {plan.kernels} kernels")
    model = helper.make_model(
        proto, functions=functions, producer_name=producer, producer_version=__version__,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    model.ir_version = min(model.ir_version, 9)  # readable by older runtimes; 9 is enough for opset 18 functions
    return model


def _check_plan(plan: Plan) -> None:
    """Every node in exactly one group: a plan that is not a partition cannot be written."""
    seen: dict[str, str] = {}
    for group in plan.groups:
        for n in group.nodes:
            if n in seen:
                raise OnnxExportError(f"node {n!r} is in kernels {seen[n]!r} and {group.name!r}")
            if n not in plan.graph.node_by_name:
                raise OnnxExportError(f"kernel {group.name!r} names node {n!r}, which the graph does not have")
            seen[n] = group.name
    missing = [n.name for n in plan.graph.nodes if n.name not in seen]
    if missing:
        raise OnnxExportError(f"nodes in no kernel: {', '.join(missing[:5])}")


def save_onnx(plan: Plan, path: str | os.PathLike[str], check: bool = True) -> Path:
    """Write :func:`to_onnx` of ``plan`` to ``path`` atomically (a temporary file, then a rename).

    With ``check`` the model must pass ``onnx.checker.check_model(full_check=True)`` first; nothing
    is written when building or checking fails.
    """
    target = Path(path)
    model = to_onnx(plan)
    if check:
        try:
            onnx.checker.check_model(model, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            raise OnnxExportError(f"the exported model fails the ONNX checker: {e}") from None
    try:
        data = model.SerializeToString()
    except ValueError as e:  # protobuf's 2 GiB limit; raised before any file is created
        raise OnnxExportError(f"the model cannot be serialised: {e}") from None
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
