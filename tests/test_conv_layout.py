"""Tensors handed from one convolution kernel to strided convolutions channels-last ([N, H, W, C]):
which ones (codegen/conv_layout.py), and every path that writes or reads them, against the reference.
Kernels built for AVX-512 hand them over so; for other instruction sets the same plans stay
channel-major and must compute the same numbers."""

from __future__ import annotations

import os
import tempfile
import zlib

import numpy as np
import pytest

from autofusion.codegen.conv import position_pitch, tap_slab
from autofusion.codegen.conv_layout import channels_last_tensors
from autofusion.codegen.cores import CoreChoice, CoreChooser, FixedChooser, Machine, requested_isa
from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.ops.catalog import default_registry
from autofusion.runtime import CompiledModel, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
AVX512 = Machine("avx512", l2=2 * 1024 * 1024)
HANDED_OVER = requested_isa() == "avx512"  # what the kernels built here do


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def weight(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def stage(rng: np.random.Generator, channels: int = 24, size: int = 13, batch: int = 2, pool: bool = False) -> Graph:
    """A ResNet stage's hand-over: conv + relu (its output y), then into a 3x3 stride-2 convolution
    and a 1x1 stride-2 downsample, added (channel counts off the 16-float vectors on purpose)."""
    b = GraphBuilder("stage")
    x = b.input("x", (batch, 8, size, size))
    y = b.op("Relu", b.op("Conv", x, b.const(weight(rng, channels, 8, 3, 3)), b.const(weight(rng, channels, 1)[:, 0]),
                          pads=(1, 1, 1, 1)))
    main = b.op("Relu", b.op("Conv", y, b.const(weight(rng, 40, channels, 3, 3)), pads=(1, 1, 1, 1), strides=(2, 2)))
    down = b.op("Conv", y, b.const(weight(rng, 40, channels, 1, 1)), strides=(2, 2))
    out = b.op("Add", main, down)
    if pool:
        out = b.op("MaxPool", out, kernel_shape=(2, 2), strides=(2, 2))
    return b.build([out])


def one_kernel_per_conv(g: Graph) -> Plan:
    """Each Conv with the ops after it up to the next Conv as one conv_epilogue kernel (the Add goes
    with the downsample, as the greedy plan puts it)."""
    convs = [n for n in g.nodes if n.op == "Conv"]
    groups: list[list[str]] = [[c.name] for c in convs]
    for n in g.nodes:
        if n.op != "Conv":
            before = max((i for i, c in enumerate(convs) if g.node_index[c.name] < g.node_index[n.name]))
            groups[before].append(n.name)
    return Plan(g, build_groups(g, groups, template_of=lambda ns: "conv_epilogue"), ZERO_COST, ZERO_COST)


def run_checked(plan: Plan, feeds: dict[str, np.ndarray], cores: CoreChooser | None = None) -> CompiledModel:
    model = CompiledModel(plan, cache=CACHE, cores=cores)
    report = compare_outputs(run_graph(plan.graph, feeds), model.run(feeds))
    assert report.ok, report.summary()
    return model


def test_a_stage_output_into_strided_convolutions_is_handed_over_channels_last(rng: np.random.Generator) -> None:
    g = stage(rng, size=27)  # 14 output positions a row: the taps form on every instruction set
    plan = one_kernel_per_conv(g)
    y = g.nodes[1].outputs[0]  # the first Relu's
    assert channels_last_tensors(g, plan.groups, default_registry(), AVX512) == {y}
    assert channels_last_tensors(g, plan.groups, default_registry(), Machine("avx2")) == set()
    model = run_checked(plan, {"x": rng.standard_normal((2, 8, 27, 27)).astype(np.float32)})
    producer, entry, down = (k.code for k in model.source.kernels)
    assert ("af_transpose(" not in producer) == ("handed to the next convolution channels-last" in producer) == HANDED_OVER
    assert ("float* restrict tile_t" not in producer) == HANDED_OVER  # (no channel-major tile reserved where unused)
    for consumer in (entry, down):  # both read the slab with each position's channels together
        assert ("channels innermost" in consumer) == (f", {position_pitch(24)}, mlen," in consumer) == HANDED_OVER
        assert "af_transpose(" in consumer  # their own outputs stay channel-major


@pytest.mark.parametrize("impl", ["taps", "packed", "blas"])
@pytest.mark.parametrize("channels,size,batch", [(24, 13, 2), (16, 14, 1), (40, 9, 3)])
def test_every_way_a_consumer_reads_a_channels_last_input_matches_the_reference(
        rng: np.random.Generator, impl: str, channels: int, size: int, batch: int) -> None:
    """The taps' slab (rows of positions, each its channels), the im2col block the packed kernel and
    OpenBLAS read, odd image sizes and channel counts, several images."""
    g = stage(rng, channels, size, batch)
    feeds = {"x": rng.standard_normal((batch, 8, size, size)).astype(np.float32)}
    model = run_checked(one_kernel_per_conv(g), feeds, FixedChooser(CoreChoice(impl, 256)))
    consumer = model.source.kernels[1]
    taps = consumer.cores[0][1].taps  # (where the rows are too short for the taps: im2col)
    handed_over = HANDED_OVER and (size - 1) // 2 + 1 >= 7  # AVX-512 cuts rows of 7 or more into in-row blocks
    assert ("channels innermost" in consumer.code) == (handed_over and taps)
    assert ("src[(wo * " in consumer.code) == (handed_over and not taps)  # the im2col block from [N, H, W, C]


@pytest.mark.parametrize("impl", ["taps", "packed", "blas"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_producer_hands_over_the_convolutions_own_values(rng: np.random.Generator, impl: str, bias: bool) -> None:
    """The handed-over tensor is the convolution's output itself: OpenBLAS's product no longer goes
    straight into it (it did, channel-major, and the epilogue then rewrote it in place)."""
    b = GraphBuilder("bare")
    x = b.input("x", (1, 8, 16, 16))
    y = b.op("Conv", x, b.const(weight(rng, 24, 8, 3, 3)), *([b.const(weight(rng, 24, 1)[:, 0])] if bias else []),
             pads=(1, 1, 1, 1))
    g = b.build([b.op("Conv", y, b.const(weight(rng, 40, 24, 3, 3)), pads=(1, 1, 1, 1), strides=(2, 2))])
    plan = one_kernel_per_conv(g)
    assert channels_last_tensors(g, plan.groups, default_registry(), AVX512) == {y}
    run_checked(plan, {"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)}, FixedChooser(CoreChoice(impl, 256)))


@pytest.mark.parametrize("impl", ["taps", "blas"])
@pytest.mark.parametrize("geometry", [dict(strides=(2, 2), dilations=(2, 2), pads=(2, 2, 2, 2)),
                                      dict(strides=(2, 2), pads=(0, 0, 1, 1)), dict(strides=(2, 1), pads=(1, 1, 1, 1)),
                                      dict(strides=(1, 2), pads=(1, 1, 1, 1)), dict(strides=(3, 3), pads=(1, 0, 1, 0))],
                         ids=["dilated", "pads-after", "rows-strided", "columns-strided", "stride-3"])
def test_strided_geometries_read_a_channels_last_input(rng: np.random.Generator, impl: str, geometry: dict) -> None:
    """Dilation, pads on one side only (an exporter's SAME), a stride on one axis, stride 3: the
    slab's phases and padding with each position's channels together, and im2col's."""
    b = GraphBuilder("geometry")
    x = b.input("x", (2, 8, 30, 30))
    y = b.op("Relu", b.op("Conv", x, b.const(weight(rng, 24, 8, 3, 3)), pads=(1, 1, 1, 1)))
    g = b.build([b.op("Conv", y, b.const(weight(rng, 40, 24, 3, 3)), **geometry)])
    plan = one_kernel_per_conv(g)
    assert channels_last_tensors(g, plan.groups, default_registry(), AVX512) == {y}
    run_checked(plan, {"x": rng.standard_normal((2, 8, 30, 30)).astype(np.float32)}, FixedChooser(CoreChoice(impl, 256)))


def test_a_pooled_consumer_reads_a_channels_last_input(rng: np.random.Generator) -> None:
    b = GraphBuilder("pooled")
    x = b.input("x", (1, 8, 20, 20))
    y = b.op("Relu", b.op("Conv", x, b.const(weight(rng, 32, 8, 3, 3)), pads=(1, 1, 1, 1)))
    z = b.op("Relu", b.op("Conv", y, b.const(weight(rng, 48, 32, 3, 3)), pads=(1, 1, 1, 1), strides=(2, 2)))
    g = b.build([b.op("MaxPool", z, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))])
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes[:2]], [n.name for n in g.nodes[2:]]],
                                template_of=lambda ns: "conv_epilogue"), ZERO_COST, ZERO_COST)
    assert channels_last_tensors(g, plan.groups, default_registry(), AVX512) == {y}
    model = run_checked(plan, {"x": rng.standard_normal((1, 8, 20, 20)).astype(np.float32)})
    code = model.source.kernels[1].code
    taps = model.source.kernels[1].cores[0][1].taps
    assert "float* restrict pin" in code  # the pooled path
    assert (("channels innermost" if taps else "src[(wo * ") in code) == HANDED_OVER


def test_what_is_not_handed_over_channels_last(rng: np.random.Generator) -> None:
    """A stride-1 consumer, a graph output, a tensor another op reads, a grouped consumer, a
    producer that pools or writes another output, a consumer whose output rows are under 7 wide:
    each stays channel-major."""
    reg = default_registry()

    def chain(second: dict, extra_reader: bool = False, output: bool = False, pool: bool = False,
              size: int = 28, second_output: bool = False) -> tuple[Graph, str]:
        b = GraphBuilder("chain")
        x = b.input("x", (1, 8, size, size))
        y_conv = b.op("Conv", x, b.const(weight(rng, 16, 8, 3, 3)), pads=(1, 1, 1, 1))
        y = b.op("Relu", y_conv)
        if pool:
            y = b.op("MaxPool", y, kernel_shape=(2, 2), strides=(2, 2))
        groups = second.pop("group", 1)
        z = b.op("Conv", y, b.const(weight(rng, 16, 16 // groups, 3, 3)), pads=(1, 1, 1, 1), group=groups, **second)
        outs = [z] + ([b.op("Sigmoid", y)] if extra_reader else []) + ([y] if output else [])
        if second_output:  # the producer's kernel writes its conv's values too (the plan puts the Sigmoid with it)
            outs.append(b.op("Sigmoid", y_conv))
        return b.build(outs), y

    for second, kw in [({"strides": (1, 1)}, {}), ({"strides": (2, 2)}, {"output": True}),
                       ({"strides": (2, 2)}, {"extra_reader": True}), ({"strides": (2, 2), "group": 2}, {}),
                       ({"strides": (2, 2)}, {"pool": True}), ({"strides": (2, 2)}, {"size": 12}),
                       ({"strides": (2, 2)}, {"second_output": True})]:
        g, y = chain(dict(second), **kw)
        plan = one_kernel_per_conv(g)
        assert y not in channels_last_tensors(g, plan.groups, reg, AVX512), (second, kw)
    g, y = chain({"strides": (2, 2)})
    assert channels_last_tensors(g, one_kernel_per_conv(g).groups, reg, AVX512) == {y}  # the same chain, handed over


def test_a_channels_last_slab_spaces_positions_off_4_kib() -> None:
    """Each position's channels and one cache line more: 256 channels a position apart were 4 KiB
    every 4 positions, and a block's positions shared a few L1 sets."""
    assert [position_pitch(c) for c in (16, 24, 64, 256, 512)] == [32, 48, 80, 272, 528]
    slab = tap_slab(24, 3, 7, (3, 3), (2, 2), (1, 1), channels_last=True)
    assert slab.pitch == 48 and slab.slab_bytes >= slab.channel * 48 * 4
    assert tap_slab(24, 3, 7, (3, 3), (2, 2), (1, 1)).pitch == 0
