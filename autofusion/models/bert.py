"""BERT (transformers ``BertModel``) as the TorchScript exporter writes it, shape subgraphs folded.

Structure, per the export of ``tests/data/models/bert_tiny_script.onnx``:

* embeddings: ``Gather`` of word and token-type embeddings, ``Add``, ``Gather`` of position
  embeddings at constant position ids (kept, so the full table counts as parameters, though a
  constant folder could fold it), ``Add``, ``LayerNormalization`` (epsilon 1e-12);
* mask: ``Cast`` to bool, ``Reshape`` to ``[B, 1, 1, S]``, ``Expand`` to ``[B, 1, S, S]``,
  ``Where(mask, 0, float32 min)`` (the exporter's index arithmetic around it folds to a reshape);
* each layer: ``MatMul`` + ``Add`` for Q, K and V, ``Reshape``/``Transpose`` into heads, scores
  ``MatMul(Q, K^T)``, ``Mul`` by 1/sqrt(head size), ``Add`` mask, ``Softmax``, ``MatMul`` with V,
  ``Transpose``/``Reshape`` back, output ``MatMul`` + ``Add``, residual ``Add``, ``LayerNormalization``,
  FFN ``MatMul`` + ``Add``, exact GELU as ``Div``/``Erf``/``Add``/``Mul``/``Mul``, ``MatMul`` + ``Add``,
  residual ``Add``, ``LayerNormalization``;
* pooler: ``Gather`` of token 0, ``Gemm`` (transB=1), ``Tanh``.

Outputs ``last_hidden_state`` ``[B, S, H]`` and ``pooler_output`` ``[B, H]``. Weights are N(0, 0.02)
(biases too, so that every bias add shows in the numbers), LayerNorm gamma 1 and beta 0.
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
class BertConfig:
    """Sizes of a BERT encoder."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int
    type_vocab: int = 2
    eps: float = 1e-12
    init_std: float = 0.02

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


def _linear_matmul(e: ExportBuilder, w: WeightInit, scope: str, prefix: str, x: str, n_in: int, n_out: int,
                   std: float) -> str:
    """``MatMul(x, W) + b`` with W stored ``[in, out]`` as the exporter pre-transposes it."""
    weight = e.param(f"{prefix}.weight", w.normal((n_in, n_out), std))
    bias = e.param(f"{prefix}.bias", w.normal((n_out,), std))
    y = e.node(scope, "MatMul", x, weight)
    return e.node(scope, "Add", bias, y)  # the exporter puts the bias first


def _layer_norm(e: ExportBuilder, scope: str, prefix: str, x: str, n: int, eps: float, output: str | None = None) -> str:
    gamma = e.param(f"{prefix}.weight", ones(n))
    beta = e.param(f"{prefix}.bias", zeros(n))
    return e.node(f"{scope}/LayerNorm", "LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps, output=output)


def gelu_erf(e: ExportBuilder, scope: str, x: str) -> str:
    """``x * (1 + erf(x / sqrt 2)) * 0.5``, node for node as exported."""
    d = e.node(scope, "Div", x, e.const(scope, np.float32(math.sqrt(2.0))))
    erf = e.node(scope, "Erf", d)
    a = e.node(scope, "Add", erf, e.const(scope, np.float32(1.0)))
    m = e.node(scope, "Mul", x, a)
    return e.node(scope, "Mul", m, e.const(scope, np.float32(0.5)))


def _embeddings(e: ExportBuilder, w: WeightInit, cfg: BertConfig, ids: str, token_types: str, seq: Dim) -> str:
    s = "/embeddings"
    std = cfg.init_std
    word = e.param("embeddings.word_embeddings.weight", w.normal((cfg.vocab, cfg.hidden), std))
    pos = e.param("embeddings.position_embeddings.weight", w.normal((cfg.max_positions, cfg.hidden), std))
    types = e.param("embeddings.token_type_embeddings.weight", w.normal((cfg.type_vocab, cfg.hidden), std))
    x = e.node(f"{s}/word_embeddings", "Gather", word, ids)
    t = e.node(f"{s}/token_type_embeddings", "Gather", types, token_types)
    x = e.node(s, "Add", x, t)
    position_ids = e.prefix(s, np.arange(cfg.max_positions, dtype=np.int64)[None, :], seq, axes=[1])
    p = e.node(f"{s}/position_embeddings", "Gather", pos, position_ids)
    x = e.node(s, "Add", x, p)
    return _layer_norm(e, s, "embeddings.LayerNorm", x, cfg.hidden, cfg.eps)


def _extended_mask(e: ExportBuilder, mask: str, batch: Dim, seq: Dim) -> str:
    """``[B, S]`` 0/1 mask -> additive ``[B, 1, S, S]`` mask: 0 where attended, float32 min elsewhere."""
    s = ""
    b = e.node(s, "Cast", mask, to=BOOL)
    b = e.node(s, "Reshape", b, e.shape(s, (batch, 1, 1, seq)))
    b = e.node(s, "Expand", b, e.shape(s, (batch, 1, seq, seq)))
    zero = e.const(s, np.float32(0.0))
    neg = e.const(s, np.finfo(np.float32).min)
    return e.node(s, "Where", b, zero, neg)


def _self_attention(e: ExportBuilder, w: WeightInit, cfg: BertConfig, i: int, x: str, mask: str,
                    batch: Dim, seq: Dim) -> str:
    s = f"/encoder/layer.{i}/attention/self"
    p = f"encoder.layer.{i}.attention.self"
    heads_shape = (batch, seq, -1, cfg.head_size)
    q = _linear_matmul(e, w, f"{s}/query", f"{p}.query", x, cfg.hidden, cfg.hidden, cfg.init_std)
    q = e.node(s, "Transpose", e.node(s, "Reshape", q, e.shape(s, heads_shape)), perm=(0, 2, 1, 3))
    k = _linear_matmul(e, w, f"{s}/key", f"{p}.key", x, cfg.hidden, cfg.hidden, cfg.init_std)
    k = e.node(s, "Reshape", k, e.shape(s, heads_shape))
    v = _linear_matmul(e, w, f"{s}/value", f"{p}.value", x, cfg.hidden, cfg.hidden, cfg.init_std)
    v = e.node(s, "Transpose", e.node(s, "Reshape", v, e.shape(s, heads_shape)), perm=(0, 2, 1, 3))
    k_t = e.node(s, "Transpose", k, perm=(0, 2, 3, 1))
    scores = e.node(s, "MatMul", q, k_t)
    scores = e.node(s, "Mul", scores, e.const(s, np.float32(1.0 / math.sqrt(cfg.head_size))))
    probs = e.node(s, "Softmax", e.node(s, "Add", scores, mask), axis=-1)
    ctx = e.node(s, "Transpose", e.node(s, "MatMul", probs, v), perm=(0, 2, 1, 3))
    return e.node(s, "Reshape", ctx, e.shape(s, (batch, seq, -1)))


def _layer(e: ExportBuilder, w: WeightInit, cfg: BertConfig, i: int, x: str, mask: str, batch: Dim, seq: Dim,
           output: str | None) -> str:
    ctx = _self_attention(e, w, cfg, i, x, mask, batch, seq)
    s, p = f"/encoder/layer.{i}/attention/output", f"encoder.layer.{i}.attention.output"
    a = _linear_matmul(e, w, f"{s}/dense", f"{p}.dense", ctx, cfg.hidden, cfg.hidden, cfg.init_std)
    a = _layer_norm(e, s, f"{p}.LayerNorm", e.node(s, "Add", a, x), cfg.hidden, cfg.eps)
    s, p = f"/encoder/layer.{i}/intermediate", f"encoder.layer.{i}.intermediate"
    f = _linear_matmul(e, w, f"{s}/dense", f"{p}.dense", a, cfg.hidden, cfg.ffn, cfg.init_std)
    f = gelu_erf(e, f"{s}/intermediate_act_fn", f)
    s, p = f"/encoder/layer.{i}/output", f"encoder.layer.{i}.output"
    o = _linear_matmul(e, w, f"{s}/dense", f"{p}.dense", f, cfg.ffn, cfg.hidden, cfg.init_std)
    return _layer_norm(e, s, f"{p}.LayerNorm", e.node(s, "Add", o, a), cfg.hidden, cfg.eps, output=output)


def _pooler(e: ExportBuilder, w: WeightInit, cfg: BertConfig, hidden_states: str) -> str:
    s = "/pooler"
    first = e.node(s, "Gather", hidden_states, e.const(s, np.int64(0)), axis=1)
    weight = e.param("pooler.dense.weight", w.normal((cfg.hidden, cfg.hidden), cfg.init_std))  # [out, in]
    bias = e.param("pooler.dense.bias", w.normal((cfg.hidden,), cfg.init_std))
    y = e.node(f"{s}/dense", "Gemm", first, weight, bias, alpha=1.0, beta=1.0, transB=1)
    return e.node(f"{s}/activation", "Tanh", y, output="pooler_output")


def build_bert(cfg: BertConfig, seq: Dim, batch: Dim, seed: int, name: str,
               weights: Mapping[str, np.ndarray] | None = None) -> Graph:
    """A ``BertModel`` graph for ``batch`` sequences of ``seq`` tokens, weights from ``seed``."""
    e = ExportBuilder(name, weights=weights)
    w = WeightInit(seed)
    ids = e.input("input_ids", (batch, seq), DType.INT64)
    mask = e.input("attention_mask", (batch, seq), DType.INT64)
    token_types = e.input("token_type_ids", (batch, seq), DType.INT64)
    x = _embeddings(e, w, cfg, ids, token_types, seq)
    ext_mask = _extended_mask(e, mask, batch, seq)
    for i in range(cfg.layers):
        x = _layer(e, w, cfg, i, x, ext_mask, batch, seq, "last_hidden_state" if i == cfg.layers - 1 else None)
    pooled = _pooler(e, w, cfg, x)
    return e.build([x, pooled])
