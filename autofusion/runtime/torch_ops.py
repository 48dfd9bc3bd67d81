"""IR ops as torch calls: a whole graph as a ``torch.fx.GraphModule`` (one torch call per IR op,
weights as buffers: the benchmarks' torch_eager runner), or one node at a time on tensors wherever
they live (the Triton runner's ops that have no Triton kernel, on the device).

Imports torch at module level: import this module only where torch is installed (the benchmark
runners do so lazily). Shapes are static, so shape-only ops (Reshape, Expand, Flatten, Cast's
target type) take their result type from the IR instead of reading shape tensors at run time.

>>> # module = to_torch_module(graph); outputs = module(*[torch.from_numpy(feeds[n]) for n in graph.inputs])
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from autofusion.graph.graph import Graph, Node
from autofusion.graph.types import DType
from autofusion.ops.catalog import default_registry
from autofusion.ops.spatial import window


class UnsupportedOpError(ValueError):
    """An IR op the torch conversion has no rule for."""


_DTYPES: dict[DType, torch.dtype] = {
    DType.FLOAT32: torch.float32, DType.FLOAT64: torch.float64, DType.FLOAT16: torch.float16,
    DType.INT64: torch.int64, DType.INT32: torch.int32, DType.INT16: torch.int16, DType.INT8: torch.int8,
    DType.UINT8: torch.uint8, DType.BOOL: torch.bool,
}


def torch_dtype(dtype: DType) -> torch.dtype:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise UnsupportedOpError(f"no torch type for {dtype}") from None


# -- the op functions the FX graph calls (torch.compile traces through them) -------------------


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates


def _reshape(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return x.reshape(shape)


def _expand(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return x.expand(shape)


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype)


def _permute(x: torch.Tensor, perm: tuple[int, ...]) -> torch.Tensor:
    return x.permute(perm)


def _gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float, beta: float,
          trans_a: bool, trans_b: bool) -> torch.Tensor:
    a = a.t() if trans_a else a
    b = b.t() if trans_b else b
    y = torch.matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return y


def _gather(data: torch.Tensor, idx: torch.Tensor, axis: int) -> torch.Tensor:
    size = data.shape[axis]
    flat = idx.reshape(-1).to(torch.int64)
    flat = torch.where(flat < 0, flat + size, flat)  # ONNX indices may count from the end
    picked = torch.index_select(data, axis, flat)
    return picked.reshape(tuple(data.shape[:axis]) + tuple(idx.shape) + tuple(data.shape[axis + 1:]))


def _softmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.softmax(x, dim=axis)


def _layer_norm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None, *, axis: int,
                epsilon: float) -> torch.Tensor:
    axis = axis % x.dim()
    return F.layer_norm(x, tuple(x.shape[axis:]), scale, bias, epsilon)


def _batch_norm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor,
                var: torch.Tensor, epsilon: float) -> torch.Tensor:
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, epsilon)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _pad(x: torch.Tensor, begin: tuple[int, ...], end: tuple[int, ...], fill: float) -> torch.Tensor:
    widths: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):  # F.pad lists the last axis first
        widths += [b, e]
    return F.pad(x, widths, value=fill)


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, strides: tuple[int, ...],
          dilations: tuple[int, ...], begin: tuple[int, ...], end: tuple[int, ...], groups: int) -> torch.Tensor:
    padding: tuple[int, ...] = begin
    if begin != end:
        x, padding = _pad(x, begin, end, 0.0), (0,) * len(begin)
    return _CONV[len(strides)](x, w, b, strides, padding, dilations, groups)


def _max_pool(x: torch.Tensor, kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...],
              begin: tuple[int, ...], end: tuple[int, ...], ceil_mode: bool) -> torch.Tensor:
    padding: tuple[int, ...] = begin
    if begin != end or any(2 * p > k for p, k in zip(begin, kernel)):  # torch allows pads up to half a window
        x, padding = _pad(x, begin, end, float("-inf")), (0,) * len(begin)
    return _MAX_POOL[len(kernel)](x, kernel, strides, padding, dilations, ceil_mode)


def _global_average_pool(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


def _split(x: torch.Tensor, sizes: tuple[int, ...], axis: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.split(x, list(sizes), dim=axis))


def _concat(*xs: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.cat(xs, dim=axis)


# -- lowering: IR node -> (function, static keyword arguments) ---------------------------------

Lowered = tuple[Callable[..., Any], dict[str, Any]]

_SIMPLE: dict[str, Callable[..., Any]] = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": _div, "Pow": torch.pow,
    "And": torch.logical_and, "Or": torch.logical_or, "Not": torch.logical_not, "Equal": torch.eq,
    "Less": torch.lt, "Greater": torch.gt, "Where": torch.where, "MatMul": torch.matmul,
    "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf, "Exp": torch.exp,
    "Log": torch.log, "Sqrt": torch.sqrt, "Neg": torch.neg, "Abs": torch.abs, "Reciprocal": torch.reciprocal,
    "GlobalAveragePool": _global_average_pool,
}
_SHAPE_ONLY = frozenset(op for op in default_registry().names if default_registry()[op].view)  # reshapes
# ops whose other inputs (target shapes, axes, split sizes) are static and taken from the IR types
_FIRST_INPUT_ONLY = _SHAPE_ONLY | {"Expand", "Split"}


def lower(node: Node, graph: Graph) -> Lowered:
    """The torch function for ``node`` and its static arguments; UnsupportedOpError otherwise."""
    op, out_type = node.op, graph.types[node.outputs[0]]
    if op in _SIMPLE:
        return _SIMPLE[op], {}
    if op in _SHAPE_ONLY:
        return _reshape, {"shape": out_type.shape}
    if op == "Expand":
        return _expand, {"shape": out_type.shape}
    if op == "Cast":
        return _cast, {"dtype": torch_dtype(out_type.dtype)}
    if op == "Transpose":
        rank = graph.types[node.inputs[0]].rank
        perm = node.attr("perm") or tuple(reversed(range(rank)))
        return _permute, {"perm": tuple(int(p) for p in perm)}
    if op == "Gemm":
        return _gemm, {"alpha": float(node.attr("alpha", 1.0)), "beta": float(node.attr("beta", 1.0)),
                       "trans_a": bool(node.attr("transA", 0)), "trans_b": bool(node.attr("transB", 0))}
    if op == "Gather":
        rank = graph.types[node.inputs[0]].rank
        return _gather, {"axis": int(node.attr("axis", 0)) % rank}
    if op == "Softmax":
        return _softmax, {"axis": int(node.attr("axis", -1))}
    if op == "LayerNormalization":
        if len([o for o in node.outputs if o]) > 1:
            raise UnsupportedOpError("LayerNormalization with Mean/InvStdDev outputs")
        return _layer_norm, {"axis": int(node.attr("axis", -1)), "epsilon": float(node.attr("epsilon", 1e-5))}
    if op == "BatchNormalization":
        return _batch_norm, {"epsilon": float(node.attr("epsilon", 1e-5))}
    if op in ("Conv", "MaxPool"):
        return _lower_window(node, graph)
    if op == "Split":
        axis = int(node.attr("axis", 0)) % graph.types[node.inputs[0]].rank
        return _split, {"sizes": tuple(graph.types[o].shape[axis] for o in node.outputs), "axis": axis}
    if op == "Concat":
        return _concat, {"axis": int(node.attr("axis"))}
    raise UnsupportedOpError(f"no torch conversion for op {op!r}")


def _lower_window(node: Node, graph: Graph) -> Lowered:
    x = graph.types[node.inputs[0]]
    if node.op == "Conv":
        kernel = graph.types[node.inputs[1]].shape[2:]
    else:
        kernel = tuple(int(k) for k in node.attr("kernel_shape"))
        if len([o for o in node.outputs if o]) > 1:
            raise UnsupportedOpError("MaxPool with an Indices output")
    ceil_mode = bool(node.attr("ceil_mode", 0))
    w = window(x.shape[2:], kernel, node.attr, ceil_mode)
    common = {"strides": w.strides, "dilations": w.dilations, "begin": w.pad_begin, "end": w.pad_end}
    if min(w.pad_begin + w.pad_end, default=0) < 0:
        raise UnsupportedOpError(f"{node.op} with negative pads")
    if node.op == "Conv":
        return _conv, {**common, "groups": int(node.attr("group", 1))}
    return _max_pool, {**common, "kernel": w.kernel, "ceil_mode": ceil_mode}


def node_inputs(node: Node) -> tuple[str, ...]:
    """The inputs the torch call of ``node`` takes (shape-only inputs come from the IR types)."""
    return node.inputs[:1] if node.op in _FIRST_INPUT_ONLY else node.inputs


def run_node(node: Node, graph: Graph, values: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
    """``node``'s outputs (None for an unused one) computed by torch from ``values``, on the tensors'
    device; UnsupportedOpError for an op with no torch conversion."""
    fn, kwargs = lower(node, graph)
    result = fn(*(values[t] if t else None for t in node_inputs(node)), **kwargs)
    results = tuple(result) if len(node.outputs) > 1 else (result,)
    return tuple(r if out else None for r, out in zip(results, node.outputs))


def to_torch_module(graph: Graph) -> torch.fx.GraphModule:
    """``graph`` as a GraphModule taking the graph inputs positionally, returning a tuple of outputs."""
    fx = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[str, Any] = {}
    for i, name in enumerate(graph.inputs):
        env[name] = fx.placeholder(f"input_{i}")
    used = {t for n in graph.nodes for t in n.inputs if t} | set(graph.outputs)
    for i, (name, const) in enumerate(c for c in graph.constants.items() if c[0] in used):
        attr = f"const_{i}"
        root.register_buffer(attr, torch.from_numpy(np.array(const.array)), persistent=False)
        env[name] = fx.get_attr(attr)
    for node in graph.nodes:
        fn, kwargs = lower(node, graph)
        args = tuple(env[t] if t else None for t in node_inputs(node))
        result = fx.call_function(fn, args, kwargs)
        outputs = [o for o in node.outputs]
        if len(outputs) == 1:
            env[outputs[0]] = result
            continue
        for k, out in enumerate(outputs):
            if out:
                env[out] = fx.call_function(operator.getitem, (result, k))
    fx.output(tuple(env[o] for o in graph.outputs))
    return torch.fx.GraphModule(root, fx, class_name=_class_name(graph.name))


def _class_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in name) or "graph"
    return f"Graph_{cleaned}"


def torch_feeds(graph: Graph, feeds: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    """The graph inputs as torch tensors sharing the feeds' memory."""
    return tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in graph.inputs)


def numpy_outputs(graph: Graph, outputs: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
    return {name: t.detach().numpy() for name, t in zip(graph.outputs, outputs)}
