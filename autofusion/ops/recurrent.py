"""Recurrent ops: ONNX LSTM (forward, reverse, bidirectional; optional outputs, peepholes, lengths)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.types import TensorType
from autofusion.ops.common import Arrays, first, same_dtype
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError

Activation = Callable[[np.ndarray], np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


def activation(name: str, alpha: float | None, beta: float | None) -> Activation:
    """One of ONNX's recurrent activation functions, with its alpha/beta (or their defaults)."""
    fns: dict[str, tuple[float, float, Callable[[np.ndarray, float, float], np.ndarray]]] = {
        "sigmoid": (0.0, 0.0, lambda x, a, b: _sigmoid(x)),
        "tanh": (0.0, 0.0, lambda x, a, b: np.tanh(x)),
        "relu": (0.0, 0.0, lambda x, a, b: np.maximum(x, 0)),
        "affine": (1.0, 0.0, lambda x, a, b: a * x + b),
        "leakyrelu": (0.01, 0.0, lambda x, a, b: np.where(x < 0, a * x, x)),
        "thresholdedrelu": (1.0, 0.0, lambda x, a, b: np.where(x > a, x, 0)),
        "scaledtanh": (1.0, 1.0, lambda x, a, b: a * np.tanh(b * x)),
        "hardsigmoid": (0.2, 0.5, lambda x, a, b: np.clip(a * x + b, 0, 1)),
        "elu": (1.0, 0.0, lambda x, a, b: np.where(x > 0, x, a * (np.exp(np.minimum(x, 0)) - 1))),
        "softsign": (0.0, 0.0, lambda x, a, b: x / (1 + np.abs(x))),
        "softplus": (0.0, 0.0, lambda x, a, b: np.logaddexp(0, x)),
    }
    key = name.lower()
    if key not in fns:
        raise ShapeError(f"unknown recurrent activation {name!r}")
    da, db, fn = fns[key]
    a, b = da if alpha is None else alpha, db if beta is None else beta
    return lambda x: fn(x, a, b)


def _activations(a: Any, per_direction: int, dirs: int, defaults: Sequence[str]) -> list[list[Activation]]:
    names = list(a("activations", None) or list(defaults) * dirs)
    if len(names) != per_direction * dirs:
        raise ShapeError(f"expected {per_direction * dirs} activations, got {len(names)}")
    alphas = list(a("activation_alpha", None) or [])
    betas = list(a("activation_beta", None) or [])
    acts = [activation(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
            for i, n in enumerate(names)]
    return [acts[d * per_direction:(d + 1) * per_direction] for d in range(dirs)]


def _num_directions(direction: str) -> int:
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ShapeError(f"unknown direction {direction!r}")
    return 2 if direction == "bidirectional" else 1


def _lstm_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x, w, r = ctx.type(0), ctx.type(1), ctx.type(2)
    same_dtype(ctx, (0, 1, 2, 3, 5, 6, 7))
    dirs = _num_directions(ctx.attr("direction", "forward"))
    hidden = ctx.attr("hidden_size")
    if x.rank != 3 or w.rank != 3 or r.rank != 3:
        raise ShapeError("LSTM: X, W and R must have rank 3")
    hidden = int(hidden) if hidden is not None else r.shape[-1]
    layout = int(ctx.attr("layout", 0))
    seq, batch, size = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    if w.shape != (dirs, 4 * hidden, size) or r.shape != (dirs, 4 * hidden, hidden):
        raise ShapeError(f"LSTM: W {w.shape} / R {r.shape} do not match {dirs} directions, hidden {hidden}, "
                         f"input size {size}")
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    expected = {3: (dirs, 8 * hidden), 4: (batch,), 5: state, 6: state, 7: (dirs, 3 * hidden)}
    for i, shape in expected.items():
        if ctx.has_input(i) and ctx.type(i).shape != shape:
            raise ShapeError(f"LSTM: input {i} has shape {ctx.type(i).shape}, expected {shape}")
    _activations(ctx.attr, 3, dirs, ("Sigmoid", "Tanh", "Tanh"))
    y_shape = (batch, seq, dirs, hidden) if layout else (seq, dirs, batch, hidden)
    return (x.with_shape(y_shape), x.with_shape(state), x.with_shape(state))


def _lstm_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, w, r = first(xs), xs[1], xs[2]
    assert w is not None and r is not None

    layout = int(a.get("layout", 0))

    def opt(i: int) -> np.ndarray | None:
        v = xs[i] if len(xs) > i else None
        return v.transpose(1, 0, 2) if v is not None and layout and i in (5, 6) else v  # batch-first states

    if layout:
        x = x.transpose(1, 0, 2)
    seq, batch, _ = x.shape
    dirs, hidden = w.shape[0], r.shape[-1]
    direction = a.get("direction", "forward")
    acts = _activations(a.get, 3, dirs, ("Sigmoid", "Tanh", "Tanh"))
    clip = a.get("clip")
    lens = opt(4)
    lens = np.full(batch, seq, np.int64) if lens is None else lens.astype(np.int64)
    y = np.zeros((seq, dirs, batch, hidden), dtype=x.dtype)
    y_h = np.zeros((dirs, batch, hidden), dtype=x.dtype)
    y_c = np.zeros_like(y_h)
    for d in range(dirs):
        b = opt(3)
        bias = (b[d, :4 * hidden] + b[d, 4 * hidden:]) if b is not None else np.zeros(4 * hidden, x.dtype)
        h0, c0, p = opt(5), opt(6), opt(7)
        h = h0[d].copy() if h0 is not None else np.zeros((batch, hidden), x.dtype)
        c = c0[d].copy() if c0 is not None else np.zeros((batch, hidden), x.dtype)
        pi, po, pf = np.split(p[d], 3) if p is not None else (0, 0, 0)
        f_act, g_act, h_act = acts[d]
        reverse = direction == "reverse" or d == 1
        gates_x = x @ w[d].T + bias  # the input projection of every step at once
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            live = (t < lens)[:, None]  # steps past a sequence's length leave its state alone
            gates = gates_x[t] + h @ r[d].T
            if clip is not None:
                gates = np.clip(gates, -clip, clip)
            gi, go, gf, gc = np.split(gates, 4, axis=-1)
            i_g = f_act(gi + pi * c)
            f_g = 1 - i_g if a.get("input_forget", 0) else f_act(gf + pf * c)
            c_new = f_g * c + i_g * g_act(gc)
            o_g = f_act(go + po * c_new)
            h_new = o_g * h_act(c_new)
            c = np.where(live, c_new, c)
            h = np.where(live, h_new, h)
            y[t, d] = np.where(live, h_new, 0)
        y_h[d], y_c[d] = h, c
    if layout:
        return (y.transpose(2, 0, 1, 3).copy(), y_h.transpose(1, 0, 2).copy(), y_c.transpose(1, 0, 2).copy())
    return (y, y_h, y_c)


def _lstm_flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    x, r = ctx.type(0), ctx.type(2)
    dirs, hidden = r.shape[0], r.shape[-1]
    steps = x.shape[0] * x.shape[1]  # seq * batch in either layout
    per_step = 2 * 4 * hidden * (x.shape[2] + hidden) + 4 * hidden * 12  # two matmuls + gate arithmetic
    return dirs * steps * per_step


def ops() -> list[OpDef]:
    return [
        OpDef("LSTM", OpClass.OPAQUE,
              ("X", "W", "R", "B?", "sequence_lens?", "initial_h?", "initial_c?", "P?"),
              _lstm_infer, _lstm_ref, num_outputs=None, flops=_lstm_flops,
              attrs={"activation_alpha": None, "activation_beta": None, "activations": None, "clip": None,
                     "direction": "forward", "hidden_size": None, "input_forget": 0, "layout": 0},
              doc="Long short-term memory over a sequence; outputs Y, Y_h, Y_c (each optional)."),
    ]
