"""Sliding-window ops over N x C x D1 x ... tensors: Conv, ConvTranspose, MaxPool, AveragePool, LRN.

The references gather one strided view per kernel offset (im2col) and do one batched matmul, so a
ResNet-sized convolution runs in a fraction of a second.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autofusion.graph.types import DType, TensorType
from autofusion.ops.common import Arrays, first, ints, same_dtype
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError

WINDOW_ATTRS: dict[str, Any] = {"auto_pad": "NOTSET", "kernel_shape": None, "pads": None, "strides": None}


@dataclass(frozen=True)
class Window:
    """Where each output element's window starts and how far it reaches, per spatial axis."""

    out: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pad_begin: tuple[int, ...]
    pad_end: tuple[int, ...]
    kernel: tuple[int, ...]


def window(spatial: Sequence[int], kernel: Sequence[int], a: Any, ceil_mode: bool = False) -> Window:
    """Output extent and padding of a sliding window (``a`` reads attributes: ``a(name, default)``)."""
    n = len(spatial)
    if len(kernel) != n:
        raise ShapeError(f"kernel_shape {tuple(kernel)} does not match {n} spatial axes")
    strides = ints(a("strides", None) or [1] * n)
    dilations = ints(a("dilations", None) or [1] * n)
    if len(strides) != n or len(dilations) != n or min(strides + dilations, default=1) < 1:
        raise ShapeError(f"strides {strides} / dilations {dilations} must be {n} positive values")
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    auto_pad = a("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [math.ceil(i / s) for i, s in zip(spatial, strides)]
        total = [max(0, (o - 1) * s + r - i) for o, s, r, i in zip(out, strides, reach, spatial)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    elif auto_pad in ("VALID", "NOTSET"):
        pads = ints(a("pads", None) or [0] * (2 * n)) if auto_pad == "NOTSET" else [0] * (2 * n)
        if len(pads) != 2 * n:
            raise ShapeError(f"pads {pads} must have {2 * n} values")
        begin, end = pads[:n], pads[n:]
        out = []
        for i, b, e, r, s in zip(spatial, begin, end, reach, strides):
            span = i + b + e - r
            if span < 0:
                raise ShapeError(f"window of reach {r} does not fit input of size {i} with pads ({b}, {e})")
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= i + b:
                o -= 1  # the last window may not start in the right padding
            out.append(o)
    else:
        raise ShapeError(f"unknown auto_pad {auto_pad!r}")
    return Window(tuple(out), tuple(strides), tuple(dilations), tuple(begin), tuple(end), tuple(kernel))


def _padded_views(x: np.ndarray, w: Window, fill: float) -> tuple[np.ndarray, list[tuple[slice, ...]]]:
    """``x`` padded (also past the end, for ceil mode) and the strided view of every kernel offset."""
    need = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(w.out, w.strides, w.kernel, w.dilations)]
    widths = [(b, max(e, n - b - i)) for b, e, n, i in zip(w.pad_begin, w.pad_end, need, x.shape[2:])]
    crop = tuple(slice(max(-b, 0), None) for b, _ in widths)  # negative pads crop
    x = x[(slice(None), slice(None)) + crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    xp = np.pad(x, [(0, 0), (0, 0), *widths], constant_values=fill) if any(b or e for b, e in widths) else x
    views = []
    for offs in itertools.product(*(range(k) for k in w.kernel)):
        views.append(tuple(slice(o * d, o * d + (n - 1) * s + 1, s)
                           for o, d, n, s in zip(offs, w.dilations, w.out, w.strides)))
    return xp, views


def _conv_window(ctx: InferContext) -> tuple[Window, int, int]:
    x, wt = ctx.type(0), ctx.type(1)
    same_dtype(ctx, (0, 1, 2))
    group = int(ctx.attr("group", 1))
    if x.rank < 3 or wt.rank != x.rank:
        raise ShapeError(f"Conv: X {x.shape} and W {wt.shape} must both be N x C x D1 ...")
    if x.shape[1] != wt.shape[1] * group or wt.shape[0] % group:
        raise ShapeError(f"Conv: {x.shape[1]} input channels do not match W {wt.shape} with group {group}")
    kernel = ints(ctx.attr("kernel_shape") or wt.shape[2:])
    if tuple(kernel) != wt.shape[2:]:
        raise ShapeError(f"Conv: kernel_shape {kernel} differs from W {wt.shape}")
    if ctx.has_input(2) and ctx.type(2).shape != (wt.shape[0],):
        raise ShapeError(f"Conv: bias must have shape ({wt.shape[0]},)")
    return window(x.shape[2:], kernel, ctx.attr), wt.shape[0], group


def _conv_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    w, m, _ = _conv_window(ctx)
    return (ctx.type(0).with_shape((ctx.type(0).shape[0], m) + w.out),)


def _conv_flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    wt = ctx.type(1)
    per_out = 2 * wt.shape[1] * math.prod(wt.shape[2:])  # Cin/group * kernel multiply-adds
    return outs[0].numel * (per_out + (1 if ctx.has_input(2) else 0))


def conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, a: Mapping[str, Any]) -> np.ndarray:
    """ONNX Conv by im2col and one batched matmul per group."""
    group = int(a.get("group", 1))
    n, c = x.shape[:2]
    m, cg = weight.shape[:2]
    w = window(x.shape[2:], weight.shape[2:], a.get)
    xp, views = _padded_views(x, w, 0.0)
    xg = xp.reshape((n, group, cg) + xp.shape[2:])
    p = math.prod(w.out)
    cols = np.empty((n, group, cg, len(views), p), dtype=x.dtype)
    for k, view in enumerate(views):
        cols[:, :, :, k, :] = xg[(slice(None),) * 3 + view].reshape(n, group, cg, p)
    wg = weight.reshape(group, m // group, cg * len(views))
    out = np.matmul(wg, cols.reshape(n, group, cg * len(views), p)).reshape((n, m) + w.out)
    if bias is not None:
        out += bias.reshape((1, m) + (1,) * len(w.out))
    return out.astype(x.dtype, copy=False)


def _conv_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    weight = xs[1]
    assert weight is not None
    return (conv(first(xs), weight, xs[2] if len(xs) > 2 else None, a),)


def _deconv_geometry(spatial: Sequence[int], kernel: Sequence[int], a: Any) -> tuple[list[int], list[int]]:
    """Output extent and begin-padding of ConvTranspose, as the ONNX reference computes them."""
    n = len(spatial)
    strides = ints(a("strides", None) or [1] * n)
    dil = ints(a("dilations", None) or [1] * n)
    out_pad = ints(a("output_padding", None) or [0] * n)
    full = [s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in zip(strides, spatial, out_pad, kernel, dil)]
    pads = a("pads", None)
    auto_pad = a("auto_pad", "NOTSET") or "NOTSET"
    out_shape = a("output_shape", None)
    if out_shape is not None:
        out_shape = ints(out_shape)[-n:]
    if pads is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = out_shape or [i * s for i, s in zip(spatial, strides)]
        total = [f - o for f, o in zip(full, out)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        return out, begin
    if pads is None and out_shape is not None:
        total = [f - o for f, o in zip(full, out_shape)]
        return out_shape, [t - t // 2 for t in total]
    p = ints(pads or [0] * (2 * n)) if auto_pad != "VALID" else [0] * (2 * n)
    if len(p) != 2 * n:
        raise ShapeError(f"ConvTranspose: pads {p} must have {2 * n} values")
    out = out_shape or [f - b - e for f, b, e in zip(full, p[:n], p[n:])]
    return out, p[:n]


def _deconv_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x, wt = ctx.type(0), ctx.type(1)
    group = int(ctx.attr("group", 1))
    if x.rank < 3 or wt.rank != x.rank or wt.shape[0] != x.shape[1]:
        raise ShapeError(f"ConvTranspose: X {x.shape} and W {wt.shape} do not match (W is C x M/group x k...)")
    if x.shape[1] % group:
        raise ShapeError(f"ConvTranspose: {x.shape[1]} channels not divisible by group {group}")
    out, _ = _deconv_geometry(x.shape[2:], wt.shape[2:], ctx.attr)
    if any(o <= 0 for o in out):
        raise ShapeError(f"ConvTranspose: empty output {out}")
    return (x.with_shape((x.shape[0], wt.shape[1] * group) + tuple(out)),)


def _deconv_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, weight = first(xs), xs[1]
    assert weight is not None
    group = int(a.get("group", 1))
    n, c = x.shape[:2]
    cg, mg = c // group, weight.shape[1]
    kernel, spatial = weight.shape[2:], x.shape[2:]
    out, begin = _deconv_geometry(spatial, kernel, a.get)
    strides = ints(a.get("strides") or [1] * len(spatial))
    dil = ints(a.get("dilations") or [1] * len(spatial))
    k = math.prod(kernel)
    wg = weight.reshape(group, cg, mg * k).transpose(0, 2, 1)
    cols = np.matmul(wg, x.reshape(n, group, cg, -1)).reshape((n, group * mg, k) + spatial)
    extent = [max(s * (i - 1) + (kk - 1) * d + 1, b + o) for s, i, kk, d, b, o in
              zip(strides, spatial, kernel, dil, begin, out)]
    lo = [min(b, 0) for b in begin]  # negative begin padding: the output starts before the buffer
    buf = np.zeros((n, group * mg) + tuple(e - lo_ for e, lo_ in zip(extent, lo)), dtype=np.float64)
    for idx, offs in enumerate(itertools.product(*(range(kk) for kk in kernel))):
        dst = tuple(slice(o * d - lo_, o * d - lo_ + (i - 1) * s + 1, s)
                    for o, d, i, s, lo_ in zip(offs, dil, spatial, strides, lo))
        buf[(slice(None), slice(None)) + dst] += cols[:, :, idx]
    y = buf[(slice(None), slice(None)) + tuple(slice(b - lo_, b - lo_ + o) for b, lo_, o in zip(begin, lo, out))]
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2].reshape((1, -1) + (1,) * len(out))
    return (y.astype(x.dtype),)


def _deconv_flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    wt = ctx.type(1)
    return 2 * ctx.type(0).numel * wt.shape[1] * math.prod(wt.shape[2:])


def _pool_window(ctx: InferContext) -> Window:
    x = ctx.type(0)
    kernel = ctx.attr("kernel_shape")
    if x.rank < 3 or kernel is None:
        raise ShapeError(f"{ctx.node.op}: needs an N x C x D1 ... input and kernel_shape")
    return window(x.shape[2:], ints(kernel), ctx.attr, bool(ctx.attr("ceil_mode", 0)))


def _pool_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    y = x.with_shape(x.shape[:2] + _pool_window(ctx).out)
    return (y, y.with_dtype(DType.INT64))


def _pool_flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
    return outs[0].numel * math.prod(ints(ctx.attr("kernel_shape")))


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _maxpool_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    w = window(x.shape[2:], ints(a["kernel_shape"]), a.get, bool(a.get("ceil_mode", 0)))
    xp, views = _padded_views(x, w, _lowest(x.dtype))
    best = np.full(x.shape[:2] + w.out, _lowest(x.dtype), dtype=x.dtype)
    where = np.zeros(best.shape, dtype=np.int64)
    for k, view in enumerate(views):
        v = xp[(slice(None), slice(None)) + view]
        better = v > best
        best = np.where(better, v, best)
        where = np.where(better, k, where)
    return (best, _max_indices(x.shape, w, where, bool(a.get("storage_order", 0))))


def _max_indices(shape: tuple[int, ...], w: Window, which: np.ndarray, col_major: bool) -> np.ndarray:
    """Flat input indices of the maxima (MaxPool's second output)."""
    offs = np.array(list(itertools.product(*(range(k) for k in w.kernel))), dtype=np.int64).reshape(-1, len(w.kernel))
    spatial = shape[2:]
    coords = []
    for ax in range(len(spatial)):
        pos = np.arange(w.out[ax]) * w.strides[ax] - w.pad_begin[ax]
        pos = pos.reshape((1, 1) + tuple(-1 if i == ax else 1 for i in range(len(spatial))))
        coords.append(pos + offs[which, ax] * w.dilations[ax])
    n_idx = np.arange(shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
    c_idx = np.arange(shape[1]).reshape((1, -1) + (1,) * (len(shape) - 2))
    if col_major:
        flat = np.zeros_like(which)
        for ax in reversed(range(len(spatial))):
            flat = flat * spatial[ax] + coords[ax]
        return (n_idx * shape[1] + c_idx) * math.prod(spatial) + flat
    flat = n_idx * shape[1] + c_idx
    for ax in range(len(spatial)):
        flat = flat * spatial[ax] + coords[ax]
    return flat.astype(np.int64)


def _avgpool_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    w = window(x.shape[2:], ints(a["kernel_shape"]), a.get, bool(a.get("ceil_mode", 0)))
    xp, views = _padded_views(x, w, 0.0)
    # which padded positions count in the divisor: data, plus the pads when count_include_pad
    inside = np.ones((1, 1) + x.shape[2:], dtype=np.float64)
    pad_w = [(b, e) for b, e in zip(w.pad_begin, w.pad_end)]
    counted = np.pad(inside, [(0, 0), (0, 0), *pad_w], constant_values=1.0 if a.get("count_include_pad", 0) else 0.0)
    counted, _ = _padded_views(counted, Window(w.out, w.strides, w.dilations, (0,) * len(w.out),
                                               (0,) * len(w.out), w.kernel), 0.0)
    total = np.zeros(x.shape[:2] + w.out, dtype=np.float64)
    count = np.zeros((1, 1) + w.out, dtype=np.float64)
    for view in views:
        total += xp[(slice(None), slice(None)) + view]
        count += counted[(slice(None), slice(None)) + view]
    return ((total / count).astype(x.dtype),)


def _lrn_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = first(xs)
    size = int(a["size"])
    sq = np.square(x.astype(np.float64))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = np.pad(sq, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    window_sum = sum(padded[:, i:i + x.shape[1]] for i in range(size))
    denom = (a.get("bias", 1.0) + a.get("alpha", 1e-4) / size * window_sum) ** a.get("beta", 0.75)
    return ((x / denom).astype(x.dtype),)


def _lrn_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    if ctx.type(0).rank < 3 or ctx.attr("size") is None:
        raise ShapeError("LRN: needs an N x C x D1 ... input and size")
    return (ctx.type(0),)


def ops() -> list[OpDef]:
    o = OpClass.OPAQUE
    conv_attrs = {**WINDOW_ATTRS, "dilations": None, "group": 1}
    pool = {"ceil_mode": 0, "dilations": None}
    return [
        OpDef("Conv", o, ("X", "W", "B?"), _conv_infer, _conv_ref, attrs=conv_attrs, flops=_conv_flops,
              doc="N-d convolution with groups, strides, dilations and explicit or automatic padding.", core="conv"),
        OpDef("ConvTranspose", o, ("X", "W", "B?"), _deconv_infer, _deconv_ref, flops=_deconv_flops,
              attrs={**conv_attrs, "output_padding": None, "output_shape": None},
              doc="Transposed (fractionally strided) convolution."),
        OpDef("MaxPool", o, ("X",), _pool_infer, _maxpool_ref, num_outputs=None, flops=_pool_flops,
              attrs={**WINDOW_ATTRS, **pool, "storage_order": 0},
              doc="Max over each window; optional second output: flat indices of the maxima.", pooling=True),
        OpDef("AveragePool", o, ("X",), lambda ctx: _pool_infer(ctx)[:1], _avgpool_ref, flops=_pool_flops,
              attrs={**WINDOW_ATTRS, **pool, "count_include_pad": 0},
              doc="Mean over each window; pads count in the divisor only with count_include_pad.",
              pooling=True),
        OpDef("LRN", o, ("X",), _lrn_infer, _lrn_ref, flops_per_element=0,
              attrs={"size": None, "alpha": 1e-4, "beta": 0.75, "bias": 1.0},
              doc="Local response normalisation across channels."),
    ]
