"""A GEMM's epilogue stores what only moves its product where the moves put each element
(codegen/scatter.py): a training graph's Q, K and V split into heads and transposed from one QKV
product, kept for the backward, with no split or transpose kernel after the product."""

from __future__ import annotations

import itertools
import os
import tempfile

import numpy as np
import pytest

from autofusion.api import optimize
from autofusion.codegen.scatter import landing, source_of
from autofusion.codegen.triton import tindex
from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.ops.catalog import default_registry
from autofusion.runtime import CompiledModel, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")


def heads_graph(batch: int, tokens: int, heads: int, dims: int, gemm: bool = False) -> Graph:
    """x @ w + b split into Q, K, V heads as PyTorch's attention writes it: Q and V [batch, heads,
    tokens, dims], K transposed to [batch, heads, dims, tokens] (q @ k.transpose(-1, -2)); with
    ``gemm``, the product and its bias one Gemm (GPT-2's export)."""
    b = GraphBuilder("qkv_heads")
    width = heads * dims
    x = b.input("x", (batch * tokens, width))
    w, bias = b.input("w", (width, 3 * width)), b.input("b", (3 * width,))  # parameters: run-time inputs
    product = b.op("Gemm", x, w, bias) if gemm else b.op("Add", b.op("MatMul", x, w), bias)
    y = b.op("Reshape", product, b.const(np.array([batch, tokens, 3 * width])))
    parts = b.op_multi("Split", [y, b.const(np.array([width] * 3))], 3, axis=-1)
    outs = []
    for i, part in enumerate(parts):
        h = b.op("Reshape", part, b.const(np.array([batch, tokens, heads, dims])))
        outs.append(b.op("Transpose", h, perm=(0, 2, 3, 1) if i == 1 else (0, 2, 1, 3)))
    return b.build(outs)


def feeds_of(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t: rng.standard_normal(g.types[t].shape).astype(np.float32) for t in g.inputs}


def one_kernel_code(g: Graph, seed: int) -> str:
    """The C of ``g`` compiled as one gemm_epilogue kernel, its outputs checked against the reference."""
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "gemm_epilogue"),
                ZERO_COST, ZERO_COST)
    model = CompiledModel(plan, cache=CACHE)
    feeds = feeds_of(g, seed)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    return "\n".join(k.code for k in model.source.kernels)


def test_landing_puts_every_element_where_the_ops_do() -> None:
    """Every element of the product lands in exactly one head, at the place the reference's split,
    reshapes and transposes put it (the index expressions evaluated in Python)."""
    g = heads_graph(batch=2, tokens=3, heads=2, dims=5)
    members = frozenset(n.name for n in g.nodes)
    product = next(n for n in g.nodes if n.op == "Add").outputs[0]
    rows, cols = g.types[product].shape
    value = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)  # each element numbered
    heads = np.split(value.reshape(2, 3, cols), 3, axis=-1)
    expected = [h.reshape(2, 3, 2, 5).transpose(p) for h, p in zip(heads, [(0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3)])]
    got = [np.full(e.shape, -1.0, np.float32) for e in expected]
    reg = default_registry()
    for out, target in zip(got, g.outputs):
        assert source_of(g, members, target, reg) == product
        land = landing(g, members, product, target, ("i0", "i1"), reg, reshape=tindex.reshape)
        assert land is not None
        for i0, i1 in itertools.product(range(rows), range(cols)):
            env = {"i0": i0, "i1": i1}
            if all(eval(c, {}, env) for c in land.conditions()):
                flat = eval(tindex.linear(land.index, out.shape), {}, env)
                assert out.flat[flat] == -1.0  # no element lands twice
                out.flat[flat] = value[i0, i1]
    for g_out, e in zip(got, expected):
        np.testing.assert_array_equal(g_out, e)


def test_landing_refuses_what_is_not_only_moves() -> None:
    b = GraphBuilder("not_moves")
    x = b.input("x", (4, 6))
    y = b.op("MatMul", x, b.input("w", (6, 8)))
    stepped = b.op("Slice", y, b.const(np.array([0])), b.const(np.array([8])), b.const(np.array([1])),
                   b.const(np.array([2])))
    g = b.build([b.op("Relu", y), stepped])
    members = frozenset(n.name for n in g.nodes)
    reg = default_registry()
    assert landing(g, members, y, stepped, ("i0", "i1"), reg) is None  # a slice of step 2
    assert source_of(g, members, g.outputs[0], reg) == g.outputs[0]  # Relu computes: not a move


@pytest.mark.parametrize("batch,tokens,heads,dims", [
    (8, 64, 4, 64),  # the training encoder's heads: splits on tile boundaries
    (3, 7, 3, 5),  # odd sizes: each split boundary falls inside a tile
    (6, 50, 5, 40),  # 300 rows: several row tiles
])
def test_the_heads_are_stored_by_the_products_epilogue(batch: int, tokens: int, heads: int, dims: int) -> None:
    g = heads_graph(batch, tokens, heads, dims)
    plan = optimize(g)
    kernels = [grp for grp in plan.groups if grp.template != "view"]
    assert len(kernels) == 1 and kernels[0].template == "gemm_epilogue", [k.nodes for k in kernels]
    model = CompiledModel(plan, cache=CACHE)
    feeds = feeds_of(g)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    code = "\n".join(k.code for k in model.source.kernels)
    width = heads * dims
    for lo in (0, 2 * width):  # Q's and V's heads stored from their columns of each tile
        assert f"/* columns {lo}..{lo + width} of the product */" in code
    # K^T's: a tile row would land a row of K^T apart per element, so it is written after the tiles
    assert f"/* columns {width}..{2 * width} of the product */" not in code and "scratch +" in code


def test_a_move_the_tiles_cannot_store_is_computed_after_them() -> None:
    """A slice of step 2 does not land in a tile: it is computed from the full product, as before."""
    b = GraphBuilder("stepped")
    x = b.input("x", (40, 24))
    y = b.op("Add", b.op("MatMul", x, b.input("w", (24, 30))), b.input("b", (30,)))
    stepped = b.op("Slice", y, b.const(np.array([1])), b.const(np.array([30])), b.const(np.array([1])),
                   b.const(np.array([2])))
    moved = b.op("Transpose", b.op("Reshape", y, b.const(np.array([40, 3, 10]))), perm=(1, 2, 0))
    code = one_kernel_code(b.build([stepped, moved]), seed=1)
    assert "scratch +" in code  # the stepped slice: from the product kept in scratch


def test_a_gemm_s_bias_is_added_once_when_heads_scatter_beside_a_late_one() -> None:
    """A Gemm's C is added to the product in place where the full product is kept (K^T is written
    after the tiles from it): Q's and V's stores read the tile before that, or they added it twice."""
    code = one_kernel_code(heads_graph(batch=2, tokens=24, heads=2, dims=16, gemm=True), seed=2)
    assert "/* columns 0..32 of the product */" in code and "scratch +" in code  # scattered and late, both


def test_triton_stores_the_heads_from_its_tiles() -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("torch", exc_type=ImportError)
    pytest.importorskip("triton", exc_type=ImportError)
    from autofusion.runtime.triton_runner import TritonModel

    g = heads_graph(batch=3, tokens=7, heads=3, dims=5)
    plan = optimize(g)
    model = TritonModel(plan, fallback=False)
    feeds = feeds_of(g)
    got, want = model(feeds), run_graph(g, feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)
    assert any("tl.dot(" in k.source for k in model.kernels)
