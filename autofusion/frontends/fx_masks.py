"""The ops a model builds its attention mask with: dtype casts and device moves, comparisons, logical
ops, and indexing by index tensors. They take int64 and bool tensors as well as float32 ones, so a
padded batch's mask is computed inside the partition instead of cutting it in two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.frontends.fx_nodes import (
    Converter,
    Handler,
    convert_reshape,
    example_value,
    out_shape,
    shape_of,
    static_tensor,
)
from autofusion.graph.types import DType
from autofusion.ops.dtypes import onnx_code

MAX_INDEX_ELEMENTS = 1 << 22  # as many as a folded constant may hold (fx_import.FOLD_MAX_ELEMENTS)

_COMPARE = {"ge": "GreaterOrEqual", "gt": "Greater", "le": "LessOrEqual", "lt": "Less", "eq": "Equal"}
_LOGICAL = {"and_": "And", "or_": "Or", "xor": "Xor", "logical_and": "And", "logical_or": "Or",
            "logical_xor": "Xor", "bitwise_and": "And", "bitwise_or": "Or", "bitwise_xor": "Xor"}


def _dtype(value: Any) -> DType:
    return DType(str(value.dtype).removeprefix("torch."))


def _to(cv: Converter, node: Any) -> str:
    """``x.to(dtype)``, ``x.to(device)``, ``x.to(other)``, ``x.type(dtype)``, ``x.bool()``...: a Cast
    where the dtype changes (the device is always the CPU here)."""
    x = node.args[0]
    source, target = _dtype(example_value(x)), _dtype(example_value(node))
    if source == target:
        return cv.tensor(x)
    return cv.b.op("Cast", cv.tensor(x), to=onnx_code(target))


def _to_ok(node: Any) -> bool:
    """A cast that stays on the CPU (what the example value says, not the arguments: ``x.to(0)``,
    ``x.type("torch.LongTensor")`` and the like spell devices and dtypes many ways)."""
    value = example_value(node)
    return (bool(node.args) and static_tensor(example_value(node.args[0])) and static_tensor(value)
            and value.device.type == "cpu")


def _operand(cv: Converter, value: Any, like: DType) -> str:
    """A tensor argument, or a Python number as a constant of the other operand's dtype."""
    if isinstance(value, (bool, int, float)):
        return cv.b.const(np.asarray(value, like.numpy))
    return cv.tensor(value)


def _tensor_dtype(node: Any) -> DType:
    return next(_dtype(example_value(a)) for a in node.args[:2] if not isinstance(a, (bool, int, float)))


def _compare(key: str) -> Handler:
    def convert(cv: Converter, node: Any) -> str:
        like = _tensor_dtype(node)
        a, b = (_operand(cv, v, like) for v in node.args[:2])
        if key == "ne":
            return cv.b.op("Not", cv.b.op("Equal", a, b))
        return cv.b.op(_COMPARE[key], a, b)
    return convert


def _logical(op: str) -> Handler:
    def convert(cv: Converter, node: Any) -> str:
        a, b = (_operand(cv, v, DType.BOOL) for v in node.args[:2])
        return cv.b.op(op, a, b)
    return convert


def _not(cv: Converter, node: Any) -> str:
    return cv.b.op("Not", cv.tensor(node.args[0]))


def _binary_ok(bools: bool) -> Callable[[Any], bool]:
    """Two operands, at least one a tensor, of one dtype (bool for the logical ops); a number beside a
    tensor of its kind."""
    def check(node: Any) -> bool:
        if len(node.args) != 2 or node.kwargs:
            return False
        values = [a if isinstance(a, (bool, int, float)) else example_value(a) for a in node.args]
        tensors = [v for v in values if not isinstance(v, (bool, int, float))]
        if not tensors or not all(static_tensor(t) for t in tensors):
            return False
        dtypes = {_dtype(t) for t in tensors}
        if len(dtypes) != 1 or (bools and dtypes != {DType.BOOL}):
            return False
        (dtype,) = dtypes
        numbers = [v for v in values if isinstance(v, (bool, int, float))]
        if dtype == DType.BOOL:  # torch promotes a bool tensor beside any other number (mask == 2: int64)
            return all(isinstance(v, bool) for v in numbers)
        return all(dtype.is_float or not isinstance(v, float) for v in numbers)
    return check


def _not_ok(node: Any) -> bool:
    return len(node.args) == 1 and _dtype(example_value(node.args[0])) == DType.BOOL


def _expand(cv: Converter, node: Any) -> str:
    """``x.expand(2, -1, 8)`` or ``x.expand((2, -1, 8))``: its result's static shape."""
    return cv.b.op("Expand", cv.tensor(node.args[0]), cv.b.const(np.asarray(out_shape(node), np.int64)))


def _expand_ok(node: Any) -> bool:
    """Sizes as ints, one by one or in one tuple (aten's ``expand(x, sizes, implicit=False)``)."""
    sizes = node.args[1:]
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    return (bool(sizes) and all(isinstance(s, int) for s in sizes)
            and not node.kwargs.get("implicit", False) and set(node.kwargs) <= {"implicit"})


def advanced_index(cv: Converter, node: Any, indices: Sequence[Any]) -> str:
    """``x[i, j]`` for index tensors ``i, j`` that the converter holds as constants (a mask's
    broadcast aranges), over ``x``'s leading axes: one Gather of the flattened leading axes at the
    indices' broadcast positions."""
    x = node.args[0]
    shape = shape_of(x)
    arrays = []
    for i in indices:
        found = cv.const_value(i)
        if found is None:
            raise ValueError(f"node {node.name}: an index tensor is not a constant")
        arrays.append(found)
    lead = shape[:len(arrays)]
    wrapped = [np.where(a < 0, a + n, a) for a, n in zip(arrays, lead)]
    if any(((a < 0) | (a >= n)).any() for a, n in zip(wrapped, lead)):
        raise IndexError(f"node {node.name}: an index is out of range for {tuple(lead)}")
    flat = np.ravel_multi_index(np.broadcast_arrays(*wrapped), lead).astype(np.int64)
    rows = cv.b.op("Reshape", cv.tensor(x), cv.b.const(np.asarray([int(np.prod(lead)), *shape[len(lead):]],
                                                                   np.int64)))
    return cv.b.op("Gather", rows, cv.b.const(flat), axis=0)


def advanced_indices(node: Any) -> list[Any] | None:
    """The index tensors of ``x[i, j, ...]`` when they are FX nodes over ``x``'s leading axes,
    followed by nothing but whole slices; None for any other index."""
    from torch.fx import Node

    index = node.args[1]
    items = list(index) if isinstance(index, tuple) else [index]
    lead = []
    for item in items:
        if not isinstance(item, Node):
            break
        lead.append(item)
    rest = items[len(lead):]
    if not lead or any(r != slice(None) for r in rest):
        return None
    values = [example_value(i) for i in lead]
    if not all(static_tensor(v) and _dtype(v) == DType.INT64 for v in values):
        return None
    if math.prod(np.broadcast_shapes(*(tuple(v.shape) for v in values))) > MAX_INDEX_ELEMENTS:
        return None  # the flat index is a constant of the graph: a large one stays with torch
    return lead


# tensor methods that cast: x.bool(), x.float(), x.long()
CAST_METHODS = ("bool", "float", "long")

HANDLERS: Mapping[str, Handler] = {
    **{method: _to for method in CAST_METHODS},
    "to": _to,
    "type": _to,
    "_to_copy": _to,
    "ne": _compare("ne"),
    **{key: _compare(key) for key in _COMPARE},
    **{key: _logical(op) for key, op in _LOGICAL.items()},
    "invert": _not,
    "logical_not": _not,
    "bitwise_not": _not,
    "unsqueeze": convert_reshape,
    "expand": _expand,
}

ARG_CHECKS: Mapping[str, Callable[[Any], bool]] = {
    **{method: (lambda node: len(node.args) == 1 and node.op == "call_method") for method in CAST_METHODS},
    "to": _to_ok,
    "type": _to_ok,
    "_to_copy": _to_ok,
    **{key: _binary_ok(bools=False) for key in (*_COMPARE, "ne")},
    **{key: _binary_ok(bools=True) for key in _LOGICAL},
    "invert": _not_ok,
    "logical_not": _not_ok,
    "bitwise_not": _not_ok,
    "unsqueeze": lambda node: len(node.args) == 2 and isinstance(node.args[1], int),
    "expand": _expand_ok,
}

# ops that take and give int64 and bool tensors as well as float32 ones
ANY_DTYPE = frozenset({*HANDLERS, "getitem", "view", "reshape", "flatten", "permute", "transpose", "contiguous",
                       "clone", "detach", "_unsafe_view"})
