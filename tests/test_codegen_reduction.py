"""The reduction template: one pass per row over the reduced axes, with the prologue inlined per
element and the epilogue written from the row, checked against the reference interpreter."""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import pytest
from gradient_graphs import layernorm_gradient

from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import DType, Graph, GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
RNG = np.random.default_rng(11)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def check(g: Graph, feeds: dict[str, np.ndarray], template: str = "reduction") -> str:
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: template),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    return "\n".join(k.code for k in model.source.kernels)


def test_layernorm_with_residual_prologue_and_affine_epilogue() -> None:
    b = GraphBuilder("ln")
    x, r = b.input("x", (2, 16, 64)), b.input("r", (2, 16, 64))
    h = b.op("Add", x, r)  # the residual sum is materialised too: the next residual needs it
    ln = b.op("LayerNormalization", h, b.const(f32(64)), b.const(f32(64)), axis=-1, epsilon=1e-5)
    y = b.op("Add", b.op("Mul", ln, b.const(np.float32(2.0))), b.const(f32(64)))
    g = b.build([y, h])
    code = check(g, {"x": f32(2, 16, 64), "r": f32(2, 16, 64)})
    assert code.count("stage 0") == 1 and "stage 1" not in code  # one pass structure, no second nest
    assert "for (int64_t o = 0;" not in code  # both outputs written from the row loop


def test_softmax_with_scale_and_mask_prologue() -> None:
    b = GraphBuilder("attn")
    s, mask = b.input("scores", (1, 2, 16, 16)), b.input("mask", (1, 1, 1, 16), DType.BOOL)
    scaled = b.op("Div", s, b.const(np.float32(5.656854)))
    masked = b.op("Where", mask, scaled, b.const(np.float32(-3.4e38)))
    g = b.build([b.op("Softmax", masked, axis=-1)])
    mask_v = np.ones((1, 1, 1, 16), bool)
    mask_v[..., 12:] = False
    code = check(g, {"scores": f32(1, 2, 16, 16), "mask": mask_v})
    assert "xrow" in code  # the prologue is computed once per element and kept in the row buffer


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [1, -1])
def test_normalising_ops_on_any_axis(op: str, axis: int) -> None:
    b = GraphBuilder("norm")
    x = b.input("x", (3, 5, 7))
    g = b.build([b.op("Relu", b.op(op, b.op("Mul", x, b.const(np.float32(1.5))), axis=axis))])
    check(g, {"x": f32(3, 5, 7)})


REDUCES = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSumExp"]


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_ops_with_prologue_and_epilogue(keepdims: int) -> None:
    b = GraphBuilder("reduce")
    x = b.input("x", (4, 6, 5))
    pre = b.op("Abs", b.op("Add", x, b.const(np.float32(0.1))))
    outs = []
    for i, op in enumerate(REDUCES):
        axes = [np.array([1], np.int64), np.array([0, 2], np.int64), np.array([-1], np.int64)][i % 3]
        r = b.op(op, pre, b.const(axes), keepdims=keepdims)
        outs.append(b.op("Mul", r, b.const(np.float32(0.5))))
    outs.append(b.op("ReduceLogSum", pre, b.const(np.array([2], np.int64)), keepdims=keepdims))
    outs.append(b.op("ReduceSum", x, keepdims=keepdims))  # all axes
    outs.append(b.op("ReduceSum", x, b.const(np.zeros(0, np.int64)), noop_with_empty_axes=1))
    g = b.build(outs)
    # each reduction is its own row pass over the shared prologue
    check(g, {"x": f32(4, 6, 5)}, template="multi_output")


def test_argmax_argmin_and_integer_reduce() -> None:
    b = GraphBuilder("arg")
    x, i = b.input("x", (4, 9)), b.input("i", (4, 9), DType.INT64)
    outs = [b.op("ArgMax", x, axis=1), b.op("ArgMin", x, axis=0, keepdims=0),
            b.op("ArgMax", b.op("Round", x), axis=1, select_last_index=1),
            b.op("ReduceSum", i, b.const(np.array([1], np.int64))), b.op("ReduceMax", i, b.const(np.array([0], np.int64)))]
    g = b.build(outs)
    check(g, {"x": f32(4, 9), "i": RNG.integers(-50, 50, (4, 9))}, template="multi_output")


def test_pools_and_instance_norm() -> None:
    b = GraphBuilder("pool")
    x = b.input("x", (2, 3, 5, 4))
    gap = b.op("GlobalAveragePool", b.op("Relu", x))
    gmp = b.op("GlobalMaxPool", x)
    inorm = b.op("InstanceNormalization", x, b.const(f32(3)), b.const(f32(3)), epsilon=1e-4)
    g = b.build([b.op("Flatten", gap), gmp, inorm])
    check(g, {"x": f32(2, 3, 5, 4)}, template="multi_output")


def test_output_not_aligned_with_rows_uses_row_statistics() -> None:
    b = GraphBuilder("misaligned")
    x = b.input("x", (3, 4, 8))
    sm = b.op("Softmax", x, axis=-1)
    t = b.op("Transpose", sm, perm=(2, 0, 1))  # read across rows: needs the stored row statistics
    mean = b.op("ReduceMean", x, b.const(np.array([2], np.int64)), keepdims=1)
    centered = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Mul", centered, centered), b.const(np.array([2], np.int64)), keepdims=1)
    norm = b.op("Div", centered, b.op("Sqrt", b.op("Add", var, b.const(np.float32(1e-5)))))
    g = b.build([t, norm])
    code = check(g, {"x": f32(3, 4, 8)})
    assert "(scratch + " in code  # statistics kept per row in scratch for the transposed read


def test_softmax_keeps_each_exp_for_its_own_row_only() -> None:
    """Softmax's sum pass keeps each exp in a row buffer, which the output computed in the same
    row's loop scales (no second exp); an output read across rows (transposed) computes the exp
    again from the stored statistics, as the buffer then holds another row. Both in one kernel,
    with a computed X (scaled), so the row copy and the exp row share the thread's block."""
    b = GraphBuilder("softmax_rows")
    x = b.input("x", (3, 5, 24))
    sm = b.op("Softmax", b.op("Mul", x, b.const(np.float32(0.7))), axis=-1)
    g = b.build([b.op("Mul", sm, b.const(np.float32(2.0))), b.op("Transpose", sm, perm=(2, 0, 1))])
    code = check(g, {"x": f32(3, 5, 24) * np.float32(4.0)}, template="multi_output")
    assert "s0_erow[j] = s0_e;" in code and "s0_erow = s0_rows + 24;" in code
    assert code.count("af_expf(") == 2  # the sum pass's and the transposed read's


def test_many_rows_run_in_parallel() -> None:
    b = GraphBuilder("rows")
    x = b.input("x", (512, 96))
    g = b.build([b.op("LayerNormalization", b.op("Gelu", x), b.const(f32(96)), axis=-1)])
    code = check(g, {"x": f32(512, 96)})
    assert "#pragma omp for schedule(dynamic" in code


LEADING_SHAPES = [((512, 96), (0,)), ((4, 33, 40), (0, 1)), ((7, 17), (0,)), ((300, 1000), (0,)), ((6, 5, 18), (0,))]


@pytest.mark.parametrize("op,shape,axes", [
    (op, shape, axes) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ArgMax")
    for shape, axes in LEADING_SHAPES if op != "ArgMax" or len(axes) == 1])  # ArgMax takes one axis
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_over_leading_axes_run_rows_side_by_side(op: str, shape: tuple[int, ...],
                                                            axes: tuple[int, ...], keepdims: int) -> None:
    """A reduction whose axes all precede the kept ones (a bias gradient: the sum over the batch
    rows) reduces its rows side by side, each step reading a contiguous run of them: with a
    pointwise prologue and epilogue, rows not a multiple of the block, fewer than 16 rows (one at a
    time), axes that do not lead (one at a time)."""
    b = GraphBuilder("columns")
    x, r = b.input("x", shape), b.input("r", shape[-1:])
    h = b.op("Add", x, r)
    if op == "ArgMax":
        y = b.op("ArgMax", h, axis=axes[0], keepdims=keepdims)
    else:
        y = b.op("Mul", b.op(op, h, b.const(np.asarray(axes, np.int64)), keepdims=keepdims), b.const(np.float32(0.5)))
    code = check(b.build([y]), {"x": f32(*shape), "r": f32(shape[-1])})
    rows = int(np.prod([n for d, n in enumerate(shape) if d not in axes]))
    leading = max(axes) < min(d for d in range(len(shape)) if d not in axes)
    assert ("side by side" in code) == (leading and rows >= 16), code[:3000]
    kept = [d for d in range(len(shape)) if d not in axes]
    if leading and rows >= 16 and len(kept) > 1:  # several kept axes: indices from a table, no division per element
        assert f"const int64_t i{kept[0]} = i{kept[0]}c[c];" in code


def test_reduction_over_a_trailing_axis_keeps_one_row_at_a_time() -> None:
    b = GraphBuilder("rows")
    x = b.input("x", (64, 48))
    code = check(b.build([b.op("ReduceSum", x, b.const(np.asarray([1], np.int64)), keepdims=0)]), {"x": f32(64, 48)})
    assert "side by side" not in code


def test_rows_side_by_side_also_write_the_prologue_when_it_is_an_output() -> None:
    """A gradient sum that is also an output (the residual's gradient) and its bias gradient, the
    sum over the rows, in one kernel: the prologue's value is stored where it is computed."""
    b = GraphBuilder("residual_grad")
    x, y = b.input("x", (8, 20, 48)), b.input("y", (8, 20, 48))
    h = b.op("Add", x, y)
    g = b.build([h, b.op("ReduceSum", h, b.const(np.asarray([0, 1], np.int64)), keepdims=0)])
    code = check(g, {"x": f32(8, 20, 48), "y": f32(8, 20, 48)})
    assert "side by side" in code and code.count("stage 0") == 1


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMean"])
@pytest.mark.parametrize("axes", [(0, 2, 3), (1, 3), (2, 3)])
def test_several_reduced_axes_loop_one_axis_each(op: str, axes: tuple[int, ...]) -> None:
    """A row spread over several axes (a training batch norm's statistics over N, H and W) is
    walked with one loop per axis, no division per element; with a prologue that is also an
    output of X's shape."""
    b = GraphBuilder("nest")
    x, y = b.input("x", (4, 5, 6, 7)), b.input("y", (4, 5, 6, 7))
    h = b.op("Mul", x, y)
    g = b.build([h, b.op(op, h, b.const(np.asarray(axes, np.int64)), keepdims=1)])
    code = check(g, {"x": f32(4, 5, 6, 7), "y": f32(4, 5, 6, 7)})
    assert "j / " not in code and "j % " not in code, code


def test_trailing_reduced_axes_that_every_operand_takes_whole_or_not_are_one_loop() -> None:
    """Sums over N, H and W of [N, C, H, W]: H and W are one loop of H * W (the accumulators summed
    across the vector once per image, not once per row of W); an operand that varies along W
    alone keeps the loops apart."""
    def sums(factor_shape: tuple[int, ...]) -> str:
        b = GraphBuilder("channel_sums")
        x, factor = b.input("x", (3, 5, 6, 7)), b.input("f", factor_shape)
        axes = b.const(np.array([0, 2, 3], np.int64))
        g = b.build([b.op("ReduceSum", b.op("Mul", x, factor), axes, keepdims=1)])
        return check(g, {"x": f32(3, 5, 6, 7), "f": f32(*factor_shape)})

    code = sums((1, 5, 1, 1))
    assert "const int64_t i2 = 0;" in code and "i3 < 42;" in code, code
    code = sums((7,))
    assert "const int64_t i2 = 0;" not in code and "i2 < 6;" in code and "i3 < 7;" in code, code


def test_sibling_reductions_share_one_pass_and_the_row_loop_writes_every_output() -> None:
    b = GraphBuilder("ln_grad")
    dy, x = b.input("dy", (4, 8, 96)), b.input("x", (4, 8, 96))
    mean, rstd = b.input("mean", (4, 8, 1)), b.input("rstd", (4, 8, 1))
    dx, xhat, gw = layernorm_gradient(b, dy, x, mean, rstd, b.const(f32(96)))
    g = b.build([dx, xhat, gw])  # x-hat and dy * w are read by other kernels (the weight gradients)
    feeds = {"dy": f32(4, 8, 96), "x": f32(4, 8, 96), "mean": f32(4, 8, 1),
             "rstd": np.abs(f32(4, 8, 1)) + 0.5}
    code = check(g, feeds)
    assert "in the same pass: ReduceMean" in code
    # one loop over the rows writes all three; no loop over the elements after it
    assert code.count("for (int64_t row = 0;") == 1 and "for (int64_t o = 0;" not in code, code
    assert re.search(r"#pragma omp simd reduction\(\+:s0_\w+\) reduction\(\+:s1_\w+\)", code), code


def test_channel_sums_of_a_masked_gradient_share_one_pass_and_vectorise_over_the_mask() -> None:
    """A BatchNorm gradient behind a ReLU's mask, the mask read from memory as bytes: both sums per
    channel (axes 0, 2, 3) in one pass; Where is a bitwise blend there, which GCC 12 vectorises
    where the select `c ? x : y` beside double accumulators was left scalar (1.26 ms against 0.36)."""
    b = GraphBuilder("bn_grad")
    shape = (3, 5, 6, 7)
    mask, dy, x = b.input("mask", shape, DType.BOOL), b.input("dy", shape), b.input("x", shape)
    axes = b.const(np.array([0, 2, 3], np.int64))
    masked = b.op("Where", mask, b.const(np.float32(0)), dy)
    s1 = b.op("ReduceSum", masked, axes, keepdims=1)
    s2 = b.op("ReduceSum", b.op("Mul", masked, x), axes, keepdims=1)
    dx = b.op("Sub", b.op("Sub", masked, b.op("Mul", s1, b.const(np.float32(1 / 126)))),
              b.op("Mul", x, b.op("Mul", s2, b.const(np.float32(1 / 126)))))
    g = b.build([dx, s1, s2])
    code = check(g, {"mask": RNG.random(shape) > 0.5, "dy": f32(*shape), "x": f32(*shape)})
    assert "in the same pass: ReduceSum" in code and "af_wheref(" in code, code


def test_where_on_floats_selects_every_bit_pattern_as_numpy_does() -> None:
    b = GraphBuilder("where_bits")
    c, x, y = b.input("c", (8,), DType.BOOL), b.input("x", (8,)), b.input("y", (8,))
    g = b.build([b.op("Where", c, x, y)])
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -3.4e38, 1.5], np.float32)
    feeds = {"c": np.array([1, 0, 1, 0, 1, 0, 1, 0], bool), "x": special, "y": special[::-1].copy()}
    out = CompiledModel(Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "pointwise"),
                             ZERO_COST, ZERO_COST), cache=CACHE).run(feeds)[g.outputs[0]]
    want = np.where(feeds["c"], feeds["x"], feeds["y"])
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))  # NaN, -0.0 and infinities included


def test_reductions_that_feed_each_other_or_differ_in_rows_keep_their_own_pass() -> None:
    b = GraphBuilder("chained")
    x = b.input("x", (6, 40))
    axes = b.const(np.array([-1], np.int64))
    centred = b.op("Sub", x, b.op("ReduceMean", x, axes, keepdims=1))
    var = b.op("ReduceMean", b.op("Mul", centred, centred), axes, keepdims=1)  # reads the first mean
    other = b.op("ReduceSum", b.op("Exp", x), b.const(np.array([0], np.int64)), keepdims=1)  # other rows
    g = b.build([var, other])
    code = check(g, {"x": f32(6, 40)})
    assert "in the same pass" not in code and code.count("stage ") >= 3


def test_a_sum_over_everything_leaves_its_prologue_output_to_a_parallel_nest() -> None:
    # one row (a loss): writing the differences in that row's loop would put them on one thread
    b = GraphBuilder("loss")
    x, y = b.input("x", (64, 512)), b.input("y", (64, 512))
    diff = b.op("Sub", x, y)
    g = b.build([b.op("ReduceMean", b.op("Mul", diff, diff), keepdims=0), diff])
    code = check(g, {"x": f32(64, 512), "y": f32(64, 512)})
    assert code.count("for (int64_t row = 0;") == 1 and "#pragma omp parallel for" in code, code
