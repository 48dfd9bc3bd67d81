"""Broadcast ops: the output is larger than an input by replication (Expand, Tile)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autofusion.graph.types import TensorType
from autofusion.ops.common import Arrays, dims_of, first, ints
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError, broadcast_shapes


def _expand_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    # ONNX Expand broadcasts both ways: a 1 in the target keeps the input's dimension
    return (x.with_shape(broadcast_shapes(x.shape, tuple(dims_of(ctx.const(1, "shape"))))),)


def _expand_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, shape = first(xs), xs[1]
    assert shape is not None
    target = broadcast_shapes(x.shape, tuple(ints(shape)))
    return (np.broadcast_to(x, target).copy(),)


def _read_input_once(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    return ctx.type(0).nbytes + outs[0].nbytes


def _tile_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    reps = ints(ctx.const(1, "repeats"))
    if len(reps) != x.rank or any(r < 0 for r in reps):
        raise ShapeError(f"Tile: repeats {reps} must be {x.rank} non-negative counts")
    return (x.with_shape(tuple(d * r for d, r in zip(x.shape, reps))),)


def _tile_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, reps = first(xs), xs[1]
    assert reps is not None
    return (np.tile(x, ints(reps)).reshape(tuple(d * r for d, r in zip(x.shape, ints(reps)))),)


def ops() -> list[OpDef]:
    b = OpClass.BROADCAST
    return [
        OpDef("Expand", b, ("input", "shape"), _expand_infer, _expand_ref, flops_per_element=0,
              bytes_moved=_read_input_once, const_inputs=(1,),
              doc="Broadcasts the input to a shape (numpy rules, both ways)."),
        OpDef("Tile", b, ("input", "repeats"), _tile_infer, _tile_ref, flops_per_element=0,
              bytes_moved=_read_input_once, const_inputs=(1,), doc="Repeats the input along each axis."),
    ]
