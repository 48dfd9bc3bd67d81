"""ONNX element-type codes (TensorProto.DataType) as DTypes, without importing onnx."""

from __future__ import annotations

from autofusion.graph.types import DType

_ONNX_CODES: dict[int, DType] = {
    1: DType.FLOAT32,
    2: DType.UINT8,
    3: DType.INT8,
    5: DType.INT16,
    6: DType.INT32,
    7: DType.INT64,
    9: DType.BOOL,
    10: DType.FLOAT16,
    11: DType.FLOAT64,
}
_CODES_BY_DTYPE = {v: k for k, v in _ONNX_CODES.items()}


def onnx_dtype(code: int) -> DType:
    """The DType for an ONNX element-type code; ValueError for types the IR does not support."""
    try:
        return _ONNX_CODES[code]
    except KeyError:
        raise ValueError(f"unsupported ONNX element type code {code}") from None


def onnx_code(dtype: DType) -> int:
    return _CODES_BY_DTYPE[dtype]
