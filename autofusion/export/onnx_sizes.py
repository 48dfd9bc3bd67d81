"""Symbolic sizes in an exported model: each symbolic constant computed from the inputs' shapes.

A graph with symbolic sizes holds constants such as a Reshape's target ``[batch, seq, 2, 32]``. ONNX
has no initializer for those, so the export computes each one at run time: a symbol is read off an
input that has it as a dimension (``Shape(input_ids, start=1, end=2)`` for ``seq``), expressions are
built from ``Add`` and ``Mul``, and the elements are concatenated into the constant's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autofusion.export.onnx_nodes import OnnxExportError
from autofusion.graph.graph import Graph


class SizeWriter:
    """Nodes computing a graph's symbolic constants; ``fresh`` names the helper tensors."""

    def __init__(self, graph: Graph, fresh: Callable[[str], str]) -> None:
        self.graph = graph
        self.fresh = fresh
        self.nodes: list[onnx.NodeProto] = []
        self._symbols: dict[str, str] = {}  # symbol -> tensor holding it, int64 [1]

    def constants(self) -> list[onnx.NodeProto]:
        """Nodes that compute every symbolic constant under its own name."""
        for name, const in self.graph.constants.items():
            if const.is_symbolic:
                self._constant(name, const.array)
        return self.nodes

    def _constant(self, name: str, array: np.ndarray) -> None:
        parts = [self._value(v) for v in array.reshape(-1).tolist()]
        flat = self.fresh(f"{name}_flat") if len(parts) > 1 or array.ndim != 1 else name
        if len(parts) > 1:
            self.nodes.append(helper.make_node("Concat", parts, [flat], axis=0))
        else:
            self.nodes.append(helper.make_node("Identity", parts, [flat]))
        if flat != name:
            shape = self._ints(list(array.shape))
            self.nodes.append(helper.make_node("Reshape", [flat, shape], [name]))

    def _ints(self, values: list[int]) -> str:
        out = self.fresh("size")
        value = numpy_helper.from_array(np.array(values, np.int64), out)  # value_ints cannot be empty
        self.nodes.append(helper.make_node("Constant", [], [out], value=value))
        return out

    def _value(self, v: Any) -> str:
        """A tensor (int64 [1]) holding the integer or size expression ``v``."""
        if isinstance(v, (int, np.integer)) or getattr(v, "is_Integer", False):
            return self._ints([int(v)])
        if v.is_Symbol:
            return self._symbol(v.name)
        if v.is_Add or v.is_Mul or (v.is_Pow and v.exp.is_Integer and v.exp > 0):
            op = "Add" if v.is_Add else "Mul"
            args = [self._value(a) for a in v.args] if not v.is_Pow else [self._value(v.base)] * int(v.exp)
            out = args[0]
            for a in args[1:]:
                nxt = self.fresh("size")
                self.nodes.append(helper.make_node(op, [out, a], [nxt]))
                out = nxt
            return out
        raise OnnxExportError(f"cannot write the size {v} as ONNX (sums and products of sizes only)")

    def _symbol(self, symbol: str) -> str:
        found = self._symbols.get(symbol)
        if found is not None:
            return found
        for name in self.graph.inputs:
            for axis, d in enumerate(self.graph.types[name].shape):
                if not isinstance(d, int) and d.is_Symbol and d.name == symbol:
                    out = self.fresh(symbol)
                    self.nodes.append(helper.make_node("Shape", [name], [out], start=axis, end=axis + 1))
                    self._symbols[symbol] = out
                    return out
        raise OnnxExportError(f"size {symbol!r} is no input's dimension: the exported model could not compute it")

