"""Random valid graphs for differential fuzzing, seeded: the same seed gives the same case.

Each case is a small graph over pointwise ops (broadcasting shapes, comparisons, Where, Cast),
reductions (ReduceSum/Mean/Max, Softmax, LayerNormalization), layout ops (Transpose, Reshape,
Slice, Concat, Gather with constant indices), MatMul/Gemm with constant weights and, now and then,
Conv; with inputs drawn from ranges that keep every op inside its domain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autofusion.codegen.cores import CoreChoice
from autofusion.ir import Graph, GraphBuilder

STRATEGIES = ("greedy", "dp", "beam", "exact")
UNARY = ("Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Erf", "Exp", "Floor", "Sin", "Cos", "Softsign")
BINARY = ("Add", "Sub", "Mul", "Max", "Min")
POSITIVE_UNARY = ("Sqrt", "Log", "Reciprocal")  # applied to 1 + |x| so they stay in their domain
COMPARE = ("Greater", "Less", "Equal", "GreaterOrEqual")
ONNX_FLOAT = 1  # TensorProto.FLOAT
REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax")


@dataclass(frozen=True)
class FuzzCase:
    """One generated case: the graph, its inputs, the strategy it is optimised with, the threads it
    runs on and the core implementation its products are forced to (None: the default chooser)."""

    seed: int
    graph: Graph
    feeds: dict[str, np.ndarray]
    strategy: str
    check_unfused: bool
    threads: int = 1
    cores: CoreChoice | None = None
    shapes: str = "small"  # which generator drew it: small | realistic


class CaseBuilder:
    """A graph under construction from one seed's random draws (the realistic cases build on it)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.b = GraphBuilder(f"fuzz{seed}")
        self.feeds: dict[str, np.ndarray] = {}
        self.pool: list[str] = []
        self.leaves: set[str] = set()  # inputs: exact values, safe to compare and cast to ints

    def pick(self, seq: tuple[str, ...] | list[str]) -> str:
        return str(seq[int(self.rng.integers(0, len(seq)))])

    def shape(self, t: str) -> tuple[int, ...]:
        return self.b.type_of(t).shape

    def add_input(self, shape: tuple[int, ...]) -> str:
        name = self.b.input(f"in{len(self.feeds)}", shape)
        # multiples of 1/8 in [-2, 2]: exact in fp32, so comparisons and casts of inputs are exact
        self.feeds[name] = (self.rng.integers(-16, 17, size=shape) / 8).astype(np.float32)
        self.pool.append(name)
        self.leaves.add(name)
        return name

    def const(self, shape: tuple[int, ...], scale: float = 0.5) -> str:
        return self.b.const((self.rng.standard_normal(shape) * scale).astype(np.float32))

    def ints(self, values: list[int]) -> str:
        return self.b.const(np.array(values, np.int64))

    def step(self) -> None:
        b, rng = self.b, self.rng
        x = self.pool[-1 - int(rng.integers(0, min(4, len(self.pool))))]
        shape = self.shape(x)
        rank = len(shape)
        kind = self.pick(["unary", "unary", "binary", "binary", "positive", "compare", "cast", "reduce",
                          "softmax", "layernorm", "transpose", "reshape", "slice", "concat", "gather",
                          "matmul", "gemm", "conv"])
        if kind == "unary":
            y = b.op(self.pick(UNARY), x)
        elif kind == "binary":
            other = self.broadcast_partner(shape)
            operands = (x, other) if rng.integers(0, 2) else (other, x)
            y = b.op(self.pick(BINARY), *operands)
        elif kind == "positive":
            y = b.op(self.pick(POSITIVE_UNARY), b.op("Add", b.op("Abs", x), b.const(np.array(1.0, np.float32))))
        elif kind == "compare":
            leaf = self.pick(sorted(self.leaves))
            other = self.broadcast_partner(self.shape(leaf), leaf_only=True)
            cond = b.op(self.pick(COMPARE), leaf, other)
            if rng.integers(0, 2):
                y = b.op("Cast", cond, to=ONNX_FLOAT)
            else:
                y = b.op("Where", cond, leaf, self.broadcast_partner(self.shape(leaf)))
        elif kind == "cast":
            leaf = self.pick(sorted(self.leaves))
            wide = int(self.rng.choice([6, 7, 11]))  # ONNX codes: int32, int64, float64
            y = b.op("Cast", b.op("Cast", leaf, to=wide), to=ONNX_FLOAT)
        elif kind == "reduce" and rank:
            # distinct axes, some written negative
            axes = [int(a) - rank * int(rng.integers(0, 2)) for a in
                    rng.choice(rank, size=int(rng.integers(1, rank + 1)), replace=False)]
            y = b.op(self.pick(REDUCE), x, self.ints(axes), keepdims=int(rng.integers(0, 2)))
        elif kind == "softmax" and rank:
            y = b.op("Softmax", x, axis=int(rng.integers(-rank, rank)))
        elif kind == "layernorm" and rank:
            n = shape[-1]
            y = b.op("LayerNormalization", x, self.const((n,), 1.0), self.const((n,), 0.1), axis=-1, epsilon=1e-5)
        elif kind == "transpose" and rank > 1:
            y = b.op("Transpose", x, perm=tuple(int(p) for p in rng.permutation(rank)))
        elif kind == "reshape" and rank:
            y = b.op("Reshape", x, self.ints(self.reshape_target(shape)))
        elif kind == "slice" and rank and max(shape) > 1:
            axis = int(np.argmax(shape))
            start = int(rng.integers(0, shape[axis] - 1))
            step = int(rng.integers(1, 3))
            y = b.op("Slice", x, self.ints([start]), self.ints([shape[axis]]), self.ints([axis]), self.ints([step]))
        elif kind == "concat" and rank:
            axis = int(rng.integers(0, rank))
            other_shape = tuple(int(rng.integers(1, 4)) if i == axis else d for i, d in enumerate(shape))
            y = b.op("Concat", x, self.operand(other_shape), axis=axis)
        elif kind == "gather" and rank:
            axis = int(rng.integers(0, rank))
            idx = rng.integers(-shape[axis], shape[axis], size=int(rng.integers(1, 4)))
            y = b.op("Gather", x, self.ints(idx.tolist()), axis=axis)
        elif kind == "matmul" and rank >= 1:
            k = shape[-1]
            y = b.op("MatMul", x, self.const((k, int(rng.integers(1, 9)))))
        elif kind == "gemm" and rank == 2:
            m, k = shape
            n = int(rng.integers(1, 9))
            y = b.op("Gemm", x, self.const((n, k)), self.const((n,)), transB=1, alpha=float(rng.choice([1.0, 0.5])))
        elif kind == "conv" and rank == 4 and min(shape[2:]) >= 3:
            c = shape[1]
            f = int(rng.integers(1, 5))
            y = b.op("Conv", x, self.const((f, c, 3, 3), 0.3), self.const((f,)), kernel_shape=(3, 3),
                     pads=(1, 1, 1, 1), strides=(1, 1))
        else:
            y = b.op("Relu", x)
        self.pool.append(y)

    def operand(self, shape: tuple[int, ...]) -> str:
        """A tensor of ``shape``: an existing one when available, else a new input or constant."""
        same = [t for t in self.pool if self.shape(t) == shape]
        if same and self.rng.integers(0, 2):
            return self.pick(same)
        return self.add_input(shape) if self.rng.integers(0, 2) else self.const(shape)

    def broadcast_partner(self, shape: tuple[int, ...], leaf_only: bool = False) -> str:
        """An operand whose shape broadcasts with ``shape`` (dims dropped or set to 1)."""
        keep = self.rng.integers(0, 2, size=len(shape)).astype(bool)
        other = tuple(d if k else 1 for d, k in zip(shape, keep))[int(self.rng.integers(0, len(shape) + 1)):]
        if leaf_only:
            leaves = [t for t in self.leaves if self.shape(t) == other]
            return self.pick(leaves) if leaves else self.add_input(other)
        return self.operand(other)

    def reshape_target(self, shape: tuple[int, ...]) -> list[int]:
        total = int(np.prod(shape))
        choice = int(self.rng.integers(0, 3))
        if choice == 0:
            return [total]
        if choice == 1:
            return [-1, shape[-1]] if len(shape) > 1 else [1, total]
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        d = int(self.rng.choice(divisors))
        return [d, -1]


def random_case(seed: int, max_ops: int = 7, strategy: str | None = None) -> FuzzCase:
    """The case of ``seed``: a graph of 1..``max_ops`` generated ops plus its inputs; the strategy
    rotates with the seed unless given."""
    gen = CaseBuilder(seed)
    rng = gen.rng
    rank = int(rng.choice([1, 2, 2, 3, 4]))
    shape = tuple(int(d) for d in rng.integers(1, 7, size=rank))
    if rank == 4 and rng.integers(0, 2):
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(3, 7)), int(rng.integers(3, 7)))
    gen.add_input(shape)
    for _ in range(int(rng.integers(1, max_ops + 1))):
        gen.step()
    draft = gen.b.build([gen.pool[-1]])
    consumed = {i for n in draft.nodes for i in n.inputs}
    outputs = [t for t in gen.pool if t not in consumed and t not in gen.leaves] or [gen.pool[-1]]
    if outputs == [gen.pool[0]]:
        outputs = [gen.b.op("Identity", gen.pool[0])]
    graph = gen.b.build(outputs)
    return FuzzCase(seed, graph, gen.feeds, strategy or STRATEGIES[seed % len(STRATEGIES)], bool(seed % 3 == 0))
