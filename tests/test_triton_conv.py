"""Triton convolutions (implicit GEMM with an epilogue) and pooling, under TRITON_INTERPRET=1 against the reference."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from autofusion.codegen.errors import CodegenError
from autofusion.graph.graph import Graph
from autofusion.ir import run_graph
from autofusion.ir.builder import GraphBuilder

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU
torch = pytest.importorskip("torch", reason="the Triton backend needs torch (pip install autofusion[gpu])",
                            exc_type=ImportError)
pytest.importorskip("triton", reason="the Triton backend needs triton (pip install autofusion[gpu])",
                    exc_type=ImportError)

from triton_cases import check, feeds_for, one_group_plan  # noqa: E402

from autofusion.runtime.triton_runner import TritonModel  # noqa: E402


def _const(b: GraphBuilder, shape: tuple[int, ...], seed: int) -> str:
    return b.const(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def conv_graph(xs: tuple[int, ...], ws: tuple[int, ...], bias: bool = False, epilogue: str = "",
               **attrs: Any) -> Graph:
    """A Conv of input ``xs`` and weight ``ws``, optionally followed by an epilogue op."""
    b = GraphBuilder("conv")
    x = b.input("x", xs)
    ins = [x, _const(b, ws, 1)] + ([_const(b, (ws[0],), 2)] if bias else [])
    y = b.op("Conv", *ins, **attrs)
    if epilogue == "relu":
        y = b.op("Relu", y)
    elif epilogue == "residual":  # residual Add, then Relu: a ResNet block's end
        res = b.input("res", b.build([y]).type_of(y).shape)
        y = b.op("Relu", b.op("Add", y, res))
    elif epilogue == "batchnorm":
        m = ws[0]
        var = b.const(np.linspace(0.5, 2.0, m, dtype=np.float32))
        y = b.op("BatchNormalization", y, _const(b, (m,), 3), _const(b, (m,), 4), _const(b, (m,), 5), var,
                 epsilon=1e-3)
    elif epilogue == "clip":
        y = b.op("Clip", y, b.const(np.float32(-0.5)), b.const(np.float32(0.5)))
    return b.build([y])


CONV_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool, dict[str, Any]]] = {
    "plain": ((1, 3, 6, 6), (8, 3, 3, 3), False, {}),
    "bias": ((1, 3, 6, 6), (8, 3, 3, 3), True, {}),
    "stride2_pad": ((2, 4, 9, 7), (6, 4, 3, 3), True, dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    "asym_pads_strides": ((1, 3, 8, 10), (5, 3, 3, 2), True, dict(strides=(2, 1), pads=(0, 1, 2, 0))),
    "dilation": ((1, 2, 9, 9), (4, 2, 3, 3), True, dict(dilations=(2, 2), pads=(2, 2, 2, 2))),
    "groups": ((1, 6, 7, 7), (9, 2, 3, 3), True, dict(group=3, pads=(1, 1, 1, 1))),
    "depthwise": ((2, 5, 7, 7), (5, 1, 3, 3), True, dict(group=5, pads=(1, 1, 1, 1), strides=(2, 2))),
    "odd_sizes": ((1, 5, 11, 13), (7, 5, 3, 3), True, dict(pads=(1, 1, 1, 1))),  # 143 positions, K=45: 3 x 2 tiles
    "wide_1x1": ((1, 8, 3, 3), (72, 8, 1, 1), True, {}),  # 72 channels: two column tiles
    "same_upper": ((1, 3, 7, 8), (4, 3, 4, 3), False, dict(auto_pad="SAME_UPPER", strides=(2, 2))),
    "conv1d": ((2, 3, 17), (4, 3, 3), True, dict(pads=(1, 1), strides=(2,))),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_matches_reference(case: str) -> None:
    xs, ws, bias, attrs = CONV_CASES[case]
    model = check(one_group_plan(conv_graph(xs, ws, bias, **attrs), "conv_epilogue"))
    assert "tl.dot(" in model.kernels[0].source


def test_opaque_conv_renders_as_its_kernel() -> None:
    model = check(one_group_plan(conv_graph((1, 3, 6, 6), (8, 3, 3, 3), True, pads=(1, 1, 1, 1)), "opaque"))
    assert "tl.dot(" in model.kernels[0].source


@pytest.mark.parametrize("epilogue", ["relu", "residual", "batchnorm", "clip"])
def test_conv_epilogue_matches_reference(epilogue: str) -> None:
    graph = conv_graph((2, 4, 7, 7), (6, 4, 3, 3), epilogue != "batchnorm", epilogue, pads=(1, 1, 1, 1))
    model = check(one_group_plan(graph, "conv_epilogue"))
    assert len(model.kernels) == 1 and not model.fallbacks


def _conv_relu_maxpool() -> Graph:
    b = GraphBuilder("stem")
    x = b.input("x", (1, 3, 8, 8))
    y = b.op("Relu", b.op("Conv", x, _const(b, (4, 3, 3, 3), 1), pads=(1, 1, 1, 1)))
    return b.build([b.op("MaxPool", y, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))])


def test_pooling_after_a_conv_is_refused_and_runs_as_the_conv_then_the_pool() -> None:
    plan = one_group_plan(_conv_relu_maxpool(), "conv_epilogue")
    with pytest.raises(CodegenError, match="pooling after a convolution needs its own kernel"):
        TritonModel(plan, fallback=False)
    model = TritonModel(plan)
    assert "pooling" in model.split["g0"] and not model.fallbacks
    assert [k.group.name for k in model.kernels] == ["g0_conv", "g0_pool"]
    feeds = feeds_for(plan.graph)
    out = plan.graph.outputs[0]
    np.testing.assert_allclose(model(feeds)[out], run_graph(plan.graph, feeds)[out], rtol=1e-5)


def test_conv_refusals_are_clear() -> None:
    three_d = conv_graph((1, 2, 3, 4, 4), (2, 2, 1, 1, 1))
    with pytest.raises(CodegenError, match="3 spatial axes"):
        TritonModel(one_group_plan(three_d, "conv_epilogue"), fallback=False)
    b = GraphBuilder("prologue")
    x = b.input("x", (1, 2, 5, 5))
    inner = b.build([b.op("Conv", b.op("Relu", x), _const(b, (3, 2, 3, 3), 1))])
    with pytest.raises(CodegenError, match="computed inside the group"):
        TritonModel(one_group_plan(inner, "conv_epilogue"), fallback=False)


def pool_graph(op: str, xs: tuple[int, ...], relu: bool = False, **attrs: Any) -> Graph:
    b = GraphBuilder("pool")
    x = b.input("x", xs)
    return b.build([b.op(op, b.op("Relu", x) if relu else x, **attrs)])


POOL_CASES: dict[str, tuple[str, tuple[int, ...], bool, dict[str, Any]]] = {
    "max": ("MaxPool", (1, 3, 6, 6), False, dict(kernel_shape=(2, 2), strides=(2, 2))),
    "max_pads_stride": ("MaxPool", (2, 3, 7, 9), False, dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    "relu_max": ("MaxPool", (1, 4, 8, 8), True, dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    "max_ceil_dilated": ("MaxPool", (1, 2, 9, 8), False,
                         dict(kernel_shape=(2, 3), strides=(2, 2), dilations=(2, 1), ceil_mode=1)),
    "max_1d": ("MaxPool", (2, 3, 11), False, dict(kernel_shape=(3,), strides=(2,), pads=(1, 1))),
    "avg": ("AveragePool", (1, 3, 6, 6), False, dict(kernel_shape=(2, 2), strides=(2, 2))),
    "avg_pads_exclude": ("AveragePool", (2, 3, 7, 7), False,
                         dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    "avg_pads_include": ("AveragePool", (2, 3, 7, 7), False,
                         dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 0, 1, 2), count_include_pad=1)),
    "avg_ceil": ("AveragePool", (1, 2, 8, 7), True, dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
    "avg_ceil_include": ("AveragePool", (1, 2, 8, 7), False,
                         dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1,
                              count_include_pad=1)),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pooling_matches_reference(case: str) -> None:
    op, xs, relu, attrs = POOL_CASES[case]
    check(one_group_plan(pool_graph(op, xs, relu, **attrs), "pointwise"))


def test_maxpool_indices_are_refused() -> None:
    b = GraphBuilder("argmax")
    x = b.input("x", (1, 2, 4, 4))
    values, indices = b.op_multi("MaxPool", [x], 2, kernel_shape=(2, 2), strides=(2, 2))
    plan = one_group_plan(b.build([values, indices]), "pointwise")
    with pytest.raises(CodegenError, match="MaxPool's indices output is not supported"):
        TritonModel(plan, fallback=False)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pooling_is_a_reduction(op: str) -> None:
    b = GraphBuilder("global")
    x = b.input("x", (2, 5, 3, 7))
    check(one_group_plan(b.build([b.op("Sqrt", b.op(op, b.op("Exp", x)))]), "reduction"))


def test_resnet_tiny_plan() -> None:
    from autofusion.api import optimize
    from autofusion.models import build, random_inputs

    plan = optimize(build("resnet-tiny"))
    model = TritonModel(plan)
    ops = {g.name: [plan.graph.node_by_name[n].op for n in g.nodes] for g in plan.groups}
    stems = {name for name, group_ops in ops.items() if group_ops == ["Conv", "Relu", "MaxPool"]}
    # the stem has no single kernel: its Conv, Relu and MaxPool run as one kernel each, none on the host
    assert set(model.split) <= stems and all("pooling" in why for why in model.split.values()), model.split
    assert not model.fallbacks, model.fallbacks
    templates = {k.group.template for k in model.kernels}
    assert {"conv_epilogue", "opaque", "reduction"} <= templates
    feeds = random_inputs(plan.graph)
    got, want = model(feeds), run_graph(plan.graph, feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_pooling_op_alone_in_an_opaque_group_is_one_kernel(op: str) -> None:
    """The plan may keep a pooling op as an opaque group of its own: it renders as a loop over its
    output (as in a pointwise group), not one kernel per op."""
    b = GraphBuilder("pool_alone")
    x = b.input("x", (2, 3, 9, 11))
    g = b.build([b.op(op, x, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))])
    model = check(one_group_plan(g, "opaque"))
    assert len(model.kernels) == 1 and not model.split
