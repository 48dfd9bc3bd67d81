"""Broadcast ops: the output is larger than an input by replication (Expand, Tile)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.types import TensorType
from autofusion.ops.common import Arrays, first, ints, shape_input, static_shape
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError, broadcast_shapes


def _expand_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    # ONNX Expand broadcasts both ways: a 1 in the target keeps the input's dimension
    return (x.with_shape(broadcast_shapes(x.shape, tuple(shape_input(ctx, 1, "shape")))),)


def _expand_examples(index: int, types: Sequence[TensorType | None]) -> list[np.ndarray]:
    """Targets for an input of static shape S: S itself, S under a new leading axis, each size-1
    axis of S widened to 3, all ones (which keep S)."""
    shape = static_shape(types[0])
    if index != 1 or shape is None:
        return []
    out = [shape, [2, *shape], [3 if d == 1 else d for d in shape], [1] * len(shape)]
    return [np.array(s, np.int64) for s in {tuple(s): s for s in out}.values()]


def _tile_examples(index: int, types: Sequence[TensorType | None]) -> list[np.ndarray]:
    """Repeats for an input of static shape S: once each, twice along one axis, twice along all."""
    shape = static_shape(types[0])
    if index != 1 or shape is None:
        return []
    out = [[1] * len(shape), [2] * len(shape)] + [[2 if j == i else 1 for j in range(len(shape))]
                                                  for i in range(len(shape))]
    return [np.array(s, np.int64) for s in {tuple(s): s for s in out}.values()]


def _expand_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, shape = first(xs), xs[1]
    assert shape is not None
    target = broadcast_shapes(x.shape, tuple(ints(shape)))
    return (np.broadcast_to(x, target).copy(),)


def _read_input_once(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    return ctx.type(0).nbytes + outs[0].nbytes


def _tile_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    reps = [int(r) for r in shape_input(ctx, 1, "repeats")]
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
              bytes_moved=_read_input_once, const_inputs=(1,), example_values=_expand_examples,
              doc="Broadcasts the input to a shape (numpy rules, both ways)."),
        OpDef("Tile", b, ("input", "repeats"), _tile_infer, _tile_ref, flops_per_element=0,
              bytes_moved=_read_input_once, const_inputs=(1,), example_values=_tile_examples,
              doc="Repeats the input along each axis."),
    ]
