"""Reorganising ops: move, view or select data without arithmetic."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.dims import Dim, dims_equal, slice_length
from autofusion.graph.types import TensorType
from autofusion.ops.common import (
    Arrays,
    dims_of,
    first,
    input_or_attr,
    norm_axis,
    outputs_only_bytes,
    ref_input_or_attr,
    same_as_input,
    same_dtype,
    shape_input,
    static_shape,
)
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError


def _reshape_target(shape_in: tuple[Dim, ...], spec: Sequence[Dim], allowzero: int) -> tuple[Dim, ...]:
    out: list[Dim] = []
    for i, d in enumerate(spec):
        if isinstance(d, int) and d == 0 and not allowzero:
            if i >= len(shape_in):
                raise ShapeError(f"Reshape: 0 at position {i} copies a dimension the input lacks")
            out.append(shape_in[i])
        else:
            out.append(d)
    wildcards = [i for i, d in enumerate(out) if isinstance(d, int) and d == -1]
    if len(wildcards) > 1:
        raise ShapeError("Reshape: at most one -1")
    total = math.prod(shape_in)
    if wildcards:
        known = math.prod(d for i, d in enumerate(out) if i != wildcards[0])
        if known == 0 or total % known != 0:
            raise ShapeError(f"Reshape: cannot reshape {shape_in} to {tuple(spec)}")
        out[wildcards[0]] = total // known
    if dims_equal(math.prod(out), total) is not True:
        raise ShapeError(f"Reshape: cannot reshape {shape_in} to {tuple(spec)}")
    return tuple(out)


def _reshape_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    spec = shape_input(ctx, 1, "shape")
    return (x.with_shape(_reshape_target(x.shape, spec, ctx.attr("allowzero", 0))),)


def _reshape_examples(index: int, types: Sequence[TensorType | None]) -> list[np.ndarray]:
    """Target shapes for a data input of static shape S: S, its reverse, all of it in one axis
    (also as -1), two neighbouring axes merged, an axis split in two, a leading 1, a trailing 1, and
    unit axes around it as a per-channel vector broadcast over images has them ([1, C, 1, 1])."""
    shape = static_shape(types[0])
    if index != 1 or shape is None:
        return []
    out = [shape, shape[::-1], [math.prod(shape)], [-1], [1, *shape], [*shape, 1], [1, *shape, 1, 1]]
    out += [shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2:] for i in range(len(shape) - 1)]
    for i, d in enumerate(shape):
        f = next((f for f in range(2, d) if d % f == 0), None)
        if f is not None:
            out.append(shape[:i] + [f, d // f] + shape[i + 1:])
    unique = {tuple(s): s for s in out}
    return [np.array(s, np.int64) for s in unique.values()]


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


def _squeeze_axes(rank_shape: tuple[int, ...], axes: list[int] | None, op: str) -> tuple[int, ...]:
    if axes is None or not axes:
        return tuple(i for i, d in enumerate(rank_shape) if d == 1)
    out = tuple(sorted({norm_axis(a, len(rank_shape), op) for a in axes}))
    for a in out:
        if rank_shape[a] != 1:
            raise ShapeError(f"{op}: cannot squeeze axis {a} of size {rank_shape[a]}")
    return out


def _squeeze_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    axes = _squeeze_axes(x.shape, input_or_attr(ctx, 1, "axes", "axes"), "Squeeze")
    return (x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in axes)),)


def _squeeze_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    axes = _squeeze_axes(x.shape, ref_input_or_attr(xs, a, 1, "axes"), "Squeeze")
    return (np.squeeze(x, axis=axes).copy(),)


def _unsqueeze_shape(shape: tuple[int, ...], axes: list[int] | None) -> tuple[int, ...]:
    if axes is None:
        raise ShapeError("Unsqueeze: axes are required")
    rank = len(shape) + len(axes)
    norm = sorted(norm_axis(a, rank, "Unsqueeze") for a in axes)
    if len(set(norm)) != len(norm):
        raise ShapeError(f"Unsqueeze: repeated axes {axes}")
    rest = iter(shape)
    return tuple(1 if i in norm else next(rest) for i in range(rank))


def _unsqueeze_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    return (x.with_shape(_unsqueeze_shape(x.shape, input_or_attr(ctx, 1, "axes", "axes"))),)


def _unsqueeze_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    return (x.reshape(_unsqueeze_shape(x.shape, ref_input_or_attr(xs, a, 1, "axes"))).copy(),)


def _flatten_shape(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    rank = len(shape)
    if not -rank <= axis <= rank:
        raise ShapeError(f"Flatten: axis {axis} out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return (math.prod(shape[:axis]), math.prod(shape[axis:]))


def _flatten_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    return (x.with_shape(_flatten_shape(x.shape, ctx.attr("axis", 1))),)


def _flatten_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    return (x.reshape(_flatten_shape(x.shape, a.get("axis", 1))).copy(),)


def _identity_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    return (first(xs).copy(),)


def _concat_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    types = [ctx.type(i) for i in range(len(ctx.input_types))]
    same_dtype(ctx, range(len(types)))
    rank = types[0].rank
    axis = norm_axis(ctx.attr("axis"), rank, "Concat") if ctx.attr("axis") is not None else None
    if axis is None:
        raise ShapeError("Concat: attribute axis is required")
    for t in types:
        if t.rank != rank or any(d != e for i, (d, e) in enumerate(zip(t.shape, types[0].shape)) if i != axis):
            raise ShapeError(f"Concat: shapes {[t.shape for t in types]} differ off axis {axis}")
    shape = list(types[0].shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return (types[0].with_shape(tuple(shape)),)


def _concat_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    arrays = [x for x in xs if x is not None]
    return (np.concatenate(arrays, axis=int(a["axis"]) % arrays[0].ndim),)


def _split_sizes(dim: int, split: list[int] | None, num_outputs: Any) -> list[int]:
    if split is not None:
        if sum(split) != dim or any(s < 0 for s in split):
            raise ShapeError(f"Split: sizes {split} do not add up to {dim}")
        return split
    if num_outputs is None:
        # the IR needs the part count on the node itself so references can run without the node
        raise ShapeError("Split: give split sizes (input or attribute) or the num_outputs attribute")
    n = int(num_outputs)
    if n <= 0:
        raise ShapeError("Split: num_outputs must be positive")
    chunk = -(-dim // n)  # opset 18: the last chunk may be smaller
    return [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]


def _split_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    axis = norm_axis(ctx.attr("axis", 0), x.rank, "Split")
    sizes = _split_sizes(x.shape[axis], input_or_attr(ctx, 1, "split", "split"), ctx.attr("num_outputs"))
    if ctx.node.outputs and len(sizes) != len(ctx.node.outputs):
        raise ShapeError(f"Split: {len(sizes)} parts but {len(ctx.node.outputs)} outputs")
    return tuple(x.with_shape(x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in sizes)


def _split_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    axis = int(a.get("axis", 0)) % x.ndim
    sizes = _split_sizes(x.shape[axis], ref_input_or_attr(xs, a, 1, "split"), a.get("num_outputs"))
    bounds = np.cumsum(sizes)[:-1]
    return tuple(p.copy() for p in np.split(x, bounds, axis=axis))


def _slices(shape: tuple[int, ...], starts: list[int], ends: list[int], axes: list[int] | None,
            steps: list[int] | None) -> tuple[slice, ...]:
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [norm_axis(x, rank, "Slice") for x in axes]
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError("Slice: starts, ends, axes and steps differ in length")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"Slice: repeated axes {axes}")
    out = [slice(None)] * rank
    for s, e, ax, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ShapeError("Slice: step 0")
        out[ax] = slice(s, e, st)  # Python slicing clamps exactly as ONNX specifies
    return tuple(out)


def _slice_args(get: Any) -> tuple[list[int], list[int], list[int] | None, list[int] | None]:
    starts, ends, axes, steps = (get(i, name) for i, name in enumerate(("starts", "ends", "axes", "steps"), 1))
    if starts is None or ends is None:
        raise ShapeError("Slice: starts and ends are required")
    return starts, ends, axes, steps


def _slice_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)

    def read(i: int, name: str) -> list[Any] | None:  # starts and ends may be symbolic sizes
        if name in ("starts", "ends") and ctx.has_input(i):
            return dims_of(ctx.const(i, name))
        return input_or_attr(ctx, i, name, name)

    sl = _slices(x.shape, *_slice_args(read))
    return (x.with_shape(tuple(slice_length(d, s.start, s.stop, s.step) if s != slice(None) else d
                               for d, s in zip(x.shape, sl))),)


def _slice_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    return (x[_slices(x.shape, *_slice_args(lambda i, n: ref_input_or_attr(xs, a, i, n)))].copy(),)


def _pad_widths(rank: int, pads: list[int] | None, axes: list[int] | None) -> list[tuple[int, int]]:
    if pads is None:
        raise ShapeError("Pad: pads are required")
    axes = list(range(rank)) if axes is None else [norm_axis(x, rank, "Pad") for x in axes]
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pad: {len(pads)} pads for {len(axes)} axes")
    widths = [(0, 0)] * rank
    for k, ax in enumerate(axes):
        widths[ax] = (pads[k], pads[k + len(axes)])
    return widths


def _pad_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    widths = _pad_widths(x.rank, input_or_attr(ctx, 1, "pads", "pads"), input_or_attr(ctx, 3, "axes", "axes"))
    shape = tuple(d + b + e for d, (b, e) in zip(x.shape, widths))
    if any(d < 0 for d in shape):
        raise ShapeError(f"Pad: negative pads remove more than {x.shape}")
    return (x.with_shape(shape),)


def _pad_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    widths = _pad_widths(x.ndim, ref_input_or_attr(xs, a, 1, "pads"), ref_input_or_attr(xs, a, 3, "axes"))
    # negative pads crop first; the rest pads
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for d, (b, e) in zip(x.shape, widths))
    x = x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    mode = a.get("mode", "constant")
    if mode == "constant":
        value = xs[2] if len(xs) > 2 and xs[2] is not None and xs[2].size else a.get("value", 0.0)
        out = np.pad(x, grow, mode="constant", constant_values=np.asarray(value, dtype=x.dtype).reshape(()))
    elif mode in ("reflect", "edge", "wrap"):
        out = np.pad(x, grow, mode=mode)
    else:
        raise ValueError(f"Pad: unknown mode {mode!r}")
    return (out.astype(x.dtype, copy=False),)


def _depth_to_space_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    b = int(a["blocksize"])
    n, c, h, w = x.shape
    if a.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return (np.ascontiguousarray(y.reshape(n, c // (b * b), h * b, w * b)),)


def _depth_to_space_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x, b = ctx.type(0), int(ctx.attr("blocksize"))
    if x.rank != 4 or x.shape[1] % (b * b):
        raise ShapeError(f"DepthToSpace: input {x.shape} is not NCHW with C divisible by {b * b}")
    n, c, h, w = x.shape
    return (x.with_shape((n, c // (b * b), h * b, w * b)),)


def _space_to_depth_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    b = int(a["blocksize"])
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return (np.ascontiguousarray(y.reshape(n, c * b * b, h // b, w // b)),)


def _space_to_depth_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x, b = ctx.type(0), int(ctx.attr("blocksize"))
    if x.rank != 4 or x.shape[2] % b or x.shape[3] % b:
        raise ShapeError(f"SpaceToDepth: input {x.shape} is not NCHW with H, W divisible by {b}")
    n, c, h, w = x.shape
    return (x.with_shape((n, c * b * b, h // b, w // b)),)


def ops() -> list[OpDef]:
    return [
        OpDef("Reshape", OpClass.REORGANIZE, ("data", "shape"), _reshape_infer, _reshape_ref,
              attrs={"allowzero": 0}, view=True, const_inputs=(1,), example_values=_reshape_examples,
              doc="Same data, new shape.", flops_per_element=0),
        OpDef("Transpose", OpClass.REORGANIZE, ("data",), _transpose_infer, _transpose_ref,
              attrs={"perm": None}, doc="Permutes axes (reverses them by default).", flops_per_element=0),
        OpDef("Squeeze", OpClass.REORGANIZE, ("data", "axes?"), _squeeze_infer, _squeeze_ref,
              attrs={"axes": None}, view=True, const_inputs=(1,), doc="Drops size-1 axes.", flops_per_element=0),
        OpDef("Unsqueeze", OpClass.REORGANIZE, ("data", "axes?"), _unsqueeze_infer, _unsqueeze_ref,
              attrs={"axes": None}, view=True, const_inputs=(1,), doc="Inserts size-1 axes.", flops_per_element=0),
        OpDef("Flatten", OpClass.REORGANIZE, ("input",), _flatten_infer, _flatten_ref,
              attrs={"axis": 1}, view=True, doc="Views as 2-D, splitting the axes at axis.", flops_per_element=0),
        OpDef("Identity", OpClass.REORGANIZE, ("input",), same_as_input, _identity_ref,
              view=True, doc="The input itself.", flops_per_element=0),
        OpDef("Concat", OpClass.REORGANIZE, ("inputs*",), _concat_infer, _concat_ref,
              attrs={"axis": None}, doc="Joins inputs along axis.", flops_per_element=0),
        OpDef("Split", OpClass.REORGANIZE, ("input", "split?"), _split_infer, _split_ref,
              attrs={"axis": 0, "num_outputs": None, "split": None}, num_outputs=None, const_inputs=(1,),
              doc="Splits along axis by sizes (input or attribute) or into num_outputs parts.", flops_per_element=0),
        OpDef("Slice", OpClass.REORGANIZE, ("data", "starts?", "ends?", "axes?", "steps?"),
              _slice_infer, _slice_ref, attrs={"starts": None, "ends": None, "axes": None},
              bytes_moved=outputs_only_bytes, const_inputs=(1, 2, 3, 4),
              doc="Strided sub-block; reads only the selected elements.", flops_per_element=0),
        OpDef("Pad", OpClass.REORGANIZE, ("data", "pads?", "constant_value?", "axes?"), _pad_infer, _pad_ref,
              attrs={"mode": "constant", "pads": None, "value": 0.0}, const_inputs=(1, 3),
              doc="Pads (or crops, for negative pads) with a constant, reflection, edge or wrap.", flops_per_element=0),
        OpDef("DepthToSpace", OpClass.REORGANIZE, ("input",), _depth_to_space_infer, _depth_to_space_ref,
              attrs={"blocksize": None, "mode": "DCR"}, doc="Moves channel blocks into space.", flops_per_element=0),
        OpDef("SpaceToDepth", OpClass.REORGANIZE, ("input",), _space_to_depth_infer, _space_to_depth_ref,
              attrs={"blocksize": None}, doc="Moves spatial blocks into channels.", flops_per_element=0),
    ]
