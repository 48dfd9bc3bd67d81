"""Bad ONNX input never ends in a traceback: each case is one OnnxImportError that says what is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autofusion.frontends import OnnxImportError, load_onnx
from autofusion.ir import run_graph

MODELS = Path(__file__).parent / "data" / "models"


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[str],
           opset: int = 17, initializers: list[TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _x(name: str = "x", shape: tuple = (2, 3)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _error(source: object, **kwargs: object) -> str:
    with pytest.raises(OnnxImportError) as info:
        load_onnx(source, **{"symbolic": False, **kwargs})  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)  # callers may catch it as a ValueError
    return str(info.value)


def test_truncated_file(tmp_path: Path) -> None:
    data = (MODELS / "resnet_tiny_script.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    msg = _error(path)
    assert "cut.onnx" in msg and ("truncated" in msg or "not an ONNX model" in msg)


def test_garbage_bytes() -> None:
    for junk in (b"\xff\xfe this is not a protobuf \x00\x01", b"hello world", b""):
        msg = _error(junk)
        assert "not" in msg and "ONNX model" in msg


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert "not found" in _error(tmp_path / "nope.onnx")
    assert "directory" in _error(tmp_path)


def test_wrong_argument_type() -> None:
    assert "file path, bytes or an onnx.ModelProto" in _error(42)


def test_unsupported_ops_are_listed_once_with_counts() -> None:
    nodes = [
        helper.make_node("StringNormalizer", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("HammingWindow", ["b"], ["c"]),
        helper.make_node("StringNormalizer", ["c"], ["d"]),
        helper.make_node("FusedGemm", ["d"], ["y"], domain="com.microsoft"),
    ]
    msg = _error(_model(nodes, [_x()], ["y"]))
    assert msg.startswith("unsupported ops:")
    assert "StringNormalizer (x2)" in msg and "HammingWindow (x1)" in msg and "com.microsoft.FusedGemm (x1)" in msg
    assert "Relu" not in msg


def test_unsupported_op_in_a_dead_branch_is_dropped_not_an_error() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("StringNormalizer", ["x"], ["unused"])]
    graph = load_onnx(_model(nodes, [_x()], ["y"]))
    assert [n.op for n in graph.nodes] == ["Relu"]


def test_unbound_symbolic_dims_name_themselves_and_the_fix() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "seq"])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], ["y"])
    msg = _error(model)
    assert "'batch'" in msg and "'seq'" in msg and "dims=" in msg and "'x'" in msg
    msg = _error(model, dims={"batch": 2})
    assert "'seq'" in msg and "'batch'" not in msg
    graph = load_onnx(model, dims={"batch": 2, "seq": 5})
    assert graph.types["x"].shape == (2, 3, 5) and graph.types["y"].shape == (2, 3, 5)
    assert [str(d) for d in load_onnx(model, dims={"batch": 2}).types["y"].shape] == ["2", "3", "seq"]


def test_dims_are_read_off_the_feeds_given_for_the_inputs() -> None:
    """A model exported with dynamic axes is bound by the feeds of a run: named and unnamed
    dimensions from every input, ``dims`` first, and a clear error for an array of another rank, a
    fixed dimension of another size, one symbol given two sizes, or feeds that contradict ``dims``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    bias = helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", None, 4])
    model = _model([helper.make_node("Add", ["x", "bias"], ["y"])], [x, bias], ["y"])
    feeds = {"x": np.zeros((2, 5, 4), np.float32), "bias": np.zeros((2, 1, 4), np.float32)}
    graph = load_onnx(model, feeds=feeds)
    assert graph.types["x"].shape == (2, 5, 4) and graph.types["bias"].shape == (2, 1, 4)
    assert load_onnx(model, dims={"bias[1]": 5}, feeds={"x": feeds["x"]}).types["y"].shape == (2, 5, 4)
    assert "'bias[1]'" in _error(model, feeds={"x": feeds["x"]})  # bias not given: its own dim unbound
    msg = _error(model, feeds={**feeds, "bias": np.zeros((3, 1, 4), np.float32)})
    assert "dimension 'batch' is 2 in input 'x' (axis 0) but 3 in input 'bias' (axis 0)" in msg
    msg = _error(model, feeds={"x": np.zeros((2, 5, 5), np.float32)})
    assert "'x' is given as [2, 5, 5], the model declares ['batch', 'seq', 4]: axis 2 is fixed at 4" in msg
    assert "'x' is given as [2, 5], the model declares" in _error(model, feeds={"x": np.zeros((2, 5), np.float32)})
    msg = _error(model, dims={"seq": 4}, feeds=feeds)
    assert "dimension 'seq' is bound to 4, but input 'x' (axis 1) has 5" in msg


def test_unnamed_dynamic_dim_is_bound_by_input_and_axis() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], ["y"])
    assert "'x[0]'" in _error(model)
    assert load_onnx(model, dims={"x[0]": 3}).types["y"].shape == (3, 4)


def test_cycle_is_reported_with_its_nodes() -> None:
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Neg", ["b"], ["c"], name="third"),
        helper.make_node("Relu", ["b"], ["y"], name="out"),
    ]
    msg = _error(_model(nodes, [_x()], ["y"]))
    assert "cycle" in msg and "'first'" in msg and "'second'" in msg and "'third'" in msg


def test_dangling_input() -> None:
    msg = _error(_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [_x()], ["y"]))
    assert "'ghost'" in msg and "'adder'" in msg and "no node, graph input or initializer" in msg


def test_undefined_graph_output() -> None:
    msg = _error(_model([helper.make_node("Relu", ["x"], ["y"])], [_x()], ["nowhere"]))
    assert "'nowhere'" in msg and "not defined" in msg


def test_tensor_defined_twice() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
    assert "defined twice" in _error(_model(nodes, [_x()], ["y"]))


def test_bad_opset() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_x()], ["y"], opset=999)
    msg = _error(model)
    assert "unknown opset 999" in msg
    model.ClearField("opset_import")
    assert "operator set" in _error(model)


def test_failed_opset_upgrade_falls_back_or_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnx import version_converter

    from autofusion.frontends.onnx_proto import OnnxImportWarning

    def refuse(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
        raise RuntimeError("No adapter for Foo")

    monkeypatch.setattr(version_converter, "convert_version", refuse)
    # ops whose meaning did not change import at their own opset, with a warning
    softmax_last = [helper.make_node("Softmax", ["x"], ["y"])]  # rank 2, default axis 1: the last axis
    with pytest.warns(OnnxImportWarning, match="No adapter for Foo"):
        graph = load_onnx(_model(softmax_last, [_x()], ["y"], opset=9))
    x = np.array([[1, 2, 3], [0, 0, 0]], np.float32)
    np.testing.assert_allclose(run_graph(graph, {"x": x})["y"].sum(axis=1), [1, 1], rtol=1e-6)
    # Softmax over several axes together (its pre-13 meaning) cannot be imported without the upgrade
    softmax_3d = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]
    with pytest.warns(OnnxImportWarning):
        msg = _error(_model(softmax_3d, [_x("x", (2, 3, 4))], ["y"], opset=9))
    assert "opset 9" in msg and "re-export" in msg and "Softmax" in msg


def test_wrong_element_types() -> None:
    xi = helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3])
    msg = _error(_model([helper.make_node("Add", ["x", "i"], ["y"], name="mix")], [_x(), xi], ["y"]))
    assert "'mix'" in msg and "element types differ" in msg and "float32" in msg and "int64" in msg
    declared = _model([helper.make_node("Relu", ["x"], ["y"])], [_x()], [])
    declared.graph.output.append(helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3]))
    assert "declared int32 but computes float32" in _error(declared)


def test_unknown_attribute() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="r", flavour=3)], [_x()], ["y"])
    msg = _error(model)
    assert "'flavour'" in msg and "'r'" in msg


def test_shape_error_names_the_node() -> None:
    w = numpy_helper.from_array(np.ones((4, 5), np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [_x()], ["y"], initializers=[w])
    msg = _error(model)
    assert "'mm'" in msg and "MatMul" in msg and "inner dimensions" in msg


def test_unsupported_element_type() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])
    msg = _error(_model([helper.make_node("Relu", ["x"], ["y"])], [x], ["y"]))
    assert "BFLOAT16" in msg and "'x'" in msg


def test_value_dependent_shape_says_which_input_to_fix() -> None:
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    nodes = [helper.make_node("Expand", ["x", "shape"], ["y"])]
    model = _model(nodes, [_x("x", (3, 1)), shape], ["y"])
    msg = _error(model)
    assert "'shape'" in msg and "values=" in msg
    graph = load_onnx(model, values={"shape": np.array([3, 4], np.int64)})
    assert graph.inputs == ("x",) and graph.types["y"].shape == (3, 4)
    assert "not graph inputs" in _error(model, values={"other": np.zeros(2)})
    assert "declares" in _error(model, values={"shape": np.zeros(2, np.float32)})


def test_external_data_without_a_base_directory(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((3, 3), np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_x("x", (2, 3))], ["y"], initializers=[w])
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    raw = onnx.load(path, load_external_data=False)
    assert "external data" in _error(raw.SerializeToString())
    (tmp_path / "weights.bin").unlink()
    msg = _error(path)
    assert "external data" in msg and "'w'" in msg
