"""The aten ops of training graphs: what ``aot_autograd`` hands a backend for the forward and the
backward pass, beyond the ops eager graphs share with them (mm, addmm, view, add...).

Each backward op is spelled in IR ops from its formula, so the fusion rules see ordinary pointwise
ops and reductions (a ``threshold_backward`` is a Where the GEMM before it can take as epilogue, a
bias gradient is a ReduceSum over the batch rows). The formulas are torch's own
(tools/autograd/derivatives.yaml); the tests compare every op with torch on random inputs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from autofusion.frontends.conv_grad import conv2d_input_grad, conv2d_weight_grad
from autofusion.frontends.fx_nodes import (
    Converter,
    Handler,
    arg,
    convert_identity,
    convert_reshape,
    convert_softmax,
    example_value,
    out_shape,
    shape_of,
)


def _scalar(cv: Converter, value: float) -> str:
    return cv.b.const(np.asarray(value, np.float32))


def _axes(cv: Converter, axes: list[int]) -> str:
    return cv.b.const(np.asarray(axes, np.int64))


def _dims(node: Any, position: int, name: str) -> list[int] | None:
    """The reduced dimensions of a sum/mean, normalised to non-negative; None for all of them."""
    dims = arg(node, position, name)
    if dims is None:
        return None
    dims = [dims] if isinstance(dims, int) else list(dims)
    rank = len(shape_of(node.args[0]))
    return sorted({int(d) % rank for d in dims}) if dims else None


def _reduce(op: str) -> Handler:
    """``sum``/``mean`` over ``dim`` (all dimensions when absent), keeping them with ``keepdim``."""

    def handler(cv: Converter, node: Any) -> str:
        dims = _dims(node, 1, "dim")
        keep = int(bool(arg(node, 2, "keepdim", False)))
        x = cv.tensor(node.args[0])
        if dims is None:
            return cv.b.op(op, x, keepdims=keep)
        return cv.b.op(op, x, _axes(cv, dims), keepdims=keep)

    return handler


def _reduce_ok(node: Any) -> bool:
    """No dtype, and a tensor with dimensions to reduce (a 0-d sum is left to torch)."""
    return node.kwargs.get("dtype") is None and len(node.args) <= 3 and len(shape_of(node.args[0])) > 0


def _normalized_axes(x: Any, normalized_shape: Any) -> list[int]:
    """The trailing axes of ``x`` a layer norm over ``normalized_shape`` normalises."""
    rank = len(shape_of(x))
    return list(range(rank - len(normalized_shape), rank))


def _native_layer_norm(cv: Converter, node: Any) -> str:
    """(y, mean, rstd): y through LayerNormalization, the statistics the backward pass reads beside it."""
    axes = _normalized_axes(node.args[0], node.args[1])
    normalized = [int(d) for d in node.args[1]]
    x = cv.tensor(node.args[0])
    weight, bias, eps = node.args[2], node.args[3], float(node.args[4])
    scale = cv.tensor(weight) if weight is not None else cv.b.const(np.ones(normalized, np.float32))
    shift = cv.tensor(bias) if bias is not None else cv.b.const(np.zeros(normalized, np.float32))
    # LayerNormalization's Mean and InvStdDev outputs are the statistics it computes anyway
    y, mean, rstd = cv.b.op_multi("LayerNormalization", [x, scale, shift], 3, axis=axes[0], epsilon=eps)
    cv.multi[node] = (y, mean, rstd)
    return y


def _native_layer_norm_ok(node: Any) -> bool:
    return len(node.args) == 5 and all(isinstance(d, int) for d in node.args[1])


def _native_layer_norm_backward(cv: Converter, node: Any) -> str:
    """(dx, dweight, dbias) of y = xhat * w + b with xhat = (x - mean) * rstd over the last axes:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, dweight = sum(dy * xhat) and
    dbias = sum(dy) over the leading axes."""
    axes = _normalized_axes(node.args[1], node.args[2])
    dy, x = cv.tensor(node.args[0]), cv.tensor(node.args[1])
    mean, rstd = cv.tensor(node.args[3]), cv.tensor(node.args[4])
    xhat = cv.b.op("Mul", cv.b.op("Sub", x, mean), rstd)
    g = cv.b.op("Mul", dy, cv.tensor(node.args[5]))  # the weight (_native_layer_norm_backward_ok)
    mean_g = cv.b.op("ReduceMean", g, _axes(cv, axes), keepdims=1)
    mean_gx = cv.b.op("ReduceMean", cv.b.op("Mul", g, xhat), _axes(cv, axes), keepdims=1)
    dx = cv.b.op("Mul", rstd, cv.b.op("Sub", cv.b.op("Sub", g, mean_g), cv.b.op("Mul", xhat, mean_gx)))
    if axes[0] == 0:  # nothing to sum over: the gradients are the products themselves
        dweight, dbias = cv.b.op("Mul", dy, xhat), dy
    else:
        lead = _axes(cv, list(range(axes[0])))
        dweight = cv.b.op("ReduceSum", cv.b.op("Mul", dy, xhat), lead, keepdims=0)
        dbias = cv.b.op("ReduceSum", dy, lead, keepdims=0)
    cv.multi[node] = (dx, dweight, dbias)
    return dx


def _native_layer_norm_backward_ok(node: Any) -> bool:
    return (len(node.args) == 8 and all(isinstance(d, int) for d in node.args[2]) and list(node.args[7]) == [True] * 3
            and node.args[5] is not None and node.args[6] is not None)


def _per_channel(cv: Converter, v: str, rank: int) -> str:
    """A [C] tensor shaped to broadcast over N x C x ... (axis 1)."""
    return cv.b.op("Reshape", v, cv.b.const(np.asarray([1, -1] + [1] * (rank - 2), np.int64)))


def _batch_norm_training(cv: Converter, node: Any) -> str:
    """``_native_batch_norm_legit_functional(x, w, b, running_mean, running_var, True, momentum, eps)``:
    (y, mean, rstd, new running mean, new running var) over the batch statistics; the running
    variance takes the unbiased variance, as torch's does."""
    x_arg, weight, bias, r_mean, r_var = node.args[:5]
    momentum, eps = float(node.args[6]), float(node.args[7])
    shape = shape_of(x_arg)
    rank, axes = len(shape), [0] + list(range(2, len(shape)))
    count = math.prod(shape) // shape[1]
    x = cv.tensor(x_arg)
    mean = cv.b.op("ReduceMean", x, _axes(cv, axes), keepdims=1)
    centred = cv.b.op("Sub", x, mean)
    var = cv.b.op("ReduceMean", cv.b.op("Mul", centred, centred), _axes(cv, axes), keepdims=1)
    rstd = cv.b.op("Reciprocal", cv.b.op("Sqrt", cv.b.op("Add", var, _scalar(cv, eps))))
    y = cv.b.op("Mul", centred, rstd)
    if weight is not None:
        y = cv.b.op("Mul", y, _per_channel(cv, cv.tensor(weight), rank))
    if bias is not None:
        y = cv.b.op("Add", y, _per_channel(cv, cv.tensor(bias), rank))
    flat = cv.b.const(np.asarray([shape[1]], np.int64))
    mean_c, var_c, rstd_c = (cv.b.op("Reshape", t, flat) for t in (mean, var, rstd))
    keep = _scalar(cv, 1.0 - momentum)
    new_mean = cv.b.op("Add", cv.b.op("Mul", cv.tensor(r_mean), keep), cv.b.op("Mul", mean_c, _scalar(cv, momentum)))
    unbiased = momentum * count / (count - 1)  # count > 1: _batch_norm_training_ok
    new_var = cv.b.op("Add", cv.b.op("Mul", cv.tensor(r_var), keep), cv.b.op("Mul", var_c, _scalar(cv, unbiased)))
    cv.multi[node] = (y, mean_c, rstd_c, new_mean, new_var)
    return y


def _batch_norm_training_ok(node: Any) -> bool:
    return (len(node.args) == 8 and node.args[5] is True and node.args[3] is not None and node.args[4] is not None
            and len(shape_of(node.args[0])) >= 3 and math.prod(shape_of(node.args[0])) > shape_of(node.args[0])[1])


def _batch_norm_backward(cv: Converter, node: Any) -> str:
    """(dx, dweight, dbias) of training batch norm: with xhat = (x - mean) * rstd per channel,
    dbias = sum(dy), dweight = sum(dy * xhat) over N and the spatial axes, and
    dx = w * rstd * (dy - dbias / M - xhat * dweight / M), M the elements per channel."""
    dy_arg, x_arg, weight = node.args[0], node.args[1], node.args[2]
    shape = shape_of(x_arg)
    rank, axes = len(shape), [0] + list(range(2, len(shape)))
    count = math.prod(shape) // shape[1]
    dy, x = cv.tensor(dy_arg), cv.tensor(x_arg)
    mean, rstd = (_per_channel(cv, cv.tensor(node.args[i]), rank) for i in (5, 6))
    xhat = cv.b.op("Mul", cv.b.op("Sub", x, mean), rstd)
    dbias = cv.b.op("ReduceSum", dy, _axes(cv, axes), keepdims=0)
    dweight = cv.b.op("ReduceSum", cv.b.op("Mul", dy, xhat), _axes(cv, axes), keepdims=0)
    inv = _scalar(cv, 1.0 / count)
    centred = cv.b.op("Sub", cv.b.op("Sub", dy, cv.b.op("Mul", _per_channel(cv, dbias, rank), inv)),
                      cv.b.op("Mul", xhat, cv.b.op("Mul", _per_channel(cv, dweight, rank), inv)))
    scale = cv.b.op("Mul", rstd, _per_channel(cv, cv.tensor(weight), rank))  # weight: _batch_norm_backward_ok
    dx = cv.b.op("Mul", centred, scale)
    cv.multi[node] = (dx, dweight, dbias)
    return dx


def _batch_norm_backward_ok(node: Any) -> bool:
    return (len(node.args) == 10 and node.args[7] is True and list(node.args[9]) == [True] * 3
            and node.args[2] is not None and node.args[5] is not None and node.args[6] is not None
            and len(shape_of(node.args[1])) >= 3)


def _gelu_backward(cv: Converter, node: Any) -> str:
    """dy * (cdf(x) + x * pdf(x)), GELU's exact form."""
    dy, x = cv.tensor(node.args[0]), cv.tensor(node.args[1])
    cdf = cv.b.op("Mul", _scalar(cv, 0.5), cv.b.op("Add", _scalar(cv, 1.0),
                                                   cv.b.op("Erf", cv.b.op("Mul", x, _scalar(cv, math.sqrt(0.5))))))
    gauss = cv.b.op("Exp", cv.b.op("Mul", cv.b.op("Mul", x, x), _scalar(cv, -0.5)))
    pdf = cv.b.op("Mul", gauss, _scalar(cv, 1.0 / math.sqrt(2.0 * math.pi)))
    return cv.b.op("Mul", dy, cv.b.op("Add", cdf, cv.b.op("Mul", x, pdf)))


def _gelu_backward_ok(node: Any) -> bool:
    return str(node.kwargs.get("approximate", arg(node, 2, "approximate", "none"))) == "none"


def _softmax_backward_data(cv: Converter, node: Any) -> str:
    """y * (dy - sum(dy * y)) along the softmax axis."""
    dy, y = cv.tensor(node.args[0]), cv.tensor(node.args[1])
    axis = int(node.args[2]) % len(out_shape(node))
    dot = cv.b.op("ReduceSum", cv.b.op("Mul", dy, y), _axes(cv, [axis]), keepdims=1)
    return cv.b.op("Mul", y, cv.b.op("Sub", dy, dot))


def _threshold_backward(cv: Converter, node: Any) -> str:
    """0 where x <= threshold, else dy (ReLU's backward with threshold 0; a NaN x passes dy, as in torch)."""
    dy, x = cv.tensor(node.args[0]), cv.tensor(node.args[1])
    below = cv.b.op("LessOrEqual", x, _scalar(cv, float(node.args[2])))
    return cv.b.op("Where", below, _scalar(cv, 0.0), dy)


def _tanh_backward(cv: Converter, node: Any) -> str:
    dy, y = cv.tensor(node.args[0]), cv.tensor(node.args[1])
    return cv.b.op("Mul", dy, cv.b.op("Sub", _scalar(cv, 1.0), cv.b.op("Mul", y, y)))


def _sigmoid_backward(cv: Converter, node: Any) -> str:
    dy, y = cv.tensor(node.args[0]), cv.tensor(node.args[1])
    return cv.b.op("Mul", dy, cv.b.op("Mul", y, cv.b.op("Sub", _scalar(cv, 1.0), y)))


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _convolution(cv: Converter, node: Any) -> str:
    """``convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups)``, 2-D."""
    x, weight, bias = node.args[0], node.args[1], node.args[2]
    stride, padding, dilation = (list(node.args[i]) for i in (3, 4, 5))
    inputs = [cv.tensor(x), cv.tensor(weight)] + ([cv.tensor(bias)] if bias is not None else [])
    return cv.b.op("Conv", *inputs, strides=stride, pads=padding + padding, dilations=dilation,
                   group=int(node.args[8]))


def _convolution_ok(node: Any) -> bool:
    return (len(node.args) == 9 and not node.args[6] and len(example_value(node).shape) == 4
            and all(len(node.args[i]) == 2 for i in (3, 4, 5)))


def _convolution_backward(cv: Converter, node: Any) -> str:
    """``convolution_backward(dy, x, w, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask)``: the input gradient as stride-phase Convs, the weight
    gradient as one Conv with batch and channels swapped (:mod:`conv_grad`), the bias gradient as a
    sum; each as its mask asks (:func:`split_gradients` leaves the ones torch computes faster to a
    node of their own)."""
    dy_node, x_node, w_node = node.args[:3]
    stride, padding, groups, mask = node.args[4], node.args[5], int(node.args[9]), node.args[10]
    dy = cv.tensor(dy_node)
    grad_input = grad_weight = grad_bias = None
    if mask[0]:
        hw = tuple(shape_of(x_node)[2:])
        grad_input = conv2d_input_grad(cv.b, dy, cv.tensor(w_node), (hw[0], hw[1]), (stride[0], stride[1]),
                                       (padding[0], padding[1]), groups)
    if mask[1]:
        khw = tuple(shape_of(w_node)[2:])
        grad_weight = conv2d_weight_grad(cv.b, dy, cv.tensor(x_node), (khw[0], khw[1]), (stride[0], stride[1]),
                                         (padding[0], padding[1]))
    if mask[2]:
        grad_bias = cv.b.op("ReduceSum", dy, _axes(cv, [0, 2, 3]), keepdims=0)
    cv.multi[node] = (grad_input, grad_weight, grad_bias)
    return next(t for t in (grad_input, grad_weight, grad_bias) if t)  # the mask asks for one (_convolution_backward_ok)


# node.meta key: torch computes this convolution_backward whole (measured faster, or split off by
# split_gradients); its value says why, in a few words
TORCH_KEEPS = "_autofusion_torch_keeps"


def _convolution_backward_ok(node: Any) -> bool:
    """2-D, not transposed, dilation 1, one group where the weight gradient is asked for, and not
    left to torch (TORCH_KEEPS)."""
    if len(node.args) != 11 or node.kwargs or node.meta.get(TORCH_KEEPS):
        return False
    _, _, _, _, stride, padding, dilation, transposed, _, groups, mask = node.args
    return (not transposed and list(dilation) == [1, 1] and len(stride) == 2 and len(padding) == 2
            and isinstance(groups, int) and len(shape_of(node.args[1])) == 4 and any(mask)
            and (groups == 1 or not mask[1]))


def output_computed(node: Any, index: int) -> bool:
    """Whether the converted ``node`` computes its output ``index`` (a convolution_backward only the
    outputs its mask asks for, and none where torch keeps it)."""
    if "convolution_backward" in str(node.target):
        return (len(node.args) == 11 and not node.kwargs and not node.meta.get(TORCH_KEEPS)
                and bool(node.args[10][index]))
    return True


def split_gradients(node: Any, torch_mask: list[bool], reason: str) -> Any:
    """Give the outputs ``torch_mask`` names of a ``convolution_backward`` a second node that torch
    computes (marked TORCH_KEEPS with ``reason``), and leave the first asking for the others; the
    getitems of those outputs read the new node. Returns the new node."""
    graph, mask = node.graph, list(node.args[10])
    with graph.inserting_after(node):
        split = graph.call_function(node.target, (*node.args[:10], list(torch_mask)), dict(node.kwargs))
    split.meta[TORCH_KEEPS] = reason
    for key in ("val", "example_value"):
        value = node.meta.get(key)
        if isinstance(value, (tuple, list)) and len(value) == 3:
            split.meta[key] = tuple(v if t else None for v, t in zip(value, torch_mask))
            node.meta[key] = tuple(None if t else v for v, t in zip(value, torch_mask))
    node.args = (*node.args[:10], [m and not t for m, t in zip(mask, torch_mask)])
    for user in list(node.users):
        if user.target is operator.getitem and torch_mask[user.args[1]]:
            user.replace_input_with(node, split)
    return split


HANDLERS: Mapping[str, Handler] = {
    "clone": convert_identity,
    "detach": convert_identity,
    "_unsafe_view": convert_reshape,
    "_softmax": convert_softmax,
    "sum": _reduce("ReduceSum"),
    "mean": _reduce("ReduceMean"),
    "native_layer_norm": _native_layer_norm,
    "native_layer_norm_backward": _native_layer_norm_backward,
    "gelu_backward": _gelu_backward,
    "_softmax_backward_data": _softmax_backward_data,
    "threshold_backward": _threshold_backward,
    "tanh_backward": _tanh_backward,
    "sigmoid_backward": _sigmoid_backward,
    "convolution": _convolution,
    "_native_batch_norm_legit_functional": _batch_norm_training,
    "native_batch_norm_backward": _batch_norm_backward,
    "convolution_backward": _convolution_backward,
}

ARG_CHECKS: Mapping[str, Callable[[Any], bool]] = {
    "clone": lambda node: len(node.args) == 1,
    "detach": lambda node: len(node.args) == 1 and not node.kwargs,
    "_softmax": lambda node: len(node.args) == 3 and not node.args[2] and len(shape_of(node.args[0])) > 0,
    "sum": _reduce_ok,
    "mean": _reduce_ok,
    "native_layer_norm": _native_layer_norm_ok,
    "native_layer_norm_backward": _native_layer_norm_backward_ok,
    "gelu_backward": _gelu_backward_ok,
    "_softmax_backward_data": lambda node: len(node.args) == 4 and len(shape_of(node.args[1])) > 0,
    "threshold_backward": lambda node: len(node.args) == 3 and _numeric(node.args[2]),
    "convolution": _convolution_ok,
    "_native_batch_norm_legit_functional": _batch_norm_training_ok,
    "native_batch_norm_backward": _batch_norm_backward_ok,
    "convolution_backward": _convolution_backward_ok,
}

MULTI_OUTPUT = frozenset({"native_layer_norm", "native_layer_norm_backward", "_native_batch_norm_legit_functional",
                          "native_batch_norm_backward", "convolution_backward"})  # tuples read by getitem
# ops whose result is storage of its own (an in-place update of it is private)
FRESH_STORAGE = frozenset({"sum", "mean", "_softmax", "native_layer_norm", "gelu_backward", "_softmax_backward_data",
                           "threshold_backward", "tanh_backward", "sigmoid_backward", "convolution", "clone",
                           "_native_batch_norm_legit_functional", "native_batch_norm_backward",
                           "convolution_backward"})
