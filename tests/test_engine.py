"""The engine: rewrites by equality saturation, fusion rules to permissions, bounds, the API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autofusion.api import optimize
from autofusion.dsl import load_rules
from autofusion.engine import Limits, fusion_space, saturate_rewrites
from autofusion.ir import DType, Graph, GraphBuilder, run_graph, verify
from autofusion.ops import default_registry

RULES = """
class compute = pointwise | reduction | opaque
## GELU as the exporters write it
rewrite gelu_erf: Mul(Mul(x, 0.5), Add(Erf(Div(x, 1.4142135)), 1.0)) => Gelu(x)
rewrite double_neg: Neg(Neg(x)) => x
fuse epilogue: pointwise into producer compute
fuse prologue: pointwise into consumer reduction
fuse qkv: branch x { MatMul(x, wq), MatMul(x, wk), MatMul(x, wv) } -> template "horizontal_gemm" where const(wq) and const(wk) and const(wv)
nofuse keep_exp: Exp
"""


@pytest.fixture()
def rules(tmp_path: Path):
    path = tmp_path / "t.fuse"
    path.write_text(RULES)
    return load_rules([path])


def _gelu_graph():
    rng = np.random.default_rng(0)
    b = GraphBuilder("g")
    x = b.input("x", (4, 8), DType.FLOAT32)
    m = b.op("MatMul", x, b.const(rng.standard_normal((8, 8)).astype(np.float32)))
    d = b.op("Div", m, b.const(np.float32(1.4142135)))
    a = b.op("Add", b.op("Erf", d), b.const(np.float32(1.0)))
    y = b.op("Mul", b.op("Mul", m, b.const(np.float32(0.5))), a)
    return b.build([b.op("Neg", b.op("Neg", y))])


def test_rewrites_saturate_and_extract_a_smaller_equivalent_graph(rules) -> None:
    g = _gelu_graph()
    result = saturate_rewrites(g, rules, default_registry())
    new = verify(result.graph)
    assert [n.op for n in new.nodes] == ["MatMul", "Gelu"]
    assert result.report.fired == {"gelu_erf": 1, "double_neg": 1}
    assert result.report.stop == "saturated"
    assert any("gelu_erf" in r for r in result.provenance.values())
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    out = g.outputs[0]
    assert new.outputs == g.outputs
    np.testing.assert_allclose(run_graph(new, {"x": x})[out], run_graph(g, {"x": x})[out], rtol=1e-5, atol=1e-6)


def _gelu_tanh_written(flips: tuple[int, ...]) -> Graph:
    """GPT-2's GELU (six commutative ops), each op's operands in the order ``flips`` says: 0 as the
    shipped rule writes them, 1 swapped (torch writes mul(0.5, x), add(1.0, tanh(...)))."""
    b = GraphBuilder("gelu_tanh")
    x = b.op("Relu", b.input("x", (4, 8)))

    def op(name: str, flip: int, left: str, right: str) -> str:
        return b.op(name, right, left) if flip else b.op(name, left, right)

    def c(v: float) -> str:
        return b.const(np.array(v, np.float32))

    inner = op("Add", flips[1], x, op("Mul", flips[0], b.op("Pow", x, c(3.0)), c(0.044715)))
    t = b.op("Tanh", op("Mul", flips[2], inner, c(0.7978845608028654)))
    return b.build([op("Mul", flips[5], op("Mul", flips[4], x, c(0.5)), op("Add", flips[3], t, c(1.0)))])


@pytest.mark.parametrize("flips", [(0,) * 6, (1,) * 6, (1, 0, 1, 1, 1, 0), (0, 1, 0, 0, 0, 1), (1, 1, 0, 1, 0, 1)])
def test_a_pattern_of_many_commutative_ops_matches_its_constants_on_either_side(flips: tuple[int, ...]) -> None:
    """A pattern with more commutative ops than get both argument orders (MAX_SWAPPABLE) still
    matches a scalar constant on either side: the encoder puts a commutative op's scalar constant
    second, where the pattern looks for it, and the ops without a literal take both orders. The
    GELU of a torch export (constants first) was left in primitives, apart from its GEMM."""
    from autofusion.api import load_ruleset

    g = _gelu_tanh_written(flips)
    result = saturate_rewrites(g, load_ruleset(None), default_registry())
    assert result.report.fired.get("gelu_tanh") == 1
    assert "Gelu" in [n.op for n in result.graph.nodes]
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    out = g.outputs[0]
    np.testing.assert_allclose(run_graph(result.graph, {"x": x})[out], run_graph(g, {"x": x})[out], rtol=1e-5,
                               atol=1e-6)


def test_literal_mismatch_does_not_rewrite(rules) -> None:
    b = GraphBuilder("g")
    x = b.input("x", (4, 8))
    d = b.op("Div", x, b.const(np.float32(2.0)))  # not sqrt(2): not GELU
    a = b.op("Add", b.op("Erf", d), b.const(np.float32(1.0)))
    y = b.op("Mul", b.op("Mul", x, b.const(np.float32(0.5))), a)
    g = b.build([y])
    result = saturate_rewrites(g, rules, default_registry())
    assert result.graph is g and not result.report.fired


def test_saturation_bounds_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "grow.fuse"
    path.write_text("rewrite comm: Add(a, b) => Add(b, a)\nrewrite assoc: Add(Add(a, b), c) <=> Add(a, Add(b, c))\n")
    rs = load_rules([path])
    b = GraphBuilder("chain")
    t = b.input("x", (4,))
    for i in range(8):
        t = b.op("Add", t, b.input(f"y{i}", (4,)))
    g = b.build([t])
    result = saturate_rewrites(g, rs, default_registry(), Limits(iterations=3, enodes=10**9, seconds=60))
    assert result.report.stop == "iterations" and result.report.iterations == 3
    verify(result.graph)
    small = saturate_rewrites(g, rs, default_registry(), Limits(iterations=100, enodes=500, seconds=60))
    assert small.report.stop == "enodes"
    feeds = {n: np.random.default_rng(0).standard_normal(4).astype(np.float32) for n in g.inputs}
    np.testing.assert_allclose(run_graph(small.graph, feeds)[t], run_graph(g, feeds)[t], rtol=1e-5)


def test_fusion_space_permissions_guards_and_nofuse(rules) -> None:
    rng = np.random.default_rng(0)
    b = GraphBuilder("attn")
    x = b.input("x", (8, 16))
    outs = [b.op("MatMul", x, b.const(rng.standard_normal((16, 16)).astype(np.float32)), name=f"mm{i}")
            for i in range(3)]
    nonconst = b.op("MatMul", x, b.input("w", (16, 16)), name="mm_dynamic")
    s = b.op("Add", b.op("Add", outs[0], outs[1], name="add0"), outs[2], name="add1")
    e = b.op("Exp", b.op("Add", s, nonconst, name="add2"), name="exp")
    g = b.build([b.op("Relu", e, name="relu")])
    space, report = fusion_space(g, rules, default_registry())
    assert ("mm0", "add0") in space.edges
    assert {("mm0", "mm1"), ("mm0", "mm2"), ("mm1", "mm2")} <= set(space.siblings)
    assert not any("mm_dynamic" in pair for pair in space.siblings)  # guard: weights must be constant
    assert space.nofuse == frozenset({"exp"})
    assert ("add2", "exp") not in space.edges and ("exp", "relu") not in space.edges
    assert report.fired["qkv"] >= 3


def test_optimize_plans_are_legal_and_name_their_rules(rules) -> None:
    from autofusion.models import build, random_inputs

    g = build("bert-tiny")
    plan = optimize(g, rules)
    assert plan.kernels < plan.stats["kernels_source"]
    templates = {grp.template for grp in plan.groups}
    assert {"gemm_epilogue", "horizontal_gemm"} <= templates
    for grp in plan.groups:
        if grp.fused:
            assert grp.rules and all(r.line > 0 and r.file.endswith("t.fuse") for r in grp.rules)
    feeds = random_inputs(g)
    ref, new = run_graph(g, feeds), run_graph(plan.graph, feeds)
    for name in g.outputs:
        np.testing.assert_allclose(new[name], ref[name], rtol=1e-4, atol=1e-5)


def test_only_the_engine_imports_egglog() -> None:
    code = ("import sys, autofusion, autofusion.dsl, autofusion.decide, autofusion.ir, autofusion.models; "
            "autofusion.dsl.load_rules(); assert 'egglog' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    root = Path(__file__).resolve().parent.parent / "autofusion"
    importers = {p.relative_to(root).parts[0] for p in root.rglob("*.py") if "import egglog" in p.read_text()
                 or "from egglog" in p.read_text()}
    assert importers == {"engine"}


def test_patterns_check_the_input_count_of_variadic_ops(tmp_path: Path) -> None:
    path = tmp_path / "sum.fuse"
    path.write_text("rewrite sum2: Sum(x, y) => Add(x, y)\n")
    rules = load_rules([path])
    b = GraphBuilder("sums")
    x, y, z = (b.input(n, (4,), DType.FLOAT32) for n in "xyz")
    two = b.op("Sum", x, y)
    three = b.op("Sum", x, y, z)
    g = b.build([b.op("Mul", two, three)])
    out = saturate_rewrites(g, rules, default_registry())
    assert sorted(n.op for n in out.graph.nodes) == ["Add", "Mul", "Sum"]  # three inputs are not two
    b = GraphBuilder("sum3")
    x, y, z = (b.input(n, (4,), DType.FLOAT32) for n in "xyz")
    alone = b.build([b.op("Sum", x, y, z)])
    assert saturate_rewrites(alone, rules, default_registry()).report.fired == {}
    feeds = {n: np.arange(4, dtype=np.float32) + i for i, n in enumerate("xyz")}
    np.testing.assert_allclose(run_graph(out.graph, feeds)[g.outputs[0]], run_graph(g, feeds)[g.outputs[0]])


def test_compiled_patterns_never_name_the_shared_nil(rules) -> None:
    """Naming ``(Nil)`` let egglog's planner join every one-element argument list with every other
    (a 3,000-op graph took minutes); the input count is checked on ``Op`` instead."""
    from autofusion.engine.match import PatternCompiler

    compiled = PatternCompiler(rules, default_registry()).compile(rules.rewrites[0].lhs, "r", "rs", "gelu")
    assert "Nil" not in compiled.program
    assert '(Op "Erf" ' in compiled.program and " 1))" in compiled.program


def test_prepared_sessions_are_reused_and_left_as_prepared(rules) -> None:
    from autofusion.engine import egraph

    egraph._prepared_here().clear()
    g = _gelu_graph()
    first = optimize(g, rules)
    assert len(egraph._prepared_here()) == 2  # one for the rewrites, one for the fusion rules
    sessions = dict(egraph._prepared_here())
    sizes = {k: s.size() for k, s in sessions.items()}
    second = optimize(g, rules)
    assert egraph._prepared_here() == sessions  # the same sessions, lent again
    assert {k: s.size() for k, s in sessions.items()} == sizes  # each use popped what it added
    assert [sorted(gr.nodes) for gr in first.groups] == [sorted(gr.nodes) for gr in second.groups]
    assert first.stats["saturation"] == {**second.stats["saturation"], "seconds": first.stats["saturation"]["seconds"]}


def test_a_prepared_session_that_failed_is_not_lent_again() -> None:
    from autofusion.engine import egraph

    egraph._prepared_here().clear()
    prelude = "(datatype E (N i64))"
    with pytest.raises(egraph.EgglogError):
        with egraph.prepared_session(prelude) as s:
            s.run("(this is not egglog)")
    assert not egraph._prepared_here()
    with egraph.prepared_session(prelude) as s:
        s.run("(N 1)")
    assert len(egraph._prepared_here()) == 1


def test_programs_are_split_into_top_level_forms_for_egglog() -> None:
    """egglog parses a long program super-linearly (the rule library at once: 0.44 s, 490 MB kept):
    sessions hand it a few top-level forms at a time, which must be split exactly."""
    from autofusion.engine.egraph import EggSession, top_level_forms

    text = '(a "x)(\\" ;" b) ; (not a form)\n(d (e ")")) ;; ((\n(f)'
    assert top_level_forms(text) == ['(a "x)(\\" ;" b)', '(d (e ")"))', "(f)"]
    assert top_level_forms("(g (h)") == ["(g (h)"]  # unbalanced: passed on for egglog to report
    s = EggSession()
    program = "(datatype E (N i64) (Add E E))\n" + "\n".join(f"(let $e{i} (Add (N {i}) (N {i + 1})))" for i in range(40))
    s.run(program)
    assert s.size() == 40 + 41  # 40 Add terms over 41 distinct N leaves: every form ran


def test_every_thread_gets_its_own_prepared_sessions(rules) -> None:
    """egglog's EGraph belongs to the thread that made it: a session prepared in one thread must
    never be lent to another (it panicked), nor dropped there."""
    import threading

    g = _gelu_graph()
    first = optimize(g, rules)  # prepares sessions in this thread
    results: list[object] = []

    def work() -> None:
        try:
            results.append(optimize(g, rules))
        except BaseException as e:  # a panic is a BaseException: catch it to fail the test, not the thread
            results.append(e)

    for _ in range(2):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert all(not isinstance(r, BaseException) for r in results), results
    assert all([sorted(gr.nodes) for gr in r.groups] == [sorted(gr.nodes) for gr in first.groups]
               for r in results)  # type: ignore[attr-defined]


def test_strings_reach_egglog_as_utf8() -> None:
    from autofusion.engine.egraph import EggSession
    from autofusion.engine.encode import quote

    text = 'tmpé/ü "q" back\\slash'
    s = EggSession()
    s.run("(datatype E (S String))\n(let $x (S " + quote(text) + "))")
    assert s.size() == 1
