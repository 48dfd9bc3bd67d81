"""A table-driven check of every registered op: metadata, inference vs reference, reference vs onnxruntime.

Every op in the default registry needs a row in ``SAMPLES`` (a small valid call), so a new op cannot
be added without at least one numeric check against onnxruntime.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from autofusion.ir import Const, Node, TensorType, freeze_attrs
from autofusion.ir.infer import infer_node
from autofusion.ops import OpClass, default_registry
from autofusion.ops.registry import InferContext

REGISTRY = default_registry()
RNG = np.random.default_rng(7)


def f32(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def positive(*shape: int) -> np.ndarray:
    return f32(*shape, low=0.2, high=0.9)


X = f32(2, 3)
# op -> (inputs, attributes, number of outputs); ops not listed take one (2, 3) float input
SAMPLES: dict[str, tuple[list[np.ndarray | None], dict[str, Any], int]] = {
    **{op: ([f32(2, 3), f32(3)], {}, 1) for op in ("Add", "Sub", "Mul", "Max", "Min", "Mean", "Sum")},
    "Div": ([f32(2, 3), positive(1, 3)], {}, 1),
    "Pow": ([positive(2, 3), f32(3)], {}, 1),
    "Mod": ([np.array([[5, -7, 9]], np.int64), np.array([3, 3, -4], np.int64)], {}, 1),
    **{op: ([f32(2, 3), f32(2, 1)], {}, 1) for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")},
    **{op: ([RNG.random((2, 3)) > 0.5, RNG.random(3) > 0.5], {}, 1) for op in ("And", "Or", "Xor")},
    "Not": ([RNG.random((2, 3)) > 0.5], {}, 1),
    **{op: ([positive(2, 3)], {}, 1) for op in ("Log", "Sqrt", "Asin", "Acos", "Atanh", "Reciprocal")},
    "Acosh": ([positive(2, 3) + 1], {}, 1),
    "IsNaN": ([np.array([1.0, np.nan, np.inf], np.float32)], {}, 1),
    "IsInf": ([np.array([1.0, -np.inf, np.inf], np.float32)], {"detect_positive": 0}, 1),
    "Clip": ([f32(2, 3), np.array(-0.5, np.float32), np.array(0.5, np.float32)], {}, 1),
    "PRelu": ([f32(2, 3), f32(3)], {}, 1),
    "Where": ([RNG.random((2, 1)) > 0.5, f32(2, 3), f32(3)], {}, 1),
    "Cast": ([f32(2, 3) * 10], {"to": TensorProto.INT32}, 1),
    "BatchNormalization": ([f32(2, 3, 4), f32(3), f32(3), f32(3), positive(3)], {}, 1),
    "Dropout": ([f32(2, 3)], {}, 2),
    "Gelu": ([f32(2, 3)], {"approximate": "tanh"}, 1),
    "Expand": ([f32(3, 1), i64(2, 1, 4)], {}, 1),
    "Tile": ([f32(2, 3), i64(2, 2)], {}, 1),
    **{op: ([f32(2, 3, 4), i64(1)], {"keepdims": 0} if op != "ReduceMax" else {}, 1)
       for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                  "ReduceSumSquare", "ReduceLogSumExp")},
    "ReduceLogSum": ([positive(2, 3, 4), i64(0, 2)], {}, 1),
    "Softmax": ([f32(2, 3, 4)], {"axis": 1}, 1),
    "LogSoftmax": ([f32(2, 3, 4)], {}, 1),
    "Hardmax": ([f32(2, 3, 4)], {"axis": 0}, 1),
    "LayerNormalization": ([f32(2, 3, 4), f32(4), f32(4)], {}, 3),
    "InstanceNormalization": ([f32(2, 3, 4), f32(3), f32(3)], {"epsilon": 1e-3}, 1),
    "GlobalAveragePool": ([f32(2, 3, 4, 5)], {}, 1),
    "GlobalMaxPool": ([f32(2, 3, 4)], {}, 1),
    "ArgMax": ([f32(2, 3, 4)], {"axis": 1}, 1),
    "ArgMin": ([f32(2, 3, 4)], {"axis": -1, "keepdims": 0}, 1),
    "CumSum": ([f32(2, 3), i64(1)[0]], {"reverse": 1}, 1),
    "Identity": ([f32(2, 3, 4)], {}, 1),
    "Reshape": ([f32(2, 3, 4), i64(0, -1)], {}, 1),
    "Transpose": ([f32(2, 3, 4)], {"perm": [1, 2, 0]}, 1),
    "Squeeze": ([f32(2, 1, 3), i64(1)], {}, 1),
    "Unsqueeze": ([f32(2, 3), i64(0, -1)], {}, 1),
    "Flatten": ([f32(2, 3, 4)], {"axis": 2}, 1),
    "Concat": ([f32(2, 3), f32(2, 1), f32(2, 2)], {"axis": 1}, 1),
    "Split": ([f32(2, 6), i64(1, 5)], {"axis": 1}, 2),
    "Slice": ([f32(4, 5), i64(3, 1), i64(0, 100), i64(0, 1), i64(-1, 2)], {}, 1),
    "Pad": ([f32(2, 3), i64(1, 0, 0, 2), np.array(0.5, np.float32)], {}, 1),
    "DepthToSpace": ([f32(1, 8, 2, 2)], {"blocksize": 2}, 1),
    "SpaceToDepth": ([f32(1, 2, 4, 4)], {"blocksize": 2}, 1),
    "Gather": ([f32(5, 3), np.array([[4, -1], [0, 2]], np.int64)], {"axis": 0}, 1),
    "GatherND": ([f32(2, 3, 4), np.array([[1, 2], [0, -1]], np.int64)], {}, 1),
    "GatherElements": ([f32(3, 4), np.array([[0, 3], [2, 1], [-1, 0]], np.int64)], {"axis": 1}, 1),
    "Shape": ([f32(2, 3, 4)], {"start": -2}, 1),
    "Size": ([f32(2, 3, 4)], {}, 1),
    "ConstantOfShape": ([i64(2, 3)], {"value": numpy_helper.from_array(np.array([1.5], np.float32))}, 1),
    "Range": ([np.array(1.0, np.float32), np.array(4.0, np.float32), np.array(0.7, np.float32)], {}, 1),
    "Trilu": ([f32(2, 3, 4), np.array(-1, np.int64)], {"upper": 0}, 1),
    "MatMul": ([f32(2, 3, 4), f32(4, 5)], {}, 1),
    "Gemm": ([f32(4, 3), f32(5, 4), f32(5)], {"transA": 1, "transB": 1, "alpha": 0.5}, 1),
    "Einsum": ([f32(2, 3, 4), f32(2, 4, 5)], {"equation": "bij,bjk->bik"}, 1),
    "Conv": ([f32(1, 4, 6, 6), f32(6, 2, 3, 3), f32(6)], {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 1]}, 1),
    "ConvTranspose": ([f32(1, 2, 4, 4), f32(2, 3, 3, 3)], {"strides": [2, 2], "pads": [1, 1, 0, 0]}, 1),
    "MaxPool": ([f32(1, 2, 5, 5)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 2),
    "AveragePool": ([f32(1, 2, 5, 5)], {"kernel_shape": [2, 2], "ceil_mode": 1, "strides": [2, 2]}, 1),
    "LRN": ([f32(1, 5, 3, 3)], {"size": 3}, 1),
    "LSTM": ([f32(3, 2, 4), f32(2, 20, 4), f32(2, 20, 5), f32(2, 40), None, f32(2, 2, 5)],
             {"hidden_size": 5, "direction": "bidirectional"}, 3),
}


def _ir_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attributes as the IR holds them: a one-element tensor becomes a plain number."""
    return {k: (numpy_helper.to_array(v).reshape(-1)[0].item() if isinstance(v, TensorProto) else v)
            for k, v in attrs.items()}


def _sample(op: str) -> tuple[list[np.ndarray | None], dict[str, Any], int]:
    return SAMPLES.get(op, ([X], {}, 1))


def _onnxruntime(op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], n_out: int) -> list[np.ndarray]:
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    consts = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(v))
              for n, v in zip(names, inputs) if n]  # constants, so shape-defining inputs are known
    outs = [f"out{i}" for i in range(n_out)]
    graph = helper.make_graph([*consts, helper.make_node(op, names, outs, **attrs)], "g", [],
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {})


@pytest.mark.parametrize("op", REGISTRY.names)
def test_op_metadata(op: str) -> None:
    opdef = REGISTRY[op]
    assert isinstance(opdef.op_class, OpClass)
    assert opdef.doc, f"{op} has no doc"
    assert all(isinstance(k, str) for k in opdef.attrs)
    optional = [n.endswith("?") for n in opdef.inputs]
    assert optional == sorted(optional) or op in ("LSTM", "Pad", "Slice"), f"{op}: optional inputs come last"
    if opdef.view:
        assert opdef.op_class is OpClass.REORGANIZE


@pytest.mark.parametrize("op", REGISTRY.names)
def test_inference_agrees_with_reference_and_onnxruntime(op: str) -> None:
    inputs, attrs, n_out = _sample(op)
    ir_attrs = _ir_attrs(attrs)
    names = tuple(f"in{i}" if v is not None else "" for i, v in enumerate(inputs))
    outs = tuple(f"out{i}" for i in range(n_out))
    node = Node(op, names, outs, freeze_attrs(ir_attrs), "n")
    types = {n: TensorType.of(v) for n, v in zip(names, inputs) if n and v is not None}
    consts = {n: Const(v) for n, v in zip(names, inputs) if n and v is not None}
    inferred = infer_node(node, types, consts, REGISTRY)
    got = REGISTRY[op].reference(list(inputs), node.attrs)[:n_out]
    expected = _onnxruntime(op, inputs, attrs, n_out)
    for t, g, e in zip(inferred, got, expected):
        assert (t.shape, t.dtype.numpy) == (g.shape, g.dtype), f"{op}: inference {t} vs reference {g.dtype}{g.shape}"
        assert g.shape == e.shape and g.dtype == e.dtype, f"{op}: reference {g.dtype}{g.shape} vs ort {e.dtype}{e.shape}"
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=op)
    ctx = InferContext(node, tuple(types.get(n) for n in names), tuple(consts[n].array if n else None for n in names))
    assert REGISTRY[op].count_flops(ctx, inferred) >= 0
    assert REGISTRY[op].count_bytes(ctx, inferred) >= 0


def test_every_op_has_a_sample_or_takes_one_float_input() -> None:
    for opdef in REGISTRY:
        if opdef.name not in SAMPLES:
            assert opdef.min_inputs == 1 and opdef.op_class is OpClass.POINTWISE, f"add {opdef.name} to SAMPLES"


# inputs that became inputs at some opset but were attributes before: optional here, required in the schema
LEGACY_OPTIONAL = {"Pad": {"pads"}, "Slice": {"starts", "ends"}, "Unsqueeze": {"axes"}}


@pytest.mark.parametrize("op", REGISTRY.names)
def test_signature_and_attribute_defaults_match_the_onnx_schema(op: str) -> None:
    """Every attribute of the op's ONNX schema (opset 22) is listed with the schema's default."""
    opdef = REGISTRY[op]
    schema = onnx.defs.get_schema(op, 22, "")
    for name, attr in schema.attributes.items():
        assert name in opdef.attrs, f"{op}: attribute {name!r} missing"
        if attr.default_value.type:
            default = helper.get_attribute_value(attr.default_value)
            default = default.decode() if isinstance(default, bytes) else default
            default = tuple(default) if isinstance(default, list) else default
            assert opdef.attrs[name] == pytest.approx(default), f"{op}.{name}: default {opdef.attrs[name]}"
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    required = {i.name for i in schema.inputs if i.option == single} - LEGACY_OPTIONAL.get(op, set())
    mine = [n for n in opdef.inputs if not n.endswith(("?", "*"))]
    assert len(mine) == len(required), f"{op}: required inputs {mine} vs schema {sorted(required)}"
    assert opdef.max_inputs is None or opdef.max_inputs == len(schema.inputs)


def test_class_lists() -> None:
    assert set(REGISTRY.of_class(OpClass.BROADCAST)) == {"Expand", "Tile"}
    assert {"MatMul", "Gemm", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "LSTM", "Einsum", "LRN"} <= set(
        REGISTRY.of_class(OpClass.OPAQUE))
    assert {"Softmax", "LayerNormalization", "ReduceMean", "GlobalAveragePool", "ArgMax"} <= set(
        REGISTRY.of_class(OpClass.REDUCTION))
    views = {op.name for op in REGISTRY if op.view}
    assert views == {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def test_op_facts_live_in_the_registry() -> None:
    """Commutativity, matrix-product cores, pooling and views are fields of OpDef: the engine, the
    legality checker, codegen and the benchmarks all read them there, not lists of their own."""
    from autofusion.ops.catalog import default_registry

    reg = default_registry()
    assert {n for n in reg.names if reg[n].commutative} == {"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or",
                                                            "Xor", "Equal"}
    assert {n: reg[n].core for n in reg.names if reg[n].core} == {"MatMul": "gemm", "Gemm": "gemm", "Conv": "conv"}
    assert {n for n in reg.names if reg[n].pooling} == {"MaxPool", "AveragePool"}
    assert {n for n in reg.names if reg[n].view} == {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def test_a_commutative_fact_makes_patterns_match_either_order(tmp_path) -> None:
    """Sub is not commutative: a rule written Sub(x, Relu(y)) does not match Sub(Relu(y), x); declared
    commutative in an extended registry, the same pattern matches it."""
    import dataclasses

    from autofusion.api import optimize
    from autofusion.dsl import load_rules
    from autofusion.ir import GraphBuilder
    from autofusion.ops.catalog import default_registry

    b = GraphBuilder("swap")
    x, y = b.input("x", (4,)), b.input("y", (4,))
    g = b.build([b.op("Sub", b.op("Relu", y), x)])
    (tmp_path / "swap.fuse").write_text('fuse relu_sub: Sub(x, Relu(y)) -> template "pointwise"\n')
    reg = default_registry()
    swapped = reg.extended([dataclasses.replace(reg["Sub"], commutative=True)])
    fused = [len(optimize(g, load_rules([tmp_path], registry=r), registry=r).groups) for r in (reg, swapped)]
    assert fused == [2, 1]
