"""The Winograd F(2x2, 3x3) core (codegen/winograd.py): its transforms, which convolutions take it,
and the kernels against the reference on edge shapes, epilogues and layouts."""

from __future__ import annotations

import os
import tempfile
import zlib

import numpy as np
import pytest

from autofusion.codegen.conv_layout import channels_last_tensors
from autofusion.codegen.cores import (
    WINOGRAD_MIN_CHANNELS,
    CoreChoice,
    CoreChooser,
    CoreSpec,
    DefaultChooser,
    FixedChooser,
    Machine,
    requested_isa,
)
from autofusion.codegen.winograd import MAX_WIDTH, G, winograd_blocks, winograd_weights
from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.ops.catalog import default_registry
from autofusion.runtime import CompiledModel, compare_outputs
from autofusion.runtime.tuning import candidates

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
WINOGRAD = FixedChooser(CoreChoice("winograd", 512))
B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def weight(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def one_kernel(g: Graph) -> Plan:
    return Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)


def run_checked(plan: Plan, feeds: dict[str, np.ndarray], cores: CoreChooser | None = WINOGRAD) -> CompiledModel:
    model = CompiledModel(plan, cache=CACHE, cores=cores)
    report = compare_outputs(run_graph(plan.graph, feeds), model.run(feeds))
    assert report.ok, report.summary()
    return model


def code_of(model: CompiledModel) -> str:
    return "\n".join(k.code for k in model.source.kernels)


def test_the_transforms_compute_a_tiles_correlation(rng: np.random.Generator) -> None:
    """A^T [(G g G^T) . (B^T d B)] A is the 3x3 correlation of the 4x4 patch d at its 2x2 positions,
    and winograd_weights lays U out [4, 4, M, C]."""
    d, g = rng.standard_normal((4, 4)), rng.standard_normal((2, 3, 3, 3))
    u = winograd_weights(g.astype(np.float32))
    assert u.shape == (4, 4, 2, 3) and u.dtype == np.float32
    np.testing.assert_allclose(u[:, :, 1, 2], G @ g[1, 2] @ G.T, rtol=1e-6, atol=1e-6)
    y = A_T @ ((G @ g[0, 0] @ G.T) * (B_T @ d @ B_T.T)) @ A_T.T
    direct = np.array([[np.sum(d[r:r + 3, c:c + 3] * g[0, 0]) for c in range(2)] for r in range(2)])
    np.testing.assert_allclose(y, direct, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="3, 3"):
        winograd_weights(np.zeros((2, 3, 5, 5), np.float32))


def test_tasks_are_whole_tiles_sized_to_l2() -> None:
    blocks = winograd_blocks(56, 56, 56, 1, 64, 64, 2 * 1024 * 1024)
    assert blocks.task_rows % 2 == 0 and 56 % blocks.task_rows == 0  # equal blocks of whole tile rows
    assert blocks.tiles * 16 * 4 * (64 + 64) <= 2 * 1024 * 1024 // 4
    assert (blocks.span, blocks.lo, blocks.hi) == (58, 1, 57)
    small = winograd_blocks(7, 7, 7, 1, 512, 256, 512 * 1024)  # too wide for L2 even at one tile row: one
    assert small.task_rows == 2 and small.tile_cols == 4


# (input shape, output channels, pads): odd and even sizes, a single row or column, pads on one side
# only, channel counts around the 16-float vectors and the 32-column panels, several channel blocks
EDGE_CASES = {
    "resnet-like": ((1, 32, 14, 14), 32, (1, 1, 1, 1)),
    "odd-sizes": ((2, 5, 9, 7), 40, (1, 1, 1, 1)),
    "one-row": ((1, 8, 1, 11), 33, (1, 1, 1, 1)),
    "one-column": ((1, 8, 6, 1), 31, (1, 1, 1, 1)),
    "no-padding": ((1, 17, 8, 9), 16, (0, 0, 0, 0)),
    "pads-on-one-side": ((1, 3, 11, 13), 48, (0, 2, 1, 0)),
    "channel-blocks": ((1, 8, 10, 10), 300, (1, 1, 1, 1)),
    "one-channel-in": ((1, 1, 12, 12), 8, (1, 1, 1, 1)),
    "tall": ((1, 16, 61, 5), 16, (1, 1, 1, 1)),
}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_winograd_convolutions_on_edge_shapes_match_the_reference(rng: np.random.Generator, case: str,
                                                                   bias: bool) -> None:
    xs, m, pads = EDGE_CASES[case]
    b = GraphBuilder("winograd")
    x = b.input("x", xs)
    args = [x, b.const(weight(rng, m, xs[1], 3, 3))] + ([b.const(weight(rng, m, 1)[:, 0])] if bias else [])
    g = b.build([b.op("Conv", *args, pads=pads)])
    model = run_checked(one_kernel(g), {"x": rng.standard_normal(xs).astype(np.float32)})
    assert [c.impl for _, c in model.source.kernels[0].cores] == ["winograd"]
    assert "Winograd F(2x2, 3x3)" in code_of(model)


def test_a_residual_block_epilogue_runs_on_winograd_tiles(rng: np.random.Generator) -> None:
    """BatchNormalization folded into the transformed weights, then the residual Add and Relu."""
    b = GraphBuilder("block")
    x, skip = b.input("x", (2, 24, 12, 12)), b.input("skip", (2, 40, 12, 12))
    c = b.op("Conv", x, b.const(weight(rng, 40, 24, 3, 3)), pads=(1, 1, 1, 1))
    bn = b.op("BatchNormalization", c, *(b.const(rng.standard_normal(40).astype(np.float32)) for _ in range(3)),
              b.const((np.abs(rng.standard_normal(40)) + 0.5).astype(np.float32)))
    g = b.build([b.op("Relu", b.op("Add", bn, skip))])
    feeds = {"x": rng.standard_normal((2, 24, 12, 12)).astype(np.float32),
             "skip": rng.standard_normal((2, 40, 12, 12)).astype(np.float32)}
    code = code_of(run_checked(one_kernel(g), feeds))
    assert "_winograd" in code and "folded_bias" in code


def test_a_winograd_output_is_handed_over_channels_last(rng: np.random.Generator) -> None:
    """A Winograd producer's tile is [positions x channels], as the packed kernel's: written so into a
    strided consumer's channels-last input where the build hands over (AVX-512)."""
    b = GraphBuilder("stage")
    x = b.input("x", (1, 32, 28, 28))
    y = b.op("Relu", b.op("Conv", x, b.const(weight(rng, 32, 32, 3, 3)), pads=(1, 1, 1, 1)))
    g = b.build([b.op("Conv", y, b.const(weight(rng, 48, 32, 3, 3)), pads=(1, 1, 1, 1), strides=(2, 2))])
    convs = [n for n in g.nodes if n.op == "Conv"]
    plan = Plan(g, build_groups(g, [[convs[0].name, g.nodes[1].name], [convs[1].name]],
                                template_of=lambda ns: "conv_epilogue"), ZERO_COST, ZERO_COST)
    assert channels_last_tensors(g, plan.groups, default_registry(), Machine("avx512", 2 * 1024 * 1024)) == {y}
    model = run_checked(plan, {"x": rng.standard_normal((1, 32, 28, 28)).astype(np.float32)},
                        FixedChooser(CoreChoice("winograd", 512)))
    producer = model.source.kernels[0].code
    assert "Winograd F(2x2, 3x3)" in producer
    assert ("handed to the next convolution channels-last" in producer) == (requested_isa() == "avx512")


def test_a_kernel_of_two_convolutions_computes_both_by_winograd(rng: np.random.Generator) -> None:
    """A group with two convolutions renders in stages: the first into a buffer (only_into)."""
    b = GraphBuilder("staged")
    x = b.input("x", (1, 8, 10, 10))
    y = b.op("Relu", b.op("Conv", x, b.const(weight(rng, 16, 8, 3, 3)), b.const(weight(rng, 16, 1)[:, 0]),
                          pads=(1, 1, 1, 1)))
    z = b.op("Add", b.op("Conv", y, b.const(weight(rng, 16, 16, 3, 3)), pads=(1, 1, 1, 1)), y)
    model = run_checked(one_kernel(b.build([z])), {"x": rng.standard_normal((1, 8, 10, 10)).astype(np.float32)})
    assert code_of(model).count("A^T M A of each tile") == 2


@pytest.mark.parametrize("geometry", [dict(strides=(2, 2)), dict(dilations=(2, 2)), dict(group=2),
                                      dict(kernel=(5, 5)), dict(kernel=(3, 1)), dict(pool=True),
                                      dict(width=MAX_WIDTH + 1)],
                         ids=["strided", "dilated", "grouped", "5x5", "3x1", "pooled", "too-wide"])
def test_convolutions_winograd_cannot_take_keep_another_core(rng: np.random.Generator, geometry: dict) -> None:
    """The core is for dense 3x3 convolutions with stride and dilation 1 and no pooling epilogue:
    asked for it, the others get the taps form (or im2col) and still match the reference."""
    kernel = geometry.pop("kernel", (3, 3))
    pool = geometry.pop("pool", False)
    width = geometry.pop("width", 15)  # (the transformed rows live on each thread's stack)
    group = geometry.get("group", 1)
    shape = (1, 16, 15 if width == 15 else 2, width)
    b = GraphBuilder("not_winograd")
    x = b.input("x", shape)
    c = b.op("Relu", b.op("Conv", x, b.const(weight(rng, 32, 16 // group, *kernel)), pads=(1, 1, 1, 1), **geometry))
    g = b.build([b.op("MaxPool", c, kernel_shape=(2, 2), strides=(2, 2)) if pool else c])
    model = run_checked(one_kernel(g), {"x": rng.standard_normal(shape).astype(np.float32)})
    (spec, choice), = model.source.kernels[0].cores
    assert not spec.winograd and choice.impl != "winograd" and "Winograd" not in code_of(model)


def test_the_default_and_the_tuner_offer_winograd_where_it_pays() -> None:
    """Untuned, 3x3 convolutions of at least WINOGRAD_MIN_CHANNELS channels in and out take it; the
    tuner times it against the taps on every convolution that can take it."""
    machine = Machine("avx2", 512 * 1024)
    wide = CoreSpec("conv", 56 * 56, 64, 64 * 9, packable=True, taps=True, winograd=True)
    narrow = CoreSpec("conv", 32 * 32, 16, 16 * 9, packable=True, taps=True, winograd=True)
    assert DefaultChooser(machine).choose(wide) == CoreChoice("winograd", machine.kc_for(wide))
    assert narrow.n < WINOGRAD_MIN_CHANNELS and DefaultChooser(machine).choose(narrow).impl == "taps"
    assert candidates(wide, machine)[0].impl == "winograd"
    assert CoreChoice("winograd", 512) in candidates(narrow, machine)
    # few positions an image (ResNet's 7 x 7 layer): neither the default nor a candidate
    small = CoreSpec("conv", 49, 512, 512 * 9, packable=True, taps=True, winograd=True)
    assert DefaultChooser(machine).choose(small).impl == "taps"
    assert all(c.impl != "winograd" for c in candidates(small, machine))
    # a stored choice the core cannot take is not forced on it
    assert CoreChoice("winograd", 512).fitting(CoreSpec("conv", 49, 64, 576, packable=True, taps=True)).impl == "taps"
    assert "w" in wide.key().split(":")[2] and wide.key() != CoreSpec("conv", 56 * 56, 64, 64 * 9, packable=True,
                                                                      taps=True).key()
