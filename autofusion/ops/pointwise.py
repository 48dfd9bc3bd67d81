"""Pointwise ops: each output element depends on the same-index (broadcast) input elements."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.types import DType, TensorType
from autofusion.ops.common import same_dtype
from autofusion.ops.registry import InferContext, OpClass, OpDef, ShapeError, broadcast_shapes

Arrays = Sequence[np.ndarray | None]


def _same_as_input(ctx: InferContext) -> tuple[TensorType, ...]:
    return (ctx.type(0),)


def _broadcast_infer(
    result_dtype: DType | None = None, same_types: bool = True
) -> Callable[[InferContext], tuple[TensorType, ...]]:
    def infer(ctx: InferContext) -> tuple[TensorType, ...]:
        types = [t for t in ctx.input_types if t is not None]
        if not types:
            raise ShapeError(f"{ctx.node.op}: needs inputs")
        if same_types:
            same_dtype(ctx, range(len(ctx.input_types)))
        shape = broadcast_shapes(*[t.shape for t in types])
        return (TensorType(shape, result_dtype or types[0].dtype),)

    return infer


def unary(
    name: str,
    fn: Callable[..., np.ndarray],
    flops: float = 1.0,
    attrs: Mapping[str, Any] | None = None,
    doc: str = "",
) -> OpDef:
    """An elementwise op of one input; ``fn(x, **attrs)`` keeps the input's dtype."""

    def reference(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        x = xs[0]
        assert x is not None
        kwargs = {k: a.get(k, d) for k, d in (attrs or {}).items()}
        return (np.asarray(fn(x, **kwargs)).astype(x.dtype, copy=False),)

    return OpDef(
        name, OpClass.POINTWISE, ("X",), _same_as_input, reference,
        attrs=dict(attrs or {}), flops_per_element=flops, doc=doc or f"Elementwise {name}(x).",
    )


def binary(
    name: str,
    fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
    flops: float = 1.0,
    result_dtype: DType | None = None,
    doc: str = "",
    same_types: bool = True,
    commutative: bool = False,
) -> OpDef:
    """A broadcasting elementwise op of two inputs (of one element type unless ``same_types`` is off)."""

    def reference(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        x, y = xs[0], xs[1]
        assert x is not None and y is not None
        out = np.asarray(fn(x, y))
        return (out.astype(result_dtype.numpy if result_dtype else x.dtype, copy=False),)

    return OpDef(
        name, OpClass.POINTWISE, ("A", "B"), _broadcast_infer(result_dtype, same_types), reference,
        flops_per_element=flops, doc=doc or f"Elementwise {name}(A, B) with numpy broadcasting.",
        commutative=commutative,
    )


def variadic(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], doc: str = "") -> OpDef:
    """Sum/Max/Min/Mean of any number of broadcasting inputs."""

    def reference(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        arrays = [x for x in xs if x is not None]
        out = arrays[0]
        for x in arrays[1:]:
            out = fn(out, x)
        if name == "Mean":
            out = out / len(arrays)
        return (np.asarray(out).astype(arrays[0].dtype, copy=False),)

    def flops(ctx: InferContext, outs: tuple[TensorType, ...]) -> int:
        return max(1, len(ctx.input_types) - 1) * outs[0].numel

    return OpDef(name, OpClass.POINTWISE, ("data_0*",), _broadcast_infer(), reference, flops=flops,
                 doc=doc or f"Elementwise {name} of any number of broadcast inputs.", commutative=True)


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates toward zero
    return a / b


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.power(a, b.astype(a.dtype) if np.issubdtype(a.dtype, np.floating) else b)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # stable for large |x|


def _gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _round(x: np.ndarray) -> np.ndarray:
    return np.round(x)  # numpy rounds half to even, as ONNX does


def _cast_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    from autofusion.ops.dtypes import onnx_dtype

    return (TensorType(ctx.type(0).shape, onnx_dtype(int(ctx.attr("to")))),)


def _cast_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    from autofusion.ops.dtypes import onnx_dtype

    x = xs[0]
    assert x is not None
    return (x.astype(onnx_dtype(int(a["to"])).numpy),)


def _where_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    if ctx.type(0).dtype is not DType.BOOL:
        raise ShapeError(f"Where: condition must be bool, got {ctx.type(0).dtype}")
    same_dtype(ctx, (1, 2))
    shape = broadcast_shapes(ctx.type(0).shape, ctx.type(1).shape, ctx.type(2).shape)
    return (TensorType(shape, ctx.type(1).dtype),)


def _where_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    c, x, y = xs
    assert c is not None and x is not None and y is not None
    return (np.where(c, x, y).astype(x.dtype, copy=False),)


def _clip_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    assert x is not None
    lo = xs[1] if len(xs) > 1 and xs[1] is not None else a.get("min")
    hi = xs[2] if len(xs) > 2 and xs[2] is not None else a.get("max")
    out = x
    if lo is not None:
        out = np.maximum(out, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi, dtype=x.dtype))
    return (out.astype(x.dtype, copy=False),)


def _prelu_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, slope = xs[0], xs[1]
    assert x is not None and slope is not None
    return (np.where(x < 0, x * slope, x).astype(x.dtype, copy=False),)


def _batchnorm_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if ctx.attr("training_mode", 0):
        raise ShapeError("BatchNormalization: training mode is not supported (inference graphs only)")
    if x.rank < 2:
        raise ShapeError("BatchNormalization: input must have rank >= 2")
    for i in range(1, 5):
        t = ctx.type(i)
        if t.shape != (x.shape[1],):
            raise ShapeError(f"BatchNormalization: parameter {i} must have shape ({x.shape[1]},), got {t.shape}")
    return (x,)


def _batchnorm_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, scale, bias, mean, var = xs[:5]
    assert x is not None and scale is not None and bias is not None and mean is not None and var is not None
    shape = (1, -1) + (1,) * (x.ndim - 2)
    eps = a.get("epsilon", 1e-5)
    inv = scale / np.sqrt(var + eps)
    out = (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)
    return (out.astype(x.dtype, copy=False),)


def _dropout_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if len(ctx.node.outputs) > 1:
        return (x, x.with_dtype(DType.BOOL))
    return (x,)


def _dropout_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    assert x is not None
    return (x.copy(), np.ones(x.shape, dtype=bool))  # inference: identity, mask all ones


def _selu(x: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    return gamma * np.where(x > 0, x, alpha * (np.exp(np.minimum(x, 0)) - 1))


def _shrink(x: np.ndarray, bias: float, lambd: float) -> np.ndarray:
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


def _logical(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], name: str, commutative: bool = False) -> OpDef:
    return binary(name, fn, result_dtype=DType.BOOL, commutative=commutative)


def _mod_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, y = xs[0], xs[1]
    assert x is not None and y is not None
    out = np.fmod(x, y) if a.get("fmod", 0) else np.mod(x, y)
    return (np.asarray(out).astype(x.dtype, copy=False),)


def _is_inf(x: np.ndarray, detect_negative: int, detect_positive: int) -> np.ndarray:
    return (np.isneginf(x) & bool(detect_negative)) | (np.isposinf(x) & bool(detect_positive))


def _bool_unary(name: str, fn: Callable[..., np.ndarray], attrs: Mapping[str, Any] | None = None) -> OpDef:
    def infer(ctx: InferContext) -> tuple[TensorType, ...]:
        return (ctx.type(0).with_dtype(DType.BOOL),)

    def reference(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        x = xs[0]
        assert x is not None
        return (np.asarray(fn(x, **{k: a.get(k, d) for k, d in (attrs or {}).items()}), dtype=bool),)

    return OpDef(name, OpClass.POINTWISE, ("X",), infer, reference, attrs=dict(attrs or {}),
                 doc=f"Elementwise {name}(x) as a bool tensor.")


def _not_ref(xs: Arrays, a: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x = xs[0]
    assert x is not None
    return (np.logical_not(x),)


def ops() -> list[OpDef]:
    f = np.float32
    return [
        binary("Add", np.add, commutative=True),
        binary("Sub", np.subtract),
        binary("Mul", np.multiply, commutative=True),
        binary("Div", _int_div),
        binary("Pow", _pow, flops=8, same_types=False),  # the exponent may have another type
        OpDef("Mod", OpClass.POINTWISE, ("A", "B"), _broadcast_infer(), _mod_ref, attrs={"fmod": 0},
              doc="Remainder: sign of the divisor (fmod=0, integers) or of the dividend (fmod=1)."),
        variadic("Sum", np.add),
        variadic("Max", np.maximum),
        variadic("Min", np.minimum),
        variadic("Mean", np.add),
        _logical(np.equal, "Equal", commutative=True),
        _logical(np.less, "Less"),
        _logical(np.less_equal, "LessOrEqual"),
        _logical(np.greater, "Greater"),
        _logical(np.greater_equal, "GreaterOrEqual"),
        _logical(np.logical_and, "And", commutative=True),
        _logical(np.logical_or, "Or", commutative=True),
        _logical(np.logical_xor, "Xor", commutative=True),
        OpDef("Not", OpClass.POINTWISE, ("X",), _same_as_input, _not_ref, doc="Elementwise logical not."),
        unary("Relu", lambda x: np.maximum(x, 0)),
        unary("Neg", np.negative),
        unary("Abs", np.abs),
        unary("Sign", np.sign),
        unary("Exp", np.exp, flops=8),
        unary("Log", np.log, flops=8),
        unary("Sqrt", np.sqrt, flops=4),
        unary("Reciprocal", np.reciprocal),
        unary("Floor", np.floor),
        unary("Ceil", np.ceil),
        unary("Round", _round),
        unary("Tanh", np.tanh, flops=10),
        unary("Sigmoid", _sigmoid, flops=10),
        unary("Erf", _erf, flops=12),
        unary("Sin", np.sin, flops=8),
        unary("Tan", np.tan, flops=10),
        unary("Asin", np.arcsin, flops=10),
        unary("Acos", np.arccos, flops=10),
        unary("Atan", np.arctan, flops=10),
        unary("Sinh", np.sinh, flops=10),
        unary("Cosh", np.cosh, flops=10),
        unary("Asinh", np.arcsinh, flops=12),
        unary("Acosh", np.arccosh, flops=12),
        unary("Atanh", np.arctanh, flops=12),
        unary("Softsign", lambda x: x / (1 + np.abs(x)), flops=3),
        unary("HardSwish", lambda x: x * np.clip(x / 6 + 0.5, 0, 1), flops=4),
        unary("Mish", lambda x: x * np.tanh(np.logaddexp(0, x)), flops=20),
        unary("ThresholdedRelu", lambda x, alpha: np.where(x > alpha, x, 0), attrs={"alpha": 1.0}),
        unary("Celu", lambda x, alpha: np.maximum(x, 0) + np.minimum(0, alpha * (np.exp(x / alpha) - 1)),
              flops=8, attrs={"alpha": 1.0}),
        _bool_unary("IsNaN", np.isnan),
        _bool_unary("IsInf", _is_inf, {"detect_negative": 1, "detect_positive": 1}),
        unary("Cos", np.cos, flops=8),
        unary("Softplus", _softplus, flops=10),
        unary("Gelu", _gelu, flops=16, attrs={"approximate": "none"}),
        unary("Elu", lambda x, alpha: np.where(x > 0, x, alpha * (np.exp(np.minimum(x, 0)) - 1)),
              flops=8, attrs={"alpha": 1.0}),
        unary("Selu", _selu, flops=8, attrs={"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
        unary("LeakyRelu", lambda x, alpha: np.where(x < 0, x * f(alpha), x), attrs={"alpha": 0.01}),
        unary("HardSigmoid", lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1), flops=3,
              attrs={"alpha": 0.2, "beta": 0.5}),
        unary("Shrink", _shrink, attrs={"bias": 0.0, "lambd": 0.5}),
        OpDef("Clip", OpClass.POINTWISE, ("input", "min?", "max?"), _same_as_input, _clip_ref,
              attrs={"min": None, "max": None}, flops_per_element=2,
              doc="Clamps to [min, max] (inputs, or attributes before opset 11); either bound optional."),
        OpDef("PRelu", OpClass.POINTWISE, ("X", "slope"), _broadcast_infer(), _prelu_ref,
              doc="x where x >= 0, slope * x elsewhere (slope broadcasts)."),
        OpDef("Where", OpClass.POINTWISE, ("condition", "X", "Y"), _where_infer, _where_ref,
              doc="X where condition, else Y, all three broadcast."),
        OpDef("Cast", OpClass.POINTWISE, ("input",), _cast_infer, _cast_ref, attrs={"to": None, "saturate": 1},
              doc="Converts to the element type `to` (an ONNX type code)."),
        OpDef("BatchNormalization", OpClass.POINTWISE, ("X", "scale", "B", "input_mean", "input_var"),
              _batchnorm_infer, _batchnorm_ref,
              attrs={"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}, flops_per_element=2,
              doc="Inference batch norm: (x - mean) / sqrt(var + epsilon) * scale + B per channel."),
        OpDef("Dropout", OpClass.POINTWISE, ("data", "ratio?", "training_mode?"), _dropout_infer, _dropout_ref,
              attrs={"seed": None, "ratio": 0.5}, num_outputs=None, flops_per_element=0,
              doc="Inference dropout: the input unchanged (and an all-true mask)."),
    ]
