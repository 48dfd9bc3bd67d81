"""Attribute corners of the heavier ops against onnxruntime, LSTM layouts, and the cost formulas."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from autofusion.ir import DType, GraphBuilder, run_graph
from autofusion.ir.infer import node_context
from autofusion.ops import default_registry

REGISTRY = default_registry()
RNG = np.random.default_rng(3)


def f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


H = 5
CASES: list[tuple[str, list[np.ndarray | None], dict[str, Any], int]] = [
    ("Conv", [f(2, 6, 9, 8), f(4, 3, 3, 2), f(4)], {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 1],
                                                   "dilations": [1, 2]}, 1),
    ("Conv", [f(1, 4, 7, 7), f(4, 1, 3, 3)], {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2]}, 1),
    ("Conv", [f(1, 3, 10), f(5, 3, 3)], {"auto_pad": "SAME_LOWER", "strides": [2]}, 1),
    ("Conv", [f(1, 2, 5, 6, 4), f(3, 2, 2, 3, 2)], {"auto_pad": "VALID", "dilations": [2, 1, 1]}, 1),
    ("ConvTranspose", [f(2, 4, 5, 5), f(4, 3, 3, 3), f(6)], {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1],
                                                             "output_padding": [1, 1]}, 1),
    ("ConvTranspose", [f(1, 2, 5, 5), f(2, 3, 3, 3)], {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, 1),
    ("ConvTranspose", [f(1, 2, 5, 5), f(2, 3, 3, 3)], {"strides": [2, 2], "output_shape": [10, 11]}, 1),
    ("ConvTranspose", [f(1, 2, 5, 4), f(2, 3, 3, 2)], {"strides": [3, 2], "dilations": [2, 1]}, 1),
    ("MaxPool", [f(2, 3, 9, 9)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, 1),
    ("MaxPool", [f(2, 3, 10, 9)], {"kernel_shape": [2, 3], "strides": [2, 1], "dilations": [2, 2],
                                   "storage_order": 1}, 2),
    ("MaxPool", [f(1, 2, 7)], {"kernel_shape": [3], "auto_pad": "SAME_LOWER", "strides": [2]}, 2),
    ("AveragePool", [f(2, 3, 9, 9)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                      "ceil_mode": 1, "count_include_pad": 1}, 1),
    ("AveragePool", [f(2, 3, 8, 8)], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, 1),
    ("AveragePool", [f(1, 2, 6, 6, 6)], {"kernel_shape": [2, 3, 2], "pads": [0, 1, 1, 1, 0, 0]}, 1),
    ("LRN", [f(2, 7, 4, 4)], {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, 1),
    *[("LSTM", [f(4, 3, 6), f(nd, 4 * H, 6), f(nd, 4 * H, H), f(nd, 8 * H), np.array([4, 2, 3], np.int32),
                f(nd, 3, H), f(nd, 3, H), f(nd, 3 * H)], {"hidden_size": H, "direction": d}, 3)
      for d, nd in (("forward", 1), ("reverse", 1), ("bidirectional", 2))],
    ("LSTM", [f(4, 3, 6), f(1, 4 * H, 6), f(1, 4 * H, H)], {"hidden_size": H, "clip": 0.5, "input_forget": 1,
                                                            "activations": ["HardSigmoid", "Tanh", "Relu"]}, 3),
    ("Einsum", [f(2, 3, 4, 5)], {"equation": "...ij->...ji"}, 1),
    ("Einsum", [f(3, 4), f(4)], {"equation": "ij,j"}, 1),
    ("Einsum", [f(3, 3)], {"equation": "ii->i"}, 1),
    ("Pad", [f(2, 3, 4), np.array([0, 1, -1, 1, 0, 2], np.int64), np.array(1.5, np.float32)], {}, 1),
    ("Pad", [f(2, 3, 4), np.array([0, 1, 1, 1, 0, 2], np.int64)], {"mode": "reflect"}, 1),
    ("Pad", [f(2, 3, 4), np.array([1, 2], np.int64), None, np.array([-1], np.int64)], {"mode": "edge"}, 1),
    ("Slice", [f(5, 6, 7), np.array([4, -100], np.int64), np.array([-100, 5], np.int64),
               np.array([0, 2], np.int64), np.array([-2, 2], np.int64)], {}, 1),
    ("Split", [f(7, 6)], {"num_outputs": 3}, 3),
    ("Range", [np.array(10, np.int64), np.array(1, np.int64), np.array(-3, np.int64)], {}, 1),
    ("GatherND", [f(2, 3, 4), np.array([[1], [0]], np.int64)], {"batch_dims": 1}, 1),
    ("DepthToSpace", [f(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, 1),
    ("CumSum", [f(3, 4), np.array(1, np.int64)], {"exclusive": 1, "reverse": 1}, 1),
    ("ArgMax", [np.array([[1, 3, 3], [2, 2, 0]], np.float32)], {"axis": 1, "select_last_index": 1, "keepdims": 0}, 1),
    ("Mod", [f(2, 3), f(3)], {"fmod": 1}, 1),
]


def _onnxruntime(op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], n_out: int) -> list[np.ndarray]:
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    consts = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(v))
              for n, v in zip(names, inputs) if n]
    outs = [f"out{i}" for i in range(n_out)]
    graph = helper.make_graph([*consts, helper.make_node(op, names, outs, **attrs)], "g", [],
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})


@pytest.mark.parametrize("op,inputs,attrs,n_out", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_reference_matches_onnxruntime(op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any],
                                       n_out: int) -> None:
    b = GraphBuilder(op)
    names = [b.const(v, f"in{i}") if v is not None else "" for i, v in enumerate(inputs)]
    outs = b.op_multi(op, names, n_out, attrs=attrs)
    got = run_graph(b.build(outs), {})
    for name, want in zip(outs, _onnxruntime(op, inputs, attrs, n_out)):
        assert got[name].shape == want.shape and got[name].dtype == want.dtype
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{op} {attrs}")


def test_lstm_batch_first_layout_is_the_transposed_time_first_one() -> None:
    x, w, r, bias, h0 = f(4, 3, 6), f(2, 4 * H, 6), f(2, 4 * H, H), f(2, 8 * H), f(2, 3, H)
    lstm = REGISTRY["LSTM"].reference
    attrs = {"hidden_size": H, "direction": "bidirectional"}
    y, y_h, y_c = lstm([x, w, r, bias, None, h0], attrs)
    yb, yb_h, yb_c = lstm([x.transpose(1, 0, 2), w, r, bias, None, h0.transpose(1, 0, 2)], {**attrs, "layout": 1})
    np.testing.assert_allclose(yb, y.transpose(2, 0, 1, 3), rtol=1e-6)
    np.testing.assert_allclose(yb_h, y_h.transpose(1, 0, 2), rtol=1e-6)
    np.testing.assert_allclose(yb_c, y_c.transpose(1, 0, 2), rtol=1e-6)


def _costs(op: str, inputs: list[str], builder: GraphBuilder, **attrs: Any) -> tuple[int, int, Any]:
    out = builder.op(op, *inputs, **attrs)
    g = builder.build([out])
    node = g.nodes[-1]
    ctx = node_context(node, g.types, g.constants)
    outs = tuple(g.types[o] for o in node.outputs)
    opdef = REGISTRY[op]
    return opdef.count_flops(ctx, outs), opdef.count_bytes(ctx, outs), outs[0]


def test_cost_formulas() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 8, 16, 16))
    w = b.const(np.zeros((4, 4, 3, 3), np.float32))
    flops, _, out = _costs("Conv", [x, w], b, group=2, pads=[1, 1, 1, 1])
    assert out.shape == (1, 4, 16, 16) and flops == out.numel * 2 * 4 * 9  # 2 * Cin/group * kh * kw

    b = GraphBuilder()
    a, m = b.input("a", (8, 32)), b.input("m", (32, 16))
    flops, nbytes, _ = _costs("Gemm", [a, m], b)
    assert flops == 2 * 8 * 32 * 16 and nbytes == 4 * (8 * 32 + 32 * 16 + 8 * 16)

    b = GraphBuilder()
    table, idx = b.input("table", (1000, 64)), b.input("ids", (1, 16), DType.INT64)
    _, nbytes, _ = _costs("Gather", [table, idx], b)
    assert nbytes == 2 * 16 * 64 * 4 + 16 * 8  # gathered rows read and written, plus indices

    b = GraphBuilder()
    big = b.input("big", (64, 64))
    starts, ends = b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))
    _, nbytes, _ = _costs("Slice", [big, starts, ends], b)
    assert nbytes == 2 * 2 * 64 * 4

    b = GraphBuilder()
    big = b.input("big", (64, 64))
    _, nbytes, _ = _costs("Shape", [big], b)
    assert nbytes == 2 * 8

    b = GraphBuilder()
    small = b.input("small", (1, 64))
    _, nbytes, _ = _costs("Expand", [small, b.const(np.array([32, 64], np.int64))], b)
    assert nbytes == 64 * 4 + 32 * 64 * 4

    b = GraphBuilder()
    t = b.input("t", (4, 6))
    flops, nbytes, _ = _costs("Reshape", [t, b.const(np.array([6, 4], np.int64))], b)
    assert flops == 0 and nbytes == 0  # a view

    b = GraphBuilder()
    seq, hidden, inp = 8, 16, 12
    xs = b.input("xs", (seq, 2, inp))
    wt, rt = b.const(np.zeros((1, 4 * hidden, inp), np.float32)), b.const(np.zeros((1, 4 * hidden, hidden), np.float32))
    out = b.op_multi("LSTM", [xs, wt, rt], 3, hidden_size=hidden)
    g = b.build(out)
    ctx = node_context(g.nodes[0], g.types, g.constants)
    flops = REGISTRY["LSTM"].count_flops(ctx, tuple(g.types[o] for o in out))
    assert flops >= seq * 2 * 2 * 4 * hidden * (inp + hidden)

    b = GraphBuilder()
    s = b.input("s", (4, 128))
    flops, _, _ = _costs("Softmax", [s], b)
    assert flops == 5 * 4 * 128
