"""Producer inlining for Triton: the expression of any tensor of a group at a symbolic index.

``Exprs.value(t, idx)`` returns a local variable holding element(s) ``idx`` of ``t``: loaded from
memory (masked when the index is a block), or computed by its producer's op from its inputs at
mapped indices, recursively. Each value is computed once per index (common subexpressions once).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from autofusion.codegen.errors import CodegenError
from autofusion.codegen.triton import tindex as ix
from autofusion.codegen.triton.ops import ELEMENTWISE, TL_DTYPES, cast_expr, spelled
from autofusion.codegen.triton.tindex import Index
from autofusion.codegen.triton.window import compute_window
from autofusion.decide.plan import FusedGroup
from autofusion.graph.graph import Graph, Node
from autofusion.ops.common import ref_input_or_attr
from autofusion.ops.registry import OpRegistry
from autofusion.ops.reorganize import _slices

Override = Callable[[Index], str]
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Exprs:
    """Computes tensors of one group at symbolic indices; see the module docstring."""

    graph: Graph
    group: FusedGroup
    registry: OpRegistry
    pointer: Callable[[str], str]  # tensor name -> kernel parameter
    mask: str | None = None  # mask of the current block (None: every lane is in range)
    vector: set[str] = field(default_factory=set)  # names holding blocks rather than scalars
    overrides: dict[str, Override] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    memo: dict[tuple[str, Index], str] = field(default_factory=dict)
    _count: int = 0

    def error(self, message: str, node: Node | None = None) -> CodegenError:
        where = f" node {node.name!r} ({node.op}):" if node else ""
        return CodegenError(f"group {self.group.name!r} (template {self.group.template!r}):{where} {message}")

    def is_vector(self, expr: str) -> bool:
        return any(w in self.vector for w in _WORD.findall(expr))

    def bind(self, expr: str) -> str:
        self._count += 1
        var = f"v{self._count}"
        self.lines.append(f"{var} = {expr}")
        if self.is_vector(expr):
            self.vector.add(var)
        return var

    def members(self) -> frozenset[str]:
        return frozenset(self.group.nodes)

    def value(self, tensor: str, idx: Index) -> str:
        key = (tensor, tuple(idx))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        override = self.overrides.get(tensor)
        node = self.graph.producers.get(tensor)
        if override is not None:
            var = override(idx)
        elif node is not None and node.name in self.members():
            var = self.compute(node, node.outputs.index(tensor), idx)
        else:
            var = self.load(tensor, idx)
        self.memo[key] = var
        return var

    def load(self, tensor: str, idx: Index) -> str:
        off = ix.linear(idx, self.graph.type_of(tensor).shape)
        ptr = self.pointer(tensor)
        if self.mask is not None and self.is_vector(off):
            return self.bind(f"tl.load({ptr} + {off}, mask={self.mask}, other=0)")
        return self.bind(f"tl.load({ptr} + {off})")

    def input_at(self, node: Node, i: int, out_idx: Index) -> str:
        """Input ``i`` of ``node`` at the index broadcast from the output index."""
        t = node.inputs[i]
        out_shape = self.graph.type_of(node.outputs[0]).shape
        return self.value(t, ix.broadcast(out_idx, out_shape, self.graph.type_of(t).shape))

    def compute(self, node: Node, pos: int, idx: Index) -> str:
        out_t = self.graph.type_of(node.outputs[pos])
        if out_t.dtype.value not in TL_DTYPES:
            raise self.error(f"element type {out_t.dtype} is not supported by the Triton backend", node)
        op = node.op
        if op in ("Identity", "Expand") or (op == "Dropout" and pos == 0):
            return self.input_at(node, 0, idx)
        if op == "Transpose":
            perm = node.attr("perm") or tuple(reversed(range(len(idx))))
            return self.value(node.inputs[0], ix.transpose(idx, perm))
        if self.registry[op].view:  # Reshape, Squeeze, Unsqueeze, Flatten: same elements, new shape
            src = node.inputs[0]
            return self.value(src, ix.reshape(idx, out_t.shape, self.graph.type_of(src).shape))
        if op == "Gather":
            return self._gather(node, idx)
        if op == "GatherND":
            return self._gather_nd(node, idx)
        if op == "Split":  # part pos starts where the parts before it end
            axis = int(node.attr("axis", 0)) % len(idx)
            start = sum(self.graph.type_of(node.outputs[k]).shape[axis] for k in range(pos))
            return self.value(node.inputs[0], tuple(ix.add(e, start) if d == axis else e for d, e in enumerate(idx)))
        if op == "Slice":
            return self._slice(node, idx)
        if op == "BatchNormalization":
            return self._batchnorm(node, pos, idx)
        if op == "Cast":
            return self.bind(cast_expr(self.input_at(node, 0, idx), out_t.dtype))
        if op == "Where":
            c, a, b = (self.input_at(node, i, idx) for i in range(3))
            return self.bind(f"tl.where({c}, {a}, {b})")
        if op == "Clip":
            return self._clip(node, idx)
        if self.registry[op].pooling:  # MaxPool, AveragePool: an unrolled loop over the window's taps
            return compute_window(self, node, pos, idx)
        fn = ELEMENTWISE.get(op) or spelled(self.registry[op].spelling.get("triton", ""))
        if fn is None:
            raise self.error(f"op {op} is not supported by the Triton backend", node)
        in_dtype = self.graph.type_of(node.inputs[0]).dtype
        args = [self.input_at(node, i, idx) for i in range(len(node.inputs)) if node.inputs[i]]
        expr = fn(args, node.attrs, in_dtype)
        if expr is None:
            raise self.error(f"op {op} on {in_dtype} is not supported by the Triton backend", node)
        return self.bind(expr)

    def _gather(self, node: Node, idx: Index) -> str:
        data_shape = self.graph.type_of(node.inputs[0]).shape
        ind_rank = self.graph.type_of(node.inputs[1]).rank
        axis = int(node.attr("axis", 0)) % len(data_shape)
        ind = self.value(node.inputs[1], tuple(idx[axis:axis + ind_rank]))
        data_idx = tuple(idx[:axis]) + (self._data_index(ind, data_shape[axis]),) + tuple(idx[axis + ind_rank:])
        return self.value(node.inputs[0], data_idx)

    def _data_index(self, raw: str, dim: int) -> str:
        """An index read from data, wrapped (negative from the end) and clamped into ``[0, dim)``, as
        the C backend does: an id off the table must not send a load off the tensor."""
        return self.bind(f"tl.minimum(tl.maximum(tl.where({raw} < 0, {raw} + {dim}, {raw}), 0), {dim - 1})")

    def _gather_nd(self, node: Node, idx: Index) -> str:
        """Data at the tuple of indices the leading output axes pick (after ``batch_dims`` shared axes),
        each index wrapped from the end and clamped into its axis, as the C backend does."""
        data_shape = self.graph.type_of(node.inputs[0]).shape
        ind_shape = self.graph.type_of(node.inputs[1]).shape
        b, q = int(node.attr("batch_dims", 0)), len(ind_shape) - 1
        src = list(idx[:b])
        for j in range(ind_shape[-1]):
            src.append(self._data_index(self.value(node.inputs[1], tuple(idx[:q]) + (str(j),)), data_shape[b + j]))
        return self.value(node.inputs[0], tuple(src) + tuple(idx[q:]))

    def _batchnorm(self, node: Node, pos: int, idx: Index) -> str:
        """Inference BatchNormalization: elementwise with the parameters of channel ``idx[1]``."""
        if pos != 0:
            raise self.error("BatchNormalization's running statistics outputs are not supported", node)
        if not self.graph.type_of(node.outputs[0]).dtype.is_float:
            raise self.error("BatchNormalization needs a float input", node)
        x = self.value(node.inputs[0], idx)
        scale, bias, mean, var = (self.value(t, (idx[1],)) for t in node.inputs[1:5])
        eps = float(node.attr("epsilon", 1e-5))
        return self.bind(f"({x} - {mean}) * ({scale} / tl.sqrt({var} + {eps!r})) + {bias}")

    def _slice(self, node: Node, idx: Index) -> str:
        consts = [self.graph.const_value(t) if t else None for t in node.inputs]
        if any(t and c is None for t, c in zip(node.inputs[1:], consts[1:])):
            raise self.error("Slice bounds, axes and steps must be constants", node)
        starts, ends, axes, steps = (ref_input_or_attr(consts, node.attrs, i, name)
                                     for i, name in enumerate(("starts", "ends", "axes", "steps"), 1))
        if starts is None or ends is None:
            raise self.error("Slice needs its starts and ends", node)
        shape = self.graph.type_of(node.inputs[0]).shape
        src = []
        for e, n, sl in zip(idx, shape, _slices(shape, starts, ends, axes, steps)):
            r = range(n)[sl]
            src.append(ix.add(ix.mul(e, r.step), r.start) if len(r) else "0")
        return self.value(node.inputs[0], tuple(src))

    def _clip(self, node: Node, idx: Index) -> str:
        x = self.input_at(node, 0, idx)
        lo = self.input_at(node, 1, idx) if len(node.inputs) > 1 and node.inputs[1] else node.attr("min")
        hi = self.input_at(node, 2, idx) if len(node.inputs) > 2 and node.inputs[2] else node.attr("max")
        if lo is not None:
            x = self.bind(f"tl.maximum({x}, {lo})")
        if hi is not None:
            x = self.bind(f"tl.minimum({x}, {hi})")
        return x
