"""An ``nn.LSTMCell`` unrolled over time steps, then a linear head, as the TorchScript exporter writes it.

Per time step ``t`` (``tests/data/models/lstm_unrolled_script.onnx``): ``Gather(x, t, axis=1)``,
``Gemm(h, W_hh^T) + b_hh`` and ``Gemm(x_t, W_ih^T) + b_ih`` (transB=1), ``Add``, ``Split`` into the
four gates, ``Sigmoid`` (input), ``Sigmoid`` (forget), ``Tanh`` (cell), ``Sigmoid`` (output),
``c = f * c + i * g`` (``Mul``, ``Mul``, ``Add``), ``h = o * tanh(c)`` (``Tanh``, ``Mul``). The first
step reads constant zero ``h0``/``c0``. A ``Gemm`` head maps the last ``h`` to ``y``.

The input is ``x`` ``[batch, steps, input]`` (batch first). Weights use PyTorch's default
U(-1/sqrt(hidden), 1/sqrt(hidden)).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from autofusion.ir import DType, Graph
from autofusion.models.export_builder import ExportBuilder
from autofusion.models.weights import WeightInit, zeros


@dataclass(frozen=True)
class LSTMConfig:
    """Sizes of the LSTM cell and its head; the number of time steps is chosen at build time."""

    input_size: int
    hidden: int
    outputs: int


def _cell(e: ExportBuilder, scope: str, x_t: str, h: str, c: str, w_ih: str, w_hh: str, b_ih: str, b_hh: str,
          hidden: int) -> tuple[str, str]:
    gh = e.node(scope, "Gemm", h, w_hh, b_hh, alpha=1.0, beta=1.0, transB=1)
    gx = e.node(scope, "Gemm", x_t, w_ih, b_ih, alpha=1.0, beta=1.0, transB=1)
    gates = e.node(scope, "Add", gh, gx)
    i, f, g, o = e.node_multi(scope, "Split", [gates, e.shape(scope, (hidden,) * 4)], 4, axis=1)
    i, f = e.node(scope, "Sigmoid", i), e.node(scope, "Sigmoid", f)
    g, o = e.node(scope, "Tanh", g), e.node(scope, "Sigmoid", o)
    c = e.node(scope, "Add", e.node(scope, "Mul", f, c), e.node(scope, "Mul", i, g))
    h = e.node(scope, "Mul", o, e.node(scope, "Tanh", c))
    return h, c


def build_lstm(cfg: LSTMConfig, steps: int, batch: int, seed: int, name: str,
               weights: Mapping[str, np.ndarray] | None = None) -> Graph:
    """The unrolled LSTM over ``steps`` time steps for ``batch`` sequences, weights from ``seed``."""
    e = ExportBuilder(name, weights=weights)
    w = WeightInit(seed)
    x = e.input("x", (batch, steps, cfg.input_size), DType.FLOAT32)
    gates = 4 * cfg.hidden
    w_ih = e.param("cell.weight_ih", w.torch_default((gates, cfg.input_size), cfg.hidden))
    w_hh = e.param("cell.weight_hh", w.torch_default((gates, cfg.hidden), cfg.hidden))
    b_ih = e.param("cell.bias_ih", w.torch_default((gates,), cfg.hidden))
    b_hh = e.param("cell.bias_hh", w.torch_default((gates,), cfg.hidden))
    h = e.const("/cell", zeros((batch, cfg.hidden)))  # the initial state is a Constant, not a parameter
    c = e.const("/cell", zeros((batch, cfg.hidden)))
    for t in range(steps):
        x_t = e.node("", "Gather", x, e.const("", np.int64(t)), axis=1)
        h, c = _cell(e, "/cell" if t == 0 else f"/cell_{t}", x_t, h, c, w_ih, w_hh, b_ih, b_hh, cfg.hidden)
    head_w = e.param("head.weight", w.torch_default((cfg.outputs, cfg.hidden), cfg.hidden))
    head_b = e.param("head.bias", w.torch_default((cfg.outputs,), cfg.hidden))
    y = e.node("/head", "Gemm", h, head_w, head_b, alpha=1.0, beta=1.0, transB=1, output="y")
    return e.build([y])
