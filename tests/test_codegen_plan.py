"""Plan-level code generation: errors that name the group, op and rule; safe names; the buffer
planner; SuperKernel structure."""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import pytest
from class_planner import greedy_plan
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.codegen import CodegenError, TemplateSet, c_comment, c_ident, plan_buffers, render_group, render_plan
from autofusion.codegen.buffers import Interval, best_fit
from autofusion.codegen.ctype import literal
from autofusion.codegen.index import reshape
from autofusion.codegen.names import NameTable
from autofusion.decide import build_groups, unfused_plan
from autofusion.decide.plan import ZERO_COST, Plan, RuleRef
from autofusion.ir import DType, Graph, GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, UnfusedRunner, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
RULE = RuleRef("my_rule", "rules/mine.fuse", 12)


def one_group(g: Graph, template: str, rules: tuple[RuleRef, ...] = (RULE,)) -> Plan:
    groups = build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: template, rules_of=lambda ns: rules)
    return Plan(g, groups, ZERO_COST, ZERO_COST)


def small_graph() -> Graph:
    b = GraphBuilder("small")
    x = b.input("x", (4, 8))
    return b.build([b.op("Relu", b.op("MatMul", x, b.const(np.ones((8, 8), np.float32))))])


# -- errors -----------------------------------------------------------------------------------------


def test_unknown_template_names_group_and_rule() -> None:
    with pytest.raises(CodegenError, match=r"group 'k0_matmul_relu'.*my_rule \(rules/mine.fuse:12\).*unknown template"):
        render_plan(one_group(small_graph(), "fancy"))


def test_op_a_template_cannot_compute_names_the_op() -> None:
    with pytest.raises(CodegenError, match=r"my_rule.*node 'matmul_\d+' \(MatMul\): op MatMul cannot be computed by the 'pointwise'"):
        render_plan(one_group(small_graph(), "pointwise"))


@pytest.mark.parametrize("template,message", [
    ("horizontal_gemm", "needs MatMul or Gemm"), ("opaque", "renders one op"), ("view", "only view ops"),
    ("conv_epilogue", "needs a Conv"),
])
def test_template_misuse(template: str, message: str) -> None:
    b = GraphBuilder("two")
    x = b.input("x", (4, 8))
    g = b.build([b.op("Tanh", b.op("Relu", x))])
    with pytest.raises(CodegenError, match=message):
        render_plan(one_group(g, template))


def test_unsupported_dtype_is_a_codegen_error() -> None:
    b = GraphBuilder("half")
    x = b.input("x", (4,), DType.FLOAT16)
    g = b.build([b.op("Relu", x)])
    with pytest.raises(CodegenError, match="float16"):
        render_plan(unfused_plan(g))


# -- names and comments ---------------------------------------------------------------------------


@given(st.text(max_size=80))
@settings(max_examples=300, deadline=None)
def test_identifiers_are_safe_and_comments_cannot_break_out(text: str) -> None:
    ident = c_ident(text)
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident)
    assert len(ident) <= 64
    comment = c_comment(text)
    assert comment.startswith("/* ") and comment.endswith(" */")
    assert "*/" not in comment[3:-3] and "/*" not in comment[3:-3] and "\n" not in comment and "??" not in comment


@given(st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=20, unique=True))
def test_distinct_names_get_distinct_identifiers(names: list[str]) -> None:
    table = NameTable()
    idents = [table(n) for n in names]
    assert len(set(idents)) == len(names)
    assert [table(n) for n in names] == idents  # stable


@given(st.floats(allow_nan=False, width=32))
def test_float_literals_are_exact(value: float) -> None:
    text = literal(value, DType.FLOAT32).strip("()").rstrip("f")
    if "INFINITY" in text:
        assert np.isinf(value)
    else:
        assert np.float32(float(text)) == np.float32(value)


EVIL = 'x*/ system("rm -rf /"); /*'


def test_hostile_names_render_as_identifiers_compile_and_run() -> None:
    b = GraphBuilder("evil */ graph")
    x = b.input(EVIL, (3, 4))
    y = b.input("a\nb", (4,))
    h = b.op("Add", x, y, name="n*/ int pwned; /*")
    out = b.op("Mul", h, b.const(np.float32(3.0), name="c??=\\"), name="line\nbreak")
    g = b.build([b.op("Relu", out, name="#include <stdio.h>")])
    plan = one_group(g, "pointwise", (RuleRef('r */ evil(); /*', "f\n*/.fuse", 1),))
    model = CompiledModel(plan, cache=CACHE)
    text = model.source.text
    code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # outside comments no user text survives unescaped
    assert "/*" not in code and "*/" not in code
    code = re.sub(r"^#include \"af_runtime.h\"$", "", code, flags=re.M)
    assert 'system("' not in code and "pwned" not in code and "#include" not in code and "??=" not in code
    feeds = {EVIL: np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32),
             "a\nb": np.ones(4, np.float32)}
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    unfused = UnfusedRunner(g, cache=CACHE).run(feeds)
    assert compare_outputs(run_graph(g, feeds), unfused).ok


def test_group_comment_names_rules_with_file_and_line() -> None:
    kernel = render_group(small_graph(), one_group(small_graph(), "gemm_epilogue").groups[0], TemplateSet())
    assert kernel is not None
    assert "/* rules: my_rule (rules/mine.fuse:12) */" in kernel.code


# -- reshape index mapping ------------------------------------------------------------------------


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
@settings(max_examples=60, deadline=None)
def test_reshape_index_mapping_matches_numpy(in_shape: list[int], data: st.DataObject) -> None:
    total = int(np.prod(in_shape))
    factors = [d for d in range(1, total + 1) if total % d == 0]
    out_shape: list[int] = []
    rest = total
    while rest > 1 and len(out_shape) < 4:
        d = data.draw(st.sampled_from([f for f in factors if rest % f == 0]))
        out_shape.append(d)
        rest //= d
    out_shape.append(rest)
    x = np.arange(total).reshape(in_shape)
    y = x.reshape(out_shape)
    names = [f"i{d}" for d in range(len(out_shape))]
    mapping = reshape(tuple(names), out_shape, in_shape)
    for flat in range(total):
        at = np.unravel_index(flat, out_shape)
        env = dict(zip(names, (int(a) for a in at)))
        src = tuple(eval(e.replace("/", "//"), {}, env) for e in mapping)  # noqa: S307 (our own expressions)
        assert x[src] == y[tuple(at)]


# -- buffer planner -------------------------------------------------------------------------------


def test_chain_reuses_two_buffers_and_views_alias() -> None:
    b = GraphBuilder("chain")
    t = b.input("x", (32, 32))
    for op in ("Relu", "Neg", "Exp", "Tanh", "Abs"):
        t = b.op(op, t)
    v = b.op("Reshape", t, b.const(np.array([1024], np.int64)))
    g = b.build([b.op("Sigmoid", v)])
    plan = unfused_plan(g)
    buffers = plan_buffers(plan, {})
    nbytes = 32 * 32 * 4
    assert buffers.workspace_bytes == 2 * nbytes  # ping-pong between two blocks
    assert buffers.placements[v].kind == "alias" and buffers.placements[v].base == t
    model = CompiledModel(plan, cache=CACHE)
    assert model.peak_bytes == 2 * nbytes
    feeds = {"x": np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)}
    assert compare_outputs(run_graph(g, feeds), model.run(feeds)).ok


def test_a_view_returned_as_an_output_is_computed_in_the_output_array() -> None:
    """A forward graph of training returns reshaped activations: the activation is computed
    straight into the output's array (no copy), still read from there by the next kernels. A second
    output viewing the same tensor, and a view of a graph input, are copied."""
    b = GraphBuilder("saved")
    x = b.input("x", (16, 24))
    h = b.op("Tanh", b.op("Relu", x))
    v = b.op("Reshape", h, b.const(np.array([384], np.int64)))
    w = b.op("Reshape", h, b.const(np.array([24, 16], np.int64)))
    xv = b.op("Reshape", x, b.const(np.array([384], np.int64)))
    g = b.build([v, b.op("Exp", h), w, xv])
    plan = unfused_plan(g)
    buffers = plan_buffers(plan, {})
    assert buffers.placements[h].kind == "output" and buffers.placements[h].index == 0
    copied = sorted(out for copies in buffers.view_copies.values() for _, out in copies)
    assert copied == [2, 3]  # the second view of h, the view of the input
    model = CompiledModel(plan, cache=CACHE)
    feeds = {"x": np.random.default_rng(2).standard_normal((16, 24)).astype(np.float32)}
    assert compare_outputs(run_graph(g, feeds), model.run(feeds)).ok
    assert model.peak_bytes == g.types[h].nbytes  # only the Relu result: h lives in the output array


@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 6)), min_size=1, max_size=40))
def test_best_fit_never_overlaps_live_blocks(specs: list[tuple[int, int, int]]) -> None:
    blocks = [Interval(f"b{i}", n, s, s + d) for i, (n, s, d) in enumerate(specs)]
    offsets, peak = best_fit(blocks)
    for i, a in enumerate(blocks):
        assert offsets[a.name] % 64 == 0 and offsets[a.name] + a.nbytes <= peak
        for c in blocks[i + 1:]:
            if a.start <= c.end and c.start <= a.end:
                oa, oc = offsets[a.name], offsets[c.name]
                assert oa + a.nbytes <= oc or oc + c.nbytes <= oa
    assert peak <= sum(-(-n // 64) * 64 for n, _, _ in specs)


def test_model_plan_workspace_is_smaller_than_all_intermediates() -> None:
    from autofusion.models import build

    g = build("bert-tiny")
    plan = greedy_plan(g)
    buffers = plan_buffers(plan, {})
    intermediates = [p for p in buffers.placements.values() if p.kind == "workspace"]
    assert buffers.workspace_bytes < sum(p.nbytes for p in intermediates)
    steps = {t: i for i, grp in enumerate(plan.groups) for t in grp.outputs}
    users: dict[str, int] = {}
    for i, grp in enumerate(plan.groups):
        for t in grp.inputs:
            users[t] = i
    for a in intermediates:  # tensors alive at the same step never share bytes
        for c in intermediates:
            if a.tensor < c.tensor and steps[a.tensor] <= users.get(c.tensor, steps[c.tensor]) and \
                    steps[c.tensor] <= users.get(a.tensor, steps[a.tensor]):
                assert a.index + a.nbytes <= c.index or c.index + c.nbytes <= a.index


def test_outputs_that_alias_inputs_or_repeat_are_copied() -> None:
    b = GraphBuilder("copies")
    x = b.input("x", (2, 3))
    r = b.op("Reshape", x, b.const(np.array([3, 2], np.int64)))
    y = b.op("Relu", x)
    g = b.build([r, y, y, x])
    model = CompiledModel(greedy_plan(g), cache=CACHE)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2}
    out = model.run(feeds)
    np.testing.assert_array_equal(out[r], feeds["x"].reshape(3, 2))
    np.testing.assert_array_equal(out[x], feeds["x"])
    np.testing.assert_array_equal(out[y], np.maximum(feeds["x"], 0))


def test_graph_without_nodes_and_zero_sized_reductions() -> None:
    b = GraphBuilder("identity")
    x = b.input("x", (3,))
    g = b.build([x])
    feeds = {"x": np.arange(3, dtype=np.float32)}
    for runner in (CompiledModel(unfused_plan(g), cache=CACHE), UnfusedRunner(g, cache=CACHE)):
        out = runner.run(feeds)[x]
        np.testing.assert_array_equal(out, feeds["x"])
        assert out is not feeds["x"]
    b = GraphBuilder("zero")
    z = b.input("z", (0, 4))
    g = b.build([b.op("Softmax", z), b.op("ReduceSum", z, b.const(np.array([0], np.int64)), keepdims=0)])
    feeds = {"z": np.zeros((0, 4), np.float32)}
    assert compare_outputs(run_graph(g, feeds), CompiledModel(greedy_plan(g), cache=CACHE).run(feeds)).ok


def test_profiling_build_clocks_every_group_and_computes_the_same() -> None:
    import time

    from autofusion import models
    from autofusion.api import optimize
    from autofusion.models.inputs import random_inputs
    from autofusion.runtime import RunError

    g = models.build("bert-tiny")
    plan = optimize(g)
    feeds = random_inputs(g, seed=0)
    plain, profiled = CompiledModel(plan, cache=CACHE), CompiledModel(plan, cache=CACHE, profile=True)
    assert plain.library_path != profiled.library_path  # the profiling build is its own library
    expected = plain.run(feeds)
    start = time.perf_counter()
    got = profiled.run(feeds)
    wall = time.perf_counter() - start
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value)
    steps = profiled.step_seconds()
    assert list(steps) == [gr.name for gr in plan.groups]
    assert all(s >= 0 for s in steps.values()) and 0 < sum(steps.values()) <= wall
    with pytest.raises(RunError, match="profiling build"):
        plain.step_seconds()


def test_profiling_build_of_a_plan_without_kernels() -> None:
    b = GraphBuilder("identity")
    x = b.input("x", (3,))
    g = b.build([x])
    model = CompiledModel(greedy_plan(g), cache=CACHE, profile=True)
    np.testing.assert_array_equal(model.run({"x": np.arange(3, dtype=np.float32)})["x"], np.arange(3))
    assert model.step_seconds() == {}


def test_a_profiling_build_times_a_sub_microsecond_step() -> None:
    """A step of a few nanoseconds reads as more than zero: the clock is read in whole nanoseconds
    (seconds since 1970 as a double keep ~0.2 us, and a 1 x 64 @ 64 x 10 product read as 0)."""
    b = GraphBuilder("tiny")
    x = b.input("x", (4,))
    g = b.build([b.op("Relu", x)])
    model = CompiledModel(greedy_plan(g), cache=CACHE, profile=True)
    feeds = {"x": np.arange(4, dtype=np.float32)}
    readings = []
    for _ in range(50):
        model.run(feeds)
        readings += list(model.step_seconds().values())
    assert len(readings) == 50 and all(0 < s < 1e-3 for s in readings), sorted(readings)[:5]
