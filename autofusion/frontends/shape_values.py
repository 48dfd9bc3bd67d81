"""Shape arithmetic on symbolic sizes, as exporters spell it: ``Shape`` -> ``Gather`` -> ``Unsqueeze``
-> ``Concat`` -> ``Reshape``, with ``Mul``, ``Div`` and comparisons between.

Static shapes fold such subgraphs to int64 constants through the ops' numpy references. With
dynamic axes the values are symbolic constants (object arrays of ints and sympy expressions,
:class:`autofusion.graph.graph.Const`): the ops that only move elements run their references on the
object arrays; arithmetic and comparisons run here with integer semantics, a comparison decided
for every binding or refused. An op without a rule here does not fold: it stays a node of the graph
(``Range(0, seq)``, ``ConstantOfShape([batch, seq])``), computed at run time.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from autofusion.graph.dims import decide
from autofusion.ops.dtypes import onnx_dtype

# ops whose reference only selects, moves or repeats elements (or reads the shape): correct on object
# arrays as they are
MOVING = frozenset({"Gather", "Unsqueeze", "Squeeze", "Concat", "Reshape", "Slice", "Transpose", "Flatten",
                    "Identity", "Expand", "Split", "Tile", "Shape", "Size"})


class UndecidedShapeValue(ValueError):
    """A comparison of symbolic sizes whose outcome depends on the binding."""


def _int_div(a: Any, b: Any) -> Any:
    # ONNX integer Div truncates toward zero; sizes are non-negative, where that is floor division
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a // b


def _compare(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], bool]:
    def run(a: Any, b: Any) -> bool:
        if isinstance(a, int) and isinstance(b, int):
            return bool(op(a, b))
        import sympy

        relation = sympy.Eq(a, b) if op is operator.eq else op(a, b)
        value = decide(relation)
        if value is None:
            raise UndecidedShapeValue(f"whether {a} {_SPELLED[op]} {b} depends on the sizes bound at run time")
        return value

    return run


_SPELLED = {operator.eq: "==", operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">="}

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "Div": _int_div,
    "Equal": _compare(operator.eq),
    "Less": _compare(operator.lt),
    "LessOrEqual": _compare(operator.le),
    "Greater": _compare(operator.gt),
    "GreaterOrEqual": _compare(operator.ge),
}


def _elementwise(fn: Callable[[Any, Any], Any], a: np.ndarray, b: np.ndarray, boolean: bool) -> np.ndarray:
    pa, pb = np.broadcast_arrays(a.astype(object), b.astype(object))
    values = [fn(x, y) for x, y in zip(pa.reshape(-1).tolist(), pb.reshape(-1).tolist())]
    if boolean:
        return np.array(values, bool).reshape(pa.shape)
    out = np.empty(len(values), object)
    out[:] = values
    return out.reshape(pa.shape)


def _minimum(a: Any, b: Any) -> Any:
    return b if _BINARY["Less"](b, a) else a


def _maximum(a: Any, b: Any) -> Any:
    return a if _BINARY["Less"](b, a) else b


def fold_symbolic(op: str, args: list[np.ndarray | None], attrs: Mapping[str, Any],
                  reference: Callable[..., tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...] | None:
    """``op`` evaluated on constant inputs of which some are symbolic; None when it does not fold
    (it stays a node). Raises UndecidedShapeValue for a comparison the binding decides."""
    if op in MOVING:
        try:
            return tuple(np.asarray(v) for v in reference(args, attrs))
        except TypeError:  # a symbolic count or bound (Slice's end at seq): the result's size is symbolic
            return None
    present = [a for a in args if a is not None]
    if op in _BINARY and len(present) == 2:
        return (_elementwise(_BINARY[op], present[0], present[1], boolean=op not in ("Add", "Sub", "Mul", "Div")),)
    if op == "Neg" and len(present) == 1:
        return (-present[0],)
    if op in ("Min", "Max") and present:
        pick = _minimum if op == "Min" else _maximum
        return (functools.reduce(lambda a, b: _elementwise(pick, a, b, boolean=False), present),)
    if op == "Cast" and onnx_dtype(int(attrs.get("to", 0))).numpy.kind in "iu":
        return (present[0].copy(),)  # sizes are integers: a cast between integer types keeps them
    if op == "Where" and len(present) == 3 and present[0].dtype == bool:
        cond, x, y = np.broadcast_arrays(present[0], present[1].astype(object), present[2].astype(object))
        return (np.where(cond, x, y),)
    return None
