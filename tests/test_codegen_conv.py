"""conv_epilogue: im2col + sgemm tiles per image and group, epilogue per tile."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
RNG = np.random.default_rng(5)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def check(g: Graph, feeds: dict[str, np.ndarray]) -> str:
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    return "\n".join(k.code for k in model.source.kernels)


def test_conv_batchnorm_relu_residual() -> None:
    b = GraphBuilder("block")
    x, skip = b.input("x", (2, 8, 10, 10)), b.input("skip", (2, 16, 5, 5))
    c = b.op("Conv", x, b.const(f32(16, 8, 3, 3)), b.const(f32(16)), pads=(1, 1, 1, 1), strides=(2, 2))
    bn = b.op("BatchNormalization", c, b.const(f32(16)), b.const(f32(16)), b.const(f32(16)),
              b.const(np.abs(f32(16)) + 0.5))
    g = b.build([b.op("Add", b.op("Relu", bn), skip)])
    code = check(g, {"x": f32(2, 8, 10, 10), "skip": f32(2, 16, 5, 5)})
    assert "im2col" in code and "af_sgemm_packed(" in code  # constant weights: packed, tiles transposed
    assert "for (int64_t o = 0;" not in code  # the whole epilogue runs on the tiles
    assert "_packed" in code and "folded_bias" in code  # BatchNormalization folded at build time


@pytest.mark.parametrize("bias", [False, True])
def test_conv_with_weights_from_an_input_calls_openblas(bias: bool) -> None:
    """Weights that are not constants cannot be packed at build time: OpenBLAS's sgemm, tile not
    transposed; the convolution alone is the output (written straight by sgemm without a bias)."""
    b = GraphBuilder("conv_input_w")
    x, w = b.input("x", (1, 3, 8, 8)), b.input("w", (5, 3, 3, 3))
    args = [x, w] + ([b.const(f32(5))] if bias else [])
    g = b.build([b.op("Conv", *args, pads=(1, 1, 1, 1))])
    code = check(g, {"x": f32(1, 3, 8, 8), "w": f32(5, 3, 3, 3)})
    assert "scipy_cblas_sgemm" in code and "af_sgemm_packed(" not in code


@pytest.mark.parametrize("channels,group", [(300, 1), (100, 1), (96, 3), (600, 2)])
def test_packed_conv_channel_blocks_and_groups(channels: int, group: int) -> None:
    """Channel blocks that start on 32-column panels (300 channels: blocks of 256 and 44; 600 in two
    groups), groups whose channels are not a whole panel (96 / 3 = 32, 100), the convolution alone
    as the output (every tile transposed back)."""
    b = GraphBuilder("conv_wide")
    x = b.input("x", (1, 2 * group, 6, 6))
    g = b.build([b.op("Conv", x, b.const(f32(channels, 2, 3, 3)), group=group, pads=(1, 1, 1, 1))])
    code = check(g, {"x": f32(1, 2 * group, 6, 6)})
    assert "af_sgemm_packed(" in code


@pytest.mark.parametrize("attrs,x_shape,w_shape", [
    ({"group": 2, "dilations": (2, 2), "pads": (2, 1, 2, 1)}, (1, 8, 9, 11), (6, 4, 3, 3)),
    ({}, (2, 8, 6, 6), (4, 8, 1, 1)),  # 1x1: the input is the matrix, no im2col
    ({"strides": (2,), "pads": (1, 1)}, (2, 3, 17), (5, 3, 4)),  # 1-D
    ({"pads": (1, 0, 1, 1, 0, 1)}, (1, 2, 4, 5, 6), (3, 2, 2, 3, 2)),  # 3-D
    ({"auto_pad": "SAME_UPPER", "strides": (2, 2)}, (1, 3, 7, 7), (4, 3, 3, 3)),
    ({"group": 4}, (1, 4, 6, 6), (4, 1, 3, 3)),  # depthwise
])
@pytest.mark.parametrize("widen", [1, 8])
def test_conv_geometries(attrs: dict, x_shape: tuple[int, ...], w_shape: tuple[int, ...], widen: int) -> None:
    """Each geometry with few output channels per group (sgemm: panels would be mostly padding) and
    with 8x as many (packed weights, transposed tiles)."""
    w_shape = (w_shape[0] * widen,) + w_shape[1:]
    b = GraphBuilder("conv")
    x = b.input("x", x_shape)
    y = b.op("Conv", x, b.const(f32(*w_shape)), **attrs)
    g = b.build([b.op("Clip", y, b.const(np.float32(-2.0)), b.const(np.float32(2.0)))])
    code = check(g, {"x": f32(*x_shape)})
    assert ("/* im2col of the block" in code) == (attrs != {})
    assert ("af_sgemm_packed(" in code) == (widen == 8)


def test_batchnorm_is_not_folded_when_the_conv_output_is_needed() -> None:
    b = GraphBuilder("keep")
    x = b.input("x", (1, 3, 6, 6))
    c = b.op("Conv", x, b.const(f32(4, 3, 3, 3)), pads=(1, 1, 1, 1))
    bn = b.op("BatchNormalization", c, b.const(f32(4)), b.const(f32(4)), b.const(f32(4)),
              b.const(np.abs(f32(4)) + 0.5))
    g = b.build([bn, c])
    code = check(g, {"x": f32(1, 3, 6, 6)})
    assert "folded" not in code


def test_conv_with_an_output_across_tiles() -> None:
    b = GraphBuilder("gap")
    x = b.input("x", (1, 4, 8, 8))
    c = b.op("Relu", b.op("Conv", x, b.const(f32(6, 4, 3, 3)), pads=(1, 1, 1, 1)))
    g = b.build([b.op("GlobalAveragePool", c), c])
    check(g, {"x": f32(1, 4, 8, 8)})


def test_large_conv_runs_tiles_in_parallel() -> None:
    b = GraphBuilder("big")
    x = b.input("x", (1, 16, 32, 32))
    g = b.build([b.op("Relu", b.op("Conv", x, b.const(f32(32, 16, 3, 3)), pads=(1, 1, 1, 1)))])
    code = check(g, {"x": f32(1, 16, 32, 32)})
    assert "#pragma omp parallel num_threads(nt)" in code
