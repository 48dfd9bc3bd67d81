"""Property tests: shape inference agrees with the numpy references, and the references with numpy
(or the onnx spec's reference evaluator) on random valid inputs."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from autofusion.ir import Const, Node, TensorType, freeze_attrs
from autofusion.ir.infer import infer_node
from autofusion.ops import ShapeError, default_registry

REGISTRY = default_registry()
FAST = settings(max_examples=50, deadline=None)


def run(op: str, inputs: list[np.ndarray | None], n_out: int = 1, **attrs: Any) -> tuple[list[TensorType], list]:
    """Inferred types and reference outputs of one node whose inputs are all known constants."""
    names = tuple(f"in{i}" if v is not None else "" for i, v in enumerate(inputs))
    node = Node(op, names, tuple(f"out{i}" for i in range(n_out)), freeze_attrs(attrs), "n")
    types = {n: TensorType.of(v) for n, v in zip(names, inputs) if v is not None}
    consts = {n: Const(v) for n, v in zip(names, inputs) if v is not None}
    inferred = list(infer_node(node, types, consts, REGISTRY))
    outs = list(REGISTRY[op].reference(list(inputs), node.attrs))[:n_out]
    for t, o in zip(inferred, outs):
        assert t.shape == o.shape and t.dtype.numpy == o.dtype, f"{op}: inferred {t}, reference {o.dtype}{o.shape}"
    return inferred, outs


def onnx_reference(op: str, inputs: list[np.ndarray], **attrs: Any) -> np.ndarray:
    """The onnx package's reference evaluator: the executable form of the ONNX spec."""
    names = [f"in{i}" for i in range(len(inputs))]
    consts = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(v)) for n, v in zip(names, inputs)]
    graph = helper.make_graph([*consts, helper.make_node(op, names, ["out"], **attrs)], "g", [],
                              [helper.make_value_info("out", onnx.TypeProto())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return ReferenceEvaluator(model).run(None, {})[0]


def _array(shape: tuple[int, ...], seed: int, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-3, 3, shape).astype(dtype)


BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "GreaterOrEqual": np.greater_equal,
    "LessOrEqual": np.less_equal, "Div": np.divide, "PRelu": lambda x, s: np.where(x < 0, x * s, x),
}


@FAST
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
       op=st.sampled_from(sorted(BINARY)), seed=st.integers(0, 2**16))
def test_binary_pointwise_broadcasts_like_numpy(shapes: Any, op: str, seed: int) -> None:
    a, b = _array(shapes.input_shapes[0], seed), _array(shapes.input_shapes[1], seed + 1)
    (t,), (out,) = run(op, [a, b])
    assert t.shape == np.broadcast_shapes(a.shape, b.shape) == shapes.result_shape
    np.testing.assert_allclose(out, BINARY[op](a, b), rtol=1e-6)


@FAST
@given(a=array_shapes(min_dims=1, max_dims=3, max_side=4), b=array_shapes(min_dims=1, max_dims=3, max_side=4))
def test_non_broadcasting_shapes_are_a_shape_error(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        with pytest.raises(ShapeError, match="broadcast"):
            run("Add", [np.zeros(a, np.float32), np.zeros(b, np.float32)])
    else:
        run("Add", [np.zeros(a, np.float32), np.zeros(b, np.float32)])


@st.composite
def reshapes(draw: st.DrawFn) -> tuple[tuple[int, ...], list[int]]:
    shape = draw(array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6))
    factors = [p for d in shape for p in _prime_factors(d)]
    factors = draw(st.permutations(factors))
    k = draw(st.integers(1, max(1, len(factors))))
    cuts = sorted(draw(st.lists(st.integers(0, len(factors)), min_size=k - 1, max_size=k - 1)))
    groups = [factors[i:j] for i, j in zip([0, *cuts], [*cuts, len(factors)])]
    target = [int(np.prod(g)) if g else 1 for g in groups]
    if draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return shape, target


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@FAST
@given(case=reshapes())
def test_reshape(case: tuple[tuple[int, ...], list[int]]) -> None:
    shape, target = case
    x = _array(shape, 0)
    (t,), (out,) = run("Reshape", [x, np.array(target, np.int64)])
    np.testing.assert_array_equal(out, x.reshape(target))


@FAST
@given(data=st.data(), shape=array_shapes(min_dims=1, max_dims=5, max_side=4))
def test_transpose(data: st.DataObject, shape: tuple[int, ...]) -> None:
    perm = data.draw(st.permutations(range(len(shape))))
    x = _array(shape, 1)
    _, (out,) = run("Transpose", [x], perm=perm)
    np.testing.assert_array_equal(out, np.transpose(x, perm))


@FAST
@given(data=st.data(), shape=array_shapes(min_dims=1, max_dims=4, max_side=4))
def test_concat(data: st.DataObject, shape: tuple[int, ...]) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    parts = [_array(shape[: axis % len(shape)] + (s,) + shape[axis % len(shape) + 1:], i) for i, s in enumerate(sizes)]
    _, (out,) = run("Concat", parts, axis=axis)
    np.testing.assert_array_equal(out, np.concatenate(parts, axis=axis))


@FAST
@given(data=st.data(), shape=array_shapes(min_dims=1, max_dims=3, max_side=6))
def test_slice_matches_the_onnx_spec(data: st.DataObject, shape: tuple[int, ...]) -> None:
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    bound = st.one_of(st.integers(-8, 8), st.sampled_from([2**63 - 1, -(2**63)]))
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    x = _array(shape, 2)
    args = [x, *(np.array(v, np.int64) for v in (starts, ends, axes, steps))]
    _, (out,) = run("Slice", args)
    # the spec, not onnxruntime: onnxruntime reads end=INT64_MAX with a negative step as "to the start"
    np.testing.assert_array_equal(out, onnx_reference("Slice", args))


@FAST
@given(data=st.data(), shape=array_shapes(min_dims=1, max_dims=3, max_side=5),
       idx_shape=array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
def test_gather(data: st.DataObject, shape: tuple[int, ...], idx_shape: tuple[int, ...]) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    indices = np.array(data.draw(st.lists(st.integers(-dim, dim - 1), min_size=int(np.prod(idx_shape)),
                                          max_size=int(np.prod(idx_shape)))), np.int64).reshape(idx_shape)
    x = _array(shape, 3)
    _, (out,) = run("Gather", [x, indices], axis=axis)
    np.testing.assert_array_equal(out, np.take(x, indices % dim, axis=axis))


REDUCE = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min,
          "ReduceProd": np.prod, "ReduceL1": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
          "ReduceSumSquare": lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims)}


@FAST
@given(data=st.data(), shape=array_shapes(min_dims=1, max_dims=4, max_side=4), op=st.sampled_from(sorted(REDUCE)),
       keepdims=st.sampled_from([0, 1]))
def test_reductions(data: st.DataObject, shape: tuple[int, ...], op: str, keepdims: int) -> None:
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    x = _array(shape, 4)
    inputs = [x, np.array(axes, np.int64)] if axes else [x]
    _, (out,) = run(op, inputs, keepdims=keepdims)
    want = REDUCE[op](x, axis=tuple(axes) if axes else None, keepdims=bool(keepdims))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@FAST
@given(shapes=mutually_broadcastable_shapes(signature="(m?,n),(n,p?)->(m?,p?)", max_dims=2, max_side=4),
       seed=st.integers(0, 100))
def test_matmul(shapes: Any, seed: int) -> None:
    a, b = _array(shapes.input_shapes[0], seed), _array(shapes.input_shapes[1], seed + 7)
    (t,), (out,) = run("MatMul", [a, b])
    assert t.shape == shapes.result_shape
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-5)


@st.composite
def convolutions(draw: st.DrawFn) -> dict[str, Any]:
    rank = draw(st.integers(1, 2))
    group = draw(st.integers(1, 3))
    c_in, c_out = group * draw(st.integers(1, 2)), group * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    dil = [draw(st.integers(1, 2)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * rank)]
    spatial = [draw(st.integers((k - 1) * d + 1, 7)) for k, d in zip(kernel, dil)]
    return {"x": (draw(st.integers(1, 2)), c_in, *spatial), "w": (c_out, c_in // group, *kernel),
            "group": group, "dilations": dil, "strides": strides, "pads": pads}


def _direct_conv(x: np.ndarray, w: np.ndarray, group: int, dil: list[int], strides: list[int],
                 pads: list[int], out_spatial: tuple[int, ...]) -> np.ndarray:
    """Convolution straight from the definition, one output element at a time."""
    rank = len(dil)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + rank]) for i in range(rank)])
    n, m = x.shape[0], w.shape[0]
    cg, mg = w.shape[1], m // group
    out = np.zeros((n, m, *out_spatial))
    for b, o in itertools.product(range(n), range(m)):
        g = o // mg
        for pos in itertools.product(*(range(s) for s in out_spatial)):
            for k in itertools.product(*(range(s) for s in w.shape[2:])):
                at = tuple(p * s + kk * d for p, s, kk, d in zip(pos, strides, k, dil))
                out[(b, o, *pos)] += np.dot(xp[(b, slice(g * cg, (g + 1) * cg), *at)], w[(o, slice(None), *k)])
    return out


@FAST
@given(case=convolutions(), seed=st.integers(0, 100))
def test_conv_matches_the_definition(case: dict[str, Any], seed: int) -> None:
    x, w = _array(case["x"], seed), _array(case["w"], seed + 1)
    attrs = {k: case[k] for k in ("group", "dilations", "strides", "pads")}
    (t,), (out,) = run("Conv", [x, w], **attrs)
    want = _direct_conv(x, w, case["group"], case["dilations"], case["strides"], case["pads"], t.shape[2:])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
