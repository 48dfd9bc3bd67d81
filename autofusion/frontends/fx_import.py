"""Convert torch.fx graphs (as TorchDynamo hands them to a backend) into the autofusion IR.

Only static shapes are converted, of float32 tensors (and of int64 and bool ones for the ops that
build attention masks, frontends/fx_masks.py). Each supported FX node maps to one or a few ONNX-named
IR ops; :func:`is_convertible` says whether a node can be converted, so a partitioner can keep the
rest in eager PyTorch. Parameters and buffers become IR constants: their values are read once, at
conversion time (they are frozen; later in-place updates to the module are not seen).

torch is imported lazily: this module only touches torch objects handed to it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.frontends import fx_aten, fx_masks
from autofusion.frontends.fx_nodes import (
    Converter,
    FxConversionError,
    Handler,
    arg,
    convert_identity,
    convert_reshape,
    convert_softmax,
    example_value,
    is_module_state,
    out_shape,
    real_value,
    shape_of,
    static_float_tensor,
    static_float_tensors,
    static_tensor,
    target_key,
)
from autofusion.graph.graph import Graph, handed_over
from autofusion.graph.types import DType
from autofusion.ir.builder import GraphBuilder


def is_convertible(node: Any) -> bool:
    """Whether ``node`` is a torch op this converter handles with a static float32 output (a tuple
    of them for a split), or one computed from frozen module state alone (:func:`foldable`); never
    one the backend left to torch (``fx_aten.TORCH_KEEPS``)."""
    if node.meta.get(fx_aten.TORCH_KEEPS):
        return False
    key = target_key(node)
    return (key in HANDLERS and _produces(key, example_value(node)) and _tensor_args_ok(node)
            and _args_ok(node)) or foldable(node)


def _produces(key: str | None, value: Any) -> bool:
    """Whether ``value`` is what op ``key`` may give a partition: static float32 tensors, or for the
    mask-building ops (fx_masks.ANY_DTYPE) static int64 and bool ones too."""
    if key in MULTI_OUTPUT:
        return static_float_tensors(value)
    return static_tensor(value) if key in fx_masks.ANY_DTYPE else static_float_tensor(value)


FOLD_MAX_ELEMENTS = 1 << 22  # larger results of frozen state stay eager rather than become constants
NOT_FOLDABLE = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "poisson", "empty")


def foldable(node: Any) -> bool:
    """Whether ``node`` computes a tensor from the module's frozen state alone (a BERT's position
    ids sliced from a buffer, its token-type embeddings): the converter computes it once, in torch,
    as a constant of the compiled graph."""
    cached = node.meta.get("_autofusion_foldable")
    if cached is None:
        cached = node.meta["_autofusion_foldable"] = _foldable_op(node) and all(
            _frozen_source(a) for a in _node_args(node))
    return bool(cached)


def _foldable_op(node: Any) -> bool:
    """A deterministic op with a static float32, int64 or bool result of at most FOLD_MAX_ELEMENTS."""
    if node.op not in ("call_function", "call_method") or mutates(node):
        return False
    key = str(target_key(node) or getattr(node.target, "__name__", node.target))
    value = example_value(node)
    return (not any(word in key for word in NOT_FOLDABLE) and static_tensor(value)
            and value.numel() <= FOLD_MAX_ELEMENTS)


def _node_args(node: Any) -> list[Any]:
    """The FX nodes among ``node``'s arguments."""
    import torch.fx

    found: list[Any] = []
    torch.fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


def _frozen_source(node: Any) -> bool:
    if node.op == "placeholder":
        return is_module_state(node) and real_value(node) is not None
    return node.op == "get_attr" or foldable(node)


INPLACE_OPERATORS = (operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                     operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor,
                     operator.ilshift, operator.irshift, operator.setitem)
# functional activations whose positional argument at this index is ``inplace``
INPLACE_POSITION = {"relu": 1, "relu6": 1, "silu": 1, "mish": 1, "selu": 1, "celu": 2, "elu": 2, "leaky_relu": 2,
                    "hardtanh": 3, "hardswish": 1, "hardsigmoid": 1, "dropout": 3, "threshold": 3, "rrelu": 4}


def mutates(node: Any) -> bool:
    """Whether ``node`` updates a tensor in place (``x.add_(y)``, ``relu(x, inplace=True)``, ``x += y``,
    ``x[i] = y``): its readers, and the readers of every view of it, see the change."""
    if node.op not in ("call_function", "call_method"):
        return False
    if node.kwargs.get("inplace") is True or (node.op == "call_function" and node.target in INPLACE_OPERATORS):
        return True
    if node.op == "call_function" and getattr(node.target, "__module__", None) in ("_operator", "operator"):
        return False  # operator.and_, or_, not_, is_: functions named around keywords, not updates
    name = str(node.target) if node.op == "call_method" else str(getattr(node.target, "__name__", ""))
    position = INPLACE_POSITION.get(name)
    if position is not None and len(node.args) > position and node.args[position] is True:
        return True
    return name.endswith("_") and not name.startswith("_")


def hidden_updates(graph: Any) -> list[Any]:
    """The in-place updates of ``graph`` the converter cannot follow: a partition computes views as
    copies and its outputs as fresh tensors, so any other in-place update could be missed by a
    reader; such a graph runs eagerly."""
    return [n for n in graph.nodes if mutates(n) and not is_convertible(n)]


def why_not_convertible(node: Any) -> str:
    """Why :func:`is_convertible` says no for ``node``, in a few words ("" when it says yes)."""
    if node.meta.get(fx_aten.TORCH_KEEPS):  # first, as is_convertible asks it
        return str(node.meta[fx_aten.TORCH_KEEPS])
    if foldable(node):
        return ""
    key = target_key(node)
    if key not in HANDLERS:
        return "op not supported"
    if not _produces(key, example_value(node)):
        return "output not a static float32 tensor" if key not in fx_masks.ANY_DTYPE else \
            "output not a static float32, int64 or bool tensor"
    if key == "getitem" and target_key(node.args[0]) in MULTI_OUTPUT and isinstance(node.args[1], int) \
            and not fx_aten.output_computed(node.args[0], node.args[1]):
        return "an output its op leaves to torch"
    if not _tensor_args_ok(node):
        return "an input not a static float32 tensor"
    if not _args_ok(node):
        return "arguments not supported"
    return ""


def _tensor_args_ok(node: Any) -> bool:
    """Every FX node among the arguments must be a static float32 tensor, or for the mask-building
    ops (fx_masks.ANY_DTYPE) an int64 or bool one (no sizes, ints or tuples; a getitem reads one
    tensor of a split's tuple)."""
    found = _node_args(node)
    if target_key(node) == "scaled_dot_product_attention":  # a boolean mask beside float32 q, k, v
        mask = arg(node, 3, "attn_mask")
        return all(static_float_tensor(example_value(a)) or (a is mask and _bool_tensor(example_value(a)))
                   for a in found)
    if target_key(node) == "embedding":  # int64 ids into a float32 table
        return (len(found) == 2 and found[0] is node.args[0] and _int64_tensor(example_value(found[0]))
                and static_float_tensor(example_value(found[1])))
    if target_key(node) == "getitem":
        indices = fx_masks.advanced_indices(node) if len(node.args) == 2 else None
        if indices is not None:  # x[i, j] by constant index tensors
            return static_tensor(example_value(node.args[0])) and all(foldable(i) for i in indices) and len(
                found) == len(indices) + 1
        if len(found) != 1:
            return False
        if target_key(found[0]) in MULTI_OUTPUT:
            index = node.args[1] if len(node.args) == 2 else None
            return (static_float_tensors(example_value(found[0])) and isinstance(index, int)
                    and fx_aten.output_computed(found[0], index))
        return static_tensor(example_value(found[0]))  # a tensor indexed by slices and ints
    if target_key(node) in fx_masks.ANY_DTYPE:
        return all(static_tensor(example_value(a)) for a in found)
    return all(static_float_tensor(example_value(a)) for a in found)


def _bool_tensor(value: Any) -> bool:
    import torch

    return static_tensor(value) and value.dtype == torch.bool


def _int64_tensor(value: Any) -> bool:
    import torch

    return static_tensor(value) and value.dtype == torch.int64


def _embedding(cv: Converter, node: Any) -> str:
    """``embedding(ids, table)``: the rows of ``table`` at ``ids`` (padding_idx only matters to the
    gradient)."""
    return cv.b.op("Gather", cv.tensor(arg(node, 1, "weight")), cv.tensor(node.args[0]), axis=0)


def _embedding_ok(node: Any) -> bool:
    max_norm = arg(node, 3, "max_norm")
    return max_norm is None and len(shape_of(arg(node, 1, "weight"))) == 2


def _args_ok(node: Any) -> bool:
    check = ARG_CHECKS.get(target_key(node) or "")
    return check is None or bool(check(node))


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    values = tuple(int(v) for v in value)
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _unary(op: str, **attrs: Any) -> Handler:
    return lambda cv, node: cv.b.op(op, cv.tensor(node.args[0]), **attrs)


def _binary(op: str) -> Handler:
    return lambda cv, node: cv.b.op(op, cv.tensor(arg(node, 0, "input")), cv.tensor(arg(node, 1, "other")))


def _permute(cv: Converter, node: Any) -> str:
    rest = node.args[1:]
    dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest
    dims = dims or node.kwargs["dims"]
    return cv.transpose(cv.tensor(node.args[0]), [int(d) for d in dims])


def _transpose(cv: Converter, node: Any) -> str:
    rank = len(out_shape(node))
    perm = list(range(rank))
    d0, d1 = int(arg(node, 1, "dim0")) % rank, int(arg(node, 2, "dim1")) % rank
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return cv.transpose(cv.tensor(node.args[0]), perm)


def _t(cv: Converter, node: Any) -> str:
    rank = len(out_shape(node))
    return cv.transpose(cv.tensor(node.args[0]), [1, 0]) if rank == 2 else cv.tensor(node.args[0])


def _linear(cv: Converter, node: Any) -> str:
    x, weight, bias = node.args[0], arg(node, 1, "weight"), arg(node, 2, "bias")
    w_value = cv.const_value(weight)
    w_t = cv.b.const(handed_over(np.ascontiguousarray(w_value.T))) if w_value is not None else \
        cv.transpose(cv.tensor(weight), [1, 0])  # frozen weights are transposed once, here
    y = cv.b.op("MatMul", cv.tensor(x), w_t)
    return cv.b.op("Add", y, cv.tensor(bias)) if bias is not None else y


def _conv2d(cv: Converter, node: Any) -> str:
    x, weight, bias = node.args[0], arg(node, 1, "weight"), arg(node, 2, "bias")
    stride, padding = _pair(arg(node, 3, "stride", 1)), _pair(arg(node, 4, "padding", 0))
    dilation, groups = _pair(arg(node, 5, "dilation", 1)), int(arg(node, 6, "groups", 1))
    inputs = [cv.tensor(x), cv.tensor(weight)] + ([cv.tensor(bias)] if bias is not None else [])
    return cv.b.op("Conv", *inputs, strides=list(stride), pads=[padding[0], padding[1], padding[0], padding[1]],
                   dilations=list(dilation), group=groups)


def _conv2d_ok(node: Any) -> bool:
    padding = arg(node, 4, "padding", 0)
    return not isinstance(padding, str) and len(example_value(node).shape) == 4


def _ones_like_channels(cv: Converter, arg: Any, size: int) -> str:
    return cv.tensor(arg) if arg is not None else cv.b.const(np.ones(size, np.float32))


def _zeros_like_channels(cv: Converter, arg: Any, size: int) -> str:
    return cv.tensor(arg) if arg is not None else cv.b.const(np.zeros(size, np.float32))


def _layer_norm(cv: Converter, node: Any) -> str:
    normalized = tuple(int(d) for d in arg(node, 1, "normalized_shape"))
    weight, bias, eps = arg(node, 2, "weight"), arg(node, 3, "bias"), float(arg(node, 4, "eps", 1e-5))
    scale = cv.tensor(weight) if weight is not None else cv.b.const(np.ones(normalized, np.float32))
    shift = cv.tensor(bias) if bias is not None else cv.b.const(np.zeros(normalized, np.float32))
    return cv.b.op("LayerNormalization", cv.tensor(node.args[0]), scale, shift, axis=-len(normalized), epsilon=eps)


def _batch_norm(cv: Converter, node: Any) -> str:
    x = node.args[0]
    channels = out_shape(node)[1]
    mean, var = cv.tensor(arg(node, 1, "running_mean")), cv.tensor(arg(node, 2, "running_var"))
    scale = _ones_like_channels(cv, arg(node, 3, "weight"), channels)
    shift = _zeros_like_channels(cv, arg(node, 4, "bias"), channels)
    eps = float(arg(node, 7, "eps", 1e-5))
    return cv.b.op("BatchNormalization", cv.tensor(x), scale, shift, mean, var, epsilon=eps)


def _batch_norm_ok(node: Any) -> bool:
    return (not bool(arg(node, 5, "training", False)) and arg(node, 1, "running_mean") is not None
            and arg(node, 2, "running_var") is not None)


def _max_pool2d(cv: Converter, node: Any) -> str:
    kernel = _pair(arg(node, 1, "kernel_size"))
    stride_arg = arg(node, 2, "stride")
    stride = _pair(stride_arg) if stride_arg not in (None, ()) and stride_arg != [] else kernel
    padding, dilation = _pair(arg(node, 3, "padding", 0)), _pair(arg(node, 4, "dilation", 1))
    ceil = int(bool(arg(node, 5, "ceil_mode", False)))
    return cv.b.op("MaxPool", cv.tensor(node.args[0]), kernel_shape=list(kernel), strides=list(stride),
                   pads=[padding[0], padding[1], padding[0], padding[1]], dilations=list(dilation), ceil_mode=ceil)


def _max_pool2d_ok(node: Any) -> bool:
    return not bool(arg(node, 6, "return_indices", False)) and len(example_value(node).shape) == 4


def _adaptive_avg_pool_ok(node: Any) -> bool:
    size = arg(node, 1, "output_size")
    return size == 1 or (isinstance(size, (tuple, list)) and all(s == 1 for s in size))


def _gelu(cv: Converter, node: Any) -> str:
    return cv.b.op("Gelu", cv.tensor(node.args[0]), approximate=str(node.kwargs.get("approximate", "none")))


def _dropout_ok(node: Any) -> bool:
    return not bool(arg(node, 2, "training", True))


def _addmm(cv: Converter, node: Any) -> str:
    """``addmm(bias, x, w)``: x @ w + bias (GPT-2's Conv1D)."""
    return cv.b.op("Add", cv.b.op("MatMul", cv.tensor(node.args[1]), cv.tensor(node.args[2])), cv.tensor(node.args[0]))


def _addmm_ok(node: Any) -> bool:
    return len(node.args) == 3 and node.kwargs.get("beta", 1) == 1 and node.kwargs.get("alpha", 1) == 1


def _pow(cv: Converter, node: Any) -> str:
    return cv.b.op("Pow", cv.tensor(node.args[0]), cv.b.const(np.asarray(float(node.args[1]), np.float32)))


def _pow_ok(node: Any) -> bool:
    return len(node.args) == 2 and isinstance(node.args[1], (int, float)) and not isinstance(node.args[1], bool)


def _new_tensor(cv: Converter, node: Any) -> str:
    """``torch.tensor(data)``: the data as a constant (e.g. the empty start of a key cache)."""
    return cv.b.const(np.asarray(node.args[0], np.float32))


def _new_tensor_ok(node: Any) -> bool:
    def numbers(v: Any) -> bool:
        if isinstance(v, (list, tuple)):
            return all(numbers(x) for x in v)
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return len(node.args) == 1 and numbers(node.args[0])


def _cat(cv: Converter, node: Any) -> str:
    """``cat(tensors, dim)``; empty tensors (a cache's empty start) drop out, as torch treats them."""
    parts = [a for a in node.args[0] if example_value(a).numel() > 0]
    if len(parts) == 1:
        return cv.tensor(parts[0])
    return cv.b.op("Concat", *(cv.tensor(a) for a in parts), axis=int(arg(node, 1, "dim", 0)))


def _cat_ok(node: Any) -> bool:
    tensors = node.args[0] if node.args else None
    return isinstance(tensors, (list, tuple)) and any(example_value(a).numel() > 0 for a in tensors)


def _split(cv: Converter, node: Any) -> str:
    """``x.split(size, dim)`` into its parts (read by getitem)."""
    sizes = [int(v.shape[int(arg(node, 2, "dim", 0))]) for v in example_value(node)]
    axis = int(arg(node, 2, "dim", 0))
    parts = cv.b.op_multi("Split", [cv.tensor(node.args[0]), cv.b.const(np.asarray(sizes, np.int64))], len(sizes),
                          axis=axis)
    cv.multi[node] = tuple(parts)
    return parts[0]


def _getitem(cv: Converter, node: Any) -> str:
    """One tensor of a split's tuple, or a tensor indexed by slices, ints, None and ``...``."""
    source, index = node.args
    indices = fx_masks.advanced_indices(node)
    if indices is not None:
        return fx_masks.advanced_index(cv, node, indices)
    if source in cv.multi:
        part = cv.parts(source)[int(index)]
        if part is None:
            raise FxConversionError(f"node {node.name} reads an output {source.name} does not compute")
        return part
    shape = shape_of(source)
    items = list(index) if isinstance(index, tuple) else [index]
    if Ellipsis in items:
        at = items.index(Ellipsis)
        named = sum(1 for i in items if i is not None and i is not Ellipsis)
        items[at:at + 1] = [slice(None)] * (len(shape) - named)
    cuts: list[tuple[int, int, int, int]] = []  # (start, end, axis, step) per sliced axis
    axis = 0
    for item in items:
        if item is None:
            continue
        if isinstance(item, int):
            start = item % shape[axis]
            cuts.append((start, start + 1, axis, 1))
        elif item != slice(None):
            start, stop, step = item.indices(shape[axis])
            cuts.append((start, stop, axis, step))
        axis += 1
    x = cv.tensor(source)
    if cuts:
        consts = (cv.b.const(np.asarray(column, np.int64)) for column in zip(*cuts))
        x = cv.b.op("Slice", x, *consts)
    return cv.b.op("Reshape", x, cv.b.const(np.asarray(out_shape(node), np.int64)))


def _getitem_ok(node: Any) -> bool:
    if len(node.args) != 2:
        return False
    if fx_masks.advanced_indices(node) is not None:
        return True
    index = node.args[1]
    if isinstance(index, int):
        return True
    items = index if isinstance(index, tuple) else (index,)
    basic = all(i is None or i is Ellipsis or isinstance(i, int) or (
        isinstance(i, slice) and all(v is None or isinstance(v, int) for v in (i.start, i.stop, i.step))
        and (i.step or 1) > 0) for i in items)
    return basic and sum(1 for i in items if i is Ellipsis) <= 1 and not isinstance(index, bool)


def _attention(cv: Converter, node: Any) -> str:
    """``scaled_dot_product_attention(q, k, v)``: softmax(q k^T * scale + mask) v, as the attention
    rules expect it; ``is_causal`` adds -inf above the diagonal, a float mask is added."""
    q, k, v = (node.args[i] for i in range(3))
    shape_q, shape_k = shape_of(q), shape_of(k)
    rank = len(shape_q)
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    keys, values = cv.tensor(k), cv.tensor(v)
    if node.kwargs.get("enable_gqa", False) and shape_k[-3] != shape_q[-3]:  # each K/V head serves a run of heads
        keys, values = (_repeat_heads(cv, t, shape_of(a), shape_q[-3]) for t, a in ((keys, k), (values, v)))
    scores = cv.b.op("MatMul", cv.tensor(q), cv.transpose(keys, perm))
    scale = arg(node, 6, "scale")
    scale = float(scale) if scale is not None else 1.0 / float(np.sqrt(shape_q[-1]))
    scores = cv.b.op("Mul", scores, cv.b.const(np.asarray(scale, np.float32)))
    mask = arg(node, 3, "attn_mask")
    if mask is not None and _bool_tensor(example_value(mask)):  # True: take part; False: masked out
        scores = cv.b.op("Where", cv.tensor(mask), scores, cv.b.const(np.asarray(-np.inf, np.float32)))
    elif mask is not None:
        scores = cv.b.op("Add", scores, cv.tensor(mask))
    if bool(arg(node, 5, "is_causal", False)):
        length, source = shape_q[-2], shape_k[-2]
        causal = np.triu(np.full((length, source), -np.inf, np.float32), k=1)  # torch's: aligned top left
        scores = cv.b.op("Add", scores, cv.b.const(causal))
    return cv.b.op("MatMul", cv.b.op("Softmax", scores, axis=-1), values)


def _repeat_heads(cv: Converter, x: str, shape: tuple[int, ...], heads: int) -> str:
    """``x`` [..., Hkv, S, D] with each head repeated to ``heads`` in a row (repeat_interleave, as
    grouped-query attention reads them)."""
    lead, (kv, length, depth) = tuple(shape[:-3]), tuple(shape[-3:])
    spread = cv.b.op("Unsqueeze", x, cv.b.const(np.asarray([len(lead) + 1], np.int64)))
    spread = cv.b.op("Expand", spread, cv.b.const(np.asarray([*lead, kv, heads // kv, length, depth], np.int64)))
    return cv.b.op("Reshape", spread, cv.b.const(np.asarray([*lead, heads, length, depth], np.int64)))


def _attention_ok(node: Any) -> bool:
    mask = arg(node, 3, "attn_mask")
    if mask is not None and not (static_float_tensor(example_value(mask)) or _bool_tensor(example_value(mask))):
        return False
    if float(arg(node, 4, "dropout_p", 0.0)) != 0.0:
        return False
    shapes = [shape_of(node.args[i]) for i in range(3)] if len(node.args) >= 3 else []
    if not shapes or len({len(s) for s in shapes}) != 1 or len(shapes[0]) < 3:
        return False
    q, k, v = shapes
    if node.kwargs.get("enable_gqa", False):  # K and V may have fewer heads, a divisor of Q's
        heads_ok = k[-3] == v[-3] and q[-3] % k[-3] == 0
        return heads_ok and q[:-3] == k[:-3] == v[:-3] and k[-2] == v[-2]
    return q[:-2] == k[:-2] == v[:-2] and k[-2] == v[-2]


def _silu(cv: Converter, node: Any) -> str:
    """``silu(x)`` (swish): x * sigmoid(x)."""
    x = cv.tensor(node.args[0])
    return cv.b.op("Mul", x, cv.b.op("Sigmoid", x))


def _rsqrt(cv: Converter, node: Any) -> str:
    return cv.b.op("Reciprocal", cv.b.op("Sqrt", cv.tensor(node.args[0])))


def _alpha_ok(node: Any) -> bool:
    return node.kwargs.get("alpha", 1) == 1 and len(node.args) <= 2


def _div_ok(node: Any) -> bool:
    return node.kwargs.get("rounding_mode") is None


def _tensors_ok(node: Any) -> bool:
    """Tensor arguments must be static float32; other arguments plain Python numbers."""
    return all(static_float_tensor(example_value(a)) for a in node.args[:2] if hasattr(a, "meta")) and any(
        hasattr(a, "meta") for a in node.args[:2])


def _inplace_ok(node: Any) -> bool:
    """An in-place update (``relu(x, inplace=True)``, ``x.relu_()``) computes the same as its
    out-of-place form when nobody can see ``x`` change: the update is ``x``'s only reader, and ``x``
    is fresh storage an op of this graph computed (not a view of anything, nor a caller's input, a
    parameter or a buffer). ``nn.ReLU(inplace=True)`` after a convolution, a norm or a residual add,
    as CNNs write it, is that case."""
    source = node.args[0] if node.args else None
    if source is None or getattr(source, "op", None) not in ("call_function", "call_method"):
        return False
    return target_key(source) in FRESH_STORAGE and len(source.users) == 1


HANDLERS: Mapping[str, Handler] = {
    "linear": _linear,
    "embedding": _embedding,
    "conv2d": _conv2d,
    "relu": _unary("Relu"),
    "relu_": _unary("Relu"),  # only where no one sees the update (ARG_CHECKS)
    "addmm": _addmm,
    "pow": _pow,
    "tensor": _new_tensor,
    "cat": _cat,
    "split": _split,
    "getitem": _getitem,
    "scaled_dot_product_attention": _attention,
    "gelu": _gelu,
    "silu": _silu,
    "cos": _unary("Cos"),
    "sin": _unary("Sin"),
    "abs": _unary("Abs"),
    "log": _unary("Log"),
    "erf": _unary("Erf"),
    "reciprocal": _unary("Reciprocal"),
    "tanh": _unary("Tanh"),
    "sigmoid": _unary("Sigmoid"),
    "exp": _unary("Exp"),
    "sqrt": _unary("Sqrt"),
    "rsqrt": _rsqrt,
    "neg": _unary("Neg"),
    "add": _binary("Add"),
    "mul": _binary("Mul"),
    "sub": _binary("Sub"),
    "div": _binary("Div"),
    "truediv": _binary("Div"),
    "matmul": _binary("MatMul"),
    "bmm": _binary("MatMul"),
    "mm": _binary("MatMul"),
    "softmax": convert_softmax,
    "layer_norm": _layer_norm,
    "batch_norm": _batch_norm,
    "max_pool2d": _max_pool2d,
    "adaptive_avg_pool2d": _unary("GlobalAveragePool"),
    "flatten": convert_reshape,
    "view": convert_reshape,
    "reshape": convert_reshape,
    "permute": _permute,
    "transpose": _transpose,
    "t": _t,
    "contiguous": convert_identity,
    "dropout": convert_identity,
    **fx_aten.HANDLERS,  # the ops of training graphs (aot_autograd)
    **fx_masks.HANDLERS,  # the ops that build attention masks
}

ARG_CHECKS: Mapping[str, Callable[[Any], bool]] = {
    "conv2d": _conv2d_ok,
    "embedding": _embedding_ok,
    "batch_norm": _batch_norm_ok,
    "max_pool2d": _max_pool2d_ok,
    "adaptive_avg_pool2d": _adaptive_avg_pool_ok,
    "dropout": _dropout_ok,
    "softmax": lambda node: arg(node, 1, "dim") is not None and node.kwargs.get("dtype") is None,
    "add": lambda node: _alpha_ok(node) and _tensors_ok(node),
    "sub": lambda node: _alpha_ok(node) and _tensors_ok(node),
    "mul": _tensors_ok,
    "div": lambda node: _div_ok(node) and _tensors_ok(node),
    "truediv": _tensors_ok,
    "contiguous": lambda node: len(node.args) == 1 and not node.kwargs,
    "view": lambda node: all(isinstance(a, int) or (isinstance(a, (tuple, list)) and all(isinstance(d, int) for d in a))
                             for a in node.args[1:]),  # sizes, not x.view(dtype)
    "relu": lambda node: not bool(arg(node, 1, "inplace", False)) or _inplace_ok(node),
    "silu": lambda node: not bool(arg(node, 1, "inplace", False)) or _inplace_ok(node),
    "relu_": _inplace_ok,
    "addmm": _addmm_ok,
    "pow": _pow_ok,
    "tensor": _new_tensor_ok,
    "cat": _cat_ok,
    "split": lambda node: isinstance(arg(node, 1, "split_size"), (int, list, tuple)),
    "getitem": _getitem_ok,
    "scaled_dot_product_attention": _attention_ok,
    **fx_aten.ARG_CHECKS,
    **fx_masks.ARG_CHECKS,
}
MULTI_OUTPUT = frozenset({"split"}) | fx_aten.MULTI_OUTPUT  # ops whose value is a tuple of tensors
# ops whose result is storage of its own, never a view of an input (an in-place update of it is private)
FRESH_STORAGE = frozenset({"linear", "embedding", "conv2d", "batch_norm", "layer_norm", "add", "mul", "sub", "div", "truediv",
                           "matmul", "bmm", "mm", "addmm", "gelu", "silu", "cos", "sin", "abs", "log", "erf",
                           "reciprocal", "tanh", "sigmoid", "exp", "sqrt", "rsqrt",
                           "neg", "pow", "softmax", "max_pool2d", "adaptive_avg_pool2d", "cat",
                           "scaled_dot_product_attention"}) | fx_aten.FRESH_STORAGE



def fx_to_graph(gm: Any, placeholder_values: Sequence[Any], frozen: Sequence[bool], name: str = "torch_fx") -> Graph:
    """The IR graph of ``gm``, a GraphModule made only of convertible nodes.

    ``placeholder_values`` holds one tensor (real or fake) per placeholder for its shape and dtype;
    placeholders marked in ``frozen`` become constants holding that tensor's (real) value, the
    others become graph inputs named after the placeholder. Raises FxConversionError.
    """
    return convert_fx(gm, placeholder_values, frozen, name)[0]


def convert_fx(gm: Any, placeholder_values: Sequence[Any], frozen: Sequence[bool], name: str = "torch_fx",
               orders: Sequence[tuple[int, ...] | None] | None = None) -> tuple[Graph, tuple[str, ...]]:
    """:func:`fx_to_graph`'s graph, and the IR tensor of each of ``gm``'s results in order: a tensor
    ``gm`` returns twice is one graph output, returned twice (as eager returns one tensor twice).
    ``orders``: per placeholder, the order its dimensions are stored in (:func:`stored_order`), or
    None: such an input is the stored tensor, permuted back inside the graph, so that a transposed
    weight is read in place instead of copied."""
    builder = GraphBuilder(name)
    env: dict[Any, str] = {}
    cv = Converter(builder, env)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(placeholder_values) or len(frozen) != len(placeholders):
        raise FxConversionError("one value and one frozen flag are needed per placeholder")
    outputs: list[str] = []
    input_names: set[str] = set()
    torch_values: dict[Any, Any] = {}  # frozen placeholders and the nodes folded from them
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            position = placeholders.index(node)
            value = placeholder_values[position]
            if not static_tensor(value):
                raise FxConversionError(f"placeholder {node.name} is not a static float32, int64 or bool tensor")
            if frozen[position]:
                torch_values[node] = value
                # the builder copies the tensor's memory once, into a constant of its own
                env[node] = builder.const(value.detach().cpu().contiguous().numpy(), name=_ir_name(node.name))
                cv.consts[env[node]] = builder.const_array(env[node])
            else:
                order = orders[position] if orders else None
                shape = tuple(value.shape) if order is None else tuple(value.shape[d] for d in order)
                env[node] = builder.input(_ir_name(node.name), shape, DType(str(value.dtype)[6:]))
                input_names.add(env[node])
                if order is not None:
                    env[node] = builder.op("Transpose", env[node], perm=tuple(order.index(d) for d in range(len(order))))
        elif node.op in ("call_function", "call_method") and _computable(node, torch_values):
            torch_values[node] = _compute(node, torch_values)
            env[node] = builder.const(torch_values[node].detach().cpu().contiguous().numpy())
            cv.consts[env[node]] = builder.const_array(env[node])
        elif node.op == "output":
            results = node.args[0]
            results = results if isinstance(results, (tuple, list)) else (results,)
            outputs = [env[r] for r in results]
        elif node.op in ("call_function", "call_method"):
            if not is_convertible(node):
                raise FxConversionError(f"node {node.name} ({node.target}) is not supported")
            env[node] = HANDLERS[target_key(node) or ""](cv, node)
            values = example_value(node)
            made = zip(cv.multi.get(node, (env[node],)), values if node in cv.multi else (values,))
            pairs = [(t, v) for t, v in made if t is not None]  # an output not asked for has no tensor
            got = [(builder.type_of(t).shape, builder.type_of(t).dtype.value) for t, _ in pairs]
            expected = [None if v is None else (tuple(int(d) for d in v.shape), str(v.dtype).removeprefix("torch."))
                        for _, v in pairs]
            if got != expected:
                raise FxConversionError(f"node {node.name}: IR (shape, dtype) {got} differs from torch's {expected}")
        else:
            raise FxConversionError(f"FX node kind {node.op!r} is not supported")
    # an input or a constant returned gets a buffer of its own
    own = {o: builder.op("Identity", o) for o in dict.fromkeys(outputs) if o in input_names or o in cv.consts}
    results = tuple(own.get(o, o) for o in outputs)
    return builder.build(list(dict.fromkeys(results))), results


def folded_value(node: Any) -> Any:
    """The value of a :func:`foldable` node, computed by torch from the real module state it reads
    (for a partition whose input it is: a slice of a buffer that stayed outside)."""
    values: dict[Any, Any] = {}

    def value_of(n: Any) -> Any:
        if n not in values:
            if n.op == "placeholder":
                values[n] = real_value(n)
            elif n.op == "get_attr":  # a constant Dynamo lifted onto the module
                values[n] = module_attribute(n.graph.owning_module, str(n.target))
            elif n.op == "call_module":  # a partition of foldable ops: its own torch ops compute it
                args = [value_of(a) for a in n.args]
                values[n] = n.graph.owning_module.get_submodule(str(n.target))(*args)
            else:
                for a in _node_args(n):
                    value_of(a)
                values[n] = _compute(n, values)
        return values[n]

    return value_of(node)


def module_attribute(module: Any, target: str) -> Any:
    """``module``'s attribute at the dotted path ``target`` (a get_attr node's, a fused partition's)."""
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _computable(node: Any, values: Mapping[Any, Any]) -> bool:
    """Whether ``node`` can be folded now: :func:`foldable`'s test against this conversion's frozen values."""
    return _foldable_op(node) and all(a in values for a in _node_args(node))


def _compute(node: Any, values: Mapping[Any, Any]) -> Any:
    """``node``'s value, computed by torch from the frozen values it reads."""
    import torch
    import torch.fx

    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: values[a])
    with torch.no_grad():
        if node.op == "call_method":
            result = getattr(args[0], str(node.target))(*args[1:], **kwargs)
        else:
            result = node.target(*args, **kwargs)
    if not static_tensor(result) or tuple(result.shape) != tuple(example_value(node).shape):
        raise FxConversionError(f"node {node.name}: folding it gave {type(result).__name__}, not its tensor")
    return result


def _ir_name(name: str) -> str:
    return "t_" + name
