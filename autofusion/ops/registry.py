"""The op registry: for every op its class, signature, shape inference, numpy reference and costs.

An :class:`OpDef` is plain frozen data plus functions. Registries are values too: plugins extend a
registry by building a new one (``registry.extended([...])``), so nothing leaks between tests.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autofusion.graph.dims import Dim, dims_equal
from autofusion.graph.graph import FrozenMap, Node
from autofusion.graph.types import TensorType


class OpClass(enum.StrEnum):
    """What kind of loop nest an op is; fusion rules are written over these classes."""

    POINTWISE = "pointwise"  # one output element from the same-index elements of the inputs
    BROADCAST = "broadcast"  # output larger than an input by replication (Expand, Tile)
    REDUCTION = "reduction"  # reduces one or more axes (ReduceMean, Softmax, LayerNormalization)
    REORGANIZE = "reorganize"  # moves or views data without arithmetic (Reshape, Transpose, Concat)
    OPAQUE = "opaque"  # compute-heavy core with its own loop nest (MatMul, Gemm, Conv, LSTM)

    def __str__(self) -> str:
        return self.value


class ShapeError(ValueError):
    """Raised by shape inference when inputs or attributes are inconsistent."""


@dataclass(frozen=True)
class InferContext:
    """What shape inference and cost formulas see of one node."""

    node: Node
    input_types: tuple[TensorType | None, ...]
    const_inputs: tuple[np.ndarray | None, ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attrs.get(key, default)

    def type(self, i: int) -> TensorType:
        t = self.input_types[i] if i < len(self.input_types) else None
        if t is None:
            raise ShapeError(f"{self.node.op}: input {i} is required")
        return t

    def has_input(self, i: int) -> bool:
        return i < len(self.input_types) and self.input_types[i] is not None

    def const(self, i: int, what: str = "input") -> np.ndarray:
        """The constant value of input ``i``; shape inference needs it (e.g. Reshape's shape)."""
        v = self.const_inputs[i] if i < len(self.const_inputs) else None
        if v is None:
            raise ShapeError(f"{self.node.op}: {what} (input {i}) must be a constant")
        return v

    def maybe_const(self, i: int) -> np.ndarray | None:
        return self.const_inputs[i] if i < len(self.const_inputs) else None


InferFn = Callable[[InferContext], tuple[TensorType, ...]]
ReferenceFn = Callable[[Sequence[np.ndarray | None], Mapping[str, Any]], tuple[np.ndarray, ...]]
CostFn = Callable[[InferContext, tuple[TensorType, ...]], int]


def _default_bytes(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    read = sum(t.nbytes for t in ctx.input_types if t is not None)
    return read + sum(t.nbytes for t in outs)


def _zero(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    return 0


@dataclass(frozen=True)
class OpDef:
    """Everything the system knows about one op type.

    ``inputs`` names the inputs in order; a trailing ``?`` marks an optional one and a trailing
    ``*`` a variadic one (last only). ``attrs`` maps each attribute to its default (``None`` means
    required or no default). ``num_outputs`` is ``None`` when the count comes from the node.
    """

    name: str
    op_class: OpClass
    inputs: tuple[str, ...]
    infer: InferFn
    reference: ReferenceFn
    attrs: Mapping[str, Any] = field(default_factory=dict)
    num_outputs: int | None = 1
    flops_per_element: float = 1.0  # arithmetic per output element, when ``flops`` is not given
    flops: CostFn | None = None
    bytes_moved: CostFn = _default_bytes
    view: bool = False  # pure metadata change: costs no kernel and moves no bytes
    commutative: bool = False  # its two inputs may be swapped: rule patterns match either order
    core: str = ""  # "gemm" or "conv": a matrix-product core that a kernel's epilogue may follow
    pooling: bool = False  # a pooling window, which may end a convolution's epilogue
    const_inputs: tuple[int, ...] = ()  # inputs shape inference must know the value of
    # values a rule's checker may give such an input (index, the other inputs' types; that input's
    # type None): Reshape's target shapes for its data, so a rule over a Reshape is verified on
    # real reshapes (dsl/instantiate.py)
    example_values: Callable[[int, Sequence[TensorType | None]], Sequence[np.ndarray]] | None = None
    # how a backend ("c", "triton") computes an elementwise op the code generators do not know (a
    # plugin's): a format of the inputs' expressions, {0}, {1}, ..., in float32
    spelling: Mapping[str, str] = field(default_factory=dict)
    doc: str = ""

    @property
    def min_inputs(self) -> int:
        return sum(1 for n in self.inputs if not n.endswith(("?", "*")))

    @property
    def max_inputs(self) -> int | None:
        return None if any(n.endswith("*") for n in self.inputs) else len(self.inputs)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n.rstrip("?*") for n in self.inputs)

    def count_flops(self, ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
        if self.flops is not None:
            return int(self.flops(ctx, outs))
        return int(self.flops_per_element * sum(t.numel for t in outs))

    def count_bytes(self, ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
        if self.view:
            return 0
        return int(self.bytes_moved(ctx, outs))


class UnknownOpError(KeyError):
    """An op type the registry does not know."""

    def __init__(self, op: str) -> None:
        super().__init__(op)
        self.op = op

    def __str__(self) -> str:
        return f"unsupported op {self.op!r}"


class OpRegistry:
    """A read-only table of :class:`OpDef` by name."""

    def __init__(self, ops: Iterable[OpDef] = ()) -> None:
        table: dict[str, OpDef] = {}
        for op in ops:
            table[op.name] = op
        self._ops = FrozenMap(sorted(table.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def __getitem__(self, name: str) -> OpDef:
        try:
            return self._ops[name]
        except KeyError:
            raise UnknownOpError(name) from None

    def get(self, name: str) -> OpDef | None:
        return self._ops.get(name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._ops)

    def of_class(self, op_class: OpClass) -> tuple[str, ...]:
        return tuple(n for n, d in self._ops.items() if d.op_class is op_class)

    def extended(self, ops: Iterable[OpDef]) -> OpRegistry:
        """A new registry with ``ops`` added (or replacing ops of the same name)."""
        return OpRegistry([*self._ops.values(), *ops])

    # -- per-node conveniences ------------------------------------------------------------------

    def infer(self, ctx: InferContext) -> tuple[TensorType, ...]:
        opdef = self[ctx.node.op]
        outs = opdef.infer(ctx)
        n_out = len([o for o in ctx.node.outputs]) or len(outs)
        if opdef.num_outputs is not None and len(outs) != opdef.num_outputs:
            raise ShapeError(f"{ctx.node.op}: inference produced {len(outs)} outputs")
        if ctx.node.outputs and len(outs) < n_out:
            raise ShapeError(f"{ctx.node.op}: node declares {n_out} outputs, op produces {len(outs)}")
        return outs


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """Numpy broadcasting of shapes; raises ShapeError when they do not broadcast. A symbolic size
    broadcasts against 1 and against itself; against another size only where they are equal for
    every binding."""
    if all(isinstance(d, int) for s in shapes for d in s):
        try:
            return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
        except ValueError:
            raise ShapeError(f"shapes {', '.join(map(str, map(tuple, shapes)))} do not broadcast") from None
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for axis in range(rank):
        sizes = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        result: Dim = 1
        for d in sizes:
            if isinstance(d, int) and d == 1:
                continue
            if isinstance(result, int) and result == 1:
                result = d
            elif dims_equal(result, d) is not True:
                raise ShapeError(f"shapes {', '.join(map(str, map(tuple, shapes)))} do not broadcast for every "
                                 f"size: {result} against {d}")
        out.append(result)
    return tuple(out)
