"""conv_epilogue: im2col + sgemm tiles per image and group, epilogue per tile."""

from __future__ import annotations

import math
import os
import tempfile
import zlib

import numpy as np
import pytest

from autofusion.codegen.conv import REPACK_MIN_K
from autofusion.codegen.cores import CoreChooser
from autofusion.codegen.gemm import PACKED_MIN_COLUMNS
from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def _data_of_this_test(request: pytest.FixtureRequest) -> None:
    """Each test draws its data from a generator seeded by its own name: the data no longer depend on
    which tests ran before it (a new case used to shift every later test's data)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def check(g: Graph, feeds: dict[str, np.ndarray], cores: CoreChooser | None = None) -> str:
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE, cores=cores)
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
    assert "im2col" in code and "af_sgemm_packed" in code  # constant weights: packed, tiles transposed
    assert "for (int64_t o = 0;" not in code  # the whole epilogue runs on the tiles
    assert "_packed" in code and "folded_bias" in code  # BatchNormalization folded at build time


@pytest.mark.parametrize("bias", [False, True])
def test_conv_with_weights_from_an_input_calls_openblas(bias: bool) -> None:
    """Weights from an input with fewer output channels than a panel's worth (5) are not packed per
    call: OpenBLAS's sgemm, tile not transposed; the convolution alone is the output (written
    straight by sgemm without a bias)."""
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
    assert "af_sgemm_packed" in code


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
    # one plane (any stride) with packed weights: the taps are read in place, no im2col copy
    taps = widen == 8 and len(x_shape) != 5 and attrs != {}
    depthwise = attrs.get("group") == 4 and widen == 1  # one input and one output channel per group
    assert ("/* im2col of the block" in code) == (attrs != {} and not taps and not depthwise)
    assert ("sums its own input channel" in code) == depthwise
    assert ("af_sgemm_packed_taps(" in code) == taps
    assert ("af_sgemm_packed" in code) == (widen == 8)


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


@pytest.mark.parametrize("pool_op,pool_attrs", [
    ("MaxPool", {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),  # ResNet's stem
    ("MaxPool", {"kernel_shape": (2, 2), "strides": (2, 2)}),  # windows that do not overlap
    ("MaxPool", {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": (3, 3), "strides": (2, 2), "dilations": (2, 2), "pads": (2, 2, 2, 2)}),
    ("AveragePool", {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}),  # stride 1: every row in three windows
    ("AveragePool", {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "count_include_pad": 1}),
])
@pytest.mark.parametrize("channels,x_shape", [(5, (2, 3, 33, 19)), (40, (1, 4, 31, 31)), (300, (1, 8, 24, 24))])
@pytest.mark.parametrize("impl", ["taps", "packed"])
def test_conv_with_a_pooling_epilogue(pool_op: str, pool_attrs: dict, channels: int, x_shape: tuple[int, ...],
                                      impl: str) -> None:
    """Conv -> Relu -> pooling in one kernel: tasks are blocks of pooled rows, each computing the
    convolution rows its windows reach (overlapping blocks), sgemm (5 channels) and packed weights
    (40, and 300 in two channel blocks) with the taps read in place or im2col; the convolution's
    output is never stored."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    b = GraphBuilder("conv_pool")
    x = b.input("x", x_shape)
    c = b.op("Conv", x, b.const(f32(channels, x_shape[1], 3, 3)), b.const(f32(channels)), pads=(1, 1, 1, 1))
    g = b.build([b.op(pool_op, b.op("Relu", c), **pool_attrs)])
    code = check(g, {"x": f32(*x_shape)}, FixedChooser(CoreChoice(impl, 256)))
    # a max-pool without dilation is pooled separably (rows, then columns); the others window by window
    separable = pool_op == "MaxPool" and "dilations" not in pool_attrs
    assert ("the max-pool of the block, separably" in code) == separable
    assert ("the pooled values of the block" in code) == (not separable) and "pin[" in code
    assert "scratch +" not in code  # nothing the size of the convolution's output
    assert ("af_sgemm_packed_taps(" in code) == (impl == "taps" and channels >= PACKED_MIN_COLUMNS)
    # a packed tile is turned straight into the max-pool's rows, the Relu applied to the pooled values
    assert ("the activation after the max" in code) == (separable and channels >= PACKED_MIN_COLUMNS)


@pytest.mark.parametrize("x_shape,pool_op", [((1, 3, 112, 112), "MaxPool"), ((2, 2, 81, 63), "MaxPool"),
                                             ((1, 3, 112, 112), "AveragePool")])
@pytest.mark.parametrize("impl", ["taps", "packed", "blas"])
def test_pooled_blocks_in_a_stripe_carry_their_shared_rows_over(x_shape: tuple[int, ...], pool_op: str,
                                                               impl: str) -> None:
    """ResNet's stem pooling on a tall image: several blocks of pooled rows per task, each computing
    only the convolution rows the block before did not (one row at stride 2 over 3 rows); the
    average pool's windows read the carried rows too."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    b = GraphBuilder("stem")
    x = b.input("x", x_shape)
    c = b.op("Conv", x, b.const(f32(40, x_shape[1], 7, 7)), b.const(f32(40)), strides=(2, 2), pads=(3, 3, 3, 3))
    g = b.build([b.op(pool_op, b.op("Relu", c), kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))])
    code = check(g, {"x": f32(*x_shape)}, FixedChooser(CoreChoice(impl, 256)))
    assert "carried over in pin" in code
    assert ("the max-pool of the block, separably" in code) == (pool_op == "MaxPool")
    per = int(code.split("const int64_t first = t % ")[1].split("*")[1].split(";")[0])
    assert per > 1  # the carry is exercised: blocks follow each other within a task


@pytest.mark.parametrize("acts,after", [(("Clip",), True), (("Relu", "Clip"), True), (("Neg", "Relu"), False),
                                        (("Sigmoid",), False), ((), True)])
def test_a_max_pool_takes_the_activation_after_it_only_where_the_activation_rises(acts: tuple[str, ...],
                                                                                 after: bool) -> None:
    """max(relu(x + b)) = relu(max(x) + b): Relu and Clip with constant bounds never fall, so the raw
    tile is pooled and they run on the pooled values; a Neg between (max turns to min) keeps the
    activation before the pooling, and so does any op not known to rise (Sigmoid)."""
    b = GraphBuilder("rising")
    x = b.input("x", (1, 4, 30, 30))
    t = b.op("Conv", x, b.const(f32(48, 4, 3, 3)), b.const(f32(48)), pads=(1, 1, 1, 1))
    for act in acts:
        t = (b.op("Clip", t, b.const(np.float32(-0.5)), b.const(np.float32(0.7))) if act == "Clip" else b.op(act, t))
    g = b.build([b.op("MaxPool", t, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))])
    code = check(g, {"x": f32(1, 4, 30, 30)})
    assert ("the activation after the max" in code) == after
    assert "the max-pool of the block, separably" in code
    assert ("float* restrict tile_t" in code) == (not after)  # (no channel-major tile reserved where unused)


def test_conv_pooling_falls_back_when_the_convolution_is_also_an_output() -> None:
    """When the activation before the pooling op is an output too, the whole convolution is stored
    and pooled after it (still one kernel, still matching)."""
    b = GraphBuilder("conv_pool_both")
    x = b.input("x", (1, 3, 12, 12))
    r = b.op("Relu", b.op("Conv", x, b.const(f32(16, 3, 3, 3)), pads=(1, 1, 1, 1)))
    g = b.build([b.op("MaxPool", r, kernel_shape=(2, 2), strides=(2, 2)), r])
    code = check(g, {"x": f32(1, 3, 12, 12)})
    assert "the pooled values of the block" not in code


def test_decider_ends_the_stems_convolution_with_its_maxpool() -> None:
    """The rule library and the decider put ResNet's Conv -> Relu -> MaxPool in one kernel; the
    plan's peak activation memory is then under half the unfused plan's."""
    from autofusion.api import optimize
    from autofusion.codegen.superkernel import render_plan
    from autofusion.decide import unfused_plan
    from autofusion.models import build, random_inputs

    graph = build("resnet-tiny")
    plan = optimize(graph)
    stem = plan.groups[0]
    assert stem.template == "conv_epilogue"
    assert sorted(plan.graph.node_by_name[n].op for n in stem.nodes) == ["Conv", "MaxPool", "Relu"]
    fused, unfused = render_plan(plan).buffers, render_plan(unfused_plan(graph)).buffers
    assert fused is not None and unfused is not None
    assert fused.peak_bytes <= unfused.peak_bytes / 2
    feeds = random_inputs(graph, seed=3)
    report = compare_outputs(run_graph(graph, feeds), CompiledModel(plan, cache=CACHE).run(feeds))
    assert report.ok, report.summary()


def test_per_thread_blocks_are_counted_and_a_single_block_of_positions_shares_its_im2col() -> None:
    """Each thread's im2col block and tiles (the product's, and it turned channel-major) are counted
    (KernelSource.thread_bytes, BufferPlan.footprint);
    with one block of positions and several channel blocks the im2col matrix is computed once, by all
    threads, into the group's scratch (counted in the workspace) instead of once per task."""
    from autofusion.codegen import render_plan
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    im2col = FixedChooser(CoreChoice("packed", 512))  # the taps form (below) has no im2col block

    def kernel_of(x_shape: tuple[int, ...], channels: int):  # type: ignore[no-untyped-def]
        b = GraphBuilder("conv_blocks")
        x = b.input("x", x_shape)
        w = f32(channels, x_shape[1], 3, 3) / np.float32(3 * x_shape[1] ** 0.5)  # outputs of about unit size
        g = b.build([b.op("Relu", b.op("Conv", x, b.const(w), pads=(1, 1, 1, 1)))])
        check(g, {"x": f32(*x_shape)})
        plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                    ZERO_COST, ZERO_COST)
        source = render_plan(plan, chooser=im2col)
        assert source.buffers is not None
        return source.kernels[0], source.buffers

    # 32 x 32 positions in 4 blocks of 8 rows (256 positions), 64 channels: per-thread im2col and tiles
    kernel, buffers = kernel_of((1, 16, 32, 32), 64)
    assert "shared by every task" not in kernel.code
    assert kernel.thread_bytes == 4 * (16 * 9 * 256 + 2 * 64 * 256) and kernel.scratch_bytes == 0
    assert buffers.footprint(2) == buffers.workspace_bytes + 2 * kernel.thread_bytes
    # 7 x 7 positions, 256 channels in 4 blocks of 64: one shared im2col matrix, per-thread tiles only
    kernel, buffers = kernel_of((1, 64, 7, 7), 256)
    assert "shared by every task" in kernel.code
    assert kernel.scratch_bytes == 4 * 64 * 9 * 49 and kernel.thread_bytes == 2 * 4 * 64 * 49


def test_the_taps_form_counts_its_slab_offsets_and_tile_per_thread() -> None:
    """Reading the taps in place, a thread's block holds the task's input rows zero-padded (8 output
    rows + 2 of the 3x3 kernel's reach, 34 columns with the padding), the offset of each (channel, tap)
    and the transposed tile, compact (8 rows of 32 positions: the padding columns are not computed),
    with its channel-major copy;
    no scratch."""
    from autofusion.codegen import render_plan

    b = GraphBuilder("conv_taps")
    x = b.input("x", (1, 16, 32, 32))
    g = b.build([b.op("Relu", b.op("Conv", x, b.const(f32(64, 16, 3, 3) / np.float32(12)), pads=(1, 1, 1, 1)))])
    check(g, {"x": f32(1, 16, 32, 32)})
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    kernel = render_plan(plan).kernels[0]
    slab, offs, tile = 16 * (8 + 2) * 34 * 4, 16 * 9 * 4, 64 * 8 * 32 * 4
    assert "af_sgemm_packed_taps(" in kernel.code and kernel.scratch_bytes == 0
    assert kernel.thread_bytes == -(-(slab + offs) // 64) * 64 + 2 * tile


@pytest.mark.parametrize("l2,tasks,rows", [(2 << 20, 4, 14), (512 << 10, 14, 4)])
def test_large_images_take_tasks_of_a_quarter_of_their_rows_while_the_tile_fits_l2(l2: int, tasks: int,
                                                                                   rows: int) -> None:
    """ResNet's 56 x 56 layer in 4 tasks of 14 rows (16 input rows copied for each 14, not 6 for 4)
    where its tile, 784 positions x 64 channels, takes at most an eighth of L2 (2 MiB); with Zen 3's
    512 KiB, tasks of 4 rows as before. Both against the reference (the taps form: by default this
    layer takes the Winograd core, whose tasks test_winograd.py checks)."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser, Machine, requested_isa

    b = GraphBuilder("layer1")
    x = b.input("x", (1, 64, 56, 56))
    g = b.build([b.op("Relu", b.op("Conv", x, b.const(f32(64, 64, 3, 3) / np.float32(24)), pads=(1, 1, 1, 1)))])
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE, cores=FixedChooser(CoreChoice("taps", 512), Machine(requested_isa(), l2=l2)))
    code = model.source.kernels[0].code
    assert f"for (int64_t t = 0; t < {tasks}; ++t)" in code and f"const int64_t p0 = t % {tasks} * {rows * 56};" in code
    feeds = {"x": f32(1, 64, 56, 56)}
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()


def test_one_block_of_positions_copies_its_slab_once_for_every_channel_block() -> None:
    """With one block of positions and several of channels, the taps' slab is copied once, by all
    threads, into the kernel's scratch (counted there), not once per channel block's task; each
    thread keeps only its offsets and tiles."""
    from autofusion.codegen import render_plan
    from autofusion.codegen.conv import tap_slab

    b = GraphBuilder("conv_shared_slab")
    x = b.input("x", (1, 16, 15, 25))  # 8 output rows of 13: the taps form on every ISA
    g = b.build([b.op("Conv", x, b.const(f32(80, 16, 3, 3)), pads=(1, 1, 1, 1), strides=(2, 2))])
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    kernel = render_plan(plan).kernels[0]
    slab = tap_slab(16, 8, 13, (3, 3), (2, 2), (1, 1))
    assert "once for every channel block" in kernel.code and kernel.scratch_bytes == slab.slab_bytes
    tile = 64 * 8 * 13  # the tile holds the task's 8 rows of 13 positions, compact on every ISA
    assert kernel.thread_bytes == -(-16 * 9 * 4 // 64) * 64 + 2 * -(-tile * 4 // 64) * 64


def test_runs_reuse_each_threads_block_instead_of_fresh_pages() -> None:
    """A kernel's per-thread blocks (here a 147 KiB im2col block) come from a block each thread keeps
    between runs: with glibc's mmap threshold fixed at 128 KiB, as the benchmark does, allocating them
    per call mapped fresh pages on every run (2,870 page faults, 6 ms of system time per ResNet-18 run)."""
    import resource

    from autofusion.bench.environment import fix_malloc_threshold

    b = GraphBuilder("conv_pages")
    x = b.input("x", (1, 16, 64, 64))
    r = b.op("Relu", b.op("Conv", x, b.const(f32(32, 16, 3, 3) / np.float32(12)), pads=(1, 1, 1, 1)))
    # a small output, so that the run's own output array (allocated per run) maps no pages
    g = b.build([b.op("ReduceMean", r, b.const(np.array([2, 3], np.int64)), keepdims=0)])
    conv, relu, mean = (n.name for n in g.nodes)
    template = {frozenset([conv, relu]): "conv_epilogue", frozenset([mean]): "reduction"}
    plan = Plan(g, build_groups(g, [[conv, relu], [mean]], template_of=lambda ns: template[frozenset(ns)]),
                ZERO_COST, ZERO_COST)
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    model = CompiledModel(plan, cache=CACHE, cores=FixedChooser(CoreChoice("packed", 512)))  # im2col
    assert model.source.kernels[0].thread_bytes >= 16 * 9 * 256 * 4  # the im2col block is over 128 KiB
    fix_malloc_threshold()
    feeds = {"x": f32(1, 16, 64, 64)}
    for _ in range(3):
        model.run(feeds)
    per_run = []
    for _ in range(3):  # the fewest of three windows: a fault elsewhere in the process (seen once) is not a run's
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            model.run(feeds)
        per_run.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
    assert min(per_run) < 10, per_run


def test_each_threads_block_is_freed_with_the_thread() -> None:
    """Threads that call run once and exit give their blocks back (a 600 KiB block per thread stayed
    allocated for every exited thread before the thread-specific destructor)."""
    import os
    import threading

    b = GraphBuilder("conv_threads")
    x = b.input("x", (1, 64, 64, 64))
    g = b.build([b.op("Relu", b.op("Conv", x, b.const(f32(32, 64, 3, 3) / np.float32(24)), pads=(1, 1, 1, 1)))])
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    model = CompiledModel(plan, cache=CACHE, cores=FixedChooser(CoreChoice("packed", 512)))  # im2col
    block = model.source.kernels[0].thread_bytes
    assert block > 256 * 1024
    feeds = {"x": f32(1, 64, 64, 64)}

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    for _ in range(5):  # allocator arenas of the first threads
        t = threading.Thread(target=model.run, args=(feeds,))
        t.start()
        t.join()
    before = rss()
    for _ in range(30):
        t = threading.Thread(target=model.run, args=(feeds,))
        t.start()
        t.join()
    assert rss() - before < 10 * block  # 30 leaked blocks (and their OpenMP workers') would be 30-60


def test_pooling_falls_back_when_an_output_reads_the_convolution_beside_the_pool() -> None:
    """Conv -> Relu -> MaxPool (stride 1) added to the convolution itself: the legality check accepts
    the group, and the kernel stores the convolution and pools after it (the pooled pass has no
    convolution values to read)."""
    b = GraphBuilder("conv_pool_side")
    x = b.input("x", (1, 3, 12, 12))
    c = b.op("Conv", x, b.const(f32(8, 3, 3, 3)), pads=(1, 1, 1, 1))
    p = b.op("MaxPool", b.op("Relu", c), kernel_shape=(3, 3), pads=(1, 1, 1, 1))
    code = check(b.build([b.op("Add", p, b.op("Sigmoid", c))]), {"x": f32(1, 3, 12, 12)})
    assert "the pooled values of the block" not in code


# -- convolutions reading their taps in place (no im2col) ------------------------------------------

TAPS_CASES = {
    "3x3_pad1_batch2_residual": dict(x=(2, 40, 30, 30), w=(40, 40, 3, 3), pads=(1, 1, 1, 1)),
    "3x3_no_pad": dict(x=(1, 8, 9, 11), w=(32, 8, 3, 3), pads=(0, 0, 0, 0)),
    "asymmetric_pads": dict(x=(1, 16, 12, 10), w=(48, 16, 3, 3), pads=(0, 1, 2, 0)),
    "dilation2": dict(x=(1, 16, 17, 17), w=(32, 16, 3, 3), pads=(2, 2, 2, 2), dilations=(2, 2)),
    "5x5_groups2": dict(x=(1, 32, 14, 14), w=(64, 16, 5, 5), pads=(2, 2, 2, 2), group=2),
    "1x3_kernel": dict(x=(1, 16, 7, 20), w=(40, 16, 1, 3), pads=(0, 1, 0, 1)),
    "1x1_with_pad": dict(x=(1, 16, 6, 6), w=(32, 16, 1, 1), pads=(1, 1, 1, 1)),
    "7x7_layer4": dict(x=(1, 64, 7, 7), w=(96, 64, 3, 3), pads=(1, 1, 1, 1)),
    "rows_of_28": dict(x=(1, 8, 5, 28), w=(40, 8, 3, 3), pads=(1, 1, 1, 1)),  # two blocks of 14 a row (AVX-512)
    # channels and positions that are no multiple of the 8 x 8 blocks the tile is turned in
    "odd_channels_and_rows": dict(x=(1, 8, 11, 13), w=(37, 8, 3, 3), pads=(1, 1, 1, 1)),
    # one block of positions, two of channels: the slab copied once into scratch, shared by the tasks
    "shared_slab_stride2": dict(x=(1, 16, 15, 25), w=(80, 16, 3, 3), pads=(1, 1, 1, 1), strides=(2, 2)),
    "1d": dict(x=(2, 16, 50), w=(32, 16, 5), pads=(2, 2)),
    # strided: the slab split into stride phases (2 x 2 planes for a 3x3 stride-2 kernel)
    "3x3_stride2_odd_rows": dict(x=(1, 24, 17, 16), w=(40, 24, 3, 3), pads=(1, 1, 1, 1), strides=(2, 2)),
    "7x7_stride2_stem": dict(x=(1, 3, 30, 29), w=(64, 3, 7, 7), pads=(3, 3, 3, 3), strides=(2, 2)),
    "1x1_stride2_batch2": dict(x=(2, 16, 13, 14), w=(32, 16, 1, 1), pads=(0, 0, 0, 0), strides=(2, 2)),
    "stride2_dilation2": dict(x=(1, 8, 19, 19), w=(32, 8, 3, 3), pads=(2, 2, 2, 2), strides=(2, 2),
                              dilations=(2, 2)),  # every tap on phase 0: one plane
    "strides_2x3_asymmetric": dict(x=(1, 8, 14, 17), w=(32, 8, 3, 4), pads=(1, 0, 0, 2), strides=(2, 3)),
    "3x3_stride2_layer4": dict(x=(1, 32, 14, 14), w=(64, 32, 3, 3), pads=(1, 1, 1, 1), strides=(2, 2)),
    "1d_stride3": dict(x=(2, 16, 51), w=(32, 16, 5), pads=(2, 1), strides=(3,)),
    # rows of 14: AVX2's blocks across row ends, per image of a batch, and dilated (pitch 18)
    "14_wide_batch2": dict(x=(2, 16, 14, 14), w=(32, 16, 3, 3), pads=(1, 1, 1, 1)),
    "14_wide_dilation2": dict(x=(1, 16, 14, 14), w=(32, 16, 3, 3), pads=(2, 2, 2, 2), dilations=(2, 2)),
}


@pytest.mark.parametrize("x_shape,pads,strides", [
    ((1, 8, 1, 9, 9), (1, 1, 1, 1, 1, 1), (3, 1, 1)),  # one output plane, its tap in the depth padding
    ((1, 8, 3, 9, 9), (1, 1, 1, 1, 1, 1), (3, 1, 1)),  # one output plane from the input's first
    ((1, 8, 9, 5), (1, 1, 1, 1), (2, 2)),  # rows of 3, stride 2: too few for a block of the taps kernel
])
def test_convolutions_the_taps_form_does_not_take(x_shape: tuple[int, ...], pads: tuple[int, ...],
                                                  strides: tuple[int, ...]) -> None:
    """A depth-padded 3-D convolution with one output plane reads its plane from the padding (the
    slab holds the input's plane 0: the taps form refuses it), and rows too narrow for a row block
    of the taps kernel go to im2col; both against the reference with the default choice."""
    b = GraphBuilder("not_taps")
    w = f32(16, x_shape[1], *((1, 3, 3) if len(x_shape) == 5 else (3, 3)))
    g = b.build([b.op("Conv", b.input("x", x_shape), b.const(w), b.const(f32(16)), pads=pads, strides=strides)])
    code = check(g, {"x": f32(*x_shape)})
    assert "af_sgemm_packed_taps(" not in code


def _taps_case(case: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], dict]:
    """A TAPS_CASES geometry: input and weight shapes, the output shape, the Conv's attributes."""
    spec = TAPS_CASES[case]
    xs, ws, pads = spec["x"], spec["w"], spec["pads"]
    dil = spec.get("dilations", (1,) * (len(xs) - 2))
    strides = spec.get("strides", (1,) * (len(xs) - 2))
    half = len(pads) // 2
    out_shape = (xs[0], ws[0]) + tuple((n + pads[i] + pads[i + half] - d * (k - 1) - 1) // s + 1
                                       for i, (n, k, d, s) in enumerate(zip(xs[2:], ws[2:], dil, strides)))
    return xs, ws, out_shape, {k: v for k, v in spec.items() if k in ("pads", "dilations", "group", "strides")}


def _takes_taps(case: str, block_rows: int) -> bool:
    """Whether a TAPS_CASES geometry's rows fit the taps kernel (else it takes im2col)."""
    from autofusion.codegen.conv import taps_fit

    _, _, out_shape, attrs = _taps_case(case)
    strides = attrs.get("strides", (1,))
    joined_rows = out_shape[-2] if len(out_shape) == 4 and set(strides) == {1} else 1  # blocks across rows: stride 1
    return taps_fit(out_shape[-1], joined_rows, block_rows)


@pytest.mark.parametrize("impl", ["taps", "packed", "blas"])
@pytest.mark.parametrize("case", sorted(TAPS_CASES))
def test_convolutions_read_taps_in_place(case: str, impl: str) -> None:
    """Each geometry with BatchNormalization, Relu and a residual, computed three ways (taps read
    from the zero-padded input split by stride phase, im2col + the packed kernel, OpenBLAS), against
    the reference."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    xs, ws, out_shape, attrs = _taps_case(case)
    m = ws[0]
    b = GraphBuilder("taps")
    c = b.op("Conv", b.input("x", xs), b.const(f32(*ws) * np.float32(0.2)), b.const(f32(m)), **attrs)
    bn = b.op("BatchNormalization", c, b.const(f32(m)), b.const(f32(m)), b.const(f32(m)),
              b.const(np.abs(f32(m)) + 0.5))
    g = b.build([b.op("Add", b.op("Relu", bn), b.input("skip", out_shape))])
    feeds = {"x": f32(*xs), "skip": f32(*out_shape)}
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE, cores=FixedChooser(CoreChoice(impl, 256)))
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    code = "\n".join(k.code for k in model.source.kernels)
    # rows too narrow for the micro-kernel's blocks take im2col, unless blocks join rows (stride 1)
    taps = impl == "taps" and _takes_taps(case, model.chooser.machine.micro_kernel[0])
    assert ("af_sgemm_packed_taps(" in code) == taps
    assert ("im2col of the block" in code) == (not taps)


@pytest.mark.parametrize("impl", ["repack", "blas"])
@pytest.mark.parametrize("case", sorted(TAPS_CASES))
def test_convolutions_with_weights_given_at_run_time(case: str, impl: str) -> None:
    """A weight that is a graph input (training, a gradient's Convs): packed into panels at the start
    of each call, then the taps or im2col form as for a constant weight; or OpenBLAS. With a bias,
    Relu and a residual, against the reference; a second call with other weights too."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    xs, ws, out_shape, attrs = _taps_case(case)
    b = GraphBuilder("runtime_w")
    c = b.op("Conv", b.input("x", xs), b.input("w", ws), b.const(f32(ws[0])), **attrs)
    g = b.build([b.op("Add", b.op("Relu", c), b.input("skip", out_shape))])
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE, cores=FixedChooser(CoreChoice(impl, 256)))
    for _ in range(2):  # the panels are packed again from each call's weights
        feeds = {"x": f32(*xs), "w": f32(*ws) * np.float32(0.2), "skip": f32(*out_shape)}
        report = compare_outputs(run_graph(g, feeds), model.run(feeds))
        assert report.ok, report.summary()
    code = "\n".join(k.code for k in model.source.kernels)
    k_rows = ws[1] * math.prod(ws[2:])
    repacked = impl == "repack" and k_rows >= REPACK_MIN_K  # fewer K rows stay with OpenBLAS
    assert ("af_pack_panels(" in code) == repacked and ("scipy_cblas_sgemm(" in code) == (not repacked)
    if repacked:
        taps = _takes_taps(case, model.chooser.machine.micro_kernel[0])
        assert ("af_sgemm_packed_taps(" in code) == taps


def test_taps_are_the_default_for_stride1_and_stride2() -> None:
    b = GraphBuilder("two")
    x = b.input("x", (1, 8, 12, 12))
    y = b.op("Relu", b.op("Conv", x, b.const(f32(16, 8, 3, 3)), pads=(1, 1, 1, 1)))
    z = b.op("Conv", y, b.const(f32(16, 16, 3, 3)), pads=(1, 1, 1, 1), strides=(2, 2))
    g = b.build([z])
    plan = Plan(g, build_groups(g, [[g.nodes[0].name, g.nodes[1].name], [g.nodes[2].name]],
                                template_of=lambda ns: "conv_epilogue"), ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE)
    first, second = model.source.kernels
    assert [c.impl for _, c in first.cores] == ["taps"] and [c.impl for _, c in second.cores] == ["taps"]
    feeds = {"x": f32(1, 8, 12, 12)}
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()


def test_taps_inside_a_kernel_of_two_convolutions() -> None:
    """A group with two convolutions renders in stages; each reads its taps in place."""
    b = GraphBuilder("staged")
    x = b.input("x", (1, 8, 10, 10))
    y = b.op("Relu", b.op("Conv", x, b.const(f32(16, 8, 3, 3)), b.const(f32(16)), pads=(1, 1, 1, 1)))
    z = b.op("Add", b.op("Conv", y, b.const(f32(16, 16, 3, 3) * np.float32(0.2)), pads=(1, 1, 1, 1)), y)
    code = check(b.build([z]), {"x": f32(1, 8, 10, 10)})
    assert code.count("af_sgemm_packed_taps(") == 2


@pytest.mark.parametrize("case", ["depth_padding", "negative_pads"])
def test_convolutions_the_taps_form_cannot_take_use_im2col(case: str) -> None:
    """Padding along a unit depth axis gives several output planes, and negative pads crop: both stay on
    im2col, and compute what the reference does."""
    b = GraphBuilder("no_taps")
    if case == "depth_padding":
        x = b.input("x", (1, 16, 1, 8, 8))
        y = b.op("Conv", x, b.const(f32(32, 16, 1, 3, 3)), pads=(1, 1, 1, 1, 1, 1))
        feeds = {"x": f32(1, 16, 1, 8, 8)}
    else:
        x = b.input("x", (1, 16, 8, 8))
        y = b.op("Conv", x, b.const(f32(32, 16, 3, 3)), pads=(0, -1, 0, -1))
        feeds = {"x": f32(1, 16, 8, 8)}
    code = check(b.build([b.op("Relu", y)]), feeds)
    assert "af_sgemm_packed_taps(" not in code and "af_sgemm_packed(" in code


DEPTHWISE_CASES = {
    "3x3_pad1": dict(x=(2, 24, 13, 13), w=(24, 1, 3, 3), pads=(1, 1, 1, 1)),
    "3x3_stride2": dict(x=(1, 32, 15, 16), w=(32, 1, 3, 3), pads=(1, 1, 1, 1), strides=(2, 2)),
    "5x5_dilated": dict(x=(1, 16, 20, 20), w=(16, 1, 5, 5), pads=(4, 4, 4, 4), dilations=(2, 2)),
    "asymmetric": dict(x=(1, 8, 9, 7), w=(8, 1, 3, 2), pads=(0, 1, 2, 0)),
    "1d": dict(x=(2, 12, 40), w=(12, 1, 7), pads=(3, 3)),
    "large_positions": dict(x=(1, 8, 60, 60), w=(8, 1, 3, 3), pads=(1, 1, 1, 1)),
    "kernel_wider_than_input": dict(x=(1, 8, 4, 3), w=(8, 1, 3, 5), pads=(1, 2, 1, 2)),  # no interior columns
}


@pytest.mark.parametrize("impl", ["depthwise", "blas"])
@pytest.mark.parametrize("case", sorted(DEPTHWISE_CASES))
def test_depthwise_convolutions_sum_their_taps_directly(case: str, impl: str) -> None:
    """Depthwise geometries with BatchNormalization folded and Relu6, summed straight from the input
    (the default) or as one-row sgemms per channel (forced), against the reference."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    spec = DEPTHWISE_CASES[case]
    xs, ws = spec["x"], spec["w"]
    attrs = {k: v for k, v in spec.items() if k in ("pads", "dilations", "strides")}
    b = GraphBuilder("depthwise")
    c = b.op("Conv", b.input("x", xs), b.const(f32(*ws)), b.const(f32(ws[0])), group=xs[1], **attrs)
    bn = b.op("BatchNormalization", c, b.const(f32(ws[0])), b.const(f32(ws[0])), b.const(f32(ws[0])),
              b.const(np.abs(f32(ws[0])) + 0.5))
    g = b.build([b.op("Clip", bn, b.const(np.float32(0.0)), b.const(np.float32(6.0)))])
    feeds = {"x": f32(*xs)}
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    cores = None if impl == "depthwise" else FixedChooser(CoreChoice("blas"))
    model = CompiledModel(plan, cache=CACHE, cores=cores)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    kernel = model.source.kernels[0]
    assert [c.impl for _, c in kernel.cores] == [impl]
    assert ("sums its own input channel" in kernel.code) == (impl == "depthwise")
    assert ("scipy_cblas_sgemm" in kernel.code) == (impl == "blas")


def test_a_depthwise_convolution_as_the_output_is_written_in_place() -> None:
    """The convolution alone, its own output: summed into the output buffer, no tile."""
    b = GraphBuilder("depthwise_alone")
    g = b.build([b.op("Conv", b.input("x", (1, 16, 10, 10)), b.const(f32(16, 1, 3, 3)), group=16,
                      pads=(1, 1, 1, 1))])
    code = check(g, {"x": f32(1, 16, 10, 10)})
    assert "sums its own input channel" in code and "float* restrict c = tile" not in code


def test_tap_slab_splits_a_strided_input_into_the_phases_its_taps_read() -> None:
    """3x3 stride 2: four planes, tap (i, j) in plane (i % 2, j % 2) at row i // 2, column j // 2; a 1x1
    stride-2 kernel and a stride-2 kernel dilated by 2 read phase 0 only: one plane."""
    from autofusion.codegen.conv import tap_slab

    slab = tap_slab(16, 8, 28, (3, 3), (2, 2), (1, 1))
    assert (slab.rows, slab.width, slab.row_phases, slab.col_phases) == (9, 29, (0, 1), (0, 1))
    assert slab.offsets[0] == (0, 0, 0) and slab.offsets[1] == (1, 0, 0) and slab.offsets[2] == (0, 0, 1)
    assert slab.offsets[3] == (2, 0, 0) and slab.offsets[8] == (0, 1, 1)
    assert slab.channel == 4 * 9 * 29 and slab.slab_bytes == -(-16 * slab.channel * 4 // 64) * 64
    one = tap_slab(16, 8, 28, (1, 1), (2, 2), (1, 1))
    assert (one.rows, one.width, one.row_phases, one.col_phases, one.offsets) == (8, 28, (0,), (0,), ((0, 0, 0),))
    dilated = tap_slab(8, 4, 9, (3, 3), (2, 2), (2, 2))
    assert dilated.col_phases == (0,) and dilated.offsets[4] == (0, 1, 1) and dilated.width == 11
    stride1 = tap_slab(8, 4, 56, (3, 3), (1, 1), (1, 1))  # stride 1: the padded rows, one plane
    assert (stride1.rows, stride1.width, len(stride1.offsets)) == (6, 58, 9)


def test_taps_row_blocks_by_instruction_set() -> None:
    """Positions are cut into blocks of at most the micro-kernel's rows, as even as they go: a 7-wide
    row alone is one block of 7 with AVX-512's 12 rows, 4 + 3 with AVX2's 6 (too few), and 7 such
    rows joined are blocks of 5 and 6 (AVX2) or 9 and 10 (AVX-512)."""
    from autofusion.codegen.conv import TAPS_MIN_BLOCK, taps_block, taps_fit

    assert [taps_block(w, 12) for w in (7, 14, 28, 56, 112)] == [7, 7, 9, 11, 11]
    assert [taps_block(w, 6) for w in (7, 14, 28, 56)] == [3, 4, 5, 5]
    assert taps_block(7, 6) < TAPS_MIN_BLOCK <= taps_block(7, 12)
    assert (taps_block(49, 6), taps_block(49, 12), taps_block(196, 6)) == (5, 9, 5)
    assert taps_fit(7, 7, 6) and not taps_fit(7, 1, 6) and taps_fit(7, 1, 12) and not taps_fit(3, 1, 12)


def test_narrow_rows_run_the_taps_kernel_in_blocks_across_row_ends() -> None:
    """A task's positions are cut into the micro-kernel's blocks across row ends (7 wide: 49
    positions as blocks of 5 and 6 with AVX2's 6-row kernel, not 4 + 3 per row), each block reading
    its positions at the slab's pitch, C compact (no padding column computed). Built for AVX2 (any
    x86-64 CPU with AVX-512 runs it too), rows of 7, 13, 14 and 28, against the reference, with a
    residual (the kernel alone: test_codegen_gemm's taps test)."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser, Machine
    from autofusion.runtime.toolchain import detect_toolchain

    tc = detect_toolchain(isa="avx2")
    if not tc.runnable:
        pytest.skip("this CPU cannot run avx2 code")
    for hw in (7, 13, 14, 28):
        b = GraphBuilder(f"joined{hw}")
        x, skip = b.input("x", (1, 32, hw, hw)), b.input("skip", (1, 64, hw, hw))
        y = b.op("Add", b.op("Relu", b.op("Conv", x, b.const(f32(64, 32, 3, 3) * np.float32(0.2)), b.const(f32(64)),
                                          pads=(1, 1, 1, 1))), skip)
        g = b.build([y])
        plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                    ZERO_COST, ZERO_COST)
        model = CompiledModel(plan, cache=CACHE, toolchain=tc, cores=FixedChooser(CoreChoice("taps", 256),
                                                                                  Machine("avx2")))
        feeds = {"x": f32(1, 32, hw, hw), "skip": f32(1, 64, hw, hw)}
        report = compare_outputs(run_graph(g, feeds), model.run(feeds))
        assert report.ok, report.summary()
        assert "af_sgemm_packed_taps(" in "\n".join(k.code for k in model.source.kernels)


BATCH_CASES = {  # name: (x, w, attrs, impl, pooling op after Relu or "", weight given as an input)
    "taps": ((None, 8, 12, 12), (16, 8, 3, 3), dict(pads=(1, 1, 1, 1)), "taps", "", False),
    "packed_stride2": ((None, 8, 13, 11), (40, 8, 3, 3), dict(pads=(1, 1, 1, 1), strides=(2, 2)), "packed", "", False),
    "blas": ((None, 6, 9, 9), (5, 6, 3, 3), dict(pads=(1, 1, 1, 1)), "blas", "", False),
    "one_by_one": ((None, 16, 7, 7), (32, 16, 1, 1), {}, None, "", False),
    "depthwise": ((None, 24, 13, 13), (24, 1, 3, 3), dict(pads=(1, 1, 1, 1), group=24), "depthwise", "", False),
    "weights_at_run_time": ((None, 16, 10, 10), (32, 16, 3, 3), dict(pads=(1, 1, 1, 1)), None, "", True),
    "stem_maxpool": ((None, 3, 40, 40), (40, 3, 7, 7), dict(pads=(3, 3, 3, 3), strides=(2, 2)), "taps", "MaxPool",
                     False),
    "avgpool": ((None, 4, 17, 17), (24, 4, 3, 3), dict(pads=(1, 1, 1, 1)), "packed", "AveragePool", False),
    "winograd": ((None, 12, 11, 10), (40, 12, 3, 3), dict(pads=(1, 1, 1, 1)), "winograd", "", False),
}


@pytest.mark.parametrize("case", sorted(BATCH_CASES))
def test_convolutions_take_their_batch_at_run_time(case: str) -> None:
    """One library over a symbolic batch, each kind of convolution kernel (taps, packed, OpenBLAS,
    the input as the matrix, depthwise, a weight packed per call, a pooling epilogue, Winograd), run at
    batch 1, 2 and 5 against the reference of each binding."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser
    from autofusion.graph.dims import symbol
    from autofusion.ir.symbolic import bind

    xs, ws, attrs, impl, pool, w_input = BATCH_CASES[case]
    batch = symbol("batch")
    b = GraphBuilder("batch_at_run_time")
    x = b.input("x", (batch, *xs[1:]))
    w = b.input("w", ws) if w_input else b.const(f32(*ws) * np.float32(0.3))
    c = b.op("Conv", x, w, b.const(f32(ws[0])), **attrs)
    y = b.op("Relu", b.op("BatchNormalization", c, b.const(f32(ws[0])), b.const(f32(ws[0])), b.const(f32(ws[0])),
                          b.const(np.abs(f32(ws[0])) + 0.5)))
    if pool:
        y = b.op(pool, y, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    g = b.build([y])
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "conv_epilogue"),
                ZERO_COST, ZERO_COST)
    cores = FixedChooser(CoreChoice(impl, 256)) if impl else None
    model = CompiledModel(plan, cache=CACHE, cores=cores)
    for n in (1, 2, 5):
        feeds = {"x": f32(n, *xs[1:]), **({"w": f32(*ws) * np.float32(0.3)} if w_input else {})}
        report = compare_outputs(run_graph(bind(g, {"batch": n}), feeds), model.run(feeds))
        assert report.ok, f"batch {n}: {report.summary()}"
    (kernel,) = model.source.kernels
    want = impl or {"one_by_one": "packed", "weights_at_run_time": "repack"}[case]
    assert [core.impl for _, core in kernel.cores] == [want]
    assert "S_batch" in kernel.code and ("pin[" in kernel.code) == bool(pool)
    assert ("im2col of the block" in kernel.code) == (case in ("packed_stride2", "blas", "avgpool"))
