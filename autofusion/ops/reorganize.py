"""Reorganising ops: move, view or select data without arithmetic."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.ir.types import TensorType
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError

Arrays = Sequence[np.ndarray | None]


def _reshape_target(shape_in: tuple[int, ...], spec: Sequence[int], allowzero: int) -> tuple[int, ...]:
    out = []
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= len(shape_in):
                raise ShapeError(f"Reshape: 0 at position {i} copies a dimension the input lacks")
            out.append(shape_in[i])
        else:
            out.append(int(d))
    if out.count(-1) > 1:
        raise ShapeError("Reshape: at most one -1")
    total = int(np.prod(shape_in))
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or total % known:
            raise ShapeError(f"Reshape: cannot reshape {shape_in} to {tuple(spec)}")
        out[out.index(-1)] = total // known
    if int(np.prod(out)) != total:
        raise ShapeError(f"Reshape: cannot reshape {shape_in} to {tuple(spec)}")
    return tuple(out)


def _reshape_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    spec = [int(v) for v in ctx.const(1, "shape").reshape(-1).tolist()]
    return (x.with_shape(_reshape_target(x.shape, spec, ctx.attr("allowzero", 0))),)


def _reshape_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, s = xs[0], xs[1]
    assert x is not None and s is not None
    shape = _reshape_target(x.shape, [int(v) for v in s.reshape(-1).tolist()], a.get("allowzero", 0))
    return (x.reshape(shape).copy(),)


def _perm(ctx_rank: int, perm: Any) -> tuple[int, ...]:
    return tuple(range(ctx_rank))[::-1] if perm is None else tuple(int(p) for p in perm)


def _transpose_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    perm = _perm(x.rank, ctx.attr("perm"))
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"Transpose: perm {perm} is not a permutation of rank {x.rank}")
    return (x.with_shape(tuple(x.shape[p] for p in perm)),)


def _transpose_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    assert x is not None
    return (np.ascontiguousarray(np.transpose(x, _perm(x.ndim, a.get("perm")))),)


def ops() -> list[OpDef]:
    return [
        OpDef("Reshape", OpClass.REORGANIZE, ("data", "shape"), _reshape_infer, _reshape_ref,
              attrs={"allowzero": 0}, view=True, flops_per_element=0, const_inputs=(1,)),
        OpDef("Transpose", OpClass.REORGANIZE, ("data",), _transpose_infer, _transpose_ref,
              attrs={"perm": None}, flops_per_element=0),
    ]
