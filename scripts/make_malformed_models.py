"""Write the corpus of broken ONNX files under tests/data/malformed/ (run from the repository root).

Each file is named for what is wrong with it; tests/test_malformed_models.py checks that loading
it gives one clear error and that ``autofusion info`` / ``autofusion run`` exit with status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "malformed"


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[str],
           opset: int = 17, initializers: list[TensorProto] | None = None, domain: str = "") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    model.ir_version = 8
    return model


def _x(name: str = "x", shape: tuple[int, ...] = (2, 3), elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def corpus() -> dict[str, bytes]:
    """File name -> bytes of each broken model."""
    good = _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Tanh", ["y"], ["z"])], [_x()], ["z"])
    good_bytes = good.SerializeToString()
    weight = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    short_weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3, 4], raw_data=b"\0" * 7)
    files: dict[str, bytes] = {
        "empty.onnx": b"",
        "truncated.onnx": good_bytes[: len(good_bytes) // 2],
        "garbage.onnx": bytes(range(256)) * 4,
        "text_file.onnx": b"this is not a model\n",
        "dangling_input.onnx": _model([helper.make_node("Add", ["x", "missing"], ["y"])], [_x()], ["y"]).SerializeToString(),
        "cycle.onnx": _model([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
                             [_x()], ["b"]).SerializeToString(),
        "undefined_output.onnx": _model([helper.make_node("Relu", ["x"], ["y"])], [_x()], ["nowhere"]).SerializeToString(),
        "unknown_opset.onnx": _model([helper.make_node("Relu", ["x"], ["y"])], [_x()], ["y"], opset=999).SerializeToString(),
        "unknown_domain.onnx": _model([helper.make_node("Frobnicate", ["x"], ["y"], domain="com.evil")], [_x()], ["y"],
                                      ).SerializeToString(),
        "unknown_op.onnx": _model([helper.make_node("Frobnicate", ["x"], ["y"])], [_x()], ["y"]).SerializeToString(),
        "wrong_types.onnx": _model([helper.make_node("Add", ["x", "s"], ["y"])],
                                   [_x(), _x("s", (2, 3), TensorProto.STRING)], ["y"]).SerializeToString(),
        "wrong_matmul_shapes.onnx": _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_x(shape=(2, 5))], ["y"],
                                           initializers=[weight]).SerializeToString(),
        "short_initializer.onnx": _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_x()], ["y"],
                                         initializers=[short_weight]).SerializeToString(),
        "huge_dims.onnx": _model([helper.make_node("Relu", ["x"], ["y"])], [_x(shape=(1 << 40, 1 << 40))],
                                 ["y"]).SerializeToString(),
        "huge_expand.onnx": _model([helper.make_node("Expand", ["x", "shape"], ["y"])], [_x(shape=(1, 1))], ["y"],
                                   initializers=[numpy_helper.from_array(np.array([1 << 40, 1 << 40]), "shape")],
                                   ).SerializeToString(),
        "huge_constant_of_shape.onnx": _model(
            [helper.make_node("ConstantOfShape", ["shape"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])],
            [_x(shape=(1, 1))], ["y"], initializers=[numpy_helper.from_array(np.array([1 << 40, 1 << 40]), "shape")],
        ).SerializeToString(),
        "negative_dim.onnx": _model([helper.make_node("Relu", ["x"], ["y"])], [_x(shape=(-3, 4))], ["y"]).SerializeToString(),
        "no_outputs.onnx": _model([helper.make_node("Relu", ["x"], ["y"])], [_x()], []).SerializeToString(),
    }
    return files


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, data in corpus().items():
        (OUT / name).write_bytes(data)
    print(f"wrote {len(corpus())} files to {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
