"""Tensor element types and tensor types: the vocabulary every stage shares."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike

from autofusion.graph.dims import Dim, as_dim


class DType(enum.StrEnum):
    """Element types the IR knows; values are numpy's names."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    FLOAT64 = "float64"
    INT64 = "int64"
    INT32 = "int32"
    INT16 = "int16"
    INT8 = "int8"
    UINT8 = "uint8"
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT32, DType.FLOAT16, DType.FLOAT64)

    @classmethod
    def of(cls, value: DType | DTypeLike) -> DType:
        """The DType of a numpy dtype, array, or dtype name."""
        if isinstance(value, DType):
            return value
        if isinstance(value, np.ndarray):
            value = value.dtype
        name = np.dtype(value).name
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"unsupported element type {name!r}") from None

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TensorType:
    """A tensor type, e.g. ``TensorType((1, 128, 768), DType.FLOAT32)``. A dimension is an int, or in
    a graph imported with dynamic axes a symbolic size (:mod:`autofusion.graph.dims`); every stage
    after import works on static types (``is_static``), those of a bound graph."""

    shape: tuple[Dim, ...]
    dtype: DType

    def __post_init__(self) -> None:
        if all(type(d) is int and d >= 0 for d in self.shape):
            return
        try:
            object.__setattr__(self, "shape", tuple(as_dim(d) for d in self.shape))
        except ValueError as e:
            raise ValueError(f"shape must be non-negative ints or symbolic sizes, got {self.shape!r}: {e}") from None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(type(d) is int for d in self.shape)

    @property
    def numel(self) -> Dim:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> Dim:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(self.shape, dtype)

    @classmethod
    def of(cls, array: np.ndarray) -> TensorType:
        return cls(tuple(int(d) for d in array.shape), DType.of(array))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"
