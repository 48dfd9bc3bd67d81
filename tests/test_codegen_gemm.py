"""gemm_epilogue and horizontal_gemm: sgemm tiles with the epilogue per tile, checked against the
reference interpreter."""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any

import numpy as np
import pytest

from autofusion.codegen.cores import CoreChoice, FixedChooser
from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, compare_outputs

PACKED_CALL = re.compile(r"af_sgemm_packed(_wide)?\(")  # either micro-kernel over a build-time packing
CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
RNG = np.random.default_rng(3)


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def check(g: Graph, feeds: dict[str, np.ndarray], template: str = "gemm_epilogue", cores: Any = None) -> str:
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: template),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE, cores=cores)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    return "\n".join(k.code for k in model.source.kernels)


def gelu_erf(b: GraphBuilder, h: str) -> str:
    """GELU as exporters write it: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    inner = b.op("Add", b.op("Erf", b.op("Div", h, b.const(np.float32(1.4142135)))), b.const(np.float32(1.0)))
    return b.op("Mul", b.op("Mul", h, b.const(np.float32(0.5))), inner)


def test_bias_gelu_residual_epilogue_per_tile() -> None:
    b = GraphBuilder("ffn")
    x, res = b.input("x", (2, 16, 32)), b.input("res", (2, 16, 48))
    h = b.op("Add", b.op("MatMul", x, b.const(f32(32, 48))), b.const(f32(48)))
    g = b.build([b.op("Add", gelu_erf(b, h), res)])
    code = check(g, {"x": f32(2, 16, 32), "res": f32(2, 16, 48)})
    assert PACKED_CALL.search(code) and "af_erff" in code  # a constant weight: packed at build time
    assert code.count("for (int64_t o = 0;") == 0  # no separate epilogue pass: it runs in the tile loop
    assert re.search(r"c\[mi \* \d+ \+ ni\]", code)  # the epilogue reads the tile just computed


def test_a_weight_read_by_several_kernels_is_packed_once() -> None:
    """An unrolled recurrence reads one weight at every step, in a kernel per step: the library holds
    one packed copy for all of them (one per node kept 16 copies of an LSTM's weights, out of cache),
    and a different weight of the same shape keeps its own."""
    from autofusion.decide import unfused_plan

    b = GraphBuilder("steps")
    h = b.input("h", (1, 64))
    w, other = b.const(f32(96, 64, scale=0.1)), b.const(f32(96, 64, scale=0.1))
    for weight in (w, w, w, other):
        h = b.op("Slice", b.op("Gemm", h, weight, transB=1), b.const(np.asarray([0], np.int64)),
                 b.const(np.asarray([64], np.int64)), b.const(np.asarray([1], np.int64)))
    g = b.build([h])
    model = CompiledModel(unfused_plan(g), cache=CACHE)
    feeds = {"h": f32(1, 64)}
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    packed = [arr for name, arr in model.source.constants if name.endswith("_packed")]
    assert len(packed) == 2 and not np.array_equal(*packed)


def test_attention_scores_read_transposed_views_without_copies() -> None:
    b = GraphBuilder("scores")
    q, k = b.input("q", (1, 16, 64)), b.input("k", (1, 16, 64))
    shape = b.const(np.array([1, 16, 2, 32], np.int64))
    qh = b.op("Transpose", b.op("Reshape", q, shape), perm=(0, 2, 1, 3))
    kt = b.op("Transpose", b.op("Reshape", k, shape), perm=(0, 2, 3, 1))
    s = b.op("Div", b.op("MatMul", qh, kt), b.const(np.float32(5.656854)))
    sm = b.op("Softmax", s, axis=-1)  # a reduction over the tiles: computed after them
    g = b.build([sm, s])
    feeds = {"q": f32(1, 16, 64), "k": f32(1, 16, 64)}
    code = check(g, feeds)  # the default: K^T packed per tile straight from k's buffer, read down its columns
    assert re.search(r"af_pack_panels\(32, nlen, t_k \+ [^,]*, 1, 64, bpack\)", code), code
    assert re.search(r"af_sgemm_packed\(mlen, nlen, 32, \d+, 1.0f, t_q \+ [^;]*bpack, c,", code), code
    assert code.index("af_pack_panels(") < code.index("stage 0")  # no copy loop before the product
    code = check(g, feeds, cores=FixedChooser(CoreChoice("blas")))
    assert "CblasTrans" in code  # K^T handed to BLAS as a transposed operand
    assert code.index("af_sgemm(") < code.index("stage 0")  # no copy loop before the sgemm



def test_tiles_sharing_a_packed_b_run_on_one_thread_in_turn() -> None:
    # B computed at run time: 2 row blocks x 2 column blocks; a contiguous run of tiles per thread
    # keeps a column block's two row blocks on one thread, which packs its panels once
    b = GraphBuilder("grad_w")
    a, w = b.input("a", (64, 256)), b.input("w", (64, 1024))
    g = b.build([b.op("Relu", b.op("MatMul", b.op("Transpose", a, perm=(1, 0)), w))])
    code = check(g, {"a": f32(64, 256), "w": f32(64, 1024)}, cores=FixedChooser(CoreChoice("repack", 1024)))
    assert "af_pack_panels(" in code and "for (int64_t t = 0; t < 4; ++t)" in code, code
    assert "#pragma omp for schedule(static) nowait" in code
    assert "schedule(dynamic" not in code

@pytest.mark.parametrize("trans_a,trans_b,alpha,beta,c_shape", [
    (0, 0, 1.0, 1.0, (12,)), (0, 1, 0.5, 2.0, (8, 12)), (1, 0, 2.0, 0.5, (1, 12)), (1, 1, 1.0, 1.0, None),
    (0, 1, 1.0, 1.0, ()),
])
def test_gemm_attributes(trans_a: int, trans_b: int, alpha: float, beta: float, c_shape: tuple[int, ...] | None) -> None:
    b = GraphBuilder("gemm")
    a = b.input("a", (20, 8) if trans_a else (8, 20))
    w = b.const(f32(12, 20) if trans_b else f32(20, 12))
    args = [a, w] + ([b.const(f32(*c_shape))] if c_shape is not None else [])
    y = b.op("Gemm", *args, transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    g = b.build([b.op("Tanh", y)])
    code = check(g, {"a": f32(20, 8) if trans_a else f32(8, 20)})
    assert PACKED_CALL.search(code)  # transposed operands too: W is packed, A is read through strides


@pytest.mark.parametrize("a_shape,b_shape", [
    ((7,), (7, 5)), ((3, 7), (7,)), ((7,), (2, 7, 5)), ((3, 1, 5, 8), (4, 8, 6)), ((2, 3, 4, 8), (8, 6)),
    ((1, 5, 8), (3, 8, 2)),
])
def test_matmul_ranks_and_broadcast_batches(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    b = GraphBuilder("mm")
    a, w = b.input("a", a_shape), b.input("b", b_shape)
    g = b.build([b.op("Relu", b.op("MatMul", a, w))])
    check(g, {"a": f32(*a_shape), "b": f32(*b_shape)})


def test_operand_blas_cannot_read_is_copied_first() -> None:
    b = GraphBuilder("expand")
    a, row = b.input("a", (6, 4)), b.input("row", (1, 5))
    wide = b.op("Expand", b.op("Relu", row), b.const(np.array([4, 5], np.int64)))  # computed, broadcast rows
    g = b.build([b.op("MatMul", a, wide)])
    code = check(g, {"a": f32(6, 4), "row": f32(1, 5)})
    assert code.index("for (int64_t") < code.index("af_sgemm(")  # the operand is materialised first


def test_many_tiles_in_parallel_with_late_transpose_output() -> None:
    b = GraphBuilder("tiles")
    x = b.input("x", (200, 64))
    y = b.op("Relu", b.op("MatMul", x, b.const(f32(64, 600, scale=0.1))))
    t = b.op("Transpose", y)  # not tile-aligned: computed from the full product after the tiles
    g = b.build([y, t])
    code = check(g, {"x": f32(200, 64)})
    assert "#pragma omp for schedule(dynamic, 1) nowait" in code


def test_horizontal_qkv_shares_one_input_and_concatenated_weights() -> None:
    b = GraphBuilder("qkv")
    x = b.input("x", (1, 16, 32))
    outs = []
    for _ in range(3):
        outs.append(b.op("Add", b.op("MatMul", x, b.const(f32(32, 32))), b.const(f32(32))))
    g = b.build(outs)
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "horizontal_gemm"),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE, cores=FixedChooser(CoreChoice("packed", 512)))
    report = compare_outputs(run_graph(g, {"x": (x_v := f32(1, 16, 32))}), model.run({"x": x_v}))
    assert report.ok, report.summary()
    (kernel,) = model.source.kernels
    # weights concatenated once, packed into 3 panels of 32 rows x 32 columns, slice by slice
    cols = _slice_cols(None)
    assert len(kernel.derived) == 1 and kernel.derived[0][1].shape == (3 * 32 // cols, 32, cols)
    assert kernel.code.count("af_sgemm_packed(") == 1 and "af_sgemm(" not in kernel.code  # one product


def test_horizontal_tiles_straddle_outputs_and_feed_late_outputs() -> None:
    b = GraphBuilder("wide")
    x = b.input("x", (2, 24, 40))
    q = b.op("MatMul", x, b.const(f32(40, 300, scale=0.2)))
    k = b.op("Relu", b.op("MatMul", x, b.const(f32(40, 200, scale=0.2))))
    v = b.op("MatMul", x, b.const(f32(40, 100, scale=0.2)))
    late = b.op("Transpose", v, perm=(0, 2, 1))  # needs all of v: computed after the tiles
    g = b.build([q, k, late])
    code = check(g, {"x": f32(2, 24, 40)}, template="horizontal_gemm")
    assert len(PACKED_CALL.findall(code)) == 1 and "columns 300..500 of the product" in code


def test_attention_block_with_two_matmuls_runs_staged() -> None:
    b = GraphBuilder("block")
    q, k, v = b.input("q", (2, 8, 16)), b.input("k", (2, 16, 8)), b.input("v", (2, 8, 16))
    probs = b.op("Softmax", b.op("Mul", b.op("MatMul", q, k), b.const(np.float32(0.25))), axis=-1)
    g = b.build([b.op("Add", b.op("MatMul", probs, v), b.const(np.float32(1.0)))])
    code = check(g, {"q": f32(2, 8, 16), "k": f32(2, 16, 8), "v": f32(2, 8, 16)})
    assert code.count("af_sgemm(") == 2 and "stage 0: Softmax" in code


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 25])
@pytest.mark.parametrize("n", [5, 64, 130, 520])
def test_packed_products_match_on_every_row_and_column_count(m: int, n: int) -> None:
    """A constant weight runs af_sgemm_packed: blocks of up to 12 rows and every remainder, panels of
    32 columns and a zero-padded last panel, tiles of several panels. Scaled by alpha through Gemm.
    A weight of fewer than 8 columns (n = 5) would be mostly padding: af_sgemm (few-row kernel up
    to 8 rows, OpenBLAS above)."""
    b = GraphBuilder("few_rows")
    x = b.input("x", (m, 40))
    y = b.op("Relu", b.op("Gemm", x, b.const(f32(40, n)), b.const(f32(n)), alpha=0.5))
    code = check(b.build([y]), {"x": f32(m, 40)})
    assert (PACKED_CALL.search(code) is not None) == (n >= 8) and ("af_sgemm(" in code) == (n < 8)


@pytest.mark.parametrize("kc", [256, 512, 1024])
@pytest.mark.parametrize("k", [255, 256, 511, 512, 1100])
def test_packed_products_over_several_passes_of_k(k: int, kc: int) -> None:
    """K beyond one pass of kc rows: later passes continue the sums stored by the pass before, and
    alpha is applied once, on the last."""
    from autofusion.codegen.cores import CoreChoice, FixedChooser

    b = GraphBuilder("deep")
    x = b.input("x", (14, k))
    y = b.op("Gemm", x, b.const(f32(k, 70, scale=0.05)), b.const(f32(70)), alpha=0.5)
    code = check(b.build([b.op("Relu", y)]), {"x": f32(14, k)}, cores=FixedChooser(CoreChoice("packed", kc)))
    assert f"af_sgemm_packed(mlen, nlen, {k}, {kc}," in code


def test_few_row_products_with_strided_operands_and_batches() -> None:
    """A batch of 3 x (6 x 24) @ (24 x 70) through a transposed activation (lda != K) and a column
    slice of the output tiles (ldc != N)."""
    b = GraphBuilder("batched_few_rows")
    x = b.input("x", (3, 24, 6))
    h = b.op("MatMul", b.op("Transpose", x, perm=[0, 2, 1]), b.const(f32(24, 70)))
    y = b.op("Add", h, b.input("r", (3, 6, 70)))
    check(b.build([y]), {"x": f32(3, 24, 6), "r": f32(3, 6, 70)})


def _af_sgemm_library(tmp_path, entry: str, isa: str | None = None):
    """af_sgemm.c.j2 compiled alone with the project's flags for ``isa`` (default: this CPU's), plus
    an exported ``run`` entry and ``isa()``; None when this CPU cannot run that instruction set (the
    library is still compiled: every variant builds on any x86-64 compiler)."""
    import ctypes
    import subprocess

    from autofusion.codegen.templates import default_templates
    from autofusion.runtime.toolchain import blas_flags, detect_toolchain

    tc = detect_toolchain(isa=isa)
    inc, link = blas_flags()
    templates = default_templates()
    (tmp_path / "af_runtime.h").write_text(templates.runtime_header())
    src = tmp_path / "t.c"
    src.write_text('#include "af_runtime.h"\n#include <cblas.h>\n' + templates.render("af_sgemm.c.j2")
                   + '\nAF_API const char* isa(void) { return AF_ISA; }\nAF_API ' + entry)
    lib = tmp_path / f"t_{tc.isa}.so"
    subprocess.run([tc.cc, *tc.cflags, *inc, f"-I{tmp_path}", "-shared", "-fPIC", str(src), "-o", str(lib), *link],
                   check=True, capture_output=True, text=True)
    if not tc.runnable:
        return None
    dll = ctypes.CDLL(str(lib))
    dll.isa.restype = ctypes.c_char_p
    assert dll.isa().decode() == tc.isa  # the variant built is the one asked for
    return dll.run


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_af_sgemm_small_kernel_against_numpy(tmp_path, isa: str) -> None:
    """The few-row kernel itself, for each vector width: every row count up to 8, column counts
    around the block width, leading dimensions wider than the operands, alpha."""
    import ctypes

    run = _af_sgemm_library(tmp_path, """void run(int m, int n, int k, float alpha, const float* a, int lda,
                                                  const float* b, int ldb, float* c, int ldc) {
    af_sgemm(CblasNoTrans, CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc);
}""", isa)
    if run is None:
        pytest.skip(f"{isa}: compiled; this CPU cannot run it")
    ptr = ctypes.POINTER(ctypes.c_float)
    for m in range(1, 10):
        for n, k in ((1, 3), (63, 17), (64, 64), (100, 33), (257, 70)):
            a, b = f32(m, k + 3), f32(k, n + 5)  # lda = k + 3, ldb = n + 5
            c = np.full((m, n + 2), np.nan, np.float32)  # ldc = n + 2: the last columns stay untouched
            run(m, n, k, ctypes.c_float(0.5), a.ctypes.data_as(ptr), k + 3, b.ctypes.data_as(ptr), n + 5,
                c.ctypes.data_as(ptr), n + 2)
            np.testing.assert_allclose(c[:, :n], 0.5 * a[:, :k] @ b[:, :n], rtol=1e-4, atol=1e-5)
            assert np.isnan(c[:, n:]).all()


PACKED_ENTRY = """void run(int m, int n, int k, int kc, float alpha, const float* a, int64_t ars,
                             int64_t aps, const float* w, float* c, int ldc) {
    af_sgemm_packed(m, n, k, kc, alpha, a, ars, aps, w, c, ldc);
}"""


# a transposed A (ars 1) kept in panels by each pass's first slice ((kc + 16) x m floats: gemm.py)
PACKED_AT_ENTRY = """void run(int m, int n, int k, int kc, float alpha, const float* a, int64_t ars,
                             int64_t aps, const float* w, float* c, int ldc) {
    float* apack = aligned_alloc(64, ((size_t)(k + 16) * m * sizeof(float) + 63) / 64 * 64);
    (void)ars;
    af_sgemm_packed_at(m, n, k, kc, alpha, a, aps, w, c, ldc, apack);
    free(apack);
}"""


def _packed_runner(tmp_path, isa: str | None = None, wide: bool = False, at: bool = False):
    import ctypes

    entry = PACKED_ENTRY.replace("af_sgemm_packed(", "af_sgemm_packed_wide(") if wide else PACKED_ENTRY
    entry = PACKED_AT_ENTRY if at else entry
    run = _af_sgemm_library(tmp_path, entry, isa)
    if run is not None:
        ptr = ctypes.POINTER(ctypes.c_float)
        i32, i64 = ctypes.c_int, ctypes.c_int64
        run.argtypes = [i32, i32, i32, i32, ctypes.c_float, ptr, i64, i64, ptr, ptr, i32]
    return run


def _slice_cols(isa: str | None) -> int:
    """The micro-kernel width a library built for ``isa`` (default: this CPU's) reads weights in."""
    from autofusion.codegen.cores import MICRO_KERNELS, requested_isa

    return MICRO_KERNELS[requested_isa(isa)][1]


def _check_packed(run, m: int, n: int, k: int, kc: int, transposed: bool, alpha: float = 0.5,
                  isa: str | None = None, wide: bool = False) -> None:
    """One call against numpy: A plain (lda = k + 3) or transposed, ldc = n + 2 (the last columns
    stay untouched). ``wide``: the wide micro-kernel over its own 48-column panels."""
    import ctypes

    from autofusion.codegen.cores import WIDE_KERNELS, requested_isa
    from autofusion.codegen.gemm import PACK_NR, pack_weights

    ptr = ctypes.POINTER(ctypes.c_float)
    w = f32(k, n)
    cols, panel = (WIDE_KERNELS[requested_isa(isa)][1],) * 2 if wide else (_slice_cols(isa), PACK_NR)
    packed = pack_weights(w, cols, panel)
    assert packed.shape == (-(-n // panel) * panel // cols, k, cols)
    a = f32(k, m + 2) if transposed else f32(m, k + 3)
    a_mk = a[:, :m].T if transposed else a[:, :k]
    ars, aps = (1, m + 2) if transposed else (k + 3, 1)
    c = np.full((m, n + 2), np.nan, np.float32)
    run(m, n, k, kc, alpha, a.ctypes.data_as(ptr), ars, aps, packed.ctypes.data_as(ptr), c.ctypes.data_as(ptr), n + 2)
    np.testing.assert_allclose(c[:, :n], alpha * a_mk @ w, rtol=1e-4, atol=1e-4 * max(1.0, k ** 0.5 / 4),
                               err_msg=f"m={m} n={n} k={k} kc={kc} transposed={transposed}")
    assert np.isnan(c[:, n:]).all()


@pytest.mark.parametrize("isa", ["avx512", "avx2", "avx", "portable"])
def test_every_packed_micro_kernel_on_edge_shapes(tmp_path, isa: str) -> None:
    """Each instruction set's af_sgemm_packed (12 x 32 AVX-512, 6 x 16 AVX2 and AVX, 6 x 8 portable),
    built for that ISA, against numpy: rows around every micro-kernel's row block (1, 5-7, 11-13,
    odd primes, a few hundred), columns around its slice and the 32-column panel, K around and
    across the passes of kc, A plain and transposed (read in place, and kept in panels by each
    pass's first slice, af_sgemm_packed_at). A variant this CPU cannot run is compiled only."""
    run = _packed_runner(tmp_path, isa)
    (tmp_path / "at").mkdir()
    run_at = _packed_runner(tmp_path / "at", isa, at=True)
    if run is None or run_at is None:
        from autofusion.runtime.toolchain import detect_toolchain

        assert not detect_toolchain(isa=isa).runnable  # compiled above; this CPU lacks the instructions
        return
    for m in (1, 2, 3, 5, 6, 7, 11, 12, 13, 31, 300):
        for n in (1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 97, 300):
            transposed = (m + n) % 2 == 1
            for runner in (run, run_at) if transposed else (run,):
                _check_packed(runner, m, n, 129, 128, transposed=transposed, isa=isa)
    for m in (1, 2, 3):  # blocks of too few accumulators spread K over sets: K short of, at and past them
        for k in (1, 2, 3, 4, 5, 9, 300):
            for kc in (128, 1024):
                _check_packed(run, m, 45, k, kc, transposed=(m + k) % 2 == 0, isa=isa)
    for k in (1, 2, 7, 127, 128, 129, 257, 600, 901):  # 901: passes of 226, 225, 225, 225 at kc 256
        for kc in (128, 256, 1024):
            for runner in (run, run_at) if k % 2 == 0 else (run,):
                _check_packed(runner, 13, 37, k, kc, transposed=k % 2 == 0, alpha=1.0 if kc == 256 else 0.5, isa=isa)


# what af_next_pass asks each block of a pass to prefetch: [from, to) in bytes from W, or -1 for none
NEXT_PASS_ENTRY = """void run(int n, int k, int slice, int j, int p0, int kc, int k_pass, int block, int blocks, int64_t* out) {
    static const float w[1];
    const af_ahead next = af_next_pass(w, n, k, slice, j, p0, kc, k_pass, block, blocks);
    out[0] = next.at ? next.at - (const char*)w : -1;
    out[1] = next.at ? out[0] + (int64_t)(kc - 1) * next.step + (int64_t)next.lines * 64 : -1;
}"""


def test_the_next_pass_of_w_is_prefetched_in_shares_inside_w(tmp_path) -> None:
    """While a pass of W is read from L2 by its blocks, they prefetch the next pass (the next
    slice's, else the first slice's of the next pass over K) in shares: together the shares cover
    every byte of it, each block from the start of its own share and not much beyond it. One block
    alone prefetches nothing (it reads ahead of itself); the last pass has no next."""
    import ctypes

    run = _af_sgemm_library(tmp_path, NEXT_PASS_ENTRY, "portable")
    assert run is not None
    run.argtypes = [ctypes.c_int] * 9 + [ctypes.POINTER(ctypes.c_int64)]
    out = (ctypes.c_int64 * 2)()

    def shares(n: int, k: int, slice_: int, j: int, p0: int, kc: int, k_pass: int, blocks: int) -> list[tuple[int, int]]:
        got = []
        for b in range(blocks):
            run(n, k, slice_, j, p0, kc, k_pass, b, blocks, out)
            got.append((out[0], out[1]))
        return got

    for slice_ in (32, 48, 16):
        for n, k, k_pass, blocks in ((96, 576, 576, 20), (64, 4608, 1152, 7), (33, 901, 226, 3), (200, 3072, 768, 11),
                                     (64, 300, 150, 2)):
            panels = -(-n // slice_)
            for j in range(0, panels * slice_, slice_):
                for p0 in range(0, k, k_pass):
                    rows = min(k_pass, k - p0)
                    if j + slice_ < n:
                        start, size = ((j + slice_) * k + p0 * slice_) * 4, rows * slice_ * 4
                    elif p0 + rows < k:
                        start, size = (p0 + rows) * slice_ * 4, min(k_pass, k - p0 - rows) * slice_ * 4
                    else:
                        assert shares(n, k, slice_, j, p0, rows, k_pass, blocks) == [(-1, -1)] * blocks
                        continue
                    got = shares(n, k, slice_, j, p0, rows, k_pass, blocks)
                    covered = np.zeros(size + 64 * 8, bool)
                    share = -(-size // blocks)
                    for b, (lo, hi) in enumerate(got):
                        assert lo == start + b * share, (slice_, n, k, j, p0, b)
                        # (the step is rounded up to whole bytes: at most kc bytes over, and the last line)
                        assert hi - lo <= share + rows + 64, (slice_, n, k, j, p0, b, hi - lo, share)
                        covered[lo - start:min(hi - start, size)] = True
                    assert covered[:size].all(), (slice_, n, k, j, p0)
                    assert shares(n, k, slice_, j, p0, rows, k_pass, 1) == [(-1, -1)]


# an FMA that reads a vector from memory: `vfmadd231ps 64(%rax), %ymm1, %ymm2` (AT&T syntax, as cc -S
# writes it); not one that broadcasts A's element from memory (`4(%rdx){1to16}`), read once either way
FMA_FROM_MEMORY = re.compile(r"^\s*vfmadd\w*ps\s+[^%\s]*\([^)]*\)(?!\{1to)", re.MULTILINE)


@pytest.mark.parametrize("march", ["znver3", "haswell", "skylake-avx512"])
def test_packed_blocks_load_each_vector_of_w_once_per_step(tmp_path, march: str) -> None:
    """Every row count of the packed micro-kernel keeps W's vectors in registers: with GCC's znver3
    tuning, blocks of at most 4 rows folded the load into each FMA (a load per row and vector),
    which made 8 rows as two 4-row blocks 1.46x slower on Zen 3. Checked in the assembly, so it
    holds on any CPU that builds it."""
    import platform
    import subprocess

    from autofusion.codegen.templates import default_templates
    from autofusion.runtime.toolchain import blas_flags, detect_toolchain

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 assembly")
    tc = detect_toolchain(isa="portable")
    inc, _ = blas_flags()
    templates = default_templates()
    (tmp_path / "af_runtime.h").write_text(templates.runtime_header())
    # each row count over a whole slice, and over half a vector of columns (a product of so few, its
    # column count known to the compiler, kept its sums on the stack: 1.75x the time, 12 x [8 x 64] @ [64 x 8])
    # and each row count reading a transposed A in place while it keeps it (af_sgemm_packed_at's first slice)
    blocks = "".join(f"void block{r}{part}(int k, const float* a, const float* w, float* c, float* keep) {{ if ({r} <= AF_PACK_MR) "
                     f"af_packed_block({r}, AF_PACK_NV, k, 1, 1, 1.0f, a, {ars}, {aps}, 0, NULL, NULL, w, c, 3072, {cols}, "
                     f"af_next_pass(w, 3072, k, AF_PACK_SLICE, 0, 0, k, k, 1, 4), {keeping}, keep); }}\n"
                     for r in range(1, 13) for part, cols, ars, aps, keeping in (
                         ("", "AF_PACK_SLICE", 768, 1, 0), ("_part", "AF_VW / 2", 768, 1, 0),
                         ("_keep", "AF_PACK_SLICE", 1, 1024, 1)))
    src = tmp_path / "t.c"
    src.write_text('#include "af_runtime.h"\n#include <cblas.h>\n' + templates.render("af_sgemm.c.j2") + blocks)
    flags = [f for f in tc.cflags if not f.startswith("-march")]
    (tmp_path / "empty.c").write_text("int empty;\n")
    known = subprocess.run([tc.cc, f"-march={march}", "-S", str(tmp_path / "empty.c"), "-o", str(tmp_path / "e.s")],
                           capture_output=True, text=True)
    if known.returncode != 0:
        pytest.skip(f"{tc.cc} does not know -march={march}: {known.stderr.strip()[:200]}")
    built = subprocess.run([tc.cc, *flags, f"-march={march}", *inc, f"-I{tmp_path}", "-S", str(src),
                            "-o", str(tmp_path / "t.s")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[:2000]
    assembly = (tmp_path / "t.s").read_text()
    block_rows = 12 if "avx512" in march else 6  # AF_PACK_MR: the blocks beyond it are empty
    for r in range(1, 13):
        for part in ("", "_part", "_keep"):
            body = assembly.split(f"\nblock{r}{part}:", 1)[1].split(".cfi_endproc", 1)[0]
            assert ("vfmadd" in body) == (r <= block_rows), f"block{r}{part} at -march={march}: FMAs where none belong, or none"
            assert not FMA_FROM_MEMORY.findall(body), f"{r}-row block{part} at -march={march}: an FMA reads memory"


@pytest.mark.parametrize("isa", ["avx512"])
def test_the_wide_micro_kernel_on_edge_shapes(tmp_path, isa: str) -> None:
    """af_sgemm_packed_wide (AVX-512: 8 rows x 48 columns, over panels of that width)
    against numpy: rows around its row blocks, columns around its slice, K across the passes of kc,
    A plain and transposed. Built for the instruction set on any machine; run where the CPU has it."""
    run = _packed_runner(tmp_path, isa, wide=True)
    if run is None:
        from autofusion.runtime.toolchain import detect_toolchain

        assert not detect_toolchain(isa=isa).runnable  # compiled above; this CPU lacks the instructions
        return
    for m in (1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 300):
        for n in (1, 15, 16, 17, 23, 24, 25, 47, 48, 49, 95, 96, 97, 300):
            _check_packed(run, m, n, 129, 128, transposed=(m + n) % 2 == 1, isa=isa, wide=True)
    for k in (1, 7, 128, 129, 600):
        for kc in (128, 1024):
            _check_packed(run, 9, 50, k, kc, transposed=k % 2 == 0, alpha=1.0 if kc == 128 else 0.5, isa=isa,
                          wide=True)


def test_a_weight_packed_for_the_wide_kernel_needs_it(tmp_path) -> None:
    """An instruction set without the wide micro-kernel, or with one of another width, refuses a call
    site on wide panels at compile time; AVX-512 takes its own."""
    import subprocess

    with pytest.raises(subprocess.CalledProcessError) as failed:
        _af_sgemm_library(tmp_path, "void run(void) { AF_WIDE_PACKED_FOR(24); }", "avx")
    assert "packed for the wide micro-kernel" in failed.value.stderr
    for isa, cols in (("avx2", 48), ("avx512", 24)):  # AVX2 has none; AVX-512's is 48 columns wide
        with pytest.raises(subprocess.CalledProcessError):
            _af_sgemm_library(tmp_path, f"void run(void) {{ AF_WIDE_PACKED_FOR({cols}); }}", isa)
    (tmp_path / "avx512").mkdir()
    _af_sgemm_library(tmp_path / "avx512", "void run(void) { AF_WIDE_PACKED_FOR(48); }", "avx512")  # builds


@pytest.mark.parametrize("m", [1, 7, 8, 9, 16, 33])
@pytest.mark.parametrize("n", [48, 50, 96, 470])
def test_products_forced_onto_the_wide_kernel_match(m: int, n: int) -> None:
    """A constant weight on the wide micro-kernel, in tiles of whole 48-column panels (the last
    zero-padded) and K over three passes; where this CPU has no wide kernel the choice falls back."""
    from autofusion.codegen.cores import this_machine

    b = GraphBuilder("wide_forced")
    x = b.input("x", (m, 300))
    y = b.op("Relu", b.op("Gemm", x, b.const(f32(300, n, scale=0.1)), b.const(f32(n)), alpha=0.5))
    code = check(b.build([y]), {"x": f32(m, 300)}, cores=FixedChooser(CoreChoice("packed", 128, wide=True)))
    wide = this_machine().wide_kernel
    assert ("af_sgemm_packed_wide(" in code) == (wide is not None)
    assert wide is None or f"AF_WIDE_PACKED_FOR({wide[1]})" in code


def test_horizontal_product_on_the_wide_kernel_splits_its_columns() -> None:
    """Three weights concatenated (96 + 40 + 96 columns) and packed in 48-column panels: tiles
    straddle the outputs' columns."""
    b = GraphBuilder("wide_qkv")
    x = b.input("x", (2, 21, 96))
    outs = [b.op("Relu", b.op("MatMul", x, b.const(f32(96, n, scale=0.1)))) for n in (96, 40, 96)]
    check(b.build(outs), {"x": f32(2, 21, 96)}, template="horizontal_gemm",
          cores=FixedChooser(CoreChoice("packed", 512, wide=True)))


def test_af_sgemm_packed_reads_the_layout_pack_weights_writes(tmp_path) -> None:
    """af_sgemm_packed on weights packed by pack_weights: row counts around the row blocks, columns
    around the 32-column panel, K over several passes, A plain or transposed, ldc wider than N, a
    call that starts at a later panel (column n0 at w + n0 * K)."""
    import ctypes

    from autofusion.codegen.gemm import pack_weights

    run = _packed_runner(tmp_path)
    ptr = ctypes.POINTER(ctypes.c_float)
    for m, n, k in ((1, 1, 3), (5, 31, 17), (12, 32, 64), (13, 33, 513), (25, 100, 1030), (3, 257, 7)):
        for transposed in (False, True):
            _check_packed(run, m, n, k, 512, transposed)
    m, n, k, n0 = 4, 100, 40, 64  # columns 64.. of W: the third panel on
    w, a = f32(k, n), f32(m, k)
    packed = pack_weights(w, _slice_cols(None))
    c = np.zeros((m, n - n0), np.float32)
    run(m, n - n0, k, 512, 1.0, a.ctypes.data_as(ptr), k, 1,
        packed.reshape(-1)[n0 * k:].ctypes.data_as(ptr), c.ctypes.data_as(ptr), n - n0)
    np.testing.assert_allclose(c, a @ w[:, n0:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cols", [32, 16, 8])
def test_pack_weights_lays_each_panel_out_slice_by_slice(cols: int) -> None:
    """A 32-column panel is 32 / cols slices one after another, each K rows of ``cols`` columns: the
    slice a micro-kernel call reads is contiguous (AVX2 reads 16 columns, half a panel: as halves of
    each 128-byte row, its slice used only half of L1's sets). Column j starts at j * K; padding to
    whole panels is zero."""
    from autofusion.codegen.gemm import PACK_NR, pack_weights

    k, n = 5, 45
    w = f32(k, n)
    flat = pack_weights(w, cols).reshape(-1)
    assert flat.size == -(-n // PACK_NR) * PACK_NR * k
    for j in range(-(-n // PACK_NR) * PACK_NR):
        for p in range(k):
            expected = w[p, j] if j < n else 0.0
            assert flat[(j - j % cols) * k + p * cols + j % cols] == expected
    with pytest.raises(ValueError, match="does not divide"):
        pack_weights(w, 12)


def test_pack_weights_in_wide_panels() -> None:
    """The wide micro-kernel's panel is one 48-column slice: column j at (j - j % 48) * K + p * 48 +
    j % 48, padded with zeros to whole panels."""
    from autofusion.codegen.gemm import pack_weights

    k, n = 3, 100
    w = f32(k, n)
    packed = pack_weights(w, 48, panel=48)
    assert packed.shape == (3, k, 48)
    flat = packed.reshape(-1)
    for j in range(144):
        for p in range(k):
            assert flat[(j - j % 48) * k + p * 48 + j % 48] == (w[p, j] if j < n else 0.0)
    with pytest.raises(ValueError, match="does not divide"):
        pack_weights(w, 32, panel=48)


def test_a_weight_packed_for_another_width_does_not_compile(tmp_path) -> None:
    """A call site checks at compile time that the kernel reads the slice width its weights were
    packed for: a library built for another instruction set fails to build, never reads wrongly."""
    import subprocess

    wrong = {32: 16, 16: 8, 8: 32}[_slice_cols(None)]
    with pytest.raises(subprocess.CalledProcessError) as failed:
        _af_sgemm_library(tmp_path, f"void run(void) {{ AF_PACKED_FOR({wrong}); }}", None)
    assert "packed for a micro-kernel of another width" in failed.value.stderr
    (tmp_path / "ok").mkdir()
    assert _af_sgemm_library(tmp_path / "ok", f"void run(void) {{ AF_PACKED_FOR({_slice_cols(None)}); }}",
                             None) is not None


PACK_ENTRY = """void run(int k, int n, const float* b, int64_t brs, int64_t bcs, float* pack) {
    af_pack_panels(k, n, b, brs, bcs, pack);
}"""


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_run_time_packing_matches_the_build_time_panels(tmp_path, isa: str) -> None:
    """af_pack_panels lays out a B computed at run time exactly as pack_weights does a constant one,
    from rows of B (V) or from its columns (K^T), with leading dimensions wider than B, every
    column count around the 32-column panel (the last zero-padded)."""
    import ctypes

    from autofusion.codegen.gemm import pack_weights

    run = _af_sgemm_library(tmp_path, PACK_ENTRY, isa)
    if run is None:
        pytest.skip(f"{isa}: compiled; this CPU cannot run it")
    ptr = ctypes.POINTER(ctypes.c_float)
    run.argtypes = [ctypes.c_int, ctypes.c_int, ptr, ctypes.c_int64, ctypes.c_int64, ptr]
    for k in (1, 7, 64, 129):
        for n in (1, 8, 31, 32, 33, 100):
            w = f32(k, n)
            expected = pack_weights(w, _slice_cols(isa))
            for by_rows in (True, False):
                src = np.zeros((k, n + 3), np.float32) if by_rows else np.zeros((n, k + 5), np.float32)
                if by_rows:
                    src[:, :n] = w
                    brs, bcs = n + 3, 1
                else:
                    src[:, :k] = w.T
                    brs, bcs = 1, k + 5
                pack = np.full(expected.shape, np.nan, np.float32)
                run(k, n, src.ctypes.data_as(ptr), brs, bcs, pack.ctypes.data_as(ptr))
                np.testing.assert_array_equal(pack, expected, err_msg=f"k={k} n={n} by_rows={by_rows}")


@pytest.mark.parametrize("m,n,k", [(9, 8, 1), (13, 31, 7), (12, 33, 64), (193, 130, 29), (300, 800, 65),
                                   (7, 64, 64)])
@pytest.mark.parametrize("layout", ["kt", "v", "flat", "broadcast"])
def test_products_of_two_activations_pack_b_per_call(m: int, n: int, k: int, layout: str) -> None:
    """Attention's products (B computed at run time) run the packed kernel over panels packed per
    call: K^T read down its columns, V by rows, B without a batch (folded into M) or broadcast over
    A's batch; several row blocks (M > 192) reuse one packing, several column blocks (N = 800) each
    pack theirs. A product of up to 8 rows with B read by rows stays on af_sgemm's own kernel.
    (7, 64, 64) with its own B per batch is such a product."""
    b = GraphBuilder("act_product")
    x = b.input("x", (3, m, k))
    if layout == "kt":
        other, feed_shape = b.input("y", (3, n, k)), (3, n, k)
        rhs = b.op("Transpose", other, perm=(0, 2, 1))
    else:
        feed_shape = {"v": (3, k, n), "flat": (k, n), "broadcast": (1, k, n)}[layout]
        rhs = other = b.input("y", feed_shape)
    g = b.build([b.op("Relu", b.op("MatMul", x, rhs))])
    code = check(g, {"x": f32(3, m, k), "y": f32(*feed_shape)})
    rows = m if layout in ("kt", "v") else 3 * m  # a B without a batch of its own: the batch folds into M
    small = rows <= 8 and layout != "kt"
    assert ("af_pack_panels(" in code) == (not small) and ("af_sgemm(" in code) == small
    if not small:  # the row blocks of one column block follow each other: a thread packs once per column block
        assert "const int64_t n0 = (t / " in code and "const int64_t m0 = t % " in code


def test_several_products_packed_per_call_in_one_kernel() -> None:
    """A horizontal GEMM whose products each pack their own B per call (3-D weights are not packed
    at build time): each product keeps its own record of the panels it holds."""
    b = GraphBuilder("three")
    x = b.input("x", (2, 16, 32))
    outs = [b.op("MatMul", x, b.const(f32(2, 32, 24))) for _ in range(3)]
    code = check(b.build(outs), {"x": f32(2, 16, 32)}, template="horizontal_gemm")
    assert code.count("af_pack_panels(") == 3 and "packed_key2" in code


TAPS_ENTRY = """void run(int rows, int ow, int pitch, int pstride, int n, int k, int kc, float alpha, const float* a,
                           const int32_t* offs, const float* w, float* c, int ldc) {
    af_sgemm_packed_taps(rows, ow, pitch, pstride, n, k, kc, alpha, a, offs, w, c, ldc);
}"""


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_taps_kernel_cuts_rows_into_blocks_on_edge_widths(tmp_path, isa: str, channels_last: bool) -> None:
    """af_sgemm_packed_taps for each instruction set against numpy: A's element (r, p) of output row
    y, position x at a[(y * pitch + x) * pstride + offs[p]] (offsets of a 3-row, 3-column window over
    rows of ``pitch``; pstride 1 with channel-major planes, or 21 with each position's 17 channels
    together), every row width around the blocks of 6, 12 and 14 (1..15, 25, 28, 42, 56), blocks
    joining the ends of rows (7 rows of 7 on AVX2: blocks of 5 and 6) or, on AVX-512 where a row's
    blocks keep 7 positions or more (7, 11..15, 25, 28, 42, 56; within a row up to 14), within rows;
    K in passes, the compact output at ldc, columns past n untouched."""
    import ctypes

    from autofusion.codegen.gemm import pack_weights

    run = _af_sgemm_library(tmp_path, TAPS_ENTRY, isa)
    if run is None:
        pytest.skip(f"{isa}: compiled; this CPU cannot run it")
    ptr, i32 = ctypes.POINTER(ctypes.c_float), ctypes.c_int
    run.argtypes = [i32, i32, i32, i32, i32, i32, i32, ctypes.c_float, ptr, ctypes.POINTER(ctypes.c_int32), ptr, ptr,
                    i32]
    for ow, rows, n, kc in ((1, 3, 5, 1024), (5, 2, 33, 64), (6, 2, 32, 1024), (7, 3, 17, 40),
                            (11, 1, 40, 1024), (12, 2, 8, 64), (13, 2, 64, 1024), (14, 3, 31, 40),
                            (15, 2, 33, 1024), (25, 2, 70, 1024), (28, 2, 40, 64), (42, 1, 32, 40),
                            (56, 1, 16, 64), (7, 7, 40, 64), (2, 7, 9, 40)):
        pitch, channels = ow + 2, 17
        plane = (rows + 2) * pitch
        pstride, chstride, spot = (21, 1, 21) if channels_last else (1, plane, 1)  # a channel's, a position's step
        slab = f32(max(channels * plane, plane * pstride))
        offs = np.array([ch * chstride + (dy * pitch + dx) * spot for ch in range(channels) for dy in range(3)
                         for dx in range(3)], np.int32)
        k = len(offs)  # 153: two passes of 77 and 76 at kc 64, four of 39, 38, 38, 38 at kc 40
        w = f32(k, n)
        a = np.stack([slab[(y * pitch + x) * pstride + offs] for y in range(rows) for x in range(ow)])  # [rows * ow, k]
        c = np.full((rows * ow, n + 3), np.nan, np.float32)
        packed = pack_weights(w, _slice_cols(isa))  # held: the call reads it
        run(rows, ow, pitch, pstride, n, k, kc, 0.5, slab.ctypes.data_as(ptr),
            offs.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), packed.ctypes.data_as(ptr), c.ctypes.data_as(ptr), n + 3)
        np.testing.assert_allclose(c[:, :n], 0.5 * a @ w, rtol=1e-4, atol=1e-4, err_msg=f"ow={ow} rows={rows} n={n}")
        assert np.isnan(c[:, n:]).all()


@pytest.mark.parametrize("rows", [1024, 1000])
def test_a_transposed_a_whose_rows_alias_in_l1_is_kept_in_panels(rows: int) -> None:
    """A weight gradient's X^T [K x 1,024]: its rows 4 KiB apart all fall in one set of L1, so each
    pass's first slice keeps them in panels the others read (af_sgemm_packed_at); 1,000 rows (4,000
    bytes apart) are read in place. Both against the reference, with K in several passes."""
    b = GraphBuilder("at_b")
    a, w = b.input("a", (300, rows)), b.input("b", (300, 40))
    g = b.build([b.op("Relu", b.op("MatMul", b.op("Transpose", a, perm=(1, 0)), w))])
    code = check(g, {"a": f32(300, rows) / 4, "b": f32(300, 40) / 4})  # sums of about 1: float32's error stays small
    assert ("af_sgemm_packed_at(" in code) == (rows == 1024)
