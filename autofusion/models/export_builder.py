"""Graph construction in the style of ``torch.onnx.export`` (TorchScript exporter, opset 17).

The built-in models are written with :class:`ExportBuilder`, a thin layer over
:class:`autofusion.ir.GraphBuilder` that names things the way the exporter does, so a built-in
graph reads like an imported one: node ``/encoder/layer.0/attention/self/query/MatMul`` writes
tensor ``/encoder/layer.0/attention/self/query/MatMul_output_0``; weights keep their PyTorch
state-dict names (``encoder.layer.0.attention.self.query.weight``).

>>> import numpy as np
>>> from autofusion.ir import DType
>>> e = ExportBuilder("demo")
>>> x = e.input("x", (2, 4), DType.FLOAT32)
>>> w = e.param("fc.weight", np.ones((4, 3), np.float32))
>>> y = e.node("/fc", "MatMul", x, w)
>>> y
'/fc/MatMul_output_0'
>>> e.build([y]).nodes[0].name
'/fc/MatMul'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.dims import Dim, is_static
from autofusion.ir import DType, Graph, GraphBuilder
from autofusion.ops.registry import OpRegistry


class WeightError(ValueError):
    """Given weights do not fit the model (unknown name or wrong shape)."""


class ExportBuilder:
    """Adds nodes named ``{scope}/{Op}``, ``{scope}/{Op}_1``, ... as the TorchScript exporter does."""

    def __init__(self, name: str, registry: OpRegistry | None = None,
                 weights: Mapping[str, np.ndarray] | None = None) -> None:
        self.builder = GraphBuilder(name, registry)
        self._uses: dict[str, int] = {}
        self._weights = dict(weights or {})
        self._used_weights: set[str] = set()

    def _unique(self, base: str) -> str:
        k = self._uses.get(base, 0)
        self._uses[base] = k + 1
        return base if k == 0 else f"{base}_{k}"

    def input(self, name: str, shape: Sequence[Dim], dtype: DType) -> str:
        return self.builder.input(name, shape, dtype)

    def param(self, name: str, value: np.ndarray) -> str:
        """A weight under its state-dict name: ``value``, or the given weight of that name."""
        given = self._weights.get(name)
        if given is not None:
            given = np.asarray(given)
            if given.shape != value.shape:
                raise WeightError(f"weight {name!r}: given shape {given.shape}, the model needs {value.shape}")
            value = given.astype(value.dtype, copy=False)
            self._used_weights.add(name)
        return self.builder.const(value, name)

    def const(self, scope: str, value: Any, dtype: np.dtype | type | None = None) -> str:
        """A small constant (scalar, shape vector, index tensor) as a ``Constant`` node would give."""
        array = np.asarray(value, dtype=dtype)
        if array.dtype == np.float64:
            array = array.astype(np.float32)  # the exporter writes Python floats as float32
        return self.builder.const(array, self._unique(f"{scope}/Constant") + "_output_0")

    def shape(self, scope: str, dims: Sequence[Dim]) -> str:
        """An int64 shape vector for Reshape / Expand / Split (symbolic when a size is)."""
        if all(is_static(d) for d in dims):
            return self.const(scope, list(dims), np.int64)
        return self.builder.const(np.array(list(dims), dtype=object), self._unique(f"{scope}/Concat") + "_output_0")

    def prefix(self, scope: str, table: np.ndarray, length: Dim, axes: Sequence[int]) -> str:
        """The first ``length`` entries along ``axes`` of a constant table (position ids, the causal
        mask): the constant itself for a fixed length, a ``Slice`` of the whole table for a symbolic
        one, as the exporters write a model with dynamic axes."""
        if is_static(length):
            return self.const(scope, table[tuple(slice(0, length) if d in axes else slice(None)
                                                 for d in range(table.ndim))])
        whole = self.const(scope, table)
        starts, ends = self.const(scope, [0] * len(axes), np.int64), self.shape(scope, [length] * len(axes))
        return self.node(scope, "Slice", whole, starts, ends, self.const(scope, list(axes), np.int64))

    def node(self, scope: str, op: str, *inputs: str, output: str | None = None, **attrs: Any) -> str:
        """One single-output node; its output is ``{node name}_output_0`` unless ``output`` names it."""
        name = self._unique(f"{scope}/{op}")
        out = output or f"{name}_output_0"
        return self.builder.op_multi(op, list(inputs), 1, name=name, output_names=[out], **attrs)[0]

    def node_multi(self, scope: str, op: str, inputs: Sequence[str], num_outputs: int, **attrs: Any) -> list[str]:
        """A node with several outputs (Split): ``{node name}_output_0``, ``_output_1``, ..."""
        name = self._unique(f"{scope}/{op}")
        outs = [f"{name}_output_{i}" for i in range(num_outputs)]
        return self.builder.op_multi(op, list(inputs), num_outputs, name=name, output_names=outs, **attrs)

    def build(self, outputs: Sequence[str]) -> Graph:
        unused = sorted(set(self._weights) - self._used_weights)
        if unused:
            raise WeightError(f"given weights the model does not have: {', '.join(unused[:8])}"
                              + (f" and {len(unused) - 8} more" if len(unused) > 8 else ""))
        return self.builder.build(outputs)
