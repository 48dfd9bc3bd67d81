"""Row-wise reductions as passes over a row: Reduce*, Softmax, LogSoftmax, Hardmax, LayerNormalization,
InstanceNormalization, GlobalAverage/MaxPool, ArgMax/ArgMin.

A reduction reads its input ``X`` and reduces the axes ``axes``; every other axis indexes a row.
A :class:`ReductionSpec` says which accumulators each pass over a row updates, which per-row
statistics result, and how each output element follows from the statistics (and, for normalising
ops, from ``X`` at the same position). Sums accumulate in double (int64 for integers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autofusion.codegen.ctype import ctype, highest, is_float, literal, lowest
from autofusion.codegen.errors import CodegenError
from autofusion.graph.graph import Graph, Node
from autofusion.graph.types import DType, TensorType

REDUCTION_OPS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "Softmax", "LogSoftmax", "Hardmax",
    "LayerNormalization", "InstanceNormalization", "GlobalAveragePool", "GlobalMaxPool", "ArgMax", "ArgMin",
})


@dataclass(frozen=True)
class Acc:
    """An accumulator: declared with ``init`` before a pass, updated by ``update`` (uses ``{x}``, ``{j}``)."""

    var: str
    ctype: str
    init: str
    update: str
    simd: str | None = None  # the operator of an ``omp simd reduction`` clause, when one applies


@dataclass(frozen=True)
class Pass:
    accs: tuple[Acc, ...]
    after: tuple[str, ...] = ()  # statements after the loop over the row (they define statistics)


@dataclass(frozen=True)
class Stat:
    """A per-row statistic an output needs; kept in a scratch array when read outside its row."""

    var: str
    ctype: str

    @property
    def size(self) -> int:
        return {"double": 8, "int64_t": 8, "float": 4, "int32_t": 4, "int16_t": 2}.get(self.ctype, 1)


@dataclass(frozen=True)
class OutputArgs:
    """What an output formula may use: X at the output's position (``x()``), the position inside
    the row (``inner``, row-major over the reduced axes), the statistics by name, and the node's
    other inputs (``input(i, idx)``) at an index."""

    pos: int
    idx: tuple[str, ...]
    x: Callable[[], str]
    inner: str
    stats: Mapping[str, str]
    input: Callable[[int, tuple[str, ...]], str]
    row: str | None = None  # the spec's row buffer, where the output is computed in its own row's loop


OutputFn = Callable[[OutputArgs], str]


@dataclass(frozen=True)
class ReductionSpec:
    node: Node
    x: str
    x_shape: tuple[int, ...]
    axes: tuple[int, ...]
    layouts: tuple[str, ...]  # per output: "full" (shape of X), "keep" (reduced axes 1), "drop" (removed)
    passes: tuple[Pass, ...]
    stats: tuple[Stat, ...]
    output: OutputFn
    # a per-thread row of X's element type that the passes fill (``{row}[{j}]``), named here; an
    # output computed in the same row's loop reads it (OutputArgs.row), any other computes afresh
    row_buffer: str = ""

    @property
    def row_dims(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.x_shape)) if d not in self.axes)

    @property
    def rows(self) -> int:
        return math.prod(self.x_shape[d] for d in self.row_dims)

    @property
    def length(self) -> int:
        return math.prod(self.x_shape[d] for d in self.axes)

    def x_dims_of_output(self, pos: int, idx: tuple[str, ...]) -> dict[int, str]:
        """The X dimensions an output index fixes: all dims (full), or the row dims (keep/drop)."""
        layout = self.layouts[pos]
        if layout == "full":
            return dict(enumerate(idx))
        if layout == "keep":
            return {d: idx[d] for d in self.row_dims}
        return dict(zip(self.row_dims, idx))


def _bcast(idx: tuple[str, ...], out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> tuple[str, ...]:
    from autofusion.codegen.index import broadcast

    return broadcast(idx, out_shape, in_shape)


def _axes_of(graph: Graph, node: Node, rank: int) -> tuple[int, ...] | None:
    from autofusion.ops.common import ref_input_or_attr

    xs = [graph.const_value(t) if t else None for t in node.inputs]
    if len(node.inputs) > 1 and node.inputs[1] and xs[1] is None:
        raise CodegenError(f"node {node.name!r} ({node.op}): axes must be a constant")
    axes = ref_input_or_attr(xs, node.attrs, 1, "axes")
    if not axes:
        return None
    return tuple(sorted({a % rank for a in axes}))


def is_identity_reduce(graph: Graph, node: Node) -> bool:
    """A Reduce* with no axes and ``noop_with_empty_axes``: the input itself."""
    if not node.op.startswith("Reduce"):
        return False
    rank = graph.types[node.inputs[0]].rank
    return _axes_of(graph, node, rank) is None and bool(node.attr("noop_with_empty_axes", 0))


@dataclass(frozen=True)
class _Row:
    """What every reduction family's spec starts from: the node, its input and its element type."""

    graph: Graph
    node: Node
    prefix: str  # variable names start with it

    @property
    def x(self) -> str:
        return self.node.inputs[0]

    @property
    def xt(self) -> TensorType:
        return self.graph.types[self.x]

    @property
    def xc(self) -> str:
        return ctype(self.xt.dtype, f"node {self.node.name!r}")

    @property
    def fl(self) -> bool:
        return is_float(self.xt.dtype)

    @property
    def sum_t(self) -> str:
        return "double" if self.fl else "int64_t"


def reduction_spec(graph: Graph, node: Node, prefix: str) -> ReductionSpec:
    """The passes and statistics of reduction ``node``; variable names start with ``prefix``."""
    r, op = _Row(graph, node, prefix), node.op
    if op.startswith("Reduce"):
        return _reduce(r)
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        return _global_pool(r)
    if op in ("ArgMax", "ArgMin"):
        return _arg_extreme(r)
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return _softmax(r)
    if op in ("LayerNormalization", "InstanceNormalization"):
        return _normalization(r)
    raise CodegenError(f"node {node.name!r}: {op} is not a row reduction")


def _reduce(r: _Row) -> ReductionSpec:
    """The Reduce* ops: one accumulator per row (two passes for ReduceLogSumExp)."""
    graph, node, x, xt, rank = r.graph, r.node, r.x, r.xt, r.xt.rank
    dt, xc, fl, sum_t, op, p = r.xt.dtype, r.xc, r.fl, r.sum_t, r.node.op, r.prefix

    def lit(v: object) -> str:
        return literal(v, dt)

    passes: tuple[Pass, ...]
    axes = _axes_of(graph, node, rank) or tuple(range(rank))
    layout = "keep" if node.attr("keepdims", 1) else "drop"
    n = math.prod(xt.shape[a] for a in axes)
    val = f"{p}val"
    if op in ("ReduceMax", "ReduceMin"):
        better = "af_maxf" if dt == DType.FLOAT32 else "af_max"
        if op == "ReduceMin":
            better = better.replace("max", "min")
        a = f"{p}acc"
        update = (f"{a} = {better}({a}, {{x}});" if fl else
                  f"{a} = {{x}} {'>' if op == 'ReduceMax' else '<'} {a} ? {{x}} : {a};")
        acc = Acc(a, xc, lowest(dt) if op == "ReduceMax" else highest(dt), update,
                  "max" if op == "ReduceMax" else "min")
        passes = (Pass((acc,), (f"const {xc} {val} = {p}acc;",)),)
    elif op == "ReduceLogSumExp":
        m, s = f"{p}max", f"{p}sum"
        passes = (
            Pass((Acc(m, xc, lowest(dt), f"{m} = {m} > {{x}} ? {m} : {{x}};", "max"),),
                 (f"const {xc} {p}shift = isfinite({m}) ? {m} : {lit(0)};",)),
            Pass((Acc(s, "double", "0.0", f"{s} += exp((double)({{x}} - {p}shift));", "+"),),
                 (f"const {xc} {val} = ({xc})(log({s}) + {p}shift);",)),
        )
    else:
        term = {"ReduceL1": "fabs((double){x})", "ReduceL2": "(double){x} * {x}",
                "ReduceSumSquare": "(double){x} * {x}"}.get(op, "{x}")
        if not fl:
            term = {"ReduceL1": "({x} < 0 ? -{x} : {x})", "ReduceSumSquare": "{x} * {x}"}.get(op, "{x}")
        if op == "ReduceProd":
            acc = Acc(f"{p}acc", sum_t, "1", f"{p}acc *= {{x}};", "*")
        else:
            acc = Acc(f"{p}acc", sum_t, "0", f"{p}acc += {term};", "+")
        final = {"ReduceMean": f"{p}acc / {n}", "ReduceL2": f"sqrt({p}acc)",
                 "ReduceLogSum": f"log({p}acc)"}.get(op, f"{p}acc")
        passes = (Pass((acc,), (f"const {xc} {val} = ({xc})({final});",)),)
    return ReductionSpec(node, x, xt.shape, axes, (layout,), passes, (Stat(val, xc),),
                         lambda a: a.stats[val])


def _global_pool(r: _Row) -> ReductionSpec:
    """GlobalAveragePool and GlobalMaxPool: every spatial position of a channel."""
    node, x, xt, rank = r.node, r.x, r.xt, r.xt.rank
    dt, xc, sum_t, op, p = r.xt.dtype, r.xc, r.sum_t, r.node.op, r.prefix
    axes = tuple(range(2, rank))
    n = math.prod(xt.shape[2:])
    val = f"{p}val"
    if op == "GlobalMaxPool":
        acc = Acc(f"{p}acc", xc, lowest(dt), f"{p}acc = {p}acc > {{x}} ? {p}acc : {{x}};", "max")
        after = f"const {xc} {val} = {p}acc;"
    else:
        acc = Acc(f"{p}acc", sum_t, "0", f"{p}acc += {{x}};", "+")
        after = f"const {xc} {val} = ({xc})({p}acc / {n});"
    return ReductionSpec(node, x, xt.shape, axes, ("keep",), (Pass((acc,), (after,)),), (Stat(val, xc),),
                         lambda a: a.stats[val])


def _arg_extreme(r: _Row) -> ReductionSpec:
    """ArgMax and ArgMin: the best value and where it is."""
    node, x, xt, rank, dt, xc, op, p = r.node, r.x, r.xt, r.xt.rank, r.xt.dtype, r.xc, r.node.op, r.prefix
    axis = int(node.attr("axis", 0)) % rank
    layout = "keep" if node.attr("keepdims", 1) else "drop"
    cmp = (">" if op == "ArgMax" else "<") + ("=" if node.attr("select_last_index", 0) else "")
    best, at = f"{p}best", f"{p}at"
    init = lowest(dt) if op == "ArgMax" else highest(dt)
    update = f"if ({{x}} {cmp} {best} || {{j}} == 0) {{ {best} = {{x}}; {at} = {{j}}; }}"
    passes = (Pass((Acc(best, xc, init, update), Acc(at, "int64_t", "0", "")), ()),)
    return ReductionSpec(node, x, xt.shape, (axis,), (layout,), passes, (Stat(at, "int64_t"),),
                         lambda a: a.stats[at])


def _softmax(r: _Row) -> ReductionSpec:
    """Softmax and LogSoftmax (a max pass, then a sum pass), Hardmax (one argmax pass)."""
    node, x, xt, rank, dt, xc, fl, op, p = r.node, r.x, r.xt, r.xt.rank, r.xt.dtype, r.xc, r.fl, r.node.op, r.prefix

    def lit(v: object) -> str:
        return literal(v, dt)

    axis = int(node.attr("axis", -1)) % rank
    if not fl:
        raise CodegenError(f"node {node.name!r} ({op}): element type {dt} is not supported")
    m, s = f"{p}max", f"{p}sum"
    exp = "af_expf" if dt == DType.FLOAT32 else "exp"
    max_pass = Pass((Acc(m, xc, lowest(dt), f"{m} = {m} > {{x}} ? {m} : {{x}};", "max"),))
    if op == "Hardmax":
        at = f"{p}at"
        update = f"if ({{x}} > {p}best || {{j}} == 0) {{ {p}best = {{x}}; {at} = {{j}}; }}"
        passes = (Pass((Acc(f"{p}best", xc, lowest(dt), update), Acc(at, "int64_t", "0", "")), ()),)
        return ReductionSpec(node, x, xt.shape, (axis,), ("full",), passes, (Stat(at, "int64_t"),),
                             lambda a: f"({a.inner} == {a.stats[at]} ? {lit(1)} : {lit(0)})")
    if op == "LogSoftmax":
        sum_pass = Pass((Acc(s, "double", "0.0", f"{s} += {exp}({{x}} - {m});", "+"),),
                        (f"const {xc} {p}log = ({xc})log({s});",))
        return ReductionSpec(node, x, xt.shape, (axis,), ("full",), (max_pass, sum_pass),
                             (Stat(m, xc), Stat(f"{p}log", xc)),
                             lambda a: f"({a.x()} - {a.stats[m]}) - {a.stats[p + 'log']}")
    # Softmax: the sum pass keeps each exp in the row buffer, and the output scales it by the sum's
    # reciprocal (BERT's 128-wide rows, C harness, Xeon: 131 -> 85 us a layer; a division per
    # element instead of the reciprocal was a tenth of it)
    row, inv = f"{p}erow", f"{p}inv"
    update = f"{{ const {xc} {p}e = {exp}({{x}} - {m}); {row}[{{j}}] = {p}e; {s} += {p}e; }}"
    sum_pass = Pass((Acc(s, "double", "0.0", update, "+"),), (f"const {xc} {inv} = ({xc})(1.0 / {s});",))

    def out(a: OutputArgs) -> str:
        e = f"{a.row}[{a.inner}]" if a.row else f"{exp}({a.x()} - {a.stats[m]})"
        return f"{e} * {a.stats[inv]}"

    return ReductionSpec(node, x, xt.shape, (axis,), ("full",), (max_pass, sum_pass), (Stat(m, xc), Stat(inv, xc)),
                         out, row)


def _normalization(r: _Row) -> ReductionSpec:
    """LayerNormalization and InstanceNormalization: mean, then variance."""
    graph, node, x, xt = r.graph, r.node, r.x, r.xt
    rank, dt, xc, op, p = r.xt.rank, r.xt.dtype, r.xc, r.node.op, r.prefix
    if op == "LayerNormalization":
        axis = int(node.attr("axis", -1)) % rank
        axes = tuple(range(axis, rank))
    else:
        axes = tuple(range(2, rank))
    n = math.prod(xt.shape[a] for a in axes)
    eps = literal(node.attr("epsilon", 1e-5), DType.FLOAT32)
    s1, s2, mean = f"{p}s1", f"{p}s2", f"{p}mean"
    passes = (
        Pass((Acc(s1, "double", "0.0", f"{s1} += (double){{x}};", "+"),),
             (f"const float {mean} = (float)({s1} / {n});",)),
        Pass((Acc(s2, "double", "0.0", f"{s2} += (double)(((float){{x}} - {mean}) * ((float){{x}} - {mean}));",
                  "+"),),
             (f"const float {p}var = (float)({s2} / {n});",
              f"const float {p}inv = 1.0f / sqrtf({p}var + {eps});",
              f"const float {p}den = sqrtf({p}var + {eps});")),
    )
    stats = (Stat(mean, "float"), Stat(f"{p}inv", "float"), Stat(f"{p}den", "float"))
    layouts = ("full", "keep", "keep")
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
    shapes = [graph.types[t].shape if t else () for t in node.inputs]

    def normalized(a: OutputArgs) -> str:
        if a.pos == 1:
            return a.stats[mean]
        if a.pos == 2:
            return a.stats[f"{p}inv"]
        centered = f"((float){a.x()} - {a.stats[mean]})"
        if op == "LayerNormalization":
            scale = a.input(1, _bcast(a.idx, xt.shape, shapes[1]))
            y = f"{centered} * {a.stats[p + 'inv']} * {scale}"
            if has_bias:
                y += f" + {a.input(2, _bcast(a.idx, xt.shape, shapes[2]))}"
        else:
            c = (a.idx[1],)
            y = f"{centered} / {a.stats[p + 'den']} * {a.input(1, c)} + {a.input(2, c)}"
        return f"({xc})({y})" if dt != DType.FLOAT32 else y

    return ReductionSpec(node, x, xt.shape, axes, layouts, passes, stats, normalized)


__all__ = ["REDUCTION_OPS", "Acc", "OutputArgs", "Pass", "ReductionSpec", "Stat", "is_identity_reduce",
           "reduction_spec"]
