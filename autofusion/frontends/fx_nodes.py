"""The pieces of an FX graph every converter reads: op names, example values, arguments, and
the converter state that maps FX nodes to IR tensors (torch is never imported at module level)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autofusion.ir.builder import GraphBuilder


class FxConversionError(ValueError):
    """An FX node cannot be expressed in the autofusion IR."""


Handler = Callable[["Converter", Any], str]


def target_key(node: Any) -> str | None:
    """A canonical op name for an FX node (``"linear"``, ``"relu"``...), or None when not a torch op."""
    if node.op == "call_method":
        return str(node.target)
    if node.op != "call_function":
        return None
    target = node.target
    opname = getattr(target, "_opname", None)  # aten OpOverload / OpOverloadPacket
    if opname is not None and type(target).__module__.startswith("torch"):
        return str(opname)
    module = getattr(target, "__module__", None) or ""
    if target in (operator.add, operator.mul, operator.sub, operator.truediv, operator.matmul, operator.neg,
                  operator.getitem, operator.and_, operator.or_, operator.xor, operator.invert, operator.ge,
                  operator.gt, operator.le, operator.lt, operator.eq, operator.ne):
        return target.__name__
    if module == "torch" or module.startswith("torch.") or module.startswith("torch._C"):
        return getattr(target, "__name__", None)
    return None


def example_value(node: Any) -> Any:
    """The (fake) example tensor recorded for ``node`` by TorchDynamo, or None."""
    return node.meta.get("example_value", node.meta.get("val"))


def static_float_tensor(value: Any) -> bool:
    """True for a float32 tensor whose shape is made of plain ints (no symbolic sizes)."""
    import torch

    return (isinstance(value, torch.Tensor) and value.dtype == torch.float32
            and all(type(d) is int for d in value.shape))


def static_tensor(value: Any) -> bool:
    """A float32, int64 or bool tensor with a shape of plain ints: what a folded constant or a
    graph input may be."""
    import torch

    return (isinstance(value, torch.Tensor) and value.dtype in (torch.float32, torch.int64, torch.bool)
            and all(type(d) is int for d in value.shape))


def stored_order(value: Any) -> tuple[int, ...] | None:
    """The order of a tensor's dimensions in memory, outermost first, when it is a dense row-major
    tensor with its dimensions permuted (a weight's ``t()``); None when it is contiguous or laid out
    any other way."""
    import torch

    if not isinstance(value, torch.Tensor) or value.is_contiguous() or any(type(d) is not int for d in value.shape):
        return None
    strides = tuple(int(s) for s in value.stride())
    order = tuple(sorted(range(value.dim()), key=lambda d: (-strides[d], d)))
    return order if value.permute(order).is_contiguous() else None


# a placeholder's module-state flag, recorded while Dynamo's graph argument says it (fx_shapes.py)
MODULE_STATE = "_autofusion_module_state"


def is_module_state(node: Any) -> bool:
    """Whether a placeholder carries module state (a parameter or buffer) that may be frozen."""
    import torch

    if MODULE_STATE in node.meta:
        return bool(node.meta[MODULE_STATE])
    if isinstance(example_value(node), torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(getattr(grapharg, "source", None), "name", "")
    source = source() if callable(source) else str(source)
    return "._parameters[" in source or "._buffers[" in source


def real_value(node: Any) -> Any:
    """The real tensor behind a placeholder (``_autofusion_real``, set by the backend), or None when
    only a fake one exists."""
    from torch._subclasses.fake_tensor import FakeTensor

    value = node.meta.get("_autofusion_real")
    if not isinstance(value, FakeTensor):
        return value
    example = getattr(node.meta.get("grapharg"), "example", None)
    return None if example is None or isinstance(example, FakeTensor) else example


def static_float_tensors(value: Any) -> bool:
    """A tuple or list of static float32 tensors (what a split returns), None where an output was not
    asked for (convolution_backward's output mask)."""
    return (isinstance(value, (tuple, list)) and any(v is not None for v in value)
            and all(v is None or static_float_tensor(v) for v in value))


class Converter:
    def __init__(self, builder: GraphBuilder, env: dict[Any, str]) -> None:
        self.b = builder
        self.env = env
        self.consts: dict[str, np.ndarray] = {}
        # a split's node -> its parts (None for one a convolution_backward is not asked for)
        self.multi: dict[Any, tuple[str | None, ...]] = {}
        self.transposes: dict[str, tuple[str, tuple[int, ...]]] = {}  # a Transpose's output -> (input, perm)

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        """``x`` transposed by ``perm``; a transpose of a transpose is one Transpose of the first one's
        input (as exporters write it), so that a matrix product can read it in place."""
        perm = tuple(int(p) for p in perm)
        if x in self.transposes:
            x, inner = self.transposes[x]
            perm = tuple(inner[p] for p in perm)
        if perm == tuple(range(len(perm))):
            return x
        out = self.b.op("Transpose", x, perm=list(perm))
        self.transposes[out] = (x, perm)
        return out

    def tensor(self, arg: Any) -> str:
        """The IR tensor for an FX argument: a converted node, or a Python scalar as a constant."""
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return self.b.const(np.asarray(arg, np.float32))
        if arg in self.env:
            return self.env[arg]
        raise FxConversionError(f"argument {arg!r} is not a tensor the converter knows")

    def parts(self, arg: Any) -> tuple[str | None, ...]:
        """The IR tensors of a multi-output node (a split)."""
        found = self.multi.get(arg)
        if found is None:
            raise FxConversionError(f"argument {arg!r} is not a split the converter knows")
        return found

    def const_value(self, arg: Any) -> np.ndarray | None:
        name = self.env.get(arg) if not isinstance(arg, (int, float)) else None
        return self.consts.get(name) if name else None


def arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def out_shape(node: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in example_value(node).shape)


def shape_of(arg: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in example_value(arg).shape)


# converters the module-level (fx_import) and aten (fx_aten) tables share


def convert_reshape(cv: Converter, node: Any) -> str:
    """Any reshaping view (view, reshape, flatten, aten's _unsafe_view): its result's static shape."""
    return cv.b.op("Reshape", cv.tensor(node.args[0]), cv.b.const(np.asarray(out_shape(node), np.int64)))


def convert_identity(cv: Converter, node: Any) -> str:
    """An op that returns its input's values (contiguous, inference dropout, clone, detach)."""
    return cv.tensor(node.args[0])


def convert_softmax(cv: Converter, node: Any) -> str:
    return cv.b.op("Softmax", cv.tensor(node.args[0]), axis=int(arg(node, 1, "dim")))
