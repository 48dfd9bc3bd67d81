"""Cases the differential fuzzer found; each once failed and must keep passing."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from autofusion.api import optimize
from autofusion.fuzz import random_case, run_case
from autofusion.ir import GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, compare_outputs

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU
CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")


@pytest.mark.parametrize("strategy", ["greedy", "exact"])
def test_outputs_merged_by_saturation_keep_their_names(strategy: str) -> None:
    # relu(x) and relu(relu(x)) become one e-class: both graph outputs must still be defined
    b = GraphBuilder("merged")
    x = b.input("x", (3,))
    r1 = b.op("Relu", x)
    r2 = b.op("Relu", x)
    s = b.op("Softmax", r2, axis=-1)
    r3 = b.op("Relu", r2)
    g = b.build([r1, s, r3])
    feeds = {"x": np.array([-1.0, 0.5, 2.0], np.float32)}
    plan = optimize(g, strategy=strategy)
    assert set(plan.graph.outputs) == {r1, s, r3}
    assert compare_outputs(run_graph(g, feeds), CompiledModel(plan, cache=CACHE).run(feeds)).ok


def test_reduce_with_the_same_axis_written_twice_runs_in_the_reference() -> None:
    # inference accepted axes [-1, 1] on a rank-2 tensor as one axis; the reference raised
    b = GraphBuilder("axes")
    x = b.input("x", (2, 3))
    y = b.op("ReduceMax", x, b.const(np.array([-1, 1], np.int64)), keepdims=1)
    g = b.build([y])
    out = run_graph(g, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})[y]
    assert out.shape == g.types[y].shape == (2, 1)


@pytest.mark.parametrize("seed", [11])
def test_fuzz_seeds_that_once_failed(seed: int) -> None:
    assert run_case(random_case(seed), CACHE).outcome == "ok"


@pytest.mark.parametrize("seed", [211, 319])  # ReduceMax and LayerNormalization over rows of one element
def test_triton_reductions_over_rows_of_one_element(seed: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    assert run_case(random_case(seed), CACHE, triton=True).outcome == "ok"


def test_concat_of_one_tensor_twice_in_the_unfused_runner() -> None:
    """GCC 12.2 at -O3 -mavx2 miscompiled this kernel; the toolchain now passes -fno-tree-loop-if-convert."""
    from autofusion.runtime import UnfusedRunner

    b = GraphBuilder("concat")
    x = b.input("x", (1, 3, 2))
    y = b.op("Concat", x, x, axis=1)
    g = b.build([y])
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(1, 3, 2)}
    assert compare_outputs(run_graph(g, feeds), UnfusedRunner(g, cache=CACHE).run(feeds)).ok


def test_gemm_epilogue_tile_larger_than_the_default_tile() -> None:
    """A 425x32 @ 32x600 product uses tiles wider than the 128x512 default (up to 1.5x in each direction):
    the tile buffer must be sized from the tile used, not the default (it overflowed the heap)."""
    from autofusion.decide import build_groups
    from autofusion.decide.plan import ZERO_COST, Plan
    from autofusion.runtime import CompiledModel

    rng = np.random.default_rng(0)
    b = GraphBuilder("big_tile")
    x = b.input("x", (425, 32))
    w = b.const(rng.standard_normal((32, 600)).astype(np.float32))
    y = b.op("Add", b.op("MatMul", x, w, name="mm"), b.const(rng.standard_normal(600).astype(np.float32)),
             name="bias")
    g = b.build([y])
    groups = build_groups(g, [["mm", "bias"]], template_of=lambda nodes: "gemm_epilogue")
    feeds = {"x": rng.standard_normal((425, 32)).astype(np.float32)}
    got = CompiledModel(Plan(g, groups, ZERO_COST, ZERO_COST), cache=CACHE).run(feeds)
    assert compare_outputs(run_graph(g, feeds), got).ok


def test_compare_outputs_with_zero_tolerance_accepts_equal_and_rejects_different() -> None:
    same = {"y": np.ones(2, np.float32)}
    assert compare_outputs(same, same, rtol=0, atol=0).ok
    assert not compare_outputs(same, {"y": np.array([1, 1.5], np.float32)}, rtol=0, atol=0).ok


def test_layer_norm_of_a_constant_row_is_judged_against_the_float64_reference() -> None:
    """Seed 308006 (campaign): LayerNormalization of Min(x @ w, c) where every value is clamped to c.
    The row's variance is 0, so the float32 reference's own rounding of x - mean is divided by
    sqrt(epsilon): it is off by 1.4e-5 while the SuperKernel gives the exact answer (the bias)."""
    from autofusion.fuzz.differential import _compare, _differs, float64_reference

    case = random_case(308006)
    result = run_case(case, CACHE)
    assert (result.outcome, result.detail) == ("ok", "matched the float64 reference")
    exact = float64_reference(case.graph, case.feeds)
    assert exact is not None and _compare(run_graph(case.graph, case.feeds), exact)  # float32 reference is off
    wrong = {k: v + np.float32(1e-3) for k, v in exact.items()}
    rechecked: list[bool] = []
    assert _differs(run_graph(case.graph, case.feeds), wrong, case, rechecked)  # wrong against both: a mismatch
    assert not rechecked
    assert not _differs(run_graph(case.graph, case.feeds), exact, case, rechecked) and rechecked == [True]


def test_float64_reference_agrees_with_the_float32_one_on_ordinary_cases() -> None:
    from autofusion.fuzz.differential import _compare, float64_reference

    for seed in range(300000, 300030):
        case = random_case(seed)
        exact = float64_reference(case.graph, case.feeds)
        if exact is not None:
            assert not _compare(run_graph(case.graph, case.feeds), exact), seed


def test_campaign_report_names_the_seeds_rechecked_in_float64() -> None:
    from autofusion.fuzz import run_campaign

    data = run_campaign(1, 308006, CACHE).to_json()
    assert (data["ok"], data["float64_rechecked"], data["float64_rechecked_seeds"]) == (1, 1, [308006])


@pytest.mark.parametrize("seed", [64, 103, 139])  # 1x1 and 3x3 convolutions padded on top only, im2col
def test_realistic_fuzz_seeds_that_once_failed(seed: int) -> None:
    from autofusion.fuzz.realistic import realistic_case

    assert run_case(realistic_case(seed), CACHE).outcome == "ok"


@pytest.mark.parametrize("impl", ["packed", "blas", "taps"])
def test_im2col_rows_outside_the_image_with_avx512(impl: str) -> None:
    """GCC 12.2 at -O3 with AVX-512 if-converted and vectorised im2col's per-row bounds test wrongly
    (a 1x1 convolution padded on top only got its first rows from the wrong place); rows outside
    the image are now an empty range of columns, not a branch."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser
    from autofusion.decide import unfused_plan

    b = GraphBuilder("top_pad")
    x = b.input("x", (1, 8, 6, 6))
    w = b.const(np.random.default_rng(0).standard_normal((32, 8, 1, 1)).astype(np.float32))
    g = b.build([b.op("Conv", x, w, kernel_shape=(1, 1), pads=(1, 0, 0, 0))])
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 8, 6, 6)).astype(np.float32)}
    model = CompiledModel(unfused_plan(g), cache=CACHE, cores=FixedChooser(CoreChoice(impl, 256)), tune=False)
    assert compare_outputs(run_graph(g, feeds), model.run(feeds)).ok
