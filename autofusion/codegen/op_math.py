"""Elementwise ops as C expressions: arithmetic, comparisons, activations, Cast, Where, Clip, ...

Each handler reads its inputs at the broadcast index and returns one C expression computed in the
output's element type, matching the numpy reference of the op registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from autofusion.codegen.ctype import ctype, is_float, literal
from autofusion.codegen.index import Index
from autofusion.codegen.inliner import Block, Handler, Inliner
from autofusion.graph.graph import Node
from autofusion.graph.types import DType

_F32_FUNCS = {
    "exp": "af_expf", "log": "logf", "sqrt": "sqrtf", "tanh": "af_tanhf", "erf": "af_erff", "sin": "sinf",
    "cos": "cosf", "tan": "tanf", "asin": "asinf", "acos": "acosf", "atan": "atanf", "sinh": "sinhf",
    "cosh": "coshf", "asinh": "asinhf", "acosh": "acoshf", "atanh": "atanhf", "floor": "floorf",
    "ceil": "ceilf", "round": "nearbyintf", "fabs": "fabsf", "pow": "powf", "fmod": "fmodf",
    "sigmoid": "af_sigmoidf", "softplus": "af_softplusf", "max": "af_maxf", "min": "af_minf",
    "pymod": "af_pymodf",
}
_F64_FUNCS = {k: v for k, v in _F32_FUNCS.items()}
_F64_FUNCS.update({
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "sin": "sin", "cos": "cos",
    "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
    "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "floor": "floor", "ceil": "ceil", "round": "nearbyint",
    "fabs": "fabs", "pow": "pow", "fmod": "fmod", "sigmoid": "af_sigmoid", "softplus": "af_softplus",
    "max": "af_max", "min": "af_min", "pymod": "af_pymod",
})


class _Math:
    """Spelling of functions and literals for one element type."""

    def __init__(self, inl: Inliner, node: Node, dtype: DType) -> None:
        self.inl, self.node, self.dtype = inl, node, dtype
        self.ct = ctype(dtype, f"node {node.name!r}")

    def fn(self, name: str) -> str:
        if self.dtype == DType.FLOAT32:
            return _F32_FUNCS[name]
        if self.dtype == DType.FLOAT64:
            return _F64_FUNCS[name]
        raise self.inl.k.error(f"{name} is not defined for element type {self.dtype}", self.node)

    def lit(self, value: Any) -> str:
        return literal(value, self.dtype)

    def need_float(self) -> None:
        if not is_float(self.dtype):
            raise self.inl.k.error(f"element type {self.dtype} is not supported for this op", self.node)


UnaryFn = Callable[[_Math, str, Mapping[str, Any]], str]


def _u(fn_name: str) -> UnaryFn:
    return lambda m, x, a: f"{m.fn(fn_name)}({x})"


def _relu(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    return f"({x} < {m.lit(0)} ? {m.lit(0)} : {x})"


def _abs(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    return f"{m.fn('fabs')}({x})" if is_float(m.dtype) else f"({x} < 0 ? -{x} : {x})"


def _sign(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    if is_float(m.dtype):
        return f"({x} > {m.lit(0)} ? {m.lit(1)} : ({x} < {m.lit(0)} ? {m.lit(-1)} : {x}))"
    return f"({m.ct})(({x} > 0) - ({x} < 0))"


def _neg(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    return f"({m.ct})(-{x})"


def _reciprocal(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    m.need_float()
    return f"{m.lit(1)} / {x}"


def _gelu(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    m.need_float()
    if a.get("approximate", "none") == "tanh":
        inner = f"{m.lit(np.sqrt(2.0 / np.pi))} * ({x} + {m.lit(0.044715)} * {x} * {x} * {x})"
        return f"{m.lit(0.5)} * {x} * ({m.lit(1)} + {m.fn('tanh')}({inner}))"
    return f"{m.lit(0.5)} * {x} * ({m.lit(1)} + {m.fn('erf')}({x} * {m.lit(1 / np.sqrt(2.0))}))"


def _elu(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    return f"({x} > {m.lit(0)} ? {x} : {m.lit(a.get('alpha', 1.0))} * ({m.fn('exp')}({x}) - {m.lit(1)}))"


def _selu(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    alpha = m.lit(a.get("alpha", 1.67326319217681884765625))
    gamma = m.lit(a.get("gamma", 1.05070102214813232421875))
    return f"{gamma} * ({x} > {m.lit(0)} ? {x} : {alpha} * ({m.fn('exp')}({x}) - {m.lit(1)}))"


def _celu(m: _Math, x: str, a: Mapping[str, Any]) -> str:
    alpha = m.lit(a.get("alpha", 1.0))
    neg = f"{alpha} * ({m.fn('exp')}({x} / {alpha}) - {m.lit(1)})"
    return f"({x} > {m.lit(0)} ? {x} : {m.lit(0)}) + ({neg} < {m.lit(0)} ? {neg} : {m.lit(0)})"


def _clip01(m: _Math, e: str) -> str:
    return f"{m.fn('min')}({m.fn('max')}({e}, {m.lit(0)}), {m.lit(1)})"


_UNARY: dict[str, UnaryFn] = {
    "Relu": _relu,
    "Neg": _neg,
    "Abs": _abs,
    "Sign": _sign,
    "Exp": _u("exp"),
    "Log": _u("log"),
    "Sqrt": _u("sqrt"),
    "Reciprocal": _reciprocal,
    "Floor": _u("floor"),
    "Ceil": _u("ceil"),
    "Round": _u("round"),
    "Tanh": _u("tanh"),
    "Sigmoid": _u("sigmoid"),
    "Erf": _u("erf"),
    "Sin": _u("sin"),
    "Cos": _u("cos"),
    "Tan": _u("tan"),
    "Asin": _u("asin"),
    "Acos": _u("acos"),
    "Atan": _u("atan"),
    "Sinh": _u("sinh"),
    "Cosh": _u("cosh"),
    "Asinh": _u("asinh"),
    "Acosh": _u("acosh"),
    "Atanh": _u("atanh"),
    "Softplus": _u("softplus"),
    "Softsign": lambda m, x, a: f"{x} / ({m.lit(1)} + {m.fn('fabs')}({x}))",
    "HardSwish": lambda m, x, a: f"{x} * {_clip01(m, f'{x} / {m.lit(6)} + {m.lit(0.5)}')}",
    "Mish": lambda m, x, a: f"{x} * {m.fn('tanh')}({m.fn('softplus')}({x}))",
    "ThresholdedRelu": lambda m, x, a: f"({x} > {m.lit(a.get('alpha', 1.0))} ? {x} : {m.lit(0)})",
    "Celu": _celu,
    "Gelu": _gelu,
    "Elu": _elu,
    "Selu": _selu,
    "LeakyRelu": lambda m, x, a: f"({x} < {m.lit(0)} ? {x} * {m.lit(a.get('alpha', 0.01))} : {x})",
    "HardSigmoid": lambda m, x, a: _clip01(
        m, f"{m.lit(a.get('alpha', 0.2))} * {x} + {m.lit(a.get('beta', 0.5))}"),
    "Shrink": lambda m, x, a: (
        f"({x} < {m.lit(-a.get('lambd', 0.5))} ? {x} + {m.lit(a.get('bias', 0.0))} : "
        f"({x} > {m.lit(a.get('lambd', 0.5))} ? {x} - {m.lit(a.get('bias', 0.0))} : {m.lit(0)}))"),
}


def _unary_handler(fn: UnaryFn) -> Handler:
    def handle(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
        x = inl.input_value(node, 0, idx, block)
        return fn(_Math(inl, node, inl.k.type(node.outputs[0]).dtype), x, node.attrs)

    return handle


def _int_or_float_binary(op: str, m: _Math, x: str, y: str, attrs: Mapping[str, Any]) -> str:
    f = is_float(m.dtype)
    if op == "Add":
        return f"{x} + {y}"
    if op == "Sub":
        return f"{x} - {y}"
    if op == "Mul":
        return f"{x} * {y}"
    if op == "Div":
        return f"{x} / {y}" if f else f"({m.ct})af_divi({x}, {y})"
    if op == "Mod":
        if f:
            return f"{m.fn('fmod' if attrs.get('fmod', 0) else 'pymod')}({x}, {y})"
        return f"({m.ct})af_{'fmodi' if attrs.get('fmod', 0) else 'pymodi'}({x}, {y})"
    raise AssertionError(op)


def _binary_handler(op: str) -> Handler:
    def handle(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
        x = inl.input_value(node, 0, idx, block)
        y = inl.input_value(node, 1, idx, block)
        return _int_or_float_binary(op, _Math(inl, node, inl.k.type(node.outputs[0]).dtype), x, y, node.attrs)

    return handle


def _pow(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    m = _Math(inl, node, inl.k.type(node.outputs[0]).dtype)
    x = inl.input_value(node, 0, idx, block)
    exponent = inl.k.graph.const_value(node.inputs[1])
    if is_float(m.dtype):
        if exponent is not None and exponent.size == 1:
            e = float(np.asarray(exponent, dtype=m.dtype.numpy).reshape(()))
            if e == 0.5:
                return f"{m.fn('sqrt')}({x})"
            if e == int(e) and 1 <= abs(e) <= 4:  # small integer powers as multiplications (vectorise)
                n = int(abs(e))
                prod = " * ".join([x] * n) if n < 4 else f"({x} * {x}) * ({x} * {x})"
                return prod if e > 0 else f"{m.lit(1)} / ({prod})"
        y = inl.input_value(node, 1, idx, block)
        return f"{m.fn('pow')}({x}, ({m.ct}){y})"
    y = inl.input_value(node, 1, idx, block)
    return f"({m.ct})af_powi((int64_t){x}, (int64_t){y})"


def _compare(c_op: str) -> Handler:
    def handle(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
        x = inl.input_value(node, 0, idx, block)
        y = inl.input_value(node, 1, idx, block)
        return f"(uint8_t)({x} {c_op} {y})"

    return handle


def _logical(c_op: str) -> Handler:
    def handle(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
        x = inl.input_value(node, 0, idx, block)
        y = inl.input_value(node, 1, idx, block)
        return f"(uint8_t)(({x} != 0) {c_op} ({y} != 0))"

    return handle


def _not(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    return f"(uint8_t)({inl.input_value(node, 0, idx, block)} == 0)"


def _variadic(kind: str) -> Handler:
    def handle(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
        m = _Math(inl, node, inl.k.type(node.outputs[0]).dtype)
        args = [inl.input_value(node, i, idx, block) for i, t in enumerate(node.inputs) if t]
        acc = args[0]
        for y in args[1:]:
            if kind in ("Sum", "Mean"):
                acc = f"({acc} + {y})"
            elif is_float(m.dtype):
                acc = f"{m.fn('max' if kind == 'Max' else 'min')}({acc}, {y})"
            else:
                acc = f"({acc} {'>' if kind == 'Max' else '<'} {y} ? {acc} : {y})"
        if kind == "Mean":
            acc = f"{acc} / {m.lit(len(args))}" if is_float(m.dtype) else f"({m.ct})({acc} / {len(args)})"
        return acc

    return handle


def _cast(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    x = inl.input_value(node, 0, idx, block)
    src = inl.k.type(node.inputs[0]).dtype
    dst = inl.k.type(node.outputs[0]).dtype
    ct = ctype(dst, f"node {node.name!r}")
    ctype(src, f"node {node.name!r}")
    if dst == DType.BOOL:
        return f"(uint8_t)({x} != 0)"
    if is_float(src) and not is_float(dst):
        return f"({ct})(int64_t){x}" if dst != DType.INT64 else f"({ct}){x}"
    return f"({ct}){x}"


def _where(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    c = inl.input_value(node, 0, idx, block)
    x = inl.input_value(node, 1, idx, block)
    y = inl.input_value(node, 2, idx, block)
    if inl.k.type(node.outputs[0]).dtype == DType.FLOAT32:
        return f"af_wheref({c}, {x}, {y})"
    return f"({c} ? {x} : {y})"


def _clip(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    m = _Math(inl, node, inl.k.type(node.outputs[0]).dtype)
    out = inl.input_value(node, 0, idx, block)
    bounds: list[str | None] = []
    for i, attr in ((1, "min"), (2, "max")):
        if len(node.inputs) > i and node.inputs[i]:
            bounds.append(inl.value(node.inputs[i], (), block) if not inl.shape(node.inputs[i]) else
                          inl.value(node.inputs[i], ("0",) * len(inl.shape(node.inputs[i])), block))
        elif node.attr(attr) is not None:
            bounds.append(m.lit(node.attr(attr)))
        else:
            bounds.append(None)
    lo, hi = bounds
    if lo is not None:
        out = f"{m.fn('max')}({out}, {lo})" if is_float(m.dtype) else f"({out} < {lo} ? {lo} : {out})"
    if hi is not None:
        out = f"{m.fn('min')}({out}, {hi})" if is_float(m.dtype) else f"({out} > {hi} ? {hi} : {out})"
    return out


def _prelu(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    m = _Math(inl, node, inl.k.type(node.outputs[0]).dtype)
    x = inl.input_value(node, 0, idx, block)
    s = inl.input_value(node, 1, idx, block)
    return f"({x} < {m.lit(0)} ? {x} * {s} : {x})"


def _is_nan(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    x = inl.input_value(node, 0, idx, block)
    return f"(uint8_t)({x} != {x})"


def _is_inf(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    x = inl.input_value(node, 0, idx, block)
    pos_ok = "1" if node.attr("detect_positive", 1) else "0"
    neg_ok = "1" if node.attr("detect_negative", 1) else "0"
    return f"(uint8_t)(isinf({x}) && (({x} > 0 && {pos_ok}) || ({x} < 0 && {neg_ok})))"


def _batchnorm(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    """(x - mean) * inv + bias with inv = scale / sqrt(var + eps) folded at build time when constant."""
    x_type = inl.k.type(node.inputs[0])
    m = _Math(inl, node, x_type.dtype)
    m.need_float()
    channel = idx[1]
    x = inl.value(node.inputs[0], idx, block)
    scale, bias, mean, var = (inl.k.graph.const_value(t) for t in node.inputs[1:5])
    eps = node.attr("epsilon", 1e-5)
    if scale is not None and var is not None:
        with np.errstate(all="ignore"):
            inv = (scale / np.sqrt(var + eps)).astype(x_type.dtype.numpy)
        inv_ptr = inl.k.derived_constant(f"{node.name}_inv", inv)
        inv_v = inl.bind(node.inputs[1], f"{inv_ptr}[{channel}]", block)
    else:
        s = inl.value(node.inputs[1], (channel,), block)
        v = inl.value(node.inputs[4], (channel,), block)
        inv_v = inl.bind(node.inputs[1], f"{s} / {m.fn('sqrt')}({v} + {m.lit(eps)})", block)
    mu = inl.value(node.inputs[3], (channel,), block)
    b = inl.value(node.inputs[2], (channel,), block)
    return f"({x} - {mu}) * {inv_v} + {b}"


def _dropout(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
    if pos == 1:
        return "(uint8_t)1"
    return inl.value(node.inputs[0], idx, block)


def spelled_handler(op: str, fmt: str) -> Handler:
    """The handler of an op that spells its C expression itself (``OpDef.spelling["c"]``)."""
    def handle(inl: Inliner, node: Node, pos: int, idx: Index, block: Block) -> str:
        m = _Math(inl, node, inl.k.type(node.outputs[0]).dtype)
        if m.dtype != DType.FLOAT32:
            raise inl.k.error(f"{op} spells its C for float32 only, not {m.dtype}", node)
        args = [f"({inl.input_value(node, i, idx, block)})" for i in range(len(node.inputs)) if node.inputs[i]]
        try:
            return f"({fmt.format(*args)})"
        except (IndexError, KeyError, ValueError) as e:
            raise inl.k.error(f"{op}'s C spelling {fmt!r} does not format with {len(args)} input(s): {e}",
                              node) from None

    return handle


def handlers() -> Mapping[str, Handler]:
    """Handlers of every elementwise op, by op name."""
    table: dict[str, Handler] = {op: _unary_handler(fn) for op, fn in _UNARY.items()}
    for op in ("Add", "Sub", "Mul", "Div", "Mod"):
        table[op] = _binary_handler(op)
    table["Pow"] = _pow
    for op, c in (("Equal", "=="), ("Less", "<"), ("LessOrEqual", "<="), ("Greater", ">"), ("GreaterOrEqual", ">=")):
        table[op] = _compare(c)
    for op, c in (("And", "&&"), ("Or", "||"), ("Xor", "!=")):
        table[op] = _logical(c)
    table["Not"] = _not
    for op in ("Sum", "Max", "Min", "Mean"):
        table[op] = _variadic(op)
    table.update({"Cast": _cast, "Where": _where, "Clip": _clip, "PRelu": _prelu, "IsNaN": _is_nan,
                  "IsInf": _is_inf, "BatchNormalization": _batchnorm, "Dropout": _dropout})
    return MappingProxyType(table)
