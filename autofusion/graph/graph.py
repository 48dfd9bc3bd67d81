"""The graph IR: frozen, hashable values. A graph is a value; passes return new graphs.

Tensors are named by strings. Every tensor has a :class:`TensorType` in ``Graph.types``; a tensor
is either a graph input, a constant (weights, folded shapes) or the output of exactly one node.
Nodes are kept in topological order. An empty input name marks an omitted optional input (ONNX's
convention).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from autofusion.graph.dims import as_value
from autofusion.graph.types import DType, TensorType

K = TypeVar("K")
V = TypeVar("V")

AttrValue = int | float | str | tuple[int, ...] | tuple[float, ...] | tuple[str, ...]


class FrozenMap(Mapping[K, V]):
    """An immutable, hashable mapping that keeps insertion order."""

    __slots__ = ("_d", "_h")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._d: dict[K, V] = dict(items)
        self._h: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._d[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(frozenset(self._d.items()))
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._d == other._d
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def set(self, key: K, value: V) -> FrozenMap[K, V]:
        d = dict(self._d)
        d[key] = value
        return FrozenMap(d)


def _freeze_attr(value: Any) -> AttrValue:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(_freeze_attr(v) for v in value)  # type: ignore[return-value]
    raise TypeError(f"unsupported attribute value {value!r}")


def freeze_attrs(attrs: Mapping[str, Any] | None) -> FrozenMap[str, AttrValue]:
    """Attributes as a sorted FrozenMap of plain, hashable Python values."""
    if not attrs:
        return FrozenMap()
    return FrozenMap(sorted((k, _freeze_attr(v)) for k, v in attrs.items()))


def handed_over(array: np.ndarray) -> np.ndarray:
    """``array`` made read-only, for a Const to keep as it is, without a copy: only for a fresh array
    nobody else holds (a transposed weight just made)."""
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Const:
    """A constant tensor. Read-only; equality and hash by content.

    In a graph with symbolic dimensions a shape computed at import (a Reshape's target, a Range's
    limit) is a symbolic constant: an int64 tensor held as an object array whose elements are ints
    or sympy expressions (:mod:`autofusion.graph.dims`); one without any symbol is stored as int64."""

    array: np.ndarray

    def __post_init__(self) -> None:
        arr = self.array
        # a private copy, so that nobody can mutate it; an array that owns its data and is read-only
        # already is one (another Const's, or one handed over: copying weights again was most of a
        # bert-base's import from PyTorch, 6.6 s of which 3 are gone)
        if not (isinstance(arr, np.ndarray) and arr.flags.owndata and not arr.flags.writeable):
            arr = np.array(arr, copy=True)
        if arr.dtype == object:
            arr = _symbolic_values(arr)
        arr.setflags(write=False)
        object.__setattr__(self, "array", arr)

    @property
    def is_symbolic(self) -> bool:
        return self.array.dtype == object

    @functools.cached_property
    def digest(self) -> str:
        h = hashlib.sha256()
        h.update(str(self.array.dtype).encode())
        h.update(str(self.array.shape).encode())
        if self.is_symbolic:
            h.update(repr(self.array.tolist()).encode())
        else:
            h.update(np.ascontiguousarray(self.array).tobytes())
        return h.hexdigest()

    @property
    def type(self) -> TensorType:
        if self.is_symbolic:
            return TensorType(tuple(int(d) for d in self.array.shape), DType.INT64)
        return TensorType.of(self.array)

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Const) and self.digest == other.digest

    def __repr__(self) -> str:
        return f"Const({self.type})"


def _symbolic_values(arr: np.ndarray) -> np.ndarray:
    """An object array of integer values, some symbolic: each kept an int or a sympy expression; as
    int64 when none is symbolic."""
    values = [as_value(v) for v in arr.reshape(-1).tolist()]
    if all(isinstance(v, int) for v in values):
        return np.array(values, np.int64).reshape(arr.shape)
    out = np.empty(len(values), object)
    out[:] = values
    return out.reshape(arr.shape)


@dataclass(frozen=True)
class Node:
    """One operation: ``outputs = op(inputs; attrs)``. ``name`` is unique within a graph."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: FrozenMap[str, AttrValue] = field(default_factory=FrozenMap)
    name: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def replace(self, **changes: Any) -> Node:
        """A copy with ``changes``; the same object when nothing changes."""
        if all(getattr(self, k) == v for k, v in changes.items()):
            return self
        return replace(self, **changes)


@dataclass(frozen=True)
class Graph:
    """A computation graph. Build one with :class:`autofusion.ir.builder.GraphBuilder`.

    >>> from autofusion.ir import GraphBuilder, DType
    >>> b = GraphBuilder("tiny")
    >>> x = b.input("x", (2, 3), DType.FLOAT32)
    >>> g = b.build([b.op("Relu", x)])
    >>> [n.op for n in g.nodes]
    ['Relu']
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    types: FrozenMap[str, TensorType]
    constants: FrozenMap[str, Const] = field(default_factory=FrozenMap)
    # the most each symbolic size may be (a graph with dynamic axes: what its shapes take for granted)
    bounds: FrozenMap[str, int] = field(default_factory=FrozenMap)

    # -- queries, computed once per graph value --------------------------------------------------

    @functools.cached_property
    def producers(self) -> Mapping[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs if out}

    @functools.cached_property
    def consumers(self) -> Mapping[str, tuple[Node, ...]]:
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                if i:
                    users.setdefault(i, []).append(n)
        return {k: tuple(v) for k, v in users.items()}

    @functools.cached_property
    def node_by_name(self) -> Mapping[str, Node]:
        return {n.name: n for n in self.nodes}

    @functools.cached_property
    def node_index(self) -> Mapping[str, int]:
        """Position of each node in the (topological) node order."""
        return {n.name: i for i, n in enumerate(self.nodes)}

    def type_of(self, tensor: str) -> TensorType:
        return self.types[tensor]

    def is_const(self, tensor: str) -> bool:
        return tensor in self.constants

    def const_value(self, tensor: str) -> np.ndarray | None:
        c = self.constants.get(tensor)
        return None if c is None else c.array

    def replace(self, **changes: Any) -> Graph:
        """A copy with ``changes``; the same object when nothing changes."""
        if all(getattr(self, k) == v for k, v in changes.items()):
            return self
        return replace(self, **changes)

    def __hash__(self) -> int:  # cached: graphs are hashed often by later stages
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.name, self.inputs, self.outputs, self.nodes, self.types, self.constants, self.bounds))
            object.__setattr__(self, "_hash", h)
        return h

    @functools.cached_property
    def parameter_bytes(self) -> int:
        """Bytes of all constants (cached: cost models ask for every kernel they price)."""
        return sum(c.array.nbytes for c in self.constants.values())

    def summary(self) -> str:
        return f"{self.name}: {len(self.nodes)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs"


__all__ = [
    "AttrValue",
    "Const",
    "DType",
    "FrozenMap",
    "Graph",
    "Node",
    "TensorType",
    "freeze_attrs",
    "handed_over",
]
