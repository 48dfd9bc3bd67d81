"""What the ONNX importer does to a model: constants, Identity, folding, dead code, names, opsets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from autofusion.frontends import OnnxImportError, load_onnx
from autofusion.ir import run_graph, verify


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[str],
           opset: int = 17, initializers: list[TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset >= 13 else 7
    return model


def _x(name: str = "x", shape: tuple = (2, 3)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    model = onnx.shape_inference.infer_shapes(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_constant_nodes_of_every_form_become_constants() -> None:
    nodes = [
        helper.make_node("Constant", [], ["c0"], value=numpy_helper.from_array(np.full((2, 3), 2, np.float32))),
        helper.make_node("Constant", [], ["c1"], value_float=0.5),
        helper.make_node("Constant", [], ["c2"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["c3"], value_int=3),
        helper.make_node("Constant", [], ["c4"], value_ints=[3, 2]),
        helper.make_node("Mul", ["x", "c0"], ["a"]),
        helper.make_node("Add", ["a", "c1"], ["b"]),
        helper.make_node("Add", ["b", "c2"], ["d"]),
        helper.make_node("Reshape", ["d", "c4"], ["e"]),
        helper.make_node("Cast", ["c3"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["e", "f"], ["y"]),
    ]
    model = _model(nodes, [_x()], ["y"])
    graph = verify(load_onnx(model))
    assert "Constant" not in {n.op for n in graph.nodes} and "Cast" not in {n.op for n in graph.nodes}
    assert graph.is_const("c4") and graph.const_value("c4").dtype == np.int64
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(run_graph(graph, {"x": x})["y"], _onnxruntime(model, {"x": x})[0], rtol=1e-6)


def test_initializers_listed_as_inputs_are_constants() -> None:
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_x(), _x("w", (3, 4))], ["y"],
                   initializers=[w])
    graph = load_onnx(model)
    assert graph.inputs == ("x",) and graph.is_const("w")


def test_identity_nodes_disappear_and_output_names_survive() -> None:
    nodes = [
        helper.make_node("Identity", ["x"], ["x1"]),
        helper.make_node("Relu", ["x1"], ["r"]),
        helper.make_node("Identity", ["r"], ["y"]),  # the graph output is an Identity's
        helper.make_node("Identity", ["r"], ["z"]),  # and so is a second one of the same tensor
        helper.make_node("Identity", ["x"], ["passthrough"]),  # an input straight to an output
    ]
    model = _model(nodes, [_x()], ["y", "z", "passthrough"])
    graph = verify(load_onnx(model))
    assert graph.outputs == ("y", "z", "passthrough")
    assert [n.op for n in graph.nodes].count("Identity") == 2
    relu = next(n for n in graph.nodes if n.op == "Relu")
    assert relu.inputs == ("x",) and relu.outputs == ("y",)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    out = run_graph(graph, {"x": x})
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
    np.testing.assert_array_equal(out["z"], np.maximum(x, 0))
    np.testing.assert_array_equal(out["passthrough"], x)


def test_shape_arithmetic_folds_and_dead_nodes_go() -> None:
    i64 = np.int64
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, i64))),
        helper.make_node("Gather", ["s", "zero"], ["n"]),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
        helper.make_node("Neg", ["x"], ["unused"]),
    ]
    inits = [numpy_helper.from_array(np.array([0], i64), "axes"), numpy_helper.from_array(np.array([-1], i64), "minus1")]
    graph = verify(load_onnx(_model(nodes, [_x("x", (2, 3, 4))], ["y"], initializers=inits)))
    assert [n.op for n in graph.nodes] == ["Reshape", "Relu"]
    reshape = graph.nodes[0]
    np.testing.assert_array_equal(graph.const_value(reshape.inputs[1]), [2, -1])
    assert graph.types["y"].shape == (2, 12)
    assert set(graph.constants) == {reshape.inputs[1]}  # folded intermediates are not kept


def test_node_names_are_unique_and_deterministic() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="n"),
        helper.make_node("Neg", ["a"], ["b"], name="n"),
        helper.make_node("Abs", ["b"], ["c"]),
        helper.make_node("Exp", ["c"], ["y"], name=""),
    ]
    model = _model(nodes, [_x()], ["y"])
    g1, g2 = load_onnx(model), load_onnx(model.SerializeToString())
    names = [n.name for n in g1.nodes]
    assert len(set(names)) == 4 and names[0] == "n"
    assert g1 == g2 and hash(g1) == hash(g2)


def test_split_without_sizes_records_its_part_count() -> None:
    model = _model([helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1)], [_x("x", (2, 6))], ["a", "b", "c"])
    graph = verify(load_onnx(model))
    assert graph.nodes[0].attr("num_outputs") == 3
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = run_graph(graph, {"x": x})
    np.testing.assert_array_equal(out["c"], x[:, 4:])


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_old_opsets_are_upgraded_with_their_semantics(opset: int) -> None:
    """Softmax before opset 13 flattens to 2-D from axis on; the upgraded graph must keep that meaning."""
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=1), helper.make_node("Relu", ["s"], ["y"])]
    model = _model(nodes, [_x("x", (2, 3, 4))], ["y"], opset=opset)
    graph = verify(load_onnx(model))
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run_graph(graph, {"x": x})["y"], _onnxruntime(model, {"x": x})[0], rtol=1e-5)


def test_sources_path_bytes_proto_and_external_data(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.arange(9, dtype=np.float32).reshape(3, 3), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_x("x", (2, 3))], ["y"], initializers=[w])
    inline = model.SerializeToString()
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    external = onnx.load(path, load_external_data=False)
    from_path = load_onnx(path)
    from_str = load_onnx(str(path))
    from_proto = load_onnx(external, base_dir=tmp_path)
    assert external.graph.initializer[0].data_location == TensorProto.EXTERNAL  # the caller's proto is untouched
    from_bytes = load_onnx(inline)
    for g in (from_path, from_str, from_proto, from_bytes):
        np.testing.assert_array_equal(g.const_value("w"), numpy_helper.to_array(w))


def test_opset6_prelu_slope_is_per_channel() -> None:
    slope = numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "slope")
    model = _model([helper.make_node("PRelu", ["x", "slope"], ["y"])], [_x("x", (1, 3, 2, 3))], ["y"],
                   opset=6, initializers=[slope])
    x = -np.ones((1, 3, 2, 3), np.float32)
    y = run_graph(verify(load_onnx(model)), {"x": x})["y"]
    np.testing.assert_allclose(y[0, :, 0, 0], [-0.1, -0.2, -0.3], rtol=1e-6)


def test_a_custom_registry_decides_what_is_supported() -> None:
    from autofusion.ops import OpRegistry, default_registry

    only_relu = OpRegistry([default_registry()["Relu"]])
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], [_x()], ["y"])
    with pytest.raises(OnnxImportError, match=r"unsupported ops: Neg \(x1\)"):
        load_onnx(model, registry=only_relu)
    relu_only = _model([helper.make_node("Relu", ["x"], ["y"])], [_x()], ["y"])
    assert [n.op for n in load_onnx(relu_only, registry=only_relu).nodes] == ["Relu"]
