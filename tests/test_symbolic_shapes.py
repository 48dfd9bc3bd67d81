"""Symbolic sizes: the dimension algebra, symbolic import of models exported with dynamic axes, and
``bind`` to the static graph of a binding, checked against onnxruntime at several sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from dynamic_models import CNN_AND_LSTM, DYNAMIC, dynamic_feeds
from onnx import TensorProto, helper

from autofusion.frontends import load_onnx
from autofusion.frontends.onnx_proto import OnnxImportError
from autofusion.frontends.shape_values import UndecidedShapeValue, fold_symbolic
from autofusion.graph.dims import (
    SymbolicDimError,
    as_dim,
    assumptions,
    dims_equal,
    evaluate,
    slice_length,
    symbol,
)
from autofusion.graph.graph import Const
from autofusion.graph.types import DType, TensorType
from autofusion.ir import run_graph
from autofusion.ir.symbolic import BindError, bind, is_symbolic, symbols_of
from autofusion.ops.registry import ShapeError, broadcast_shapes

BATCH, SEQ = symbol("batch"), symbol("seq")


def test_sizes_are_ints_or_expressions_over_positive_symbols() -> None:
    assert as_dim(np.int64(3)) == 3 and type(as_dim(np.int64(3))) is int
    assert as_dim(BATCH * SEQ) == SEQ * BATCH  # one canonical form per product
    assert evaluate(2 * SEQ + BATCH, {"batch": 3, "seq": 5}) == 13
    assert dims_equal(SEQ, SEQ) is True and dims_equal(SEQ, -1) is False  # a size is never -1
    assert dims_equal(SEQ, 1) is None and dims_equal(SEQ, BATCH) is None  # the binding decides
    for bad in (-1, True, 1.5, SEQ / 2, -SEQ):
        with pytest.raises(ValueError):
            as_dim(bad)
    with pytest.raises(SymbolicDimError, match="'seq'"):
        evaluate(SEQ, {"batch": 1})


def test_a_symbolic_slice_end_is_taken_within_the_sliced_size_and_recorded() -> None:
    assert slice_length(10, 2, 7, 1) == 5 and slice_length(SEQ, 0, -1, 1) == SEQ - 1
    with pytest.raises(SymbolicDimError):  # outside an import: nothing may be taken for granted
        slice_length(64, 0, SEQ, 1)
    with assumptions() as bounds:
        assert slice_length(64, 0, SEQ, 1) == SEQ and slice_length(512, 0, SEQ, 1) == SEQ
    assert bounds == {"seq": 64}  # the tightest


def test_types_and_constants_carry_symbolic_sizes() -> None:
    t = TensorType((BATCH, SEQ, 64), DType.FLOAT32)
    assert str(t) == "float32[batch,seq,64]" and not t.is_static and t.numel == 64 * BATCH * SEQ
    assert TensorType((np.int64(2), 3), DType.FLOAT32).is_static
    values = np.array([BATCH, SEQ, 2, -1], object)
    c = Const(values)
    assert c.is_symbolic and c.type == TensorType((4,), DType.INT64)
    assert Const(values.copy()) == c and Const(np.array([BATCH, SEQ, 2, 1], object)) != c
    static = Const(np.array([3, 4], object))  # no symbol left: stored as int64
    assert not static.is_symbolic and static.array.dtype == np.int64
    with pytest.raises(ValueError, match="an integer"):
        Const(np.array([SEQ, 0.5], object))


def test_symbolic_sizes_broadcast_only_where_equal_for_every_binding() -> None:
    assert broadcast_shapes((BATCH, SEQ, 64), (1, SEQ, 64)) == (BATCH, SEQ, 64)
    assert broadcast_shapes((SEQ, 1), (1, BATCH)) == (SEQ, BATCH)
    for a, b in (((SEQ,), (BATCH,)), ((SEQ,), (16,))):
        with pytest.raises(ShapeError, match="every size"):
            broadcast_shapes(a, b)


def _obj(*values: object) -> np.ndarray:
    out = np.empty(len(values), object)
    out[:] = values
    return out


def test_shape_arithmetic_folds_with_integer_semantics_and_decided_comparisons() -> None:
    def fold(op: str, *args: np.ndarray, **attrs: object) -> np.ndarray:
        from autofusion.ops.catalog import default_registry

        values = fold_symbolic(op, list(args), attrs, default_registry()[op].reference)
        assert values is not None, op
        return values[0]

    dims = _obj(BATCH, SEQ, 64)
    assert list(fold("Mul", dims, np.array(2))) == [2 * BATCH, 2 * SEQ, 128]
    assert list(fold("Div", _obj(2 * SEQ, 7), np.array([2, -2]))) == [SEQ, -3]  # truncation toward zero
    assert list(fold("Sub", dims, np.array(1))) == [BATCH - 1, SEQ - 1, 63]
    assert list(fold("Neg", dims)) == [-BATCH, -SEQ, -64]
    assert list(fold("Equal", dims, np.array(-1))) == [False, False, False]  # a size is never -1
    assert list(fold("Max", _obj(SEQ, 0), np.array([SEQ + 1, 3]))) == [SEQ + 1, 3]
    assert list(fold("Min", _obj(SEQ, 0), np.array([SEQ + 1, 3]))) == [SEQ, 0]
    assert list(fold("Cast", dims, to=TensorProto.INT32)) == [BATCH, SEQ, 64]
    assert list(fold("Where", np.array([True, False, True]), dims, np.array(0))) == [BATCH, 0, 64]
    assert list(fold("Gather", dims, np.array([1, 2]), axis=0)) == [SEQ, 64]
    assert list(fold("Shape", dims)) == [3]
    for op, args in (("Greater", (dims, np.array(1))), ("Max", (_obj(SEQ), _obj(BATCH)))):
        with pytest.raises(UndecidedShapeValue, match="depends on the sizes"):
            fold(op, *args)
    assert fold_symbolic("Cast", [dims], {"to": TensorProto.FLOAT}, lambda *a: ()) is None  # stays a node
    assert fold_symbolic("Range", [np.array(0), _obj(SEQ), np.array(1)], {}, lambda *a: ()) is None


def test_the_dynamic_models_are_there() -> None:
    assert len(DYNAMIC) == 4 and len(CNN_AND_LSTM) == 3, "tests/data/dynamic lost its models"


@pytest.mark.parametrize("path", DYNAMIC, ids=[p.stem for p in DYNAMIC])
def test_one_symbolic_import_binds_to_every_size_as_onnxruntime_runs_it(path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    graph = load_onnx(path, symbolic=True)
    assert is_symbolic(graph) and symbols_of(graph) == ("batch", "seq")
    assert all(graph.types[i].shape == (BATCH, SEQ) for i in graph.inputs)
    assert graph.types[graph.outputs[0]].shape == (BATCH, SEQ, 64)
    session = ort.InferenceSession(str(path))
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 16), (1, 7), (3, 9), (2, 1), (1, 64)):
        bound = bind(graph, {"batch": batch, "seq": seq})
        assert not is_symbolic(bound)
        static = load_onnx(path, dims={"batch": batch, "seq": seq})
        assert [n.op for n in bound.nodes] == [n.op for n in static.nodes]  # as the static import folds
        feeds = dynamic_feeds(graph, batch, seq, rng)
        (want,) = session.run(None, feeds)
        got = run_graph(bound, feeds)[bound.outputs[0]]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{path.stem} at {batch} x {seq}")


def test_a_binding_the_model_cannot_take_is_refused_by_name() -> None:
    graph = load_onnx(DYNAMIC[0], symbolic=True)  # bert: position_ids[:, :seq] of a 64-row table
    assert dict(graph.bounds) == {"seq": 64}
    for binding, message in (({"batch": 1, "seq": 65}, "'seq' = 65 exceeds 64"),
                             ({"batch": 1}, "no size given for 'seq'"),
                             ({"batch": 0, "seq": 4}, "'batch' = 0: the graph needs at least 1"),
                             ({"batch": 1.5, "seq": 4}, "must be an int")):
        with pytest.raises(BindError, match=message):
            bind(graph, binding)


def test_dimensions_given_stay_bound_and_the_rest_symbolic() -> None:
    graph = load_onnx(DYNAMIC[0], dims={"batch": 2}, symbolic=True)
    assert symbols_of(graph) == ("seq",) and graph.types["input_ids"].shape == (2, SEQ)
    with pytest.raises(OnnxImportError, match="unbound symbolic dimension"):
        load_onnx(DYNAMIC[0], symbolic=False)


def _reshape_by_comparison() -> onnx.ModelProto:
    """Reshape(x, [Where(Shape(x) == 4, 2, Shape(x)), -1]): the target depends on whether seq is 4."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["four"], value=helper.make_tensor("four", TensorProto.INT64, [1], [4])),
        helper.make_node("Equal", ["s", "four"], ["is4"]),
        helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", TensorProto.INT64, [1], [2])),
        helper.make_node("Where", ["is4", "two", "s"], ["w"]),
        helper.make_node("Constant", [], ["rest"], value=helper.make_tensor("rest", TensorProto.INT64, [1], [-1])),
        helper.make_node("Concat", ["w", "rest"], ["t"], axis=0),
        helper.make_node("Reshape", ["x", "t"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_arithmetic_that_depends_on_the_sizes_is_a_clear_error() -> None:
    with pytest.raises(OnnxImportError, match="whether seq == 4 depends on the sizes bound at run time"):
        load_onnx(_reshape_by_comparison(), symbolic=True)
    graph = load_onnx(_reshape_by_comparison(), dims={"seq": 4}, symbolic=True)  # bound: it folds
    assert graph.types["y"].shape == (2, 2) and not is_symbolic(graph)
