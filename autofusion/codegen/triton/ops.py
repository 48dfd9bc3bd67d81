"""Elementwise ops as Triton expressions, matching the numpy reference of the op registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from autofusion.graph.types import DType

TL_DTYPES = MappingProxyType({
    "float32": "tl.float32", "float64": "tl.float64", "float16": "tl.float16", "int64": "tl.int64",
    "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8", "bool": "tl.int1",
})

# (input expressions, attributes, input element type) -> expression, or None when not supported
OpFn = Callable[[Sequence[str], Mapping[str, Any], DType], "str | None"]


def cast_expr(x: str, to: DType) -> str:
    """``x`` converted to ``to``; to bool means "not zero", as numpy's astype."""
    if to == DType.BOOL:
        return f"{x} != 0"
    return f"{x}.to({TL_DTYPES[to.value]})"


def _float(fmt: str) -> OpFn:
    def fn(a: Sequence[str], attrs: Mapping[str, Any], dt: DType) -> str | None:
        return fmt.format(*a, **{k: v for k, v in attrs.items() if isinstance(v, (int, float))}) if dt.is_float else None
    return fn


def spelled(fmt: str) -> OpFn | None:
    """The OpFn of an op that spells its Triton expression itself (``OpDef.spelling["triton"]``)."""
    if not fmt:
        return None
    return lambda a, attrs, dt: fmt.format(*(f"({x})" for x in a)) if dt == DType.FLOAT32 else None


def _any(fmt: str) -> OpFn:
    return lambda a, attrs, dt: fmt.format(*a)


def _bool(fmt: str) -> OpFn:
    return lambda a, attrs, dt: fmt.format(*a) if dt == DType.BOOL else None


def _gelu(a: Sequence[str], attrs: Mapping[str, Any], dt: DType) -> str | None:
    if not dt.is_float:
        return None
    x = a[0]
    if attrs.get("approximate", "none") == "tanh":
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        return f"0.5 * {x} * (1.0 + (2.0 * tl.sigmoid(2.0 * ({inner})) - 1.0))"
    return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"


def _variadic(fn: str) -> OpFn:
    def build(a: Sequence[str], attrs: Mapping[str, Any], dt: DType) -> str:
        expr = a[0]
        for b in a[1:]:
            expr = f"{fn}({expr}, {b})"
        return expr
    return build


def _sum(a: Sequence[str], attrs: Mapping[str, Any], dt: DType) -> str:
    return " + ".join(a)


ELEMENTWISE: Mapping[str, OpFn] = MappingProxyType({
    "Add": _any("{0} + {1}"), "Sub": _any("{0} - {1}"), "Mul": _any("{0} * {1}"),
    "Div": _float("{0} / {1}"), "Neg": _any("-{0}"),
    "Relu": _float("tl.where({0} < 0.0, 0.0, {0})"), "Exp": _float("tl.exp({0})"), "Log": _float("tl.log({0})"),
    "Sqrt": _float("tl.sqrt({0})"), "Abs": _any("tl.abs({0})"), "Sigmoid": _float("tl.sigmoid({0})"),
    "Tanh": _float("2.0 * tl.sigmoid(2.0 * {0}) - 1.0"), "Erf": _float("tl.erf({0})"), "Gelu": _gelu,
    "Reciprocal": _float("1.0 / {0}"), "Floor": _float("tl.floor({0})"), "Ceil": _float("tl.ceil({0})"),
    "Sin": _float("tl.sin({0})"), "Cos": _float("tl.cos({0})"),
    "LeakyRelu": _float("tl.where({0} < 0.0, {0} * {alpha}, {0})"),
    "Equal": _any("{0} == {1}"), "Less": _any("{0} < {1}"), "LessOrEqual": _any("{0} <= {1}"),
    "Greater": _any("{0} > {1}"), "GreaterOrEqual": _any("{0} >= {1}"),
    "And": _bool("{0} & {1}"), "Or": _bool("{0} | {1}"), "Xor": _bool("{0} ^ {1}"), "Not": _bool("{0} == 0"),
    "Max": _variadic("tl.maximum"), "Min": _variadic("tl.minimum"), "Sum": _sum,
})
