"""Import an ONNX model as a statically shaped, verified :class:`~autofusion.ir.Graph`.

>>> from autofusion.frontends import load_onnx
>>> graph = load_onnx("tests/data/models/resnet_tiny_script.onnx")  # doctest: +SKIP

On the way in: old opsets are upgraded (if the converter fails, the model is imported at its own
opset with a warning, refusing the few ops whose meaning changed), ``Constant`` nodes and initializers become IR constants,
``Identity`` nodes disappear, every node whose inputs are all constant is evaluated (so exporters'
shape arithmetic becomes constants), nodes that no output needs are dropped, and symbolic dims are
bound from ``dims``. Every problem is reported as :class:`OnnxImportError`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from autofusion.frontends.onnx_proto import (
    ModelSource,
    OnnxImportError,
    UnboundDimensionError,
    constant_node_value,
    default_opset,
    element_type,
    input_type,
    load_model,
    tensor_value,
    upgrade_opset,
)
from autofusion.frontends.onnx_structure import (
    OnnxNode,
    check_single_definitions,
    check_supported,
    live_nodes,
    read_node,
    topological,
)
from autofusion.frontends.shape_values import UndecidedShapeValue, fold_symbolic
from autofusion.graph.dims import assumptions, symbol
from autofusion.graph.graph import Const, FrozenMap, Graph, Node, freeze_attrs
from autofusion.graph.types import TensorType
from autofusion.ir.infer import infer_node
from autofusion.ir.verify import VerifyError, verify
from autofusion.ops.catalog import default_registry
from autofusion.ops.indexing import shape_range
from autofusion.ops.registry import OpRegistry, ShapeError, UnknownOpError

__all__ = ["OnnxImportError", "load_onnx"]


@dataclass(frozen=True)
class _Opset:
    """The model's original ai.onnx opset, and whether it is still at it (the upgrade failed)."""

    version: int
    legacy: bool


def load_onnx(
    source: ModelSource,
    dims: Mapping[str, int] | None = None,
    registry: OpRegistry | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    values: Mapping[str, Any] | None = None,
    feeds: Mapping[str, Any] | None = None,
    symbolic: bool = True,
) -> Graph:
    """Import an ONNX model (file path, bytes or ``onnx.ModelProto``) as a verified IR graph.

    ``dims`` binds symbolic dimensions by name (``{"batch": 1, "seq": 128}``); a dimension without a
    name is bound as ``"INPUT[AXIS]"``. ``feeds`` (arrays for some or all of the inputs, as a run
    will pass them) bind the rest from their shapes: see :func:`dims_of_feeds`. ``values`` fixes
    graph inputs to constant arrays (needed when a shape depends on an input's value, e.g. Expand's
    target shape fed as an input); they are no longer graph inputs. ``base_dir`` locates external
    data for bytes or protos. The dimensions neither binds stay symbols (sizes known at run time):
    the graph's shapes are then expressions over them, one plan serves every size, and
    :func:`autofusion.ir.symbolic.bind` makes the static graph of a binding; with
    ``symbolic=False`` an unbound dimension is an error instead.
    """
    registry = registry or default_registry()
    model, where = load_model(source, base_dir)
    opset = default_opset(model)
    model, legacy = upgrade_opset(model, where)
    bound = dict(dims or {})
    for name, (size, seen) in dims_of_feeds(model.graph, feeds or {}).items():
        if bound.setdefault(name, size) != size:
            raise OnnxImportError(f"dimension {name!r} is bound to {bound[name]}, but {seen} has {size}")
    try:
        return _import_graph(model.graph, bound, registry, where, dict(values or {}), _Opset(opset, legacy), symbolic)
    except OnnxImportError:
        raise
    except (ShapeError, UnknownOpError, VerifyError, UndecidedShapeValue) as e:
        raise OnnxImportError(f"{where}: {e}") from None
    except (ValueError, TypeError, KeyError, IndexError) as e:  # bad input must not end in a traceback
        raise OnnxImportError(f"{where}: cannot import: {type(e).__name__}: {e}") from None


def dims_of_feeds(graph: onnx.GraphProto, feeds: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    """Each symbolic input dimension read off the arrays ``feeds`` gives for the graph's inputs: by
    name, or ``INPUT[AXIS]`` for an unnamed one, its size and the input and axis it came from.
    Inputs without an array are skipped. An array of another rank, a fixed dimension of another size,
    or a symbol given two sizes is an OnnxImportError naming the input and axis."""
    initializers = {t.name for t in graph.initializer}
    dims: dict[str, tuple[int, str]] = {}
    for v in graph.input:
        if v.name in initializers or v.name not in feeds or not v.type.tensor_type.HasField("shape"):
            continue
        shape = tuple(np.shape(feeds[v.name]))
        declared = v.type.tensor_type.shape.dim
        spelled = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in declared]
        if len(shape) != len(declared):
            raise OnnxImportError(f"input {v.name!r} is given as {list(shape)}, the model declares {spelled}: "
                                  f"{len(declared)} dimension(s)")
        for axis, (d, size) in enumerate(zip(declared, shape)):
            if d.HasField("dim_value") and d.dim_value >= 0:
                if size != d.dim_value:
                    raise OnnxImportError(f"input {v.name!r} is given as {list(shape)}, the model declares "
                                          f"{spelled}: axis {axis} is fixed at {d.dim_value}")
                continue
            key = d.dim_param if d.HasField("dim_param") and d.dim_param else f"{v.name}[{axis}]"
            here = f"input {v.name!r} (axis {axis})"
            if key in dims and dims[key][0] != size:
                raise OnnxImportError(f"dimension {key!r} is {dims[key][0]} in {dims[key][1]} but {size} in {here}")
            dims.setdefault(key, (int(size), here))
    return dims


def _import_graph(graph: onnx.GraphProto, dims: dict[str, int], registry: OpRegistry, where: str,
                  values: dict[str, Any], opset: _Opset, symbolic: bool = False) -> Graph:
    initializers = {t.name: t for t in graph.initializer}
    declared = [v.name for v in graph.input if v.name not in initializers]
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise OnnxImportError(f"values given for {unknown}, which are not graph inputs (inputs: {declared})")
    input_names = [n for n in declared if n not in values]
    output_names = [v.name for v in graph.output]
    if len(set(output_names)) != len(output_names):
        raise OnnxImportError(f"{where}: graph outputs repeat a name: {output_names}")
    defined = set(declared) | set(initializers)
    every_node = [read_node(i, n) for i, n in enumerate(graph.node)]
    check_single_definitions(every_node, defined)
    nodes = live_nodes(every_node, output_names)
    check_supported(nodes, registry)
    ordered = topological(nodes, defined, output_names)
    types = _input_types(graph, input_names, _SymbolsForUnbound(dims) if symbolic else dims)
    consts = {name: Const(tensor_value(t, f"initializer {name!r}")) for name, t in initializers.items()}
    consts.update(_fixed_inputs(graph, values))
    importer = _Importer(registry, types, consts, opset)
    with assumptions() as bounds:  # what the model's shapes take for granted of symbolic sizes
        result = importer.run(graph.name or "model", input_names, ordered, output_names)
    if bounds:
        result = result.replace(bounds=FrozenMap(sorted(bounds.items())))
    _check_declared_output_types(graph, result)
    return result


def _check_declared_output_types(proto: onnx.GraphProto, graph: Graph) -> None:
    """An output whose declared element type differs from what the graph computes means bad types."""
    for out in proto.output:
        code = out.type.tensor_type.elem_type if out.type.HasField("tensor_type") else 0
        if code:
            declared = element_type(code, f"graph output {out.name!r}")
            if declared != graph.types[out.name].dtype:
                raise OnnxImportError(f"graph output {out.name!r} is declared {declared} but computes "
                                      f"{graph.types[out.name].dtype}: the model's element types are inconsistent")


def _fixed_inputs(graph: onnx.GraphProto, values: Mapping[str, Any]) -> dict[str, Const]:
    """Graph inputs fixed by the caller, checked against the declared element type and shape."""
    by_name = {v.name: v for v in graph.input}
    out: dict[str, Const] = {}
    for name, value in values.items():
        arr = np.asarray(value)
        declared, _ = input_type(by_name[name], _AnyDims())
        if declared is not None and (arr.dtype != declared.dtype.numpy or arr.ndim != declared.rank):
            raise OnnxImportError(f"values[{name!r}] is {arr.dtype}{list(arr.shape)}, the model declares {declared}")
        out[name] = Const(arr) if declared is None else Const(arr.astype(declared.dtype.numpy))
    return out


class _AnyDims(dict):  # type: ignore[type-arg]
    """Binds every symbolic dim to 1: only element type and rank of a declared input are compared."""

    def get(self, key: Any, default: Any = None) -> int:
        return 1


class _SymbolsForUnbound(dict):  # type: ignore[type-arg]
    """The bound sizes, and for every other dimension the symbol of its name (``batch``, or
    ``INPUT[AXIS]`` for an unnamed one)."""

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        return default if isinstance(default, int) else symbol(str(key))


MAX_INPUT_BYTES = 1 << 48  # 256 TiB: a declared input beyond this is a broken model, not a big one


def _input_types(graph: onnx.GraphProto, names: Sequence[str], dims: Mapping[str, int]) -> dict[str, TensorType]:
    by_name = {v.name: v for v in graph.input}
    types: dict[str, TensorType] = {}
    unbound: dict[str, list[str]] = {}
    for name in names:
        t, missing = input_type(by_name[name], dims)
        for sym in missing:
            unbound.setdefault(sym, []).append(name)
        if t is not None:
            nbytes = math.prod(d for d in t.shape if isinstance(d, int)) * t.dtype.itemsize
            if nbytes > MAX_INPUT_BYTES:
                raise OnnxImportError(f"graph input {name!r} declares shape {list(t.shape)} ({nbytes:.3g} bytes), "
                                      f"beyond any machine's memory: is the model or a --dim binding wrong?")
            types[name] = t
    if unbound:
        listed = ", ".join(f"{sym!r} (in {', '.join(map(repr, users))})" for sym, users in unbound.items())
        example = ", ".join(f'"{sym}": N' for sym in unbound)
        flags = " ".join(f"--dim {sym}=N" for sym in unbound)
        raise UnboundDimensionError(f"unbound symbolic dimension(s) {listed}: running needs their sizes; bind "
                                    f"them with dims={{{example}}} (command line: {flags}, or --inputs FILE), or "
                                    "import with symbolic=True (the default) for one plan over every size",
                                    tuple(unbound))
    return types


class _Importer:
    """Walks the ordered nodes once: folds constants, drops Identity, infers every type."""

    def __init__(self, registry: OpRegistry, types: dict[str, TensorType], consts: dict[str, Const],
                 opset: _Opset) -> None:
        self.registry = registry
        self.opset = opset
        self.types = types
        self.consts = consts
        for name, c in consts.items():
            self.types[name] = c.type
        self.alias: dict[str, str] = {}
        self.nodes: list[Node] = []
        self.node_names: set[str] = set()

    def resolve(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def run(self, name: str, inputs: list[str], order: list[OnnxNode], outputs: list[str]) -> Graph:
        for n in order:
            self.add(n)
        self.bind_outputs(outputs)
        nodes = _prune(self.nodes, outputs)
        used = {i for n in nodes for i in n.inputs} | set(outputs)
        consts = {k: v for k, v in self.consts.items() if k in used}
        produced = {o for n in nodes for o in n.outputs}
        types = {k: t for k, t in self.types.items() if k in produced or k in consts or k in inputs}
        graph = Graph(name, tuple(inputs), tuple(outputs), tuple(nodes), FrozenMap(types), FrozenMap(consts))
        return verify(graph, self.registry)

    def add(self, n: OnnxNode) -> None:
        inputs = tuple(self.resolve(i) if i else "" for i in n.inputs)
        if n.op == "Constant":
            self.set_const(n.outputs[0], constant_node_value(n.attrs, n.label), n)
            return
        if n.op == "Identity":
            self.alias[n.outputs[0]] = inputs[0]
            return
        attrs = dict(n.attrs)
        inputs = self.legacy_fixes(n, inputs, attrs)
        if n.op == "Split" and (len(inputs) < 2 or not inputs[1]) and "split" not in attrs:
            attrs.setdefault("num_outputs", len(n.outputs))  # the IR carries the part count on the node
        if all(i in self.consts for i in inputs if i) or n.op in ("Shape", "Size"):
            if self.fold(n, inputs, attrs):  # static shapes: Shape and Size are known at import time
                return
        node = Node(n.op, inputs, n.outputs, self.freeze(n, attrs), self.unique_name(n))
        try:
            out_types = infer_node(node, self.types, self.consts, self.registry)
        except ShapeError as e:
            raise OnnxImportError(f"{e}{self.value_hint(node, str(e))}") from None
        for o, t in zip(n.outputs, out_types):
            if o:
                self.types[o] = t
        self.nodes.append(node)

    def legacy_semantics(self, n: OnnxNode, attrs: dict[str, Any], inputs: tuple[str, ...]) -> None:
        """An op of a model left below opset 13 whose meaning changed since: map it or refuse it."""
        if n.op in ("Softmax", "LogSoftmax", "Hardmax") and inputs[0] in self.types:
            rank = self.types[inputs[0]].rank
            axis = int(attrs.get("axis", 1)) % max(rank, 1)
            if axis != rank - 1:  # before opset 13 these normalise over all axes from `axis` on
                raise OnnxImportError(
                    f"{n.label}: at opset {self.opset.version} it normalises over axes {axis}..{rank - 1} together, "
                    f"which cannot be imported without the failed opset upgrade; re-export at opset 13 or newer")
            attrs["axis"] = axis
        if n.op == "Concat" and self.opset.version < 4:
            attrs.setdefault("axis", 1)  # the default before opset 4

    def legacy_fixes(self, n: OnnxNode, inputs: tuple[str, ...], attrs: dict[str, Any]) -> tuple[str, ...]:
        """Semantics the opset converter does not carry over from very old models."""
        if self.opset.legacy:
            self.legacy_semantics(n, attrs, inputs)
        if n.op == "PRelu" and self.opset.version < 7 and inputs[1] in self.consts and inputs[0] in self.types:
            slope, x = self.consts[inputs[1]].array, self.types[inputs[0]]
            if slope.ndim == 1 and x.rank > 2 and slope.size == x.shape[1]:
                name = f"{inputs[1]}__per_channel"  # opset 6 PRelu: a 1-D slope is per channel
                self.set_const(name, slope.reshape((-1,) + (1,) * (x.rank - 2)), n)
                return (inputs[0], name)
        return inputs

    def value_hint(self, node: Node, message: str) -> str:
        """When a shape needs a value that comes from graph inputs, say which to fix."""
        if "must be a constant" not in message:
            return ""
        producer = {o: n for n in self.nodes for o in n.outputs}
        sources: set[str] = set()
        wanted = self.registry[node.op].const_inputs
        stack = [i for k, i in enumerate(node.inputs) if k in wanted and i and i not in self.consts]
        while stack:
            t = stack.pop()
            if t in producer:
                stack.extend(i for i in producer[t].inputs if i and i not in self.consts)
            else:
                sources.add(t)
        if not sources:
            return ""
        names = ", ".join(f"{s!r}: ..." for s in sorted(sources))
        return (f"; the value depends on graph input(s) {sorted(sources)}, and static shapes need it known: "
                f"fix them with values={{{names}}}")

    def fold(self, n: OnnxNode, inputs: tuple[str, ...], attrs: dict[str, Any]) -> bool:
        """Evaluate ``n`` at import; False when its inputs are symbolic constants it cannot fold
        (it then stays a node)."""
        if n.op in ("Shape", "Size") and inputs[0] not in self.consts and not self.types[inputs[0]].is_static:
            self.set_const(n.outputs[0], _symbolic_shape(n.op, self.types[inputs[0]].shape, attrs), n)
            return True
        opdef = self.registry[n.op]
        args: list[np.ndarray | None] = []
        for i in inputs:
            if not i:
                args.append(None)
            elif i in self.consts:
                args.append(self.consts[i].array)
            else:  # Shape/Size of a non-constant tensor: only its type matters (a zero-stride stand-in)
                t = self.types[i]
                args.append(np.broadcast_to(np.zeros((), t.dtype.numpy), t.shape))
        try:
            with np.errstate(all="ignore"):
                if any(a is not None and a.dtype == object for a in args):
                    values = fold_symbolic(n.op, args, attrs, opdef.reference)
                    if values is None:
                        return False
                else:
                    values = opdef.reference(args, attrs)
        except UndecidedShapeValue as e:
            raise OnnxImportError(f"{n.label}: {e}; bind that size (dims=...) to import the model") from None
        except (ShapeError, ValueError, IndexError, TypeError, KeyError, AssertionError) as e:
            raise OnnxImportError(f"{n.label}: evaluating it on constant inputs failed: {e}") from None
        for o, v in zip(n.outputs, values):
            if o:
                self.set_const(o, np.asarray(v), n)
        return True

    def set_const(self, name: str, value: np.ndarray, n: OnnxNode) -> None:
        try:
            c = Const(value)
            t = c.type
        except ValueError as e:
            raise OnnxImportError(f"{n.label}: constant {name!r}: {e}") from None
        self.consts[name] = c
        self.types[name] = t

    def freeze(self, n: OnnxNode, attrs: Mapping[str, Any]) -> Any:
        value = attrs.get("value")
        if n.op == "ConstantOfShape" and isinstance(value, np.ndarray) and value.size == 1 \
                and value.dtype in (np.float32, np.int64, np.bool_):  # of a symbolic shape: a scalar keeps it
            attrs = {**attrs, "value": value.reshape(()).item()}
        for k, v in attrs.items():
            if isinstance(v, np.ndarray):
                raise OnnxImportError(f"{n.label}: tensor attribute {k!r} on a node that does not fold to a "
                                      "constant is not supported")
        return freeze_attrs(attrs)

    def unique_name(self, n: OnnxNode) -> str:
        base = n.name or f"{n.op.lower()}_{n.index}"
        name, k = base, 1
        while name in self.node_names:
            k += 1
            name = f"{base}_{k}"
        self.node_names.add(name)
        return name

    def bind_outputs(self, outputs: list[str]) -> None:
        """Keep graph output names exact when an Identity (now removed) produced them."""
        renames: dict[str, str] = {}
        producers = {o for n in self.nodes for o in n.outputs}
        protected = set(outputs)
        for o in outputs:
            src = self.resolve(o)
            if src == o:
                continue
            if src in self.consts:
                self.consts[o] = self.consts[src]
                self.types[o] = self.types[src]
            elif src in producers and src not in protected and src not in renames:
                renames[src] = o  # the producer writes the output name directly
                self.types[o] = self.types[src]
            else:  # a graph input or another output: keep one copy
                self.nodes.append(Node("Identity", (renames.get(src, src),), (o,), freeze_attrs({}),
                                       self.unique_name(OnnxNode(-1, f"identity_{o}", "Identity", "", (), (), {}))))
                self.types[o] = self.types[src]
        if renames:
            self.nodes = [n.replace(inputs=tuple(renames.get(i, i) for i in n.inputs),
                                    outputs=tuple(renames.get(o, o) for o in n.outputs)) for n in self.nodes]


def _symbolic_shape(op: str, shape: tuple[Any, ...], attrs: Mapping[str, Any]) -> np.ndarray:
    """``Shape`` (or ``Size``) of a tensor of symbolic sizes: a symbolic constant."""
    values = [math.prod(shape)] if op == "Size" else list(shape)[shape_range(len(shape), attrs.get)]
    out = np.empty(len(values), object)
    out[:] = values
    return out.reshape(()) if op == "Size" else out


def _prune(nodes: list[Node], outputs: Sequence[str]) -> list[Node]:
    """Drop nodes that no output needs (their inputs may have folded to constants)."""
    needed = set(outputs)
    keep: list[Node] = []
    for n in reversed(nodes):
        if any(o in needed for o in n.outputs):
            keep.append(n)
            needed.update(i for i in n.inputs if i)
    return keep[::-1]
