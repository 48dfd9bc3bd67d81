"""The pointwise template: whole elementwise/broadcast/reorganise groups as one loop nest per output,
checked against the reference interpreter."""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import pytest

from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import DType, Graph, GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
RNG = np.random.default_rng(7)


def f32(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def one_group(g: Graph, template: str = "pointwise") -> Plan:
    return Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: template), ZERO_COST, ZERO_COST)


def check(g: Graph, feeds: dict[str, np.ndarray], template: str = "pointwise") -> CompiledModel:
    model = CompiledModel(one_group(g, template), cache=CACHE)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    return model


def kernel_code(model: CompiledModel) -> str:
    return "\n".join(k.code for k in model.source.kernels)


def test_broadcast_chain_is_one_nest_with_stores_only_for_outputs() -> None:
    b = GraphBuilder("chain")
    x, y, z = b.input("x", (2, 3, 4)), b.input("y", (4,)), b.input("z", (3, 1))
    a = b.op("Add", x, y)
    m = b.op("Mul", a, z)
    s = b.op("Sub", m, b.const(np.float32(0.25)))
    out1 = b.op("Sigmoid", b.op("Relu", s))
    out2 = b.op("Tanh", m)  # a second consumer of an internal value: multi-output fusion
    g = b.build([out1, out2])
    model = check(g, {"x": f32(2, 3, 4), "y": f32(4), "z": f32(3, 1)})
    code = kernel_code(model)
    assert len(model.source.kernels) == 1
    assert len(re.findall(r"\] = ", code)) == 2  # only the two outputs are stored
    assert code.count("for (int64_t o = 0;") == 1  # both outputs in one loop nest (same shape)
    assert "0.25f" in code  # scalar constants are inlined as literals


def test_casts_comparisons_where_and_integer_arithmetic() -> None:
    b = GraphBuilder("casts")
    x, i, j = b.input("x", (3, 5)), b.input("i", (3, 5), DType.INT64), b.input("j", (5,), DType.INT64)
    to_int = b.op("Cast", b.op("Mul", x, b.const(np.float32(3.0))), to=7)  # float -> int64 truncates
    back = b.op("Cast", b.op("Add", to_int, i), to=1)
    gt = b.op("Greater", x, b.const(np.float32(0.0)))
    le = b.op("LessOrEqual", i, j)
    both = b.op("Xor", b.op("And", gt, b.op("Not", le)), b.op("Or", gt, le))
    w = b.op("Where", both, back, b.op("Neg", x))
    div = b.op("Div", i, j)
    mod = b.op("Mod", i, j)
    fmod = b.op("Mod", i, j, fmod=1)
    fm = b.op("Mod", x, b.const(np.float32(0.7)))
    p2 = b.op("Pow", x, b.const(np.float32(2.0)))
    pg = b.op("Pow", b.op("Abs", x), b.const(np.float32(1.7)))
    ipow = b.op("Pow", j, b.const(np.int64(3)))
    cb = b.op("Cast", both, to=1)
    clip = b.op("Clip", x, b.const(np.float32(-0.5)), b.const(np.float32(0.75)))
    mx = b.op("Max", x, b.op("Neg", x), b.const(np.float32(0.1)))
    mean = b.op("Mean", x, back)
    g = b.build([w, div, mod, fmod, fm, p2, pg, ipow, cb, clip, mx, mean])
    feeds = {"x": f32(3, 5), "i": RNG.integers(-20, 20, (3, 5)), "j": RNG.integers(1, 6, (5,)) * RNG.choice([-1, 1], 5)}
    check(g, feeds)


def test_layout_ops_transpose_slice_concat_expand_tile_split() -> None:
    b = GraphBuilder("layout")
    x, y = b.input("x", (2, 6, 4)), b.input("y", (2, 6, 3))
    t = b.op("Transpose", x, perm=(2, 0, 1))  # (4, 2, 6)
    r = b.op("Reshape", t, b.const(np.array([8, 6], np.int64)))
    s = b.op("Slice", r, b.const(np.array([7, 1], np.int64)), b.const(np.array([0, 6], np.int64)),
             b.const(np.array([0, 1], np.int64)), b.const(np.array([-2, 2], np.int64)))  # (4, 3), reversed rows
    c = b.op("Concat", x, y, b.op("Relu", y), axis=-1)  # (2, 6, 10)
    e = b.op("Expand", b.op("Unsqueeze", s, b.const(np.array([0], np.int64))), b.const(np.array([3, 1, 1], np.int64)))
    tile = b.op("Tile", y, b.const(np.array([1, 2, 2], np.int64)))
    p1, p2 = b.op_multi("Split", [c, b.const(np.array([3, 7], np.int64))], 2, axis=2)
    sq = b.op("Squeeze", b.op("Slice", x, b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64)),
                              b.const(np.array([0], np.int64))), b.const(np.array([0], np.int64)))
    flat = b.op("Flatten", b.op("Mul", c, b.const(np.float32(2.0))), axis=2)
    g = b.build([s, e, tile, p1, p2, sq, flat])
    check(g, {"x": f32(2, 6, 4), "y": f32(2, 6, 3)})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes(mode: str) -> None:
    b = GraphBuilder("pad")
    x = b.input("x", (2, 5, 4))
    pads = np.array([0, 2, -1, 0, 3, 1], np.int64)
    args = [x, b.const(pads)]
    if mode == "constant":
        args.append(b.const(np.float32(1.5)))
    y = b.op("Pad", *args, mode=mode)
    g = b.build([b.op("Add", y, b.const(np.float32(1.0)))])
    check(g, {"x": f32(2, 5, 4)})


def test_gather_with_constant_and_computed_indices() -> None:
    b = GraphBuilder("gather")
    table, ids = b.input("table", (10, 8)), b.input("ids", (2, 3), DType.INT64)
    emb = b.op("Gather", table, ids, axis=0)  # (2, 3, 8), runtime indices
    pos = b.op("Gather", b.const(f32(5, 8)), b.const(np.array([0, -1, 2], np.int64)), axis=0)  # constant, negative
    cols = b.op("Gather", table, b.const(np.array([[1, 3], [5, 7]], np.int64)), axis=1)  # (10, 2, 2)
    computed = b.op("Cast", b.op("Mul", b.op("Cast", ids, to=1), b.const(np.float32(0.5))), to=7)
    picked = b.op("Gather", table, computed, axis=0)  # indices computed inside the kernel
    s = b.op("Add", emb, pos)
    ge = b.op("GatherElements", table, b.const(RNG.integers(0, 8, (10, 3))), axis=1)
    nd = b.op("GatherND", table, b.const(np.array([[[1, 2]], [[9, 7]]], np.int64)))
    g = b.build([s, cols, picked, ge, nd])
    check(g, {"table": f32(10, 8), "ids": RNG.integers(-10, 10, (2, 3))})


def test_trilu_depth_space_range_shape() -> None:
    b = GraphBuilder("misc")
    x = b.input("x", (1, 8, 3, 2))
    up = b.op("Trilu", b.op("Reshape", x, b.const(np.array([8, 6], np.int64))), b.const(np.array(1, np.int64)))
    low = b.op("Trilu", b.op("Reshape", x, b.const(np.array([8, 6], np.int64))), upper=0)
    d2s = b.op("DepthToSpace", x, blocksize=2)
    crd = b.op("DepthToSpace", x, blocksize=2, mode="CRD")
    s2d = b.op("SpaceToDepth", b.op("Relu", d2s), blocksize=2)
    rng = b.op("Range", b.const(np.float32(1.0)), b.const(np.float32(3.0)), b.const(np.float32(0.5)))
    shp = b.op("Cast", b.op("Shape", x), to=1)
    full = b.op("ConstantOfShape", b.const(np.array([2, 3], np.int64)), value=np.array([4.0], np.float32))
    g = b.build([up, low, d2s, crd, s2d, rng, shp, full])
    check(g, {"x": f32(1, 8, 3, 2)})


UNARY = ["Relu", "Neg", "Abs", "Sign", "Exp", "Floor", "Ceil", "Round", "Tanh", "Sigmoid", "Erf", "Sin", "Cos",
         "Tan", "Atan", "Sinh", "Cosh", "Asinh", "Softplus", "Softsign", "HardSwish", "Mish", "Gelu", "Elu",
         "Selu", "LeakyRelu", "HardSigmoid", "Shrink", "ThresholdedRelu", "Celu", "Reciprocal"]


def test_every_unary_activation() -> None:
    b = GraphBuilder("unary")
    x, pos, unit = b.input("x", (4, 33)), b.input("pos", (4, 33)), b.input("unit", (4, 33))
    outs = [b.op(op, x) for op in UNARY]
    outs += [b.op(op, pos) for op in ("Log", "Sqrt", "Acosh")]
    outs += [b.op(op, unit) for op in ("Asin", "Acos", "Atanh")]
    outs.append(b.op("Gelu", x, approximate="tanh"))
    outs.append(b.op("IsNaN", b.op("Div", x, x)))
    outs.append(b.op("IsInf", b.op("Div", b.const(np.float32(1.0)), x), detect_negative=0))
    outs.append(b.op("PRelu", x, b.const(f32(33))))
    g = b.build(outs)
    x_val = f32(4, 33, lo=-5, hi=5)
    x_val[0, :3] = [0.0, -0.0, 0.5]  # Sign, Round, IsNaN / IsInf at zero
    check(g, {"x": x_val, "pos": f32(4, 33, lo=1.0, hi=9.0), "unit": f32(4, 33, lo=-0.99, hi=0.99)})


def test_float64_and_batchnorm_dropout() -> None:
    b = GraphBuilder("f64")
    x = b.input("x", (2, 3, 4), DType.FLOAT64)
    y = b.op("Tanh", b.op("Mul", b.op("Exp", x), b.const(np.array(0.5, np.float64))))
    z = b.input("z", (2, 3, 4))
    bn = b.op("BatchNormalization", z, b.const(f32(3)), b.const(f32(3)), b.const(f32(3)), b.const(f32(3, lo=0.5)))
    drop = b.op_multi("Dropout", [bn], 2)
    g = b.build([y, *drop])
    check(g, {"x": RNG.standard_normal((2, 3, 4)), "z": f32(2, 3, 4)})


def test_large_output_runs_in_parallel() -> None:
    b = GraphBuilder("big")
    x, y = b.input("x", (64, 1024)), b.input("y", (1024,))
    g = b.build([b.op("Tanh", b.op("Add", x, y))])
    model = check(g, {"x": f32(64, 1024), "y": f32(1024)})
    assert "#pragma omp parallel for" in kernel_code(model)
    one = model.run({"x": np.ones((64, 1024), np.float32), "y": np.zeros(1024, np.float32)}, threads=1)
    two = model.run({"x": np.ones((64, 1024), np.float32), "y": np.zeros(1024, np.float32)}, threads=2)
    np.testing.assert_array_equal(one[g.outputs[0]], two[g.outputs[0]])


def test_scalar_and_empty_tensors() -> None:
    b = GraphBuilder("edge")
    s, e = b.input("s", ()), b.input("e", (0, 3))
    g = b.build([b.op("Exp", s), b.op("Relu", e), b.op("Add", s, b.const(f32(3)))])
    check(g, {"s": np.array(0.5, np.float32), "e": np.zeros((0, 3), np.float32)})


@pytest.mark.parametrize("case", ["channel", "row", "whole", "trailing-one", "batchnorm", "transpose"])
def test_trailing_dimensions_every_operand_reads_whole_run_as_one_loop(case: str) -> None:
    """A ReLU backward of a per-channel gradient over [N, C, H, W] walks H x W as one inner loop (every
    operand takes both whole, or neither); an operand broadcast along W alone, a BatchNormalization
    (its parameters read at the channel index) or a transposed read keeps the loops as they are, and
    a last dimension of size 1 is never where the merged index runs."""
    b = GraphBuilder(case)
    shape = (2, 8, 72, 1) if case == "trailing-one" else (4, 8, 6, 5)
    h = b.input("h", shape)
    feeds = {"h": f32(*shape)}
    if case == "batchnorm":
        params = [b.const(f32(8, lo=0.5, hi=1.5)) for _ in range(4)]
        out = b.op("BatchNormalization", h, *params)
    elif case == "transpose":
        out = b.op("Relu", b.op("Add", b.op("Transpose", h, perm=[0, 1, 3, 2]), b.const(f32(5, 6))))
    else:
        side = {"channel": (4, 8, 1, 1), "row": (5,), "whole": shape, "trailing-one": (2, 8, 1, 1)}[case]
        g = b.input("g", side)
        feeds["g"] = f32(*side)
        out = b.op("Where", b.op("LessOrEqual", h, b.const(np.float32(0))), b.const(np.float32(0)), g)
    model = check(b.build([out]), feeds)
    code = kernel_code(model)
    merged = {"channel": 30, "whole": 960, "trailing-one": 72}.get(case)  # until 256 long, or all of it
    inner = re.findall(r"for \(int64_t i\d+ = 0; i\d+ < (\d+); \+\+i\d+\)", code)
    assert inner[-1] == str(merged if merged else shape[-1] if case != "transpose" else 6), code


def test_a_kernel_that_selects_its_source_per_index_keeps_gcc_from_if_converting() -> None:
    """Concat picks its source per index: its kernel is compiled without if-conversion and without a
    forced `omp simd` (GCC 12 vectorised such selections wrongly, docs/reliability.md); a plain
    pointwise kernel keeps both."""
    b = GraphBuilder("select")
    x, y = b.input("x", (6, 2, 16)), b.input("y", (6, 3, 16))
    g = b.build([b.op("Relu", b.op("Concat", x, y, axis=1))])
    code = kernel_code(check(g, {"x": f32(6, 2, 16), "y": f32(6, 3, 16)}))
    assert "AF_NO_IF_CONVERT void" in code and "#pragma omp simd" not in code
    b = GraphBuilder("plain")
    x = b.input("x", (6, 5, 16))
    code = kernel_code(check(b.build([b.op("Relu", x)]), {"x": f32(6, 5, 16)}))
    assert "AF_NO_IF_CONVERT void" not in code


def test_loop_nests_ask_for_wide_vectors_and_gemm_epilogues_do_not() -> None:
    """Pointwise and reduction kernels are AF_WIDE_VECTORS (512-bit on AVX-512, af_runtime.h: a GELU
    gradient 1.6x faster); a GEMM's epilogue keeps the compiler's default width (no faster wide)."""
    from autofusion.api import optimize

    b = GraphBuilder("widths")
    x = b.input("x", (16, 32))
    h = b.op("MatMul", x, b.const(f32(32, 32)))
    y = b.op("Softmax", b.op("Erf", b.op("Add", h, b.const(f32(32)))), axis=-1)
    g = b.build([y, b.op("Exp", x)])
    model = CompiledModel(optimize(g), cache=CACHE)
    kernels = {k.group.template: k.code for k in model.source.kernels}
    assert "AF_WIDE_VECTORS void" in kernels["pointwise"] and "AF_WIDE_VECTORS void" in kernels["reduction"]
    assert "AF_WIDE_VECTORS" not in kernels["gemm_epilogue"]
    feeds = {"x": f32(16, 32)}
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
