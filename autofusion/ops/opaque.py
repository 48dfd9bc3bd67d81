"""Opaque ops: compute-heavy cores with their own loop nests (MatMul, Gemm, Conv, LSTM, pools)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.types import TensorType
from autofusion.ops import recurrent, spatial
from autofusion.ops.common import same_dtype
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError, broadcast_shapes

Arrays = Sequence[np.ndarray | None]


def _matmul_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    a, b = ctx.type(0), ctx.type(1)
    same_dtype(ctx, (0, 1))
    if a.rank == 0 or b.rank == 0:
        raise ShapeError("MatMul: inputs must have rank >= 1")
    sa = a.shape if a.rank > 1 else (1,) + a.shape
    sb = b.shape if b.rank > 1 else b.shape + (1,)
    if sa[-1] != sb[-2]:
        raise ShapeError(f"MatMul: inner dimensions differ: {a.shape} @ {b.shape}")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    shape = batch + (sa[-2], sb[-1])
    if a.rank == 1:
        shape = shape[:-2] + shape[-1:]
    if b.rank == 1:
        shape = shape[:-1]
    return (TensorType(shape, a.dtype),)


def _matmul_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, y = xs[0], xs[1]
    assert x is not None and y is not None
    return (np.matmul(x, y).astype(x.dtype, copy=False),)


def _matmul_flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    k = ctx.type(0).shape[-1]
    return 2 * k * outs[0].numel


def _gemm_dims(ctx: InferContext) -> tuple[int, int, int]:
    a, b = ctx.type(0), ctx.type(1)
    same_dtype(ctx, (0, 1, 2))
    if a.rank != 2 or b.rank != 2:
        raise ShapeError(f"Gemm: inputs must be matrices, got {a.shape} and {b.shape}")
    m, k = a.shape[::-1] if ctx.attr("transA", 0) else a.shape
    k2, n = b.shape[::-1] if ctx.attr("transB", 0) else b.shape
    if k != k2:
        raise ShapeError(f"Gemm: inner dimensions differ: {k} vs {k2}")
    return m, k, n


def _gemm_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    m, _, n = _gemm_dims(ctx)
    if ctx.has_input(2) and broadcast_shapes(ctx.type(2).shape, (m, n)) != (m, n):
        raise ShapeError(f"Gemm: C {ctx.type(2).shape} does not broadcast to {(m, n)}")
    return (ctx.type(0).with_shape((m, n)),)


def _gemm_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, y = xs[0], xs[1]
    assert x is not None and y is not None
    x = x.T if a.get("transA", 0) else x
    y = y.T if a.get("transB", 0) else y
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    out = x @ y
    if alpha != 1.0:
        out = out * x.dtype.type(alpha)
    if len(xs) > 2 and xs[2] is not None:
        out = out + (xs[2] if beta == 1.0 else xs[2] * x.dtype.type(beta))
    return (out.astype(x.dtype, copy=False),)


def _gemm_flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    m, k, n = _gemm_dims(ctx)
    return 2 * m * k * n + (2 * m * n if ctx.has_input(2) else 0)


def _einsum_terms(eq: str, ranks: Sequence[int]) -> tuple[list[list[str]], list[str]]:
    """Labels of each operand and of the output, with ``...`` expanded into right-aligned labels."""
    lhs, arrow, rhs = eq.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ShapeError(f"Einsum: equation has {len(terms)} operands, got {len(ranks)} inputs")
    ell_ranks = [r - len(t.replace("...", "")) for t, r in zip(terms, ranks)]
    for t, r, n in zip(terms, ranks, ell_ranks):
        if n < 0 or ("..." not in t and n):
            raise ShapeError(f"Einsum: term {t!r} does not match rank {r}")
    ell = [f"...{i}" for i in range(max(ell_ranks, default=0))]

    def expand(term: str, n: int) -> list[str]:
        head, dots, tail = term.partition("...")
        return [*head, *(ell[len(ell) - n:] if dots else []), *tail]

    labels = [expand(t, n) for t, n in zip(terms, ell_ranks)]
    if arrow:
        return labels, expand(rhs, len(ell))
    letters = lhs.replace("...", "").replace(",", "")
    return labels, ell + sorted(c for c in set(letters) if letters.count(c) == 1)


def _einsum_sizes(ctx: InferContext) -> tuple[dict[str, int], list[str]]:
    types = [ctx.type(i) for i in range(len(ctx.input_types))]
    terms, out = _einsum_terms(str(ctx.attr("equation")), [t.rank for t in types])
    sizes: dict[str, int] = {}
    for term, t in zip(terms, types):
        for c, d in zip(term, t.shape):
            prev = sizes.get(c)
            if prev is None or prev == 1:
                sizes[c] = d
            elif d not in (1, prev):
                raise ShapeError(f"Einsum: label {c!r} has sizes {prev} and {d}")
    missing = [c for c in out if c not in sizes]
    if missing:
        raise ShapeError(f"Einsum: output labels {missing} appear in no input")
    return sizes, out


def _einsum_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    sizes, out = _einsum_sizes(ctx)
    return (ctx.type(0).with_shape(tuple(sizes[c] for c in out)),)


def _einsum_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    arrays = [x for x in xs if x is not None]
    return (np.einsum(str(a["equation"]), *arrays, optimize=True).astype(arrays[0].dtype, copy=False),)


def _einsum_flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    sizes, _ = _einsum_sizes(ctx)
    return 2 * int(np.prod(list(sizes.values())))  # one multiply-add per point of the full index space


def ops() -> list[OpDef]:
    o = OpClass.OPAQUE
    return [
        OpDef("MatMul", o, ("A", "B"), _matmul_infer, _matmul_ref, flops=_matmul_flops,
              doc="Matrix product with numpy broadcasting of batch axes.", core="gemm"),
        OpDef("Gemm", o, ("A", "B", "C?"), _gemm_infer, _gemm_ref, flops=_gemm_flops,
              attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
              doc="alpha * A' @ B' + beta * C, with optional transposes.", core="gemm"),
        OpDef("Einsum", o, ("Inputs*",), _einsum_infer, _einsum_ref, flops=_einsum_flops,
              attrs={"equation": None}, doc="Einstein summation over the equation's labels."),
        *spatial.ops(),
        *recurrent.ops(),
    ]
