"""GPT-2 (transformers ``GPT2Model``) as the TorchScript exporter writes it, shape subgraphs folded.

Structure, per the export of ``tests/data/models/gpt2_tiny_script.onnx``:

* embeddings: ``Reshape`` of the ids, ``Gather`` of ``wte``, ``Gather`` of ``wpe`` at constant
  position ids followed by the exporter's ``Cast`` to float, ``Add``;
* mask: ``Reshape`` and ``Cast`` of ``attention_mask`` to bool, ``Reshape`` to ``[B, 1, 1, S]``,
  ``And`` with the constant lower-triangular causal mask ``[1, 1, S, S]``,
  ``Where(mask, 0, float32 min)``;
* each block: ``LayerNormalization``; Conv1D layers as ``Reshape`` to 2-D, ``Gemm`` (weights
  ``[in, out]``), ``Reshape`` back; the fused ``c_attn`` projection ``Split`` into Q, K, V;
  heads by ``Reshape``/``Transpose``; ``MatMul(Q, K^T)``, ``Mul`` by 1/sqrt(head size), ``Add``
  mask, ``Softmax``, ``Cast``, ``MatMul`` with V; ``c_proj``; residual ``Add``; ``LayerNormalization``;
  MLP ``c_fc``, GELU in its tanh form (``Mul``/``Pow``/``Mul``/``Add``/``Mul``/``Tanh``/``Add``/``Mul``),
  ``c_proj``, residual ``Add``;
* ``ln_f`` and a final ``Reshape`` to ``last_hidden_state`` ``[B, S, H]``.

Weights are N(0, 0.02) (biases too), LayerNorm gamma 1 and beta 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from autofusion.graph.dims import Dim
from autofusion.ir import DType, Graph
from autofusion.models.export_builder import ExportBuilder
from autofusion.models.weights import WeightInit, ones, zeros

BOOL = 9  # ONNX element type codes used by Cast
FLOAT = 1


@dataclass(frozen=True)
class GPT2Config:
    """Sizes of a GPT-2 decoder stack."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    n_positions: int
    eps: float = 1e-5
    init_std: float = 0.02

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads

    @property
    def inner(self) -> int:
        return 4 * self.hidden


def _conv1d(e: ExportBuilder, w: WeightInit, scope: str, prefix: str, x: str, lead: tuple[int, ...],
            n_in: int, n_out: int, std: float) -> str:
    """transformers' Conv1D: ``Reshape`` to ``[rows, in]``, ``Gemm`` with W ``[in, out]``, ``Reshape`` back."""
    weight = e.param(f"{prefix}.weight", w.normal((n_in, n_out), std))
    bias = e.param(f"{prefix}.bias", w.normal((n_out,), std))
    flat = e.node(scope, "Reshape", x, e.shape(scope, (-1, n_in)))
    y = e.node(scope, "Gemm", flat, weight, bias, alpha=1.0, beta=1.0)
    return e.node(scope, "Reshape", y, e.shape(scope, (*lead, n_out)))


def _layer_norm(e: ExportBuilder, scope: str, prefix: str, x: str, n: int, eps: float) -> str:
    gamma = e.param(f"{prefix}.weight", ones(n))
    beta = e.param(f"{prefix}.bias", zeros(n))
    return e.node(scope, "LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)


def gelu_tanh(e: ExportBuilder, scope: str, x: str) -> str:
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, node for node as exported (NewGELU)."""
    half = e.node(scope, "Mul", x, e.const(scope, np.float32(0.5)))
    cube = e.node(scope, "Pow", x, e.const(scope, np.float32(3.0)))
    inner = e.node(scope, "Add", x, e.node(scope, "Mul", cube, e.const(scope, np.float32(0.044715))))
    t = e.node(scope, "Tanh", e.node(scope, "Mul", inner, e.const(scope, np.float32(math.sqrt(2.0 / math.pi)))))
    return e.node(scope, "Mul", half, e.node(scope, "Add", t, e.const(scope, np.float32(1.0))))


def _causal_mask(e: ExportBuilder, mask: str, batch: Dim, seq: Dim, n_positions: int) -> str:
    """Padding mask ``[B, S]`` and causal triangle -> additive ``[B, 1, S, S]`` mask."""
    s = ""
    m = e.node(s, "Reshape", mask, e.shape(s, (batch, -1)))
    m = e.node(s, "Cast", m, to=BOOL)
    m = e.node(s, "Reshape", m, e.shape(s, (batch, 1, 1, seq)))
    causal = e.prefix(s, np.tril(np.ones((n_positions, n_positions), dtype=bool))[None, None], seq, axes=[2, 3])
    m = e.node(s, "And", causal, m)
    return e.node(s, "Where", m, e.const(s, np.float32(0.0)), e.const(s, np.finfo(np.float32).min))


def _attention(e: ExportBuilder, w: WeightInit, cfg: GPT2Config, i: int, x: str, mask: str,
               batch: Dim, seq: Dim) -> str:
    s, p = f"/h.{i}/attn", f"h.{i}.attn"
    lead = (batch, seq)
    qkv = _conv1d(e, w, f"{s}/c_attn", f"{p}.c_attn", x, lead, cfg.hidden, 3 * cfg.hidden, cfg.init_std)
    q, k, v = e.node_multi(s, "Split", [qkv, e.shape(s, (cfg.hidden,) * 3)], 3, axis=2)
    heads = (batch, seq, -1, cfg.head_size)
    k = e.node(s, "Reshape", k, e.shape(s, heads))
    v = e.node(s, "Transpose", e.node(s, "Reshape", v, e.shape(s, heads)), perm=(0, 2, 1, 3))
    q = e.node(s, "Transpose", e.node(s, "Reshape", q, e.shape(s, heads)), perm=(0, 2, 1, 3))
    k_t = e.node(s, "Transpose", k, perm=(0, 2, 3, 1))
    scores = e.node(s, "Mul", e.node(s, "MatMul", q, k_t), e.const(s, np.float32(1.0 / math.sqrt(cfg.head_size))))
    probs = e.node(s, "Cast", e.node(s, "Softmax", e.node(s, "Add", scores, mask), axis=-1), to=FLOAT)
    ctx = e.node(s, "Transpose", e.node(s, "MatMul", probs, v), perm=(0, 2, 1, 3))
    ctx = e.node(s, "Reshape", ctx, e.shape(s, (batch, seq, -1)))
    return _conv1d(e, w, f"{s}/c_proj", f"{p}.c_proj", ctx, lead, cfg.hidden, cfg.hidden, cfg.init_std)


def _block(e: ExportBuilder, w: WeightInit, cfg: GPT2Config, i: int, x: str, mask: str, batch: Dim, seq: Dim) -> str:
    s, p = f"/h.{i}", f"h.{i}"
    lead = (batch, seq)
    a = _attention(e, w, cfg, i, _layer_norm(e, f"{s}/ln_1", f"{p}.ln_1", x, cfg.hidden, cfg.eps), mask, batch, seq)
    x = e.node(s, "Add", a, x)
    h = _layer_norm(e, f"{s}/ln_2", f"{p}.ln_2", x, cfg.hidden, cfg.eps)
    h = _conv1d(e, w, f"{s}/mlp/c_fc", f"{p}.mlp.c_fc", h, lead, cfg.hidden, cfg.inner, cfg.init_std)
    h = gelu_tanh(e, f"{s}/mlp/act", h)
    h = _conv1d(e, w, f"{s}/mlp/c_proj", f"{p}.mlp.c_proj", h, lead, cfg.inner, cfg.hidden, cfg.init_std)
    return e.node(s, "Add", x, h)


def build_gpt2(cfg: GPT2Config, seq: Dim, batch: Dim, seed: int, name: str,
               weights: Mapping[str, np.ndarray] | None = None) -> Graph:
    """A ``GPT2Model`` graph for ``batch`` sequences of ``seq`` tokens, weights from ``seed``."""
    e = ExportBuilder(name, weights=weights)
    w = WeightInit(seed)
    ids = e.input("input_ids", (batch, seq), DType.INT64)
    mask = e.input("attention_mask", (batch, seq), DType.INT64)
    wte = e.param("wte.weight", w.normal((cfg.vocab, cfg.hidden), cfg.init_std))
    wpe = e.param("wpe.weight", w.normal((cfg.n_positions, cfg.hidden), cfg.init_std))
    tokens = e.node("/wte", "Gather", wte, e.node("", "Reshape", ids, e.shape("", (-1, seq))))
    positions = e.node("/wpe", "Gather", wpe, e.prefix("", np.arange(cfg.n_positions, dtype=np.int64)[None, :], seq,
                                                        axes=[1]))
    x = e.node("", "Add", tokens, e.node("", "Cast", positions, to=FLOAT))
    ext_mask = _causal_mask(e, mask, batch, seq, cfg.n_positions)
    for i in range(cfg.layers):
        x = _block(e, w, cfg, i, x, ext_mask, batch, seq)
    x = _layer_norm(e, "/ln_f", "ln_f", x, cfg.hidden, cfg.eps)
    out = e.node("", "Reshape", x, e.shape("", (-1, seq, cfg.hidden)), output="last_hidden_state")
    return e.build([out])
