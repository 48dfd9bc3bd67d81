"""Element types and literal values as C."""

from __future__ import annotations

import math

import numpy as np

from autofusion.codegen.errors import CodegenError
from autofusion.graph.dims import is_symbolic
from autofusion.graph.types import DType

_CTYPES = {
    DType.FLOAT32: "float",
    DType.FLOAT64: "double",
    DType.INT64: "int64_t",
    DType.INT32: "int32_t",
    DType.INT16: "int16_t",
    DType.INT8: "int8_t",
    DType.UINT8: "uint8_t",
    DType.BOOL: "uint8_t",  # numpy bools are one byte holding 0 or 1
}


def ctype(dtype: DType, where: str = "") -> str:
    """The C type holding one element of ``dtype``; CodegenError for types the C backend lacks."""
    try:
        return _CTYPES[dtype]
    except KeyError:
        raise CodegenError(f"{where}: element type {dtype} is not supported by the C backend".lstrip(": ")) from None


def is_float(dtype: DType) -> bool:
    return dtype in (DType.FLOAT32, DType.FLOAT64)


def literal(value: object, dtype: DType) -> str:
    """A C literal of ``value`` converted to ``dtype``, exact for every float32/float64 value.

    >>> literal(0.5, DType.FLOAT32)
    '0.5f'
    >>> literal(-3, DType.INT64)
    '-3LL'
    """
    if is_symbolic(value):  # a size known at run time (codegen/sizes.py), converted as C converts
        return f"(({ctype(dtype)})({value}))"
    if dtype == DType.BOOL:
        return "1" if bool(value) else "0"
    if dtype == DType.FLOAT32 or dtype == DType.FLOAT64:
        v = float(np.asarray(value, dtype=dtype.numpy))
        suffix = "f" if dtype == DType.FLOAT32 else ""
        if math.isnan(v):
            return "NAN" if dtype == DType.FLOAT32 else "((double)NAN)"
        if math.isinf(v):
            s = "INFINITY" if dtype == DType.FLOAT32 else "((double)INFINITY)"
            return s if v > 0 else f"(-{s})"
        text = _float_text(v, dtype)
        out = text + suffix
        return f"({out})" if out.startswith("-") else out
    v = int(np.asarray(value).astype(dtype.numpy))
    if dtype == DType.INT64:
        if v == -(2**63):
            return "(-9223372036854775807LL - 1)"
        return f"({v}LL)" if v < 0 else f"{v}LL"
    return f"({v})" if v < 0 else str(v)


def _float_text(v: float, dtype: DType) -> str:
    """Shortest text that reads back as exactly ``v`` in ``dtype``: positional when readable."""
    x = np.float32(v) if dtype == DType.FLOAT32 else np.float64(v)
    if v == 0 or 1e-4 <= abs(v) < 1e7:
        return np.format_float_positional(x, unique=True, trim="0")
    text = np.format_float_scientific(x, unique=True, trim="0").replace("e+", "e")
    return text


def lowest(dtype: DType) -> str:
    """The identity of max: minus infinity for floats, the smallest value for integers."""
    if is_float(dtype):
        return literal(-np.inf, dtype)
    return literal(np.iinfo(dtype.numpy).min, dtype)


def highest(dtype: DType) -> str:
    if is_float(dtype):
        return literal(np.inf, dtype)
    return literal(np.iinfo(dtype.numpy).max, dtype)
