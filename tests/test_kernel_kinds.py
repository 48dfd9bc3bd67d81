"""Kernel kinds as one registry, and the rule's clauses taking effect: the template a rule names
renders its groups, its params reach the renderer (and the checker validates them), its priority
picks the kind and breaks cost ties in every strategy."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autofusion.api import optimize
from autofusion.codegen import CodegenError, c_kinds, render_group, render_plan
from autofusion.codegen.templates import default_templates
from autofusion.codegen.triton import triton_kinds
from autofusion.decide.explain import explain_report
from autofusion.decide.plan import Plan
from autofusion.dsl import analyze_text
from autofusion.editors.vocabulary import templates as vocabulary_templates
from autofusion.graph.graph import FrozenMap
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.kinds import ACCEPT, GroupFacts, KernelKind, KindError, KindRegistry, ParamSpec, default_kinds
from autofusion.runtime import CompiledModel
from autofusion.viz import plan_dot


def add_relu() -> Graph:
    b = GraphBuilder("add_relu")
    x = b.input("x", (4, 64))
    y = b.op("Relu", b.op("Add", x, b.const(np.linspace(-1, 1, 64, dtype=np.float32), "bias")))
    return b.build([y])


def matmul_relu(m: int = 64, n: int = 256) -> Graph:
    b = GraphBuilder("matmul_relu")
    x = b.input("x", (m, 48))
    w = b.const(np.random.default_rng(0).standard_normal((48, n)).astype(np.float32), "w")
    return b.build([b.op("Relu", b.op("MatMul", x, w))])


def plan_with(tmp_path: Path, graph: Graph, rules: str, **kwargs: Any) -> Plan:
    path = tmp_path / "rules.fuse"
    path.write_text(rules)
    return optimize(graph, [path], **kwargs)


def fused(plan: Plan) -> list[Any]:
    return [g for g in plan.groups if g.fused]


def c_source(plan: Plan) -> str:
    return "\n".join(text for _, text in render_plan(plan).units)


# -- the registry -------------------------------------------------------------------------------------


def test_every_builtin_kind_is_one_object_read_by_every_stage() -> None:
    kinds = default_kinds()
    assert set(kinds.names()) == {"pointwise", "reduction", "gemm_epilogue", "conv_epilogue", "horizontal_gemm",
                                  "multi_output", "lstm_scan", "opaque", "view"}
    for kind in kinds:
        assert kind.summary and kind.colour.startswith("#")
        c = kind.renderers["c"]
        assert isinstance(c, str) and c.startswith("autofusion.codegen.")  # the renderer lives in codegen
        assert callable(kind.renderer("c"))
    assert set(c_kinds()) == set(kinds.names())
    assert set(triton_kinds()) == {"pointwise", "reduction", "multi_output", "gemm_epilogue", "horizontal_gemm",
                                   "conv_epilogue", "lstm_scan", "opaque"}
    assert all(str(kinds[k].renderers["triton"]).startswith("autofusion.codegen.triton.") for k in triton_kinds())
    # the editors' vocabulary and the rule checker read the same list (views are no rule's kind)
    assert set(vocabulary_templates()) == set(kinds.names()) - {"view"}
    assert importlib.util.find_spec("autofusion.dsl.templates") is None


def test_registry_refuses_duplicates_and_names_the_known_kinds() -> None:
    kinds = default_kinds()
    with pytest.raises(KindError, match="two kernel kinds are named 'pointwise'"):
        kinds.extended([kinds["pointwise"]])
    with pytest.raises(KindError, match="unknown kernel kind 'nope'.*pointwise"):
        kinds["nope"]
    assert kinds.colour("someone_elses").startswith("#")


def test_param_specs_check_type_and_range() -> None:
    spec = ParamSpec("tile_m", int, "rows", 1)
    assert spec.problem(64) is None
    assert "takes int" in str(spec.problem("64")) and "takes int" in str(spec.problem(True))
    assert "at least 1" in str(spec.problem(0))
    assert ParamSpec("alpha", float, "").problem(2) is None


# -- the template clause ------------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["pointwise", "multi_output"])
def test_the_template_a_rule_names_renders_its_group(tmp_path: Path, template: str) -> None:
    plan = plan_with(tmp_path, add_relu(), f'fuse f: Add -> Relu -> template "{template}"\n')
    (group,) = fused(plan)
    assert group.template == template and group.decided_by is not None and group.decided_by.name == "f"
    assert f"template {template}, " in c_source(plan)  # the kernel's comment names the kind that rendered it
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}
    (out,) = plan.graph.outputs
    np.testing.assert_allclose(CompiledModel(plan).run(feeds)[out], run_graph(plan.graph, feeds)[out], rtol=1e-6)


def test_a_kind_that_cannot_render_the_group_keeps_it_apart_and_says_why(tmp_path: Path) -> None:
    plan = plan_with(tmp_path, add_relu(), 'fuse f: Add -> Relu -> template "reduction"\n')
    assert not fused(plan)
    (pair,) = plan.unfused
    assert str(pair.reason) == "no-template-for-group" and "f names reduction: no reduction" in pair.detail


# -- the priority clause ------------------------------------------------------------------------------


@pytest.mark.parametrize(("p_pointwise", "p_multi", "winner"), [(1, 5, "multi_output"), (5, 1, "pointwise"),
                                                                 (3, 3, "pointwise")])
def test_priority_picks_the_kind_and_explain_names_the_rule(tmp_path: Path, p_pointwise: int, p_multi: int,
                                                            winner: str) -> None:
    rules = (f'fuse as_pointwise: Add -> Relu -> template "pointwise" priority {p_pointwise}\n'
             f'fuse as_branch: Add -> Relu -> template "multi_output" priority {p_multi}\n')
    plan = plan_with(tmp_path, add_relu(), rules)
    (group,) = fused(plan)
    assert group.template == winner  # equal priorities: the registry's order
    rule = "as_pointwise" if winner == "pointwise" else "as_branch"
    (kernel,) = explain_report(plan)["kernels"]
    assert kernel["decided_by"].startswith(rule) and plan.to_json()["groups"][0]["decided_by"]["name"] == rule


def tie_kind() -> KernelKind:
    """Accepts Add -> Relu and prices it exactly as the two ops apart: a cost tie."""
    def cost(facts: GroupFacts, price: Any) -> Any:
        first, *rest = sorted(facts.compute)
        return price([first]) + price(rest)

    return KernelKind("tie", "a test kind", lambda facts: ACCEPT, renderers={"c": "autofusion.codegen."
                      "kind_renderers:render_loop_nest"}, cost=cost)


@pytest.mark.parametrize("strategy", ["greedy", "beam", "dp", "exact"])
@pytest.mark.parametrize("priority", [0, 7])
def test_priority_breaks_a_cost_tie_in_every_strategy(tmp_path: Path, strategy: str, priority: int) -> None:
    kinds = default_kinds().extended([tie_kind()])
    plan = plan_with(tmp_path, add_relu(), f'fuse f: Add -> Relu -> template "tie" priority {priority}\n',
                     strategy=strategy, kinds=kinds)
    assert len(fused(plan)) == (1 if priority > 0 else 0)
    if priority:
        assert "template tie, " in c_source(plan)


# -- the params clause --------------------------------------------------------------------------------


def test_params_reach_the_renderer(tmp_path: Path) -> None:
    default = plan_with(tmp_path, matmul_relu(), 'fuse f: MatMul -> Relu -> template "gemm_epilogue"\n')
    tiled = plan_with(tmp_path, matmul_relu(), 'fuse f: MatMul -> Relu -> template "gemm_epilogue" '
                      "(tile_m=16, tile_n=40)\n")
    assert dict(fused(tiled)[0].params) == {"tile_m": 16, "tile_n": 40}
    plain, small = c_source(default), c_source(tiled)
    assert "- m0 < 16 ?" not in plain and "- m0 < 16 ?" in small
    assert "- n0 < 64 ?" in small  # a packed weight is read in whole 32-column panels: 40 -> 64
    feeds = {"x": np.random.default_rng(2).standard_normal((64, 48)).astype(np.float32)}
    (out,) = tiled.graph.outputs
    want = run_graph(tiled.graph, feeds)[out]
    np.testing.assert_allclose(CompiledModel(tiled).run(feeds)[out], want, rtol=1e-5, atol=1e-5)


def test_a_group_with_params_its_kind_does_not_take_is_refused_at_render_time(tmp_path: Path) -> None:
    from dataclasses import replace

    plan = plan_with(tmp_path, add_relu(), 'fuse f: Add -> Relu -> template "pointwise"\n')
    group = replace(fused(plan)[0], params=FrozenMap({"tile_m": 8}))
    with pytest.raises(CodegenError, match="kind 'pointwise' has no param 'tile_m'"):
        render_group(plan.graph, group, default_templates())


@pytest.mark.parametrize(("params", "message"), [
    ("(tile_m=64)", "kind 'pointwise' has no param 'tile_m' (it takes no params)"),
])
def test_checker_reports_params_a_kind_does_not_take(params: str, message: str) -> None:
    text = f'fuse f: Add -> Relu -> template "pointwise" {params}\n'
    (d,) = analyze_text(text, verify=False).diagnostics
    assert d.code == "F026" and message in d.message
    assert d.span.line == d.span.end_line == 1 and text[d.span.col - 1:d.span.end_col - 1] == "tile_m=64"


@pytest.mark.parametrize(("params", "message"), [
    ('(tile_m="big")', "tile_m takes int, got str 'big'"),
    ("(tile_m=0)", "tile_m must be at least 1, got 0"),
    ("(tile_m=8, tile_k=4)", "kind 'gemm_epilogue' has no param 'tile_k' (it takes tile_m, tile_n)"),
])
def test_checker_validates_param_values(params: str, message: str) -> None:
    text = f'fuse f: MatMul -> Relu -> template "gemm_epilogue" {params}\n'
    diagnostics = analyze_text(text, verify=False).diagnostics
    assert [d.code for d in diagnostics] == ["F026"] and message in diagnostics[0].message


def test_checker_knows_the_kinds_it_is_given() -> None:
    text = 'fuse f: Add -> Relu -> template "tie"\n'
    assert [d.code for d in analyze_text(text, verify=False).diagnostics] == ["F012"]
    assert analyze_text(text, verify=False, kinds=default_kinds().extended([tie_kind()])).diagnostics == []


def test_pictures_use_the_kinds_colour(tmp_path: Path) -> None:
    kinds = default_kinds().extended([KernelKind("tie", "", lambda f: ACCEPT, renderers={"c": "x:y"},
                                                 colour="#123456", cost=tie_kind().cost)])
    plan = plan_with(tmp_path, add_relu(), 'fuse f: Add -> Relu -> template "tie" priority 1\n', kinds=kinds)
    assert 'fillcolor="#123456"' in plan_dot(plan)


def test_a_kind_registry_is_a_value(tmp_path: Path) -> None:
    extended = default_kinds().extended([tie_kind()])
    assert "tie" in extended and "tie" not in default_kinds() and isinstance(extended, KindRegistry)


# -- edges: ties over many groups, kinds that fail, plans copied and pickled ---------------------------


def chain(n: int = 6) -> Graph:
    b = GraphBuilder("chain")
    t = b.input("x", (8, 32))
    for op in ["Relu", "Neg", "Abs", "Sqrt", "Neg", "Abs", "Relu", "Neg"][:n]:
        t = b.op(op, t)
    return b.build([t])


def perfect_tie_kind() -> KernelKind:
    """Prices any group as its ops apart: every merge is a tie, which only priority breaks."""
    def cost(facts: GroupFacts, price: Any) -> Any:
        parts = [price([n]) for n in facts.compute]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total

    return KernelKind("tie", "", lambda facts: ACCEPT,
                      renderers={"c": "autofusion.codegen.kind_renderers:render_loop_nest"}, cost=cost)


@pytest.mark.parametrize("strategy", ["greedy", "beam", "dp", "exact"])
def test_every_strategy_breaks_ties_over_many_groups_alike(tmp_path: Path, strategy: str) -> None:
    kinds = default_kinds().extended([perfect_tie_kind()])
    plan = plan_with(tmp_path, chain(), 'fuse f: pointwise into producer pointwise -> template "tie" priority 5\n',
                     strategy=strategy, kinds=kinds)
    assert [len(g.nodes) for g in plan.groups] == [6]  # each merge is worth its priority: all of them
    apart = plan_with(tmp_path, chain(), 'fuse f: pointwise into producer pointwise -> template "tie"\n',
                      strategy=strategy, kinds=kinds)
    assert [len(g.nodes) for g in apart.groups] == [1] * 6  # priority 0: a merge that saves nothing is not made


def test_exact_is_never_dearer_than_dp() -> None:
    from autofusion.models import build

    g = build("gpt2-tiny")
    dp, exact = optimize(g, strategy="dp"), optimize(g, strategy="exact")
    assert exact.cost_after.seconds <= dp.cost_after.seconds + 1e-12


def test_an_op_core_no_kind_renders_keeps_its_group_apart(tmp_path: Path) -> None:
    from dataclasses import replace

    from autofusion.ops import default_registry
    from autofusion.ops.registry import OpRegistry

    odd = OpRegistry([replace(d, core="attention") if d.name == "MatMul" else d for d in default_registry()])
    plan = plan_with(tmp_path, matmul_relu(), "fuse f: Relu into producer MatMul\n", registry=odd)
    assert not fused(plan) and "no kernel kind 'attention_epilogue'" in plan.unfused[0].detail


def test_a_kind_that_fails_is_named(tmp_path: Path) -> None:
    def broken(facts: GroupFacts) -> Any:
        raise ZeroDivisionError("oops")

    kinds = default_kinds().extended([KernelKind("bad", "", broken, renderers={"c": "nowhere:render"})])
    with pytest.raises(KindError, match=r"kernel kind 'bad': accepts\(\) raised ZeroDivisionError: oops"):
        plan_with(tmp_path, add_relu(), 'fuse f: Add -> Relu -> template "bad"\n', kinds=kinds)
    with pytest.raises(KindError, match="its c renderer 'nowhere:render' cannot be loaded"):
        kinds["bad"].renderer("c")
    from autofusion.cli.common import expected_errors

    assert KindError in expected_errors()  # the command line reports it in one line


def test_plans_keep_their_kinds_when_copied_and_take_the_builtins_when_pickled(tmp_path: Path) -> None:
    import copy
    import pickle

    kinds = default_kinds().extended([tie_kind()])
    plan = plan_with(tmp_path, add_relu(), 'fuse f: Add -> Relu -> template "tie" priority 1\n', kinds=kinds)
    assert "tie" in copy.copy(plan).kinds and "tie" in copy.deepcopy(plan).kinds
    assert copy.deepcopy(plan) == plan
    back = pickle.loads(pickle.dumps(plan))  # a bench worker's job: functions do not travel
    assert back == plan and "tie" not in back.kinds and back.registry is not None


def test_a_transposed_operand_joins_its_matrix_product_and_other_prologues_do_not() -> None:
    """gemm_transposed_operand (rules/core.fuse): the product reads a Transpose of a tensor from
    memory through strides, so the two are one kernel with no copy; an op that computes (the Relu
    under the second Transpose) stays apart: the core reads its operands from memory."""
    b = GraphBuilder("wgrad")
    x, dy = b.input("x", (64, 32)), b.input("dy", (64, 48))
    dw = b.op("MatMul", b.op("Transpose", x, perm=[1, 0]), dy)  # a weight gradient: x^T @ dy
    other = b.op("MatMul", b.op("Transpose", b.op("Relu", x), perm=[1, 0]), dy)
    g = b.build([dw, other])
    plan = optimize(g)
    kernels = sorted((grp.template, tuple(g.node_by_name[n].op for n in grp.nodes)) for grp in plan.groups)
    assert kernels == [("gemm_epilogue", ("Transpose", "MatMul"))] * 2 + [("pointwise", ("Relu",))], kernels
    model = CompiledModel(plan)
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32),
             "dy": np.random.default_rng(1).standard_normal((64, 48)).astype(np.float32)}
    ref, out = run_graph(g, feeds), model.run(feeds)
    for t in (dw, other):
        np.testing.assert_allclose(out[t], ref[t], rtol=1e-4, atol=1e-4)
    for k in model.source.kernels:
        if k.group.template == "gemm_epilogue":  # x^T read in place: rows 1 apart, K steps 32 apart
            assert re.search(r"af_sgemm_packed\(mlen, nlen, 64, \d+, 1.0f, t_\w+ \+ \(?m0\)?, 1, 32,", k.code), k.code


def test_the_reduction_kind_takes_sibling_reductions_over_the_same_axes() -> None:
    from autofusion.ops import default_registry

    b = GraphBuilder("siblings")
    x = b.input("x", (4, 8, 16))
    last, middle = b.const(np.array([-1], np.int64)), b.const(np.array([1], np.int64))
    sq, ex = b.op("Mul", x, x), b.op("Exp", x)
    s1, s2 = b.op("ReduceMean", x, last, keepdims=1), b.op("ReduceMean", sq, last, keepdims=1)
    m1, m2 = b.op("ReduceSum", x, middle, keepdims=1), b.op("ReduceSum", ex, middle, keepdims=1)
    centred = b.op("Sub", x, s1)
    dependent = b.op("ReduceMean", centred, last, keepdims=1)
    g = b.build([s1, s2, m1, m2, dependent])
    registry, kind = default_registry(), default_kinds()["reduction"]

    def accepts(*tensors: str) -> bool:
        names = frozenset(n.name for n in g.nodes if set(n.outputs) & set(tensors))
        return kind.accepts(GroupFacts(g, names, {n: registry[g.node_by_name[n].op] for n in names})).ok

    assert accepts(s1, s2, sq)  # a LayerNorm gradient's two means: one pass over each row
    assert accepts(m1, m2, ex)  # over a middle axis (a BatchNorm gradient's sums per channel) too
    assert not accepts(s1, m1)  # over other axes: two loops over rows
    assert not accepts(s1, centred, dependent)  # the second reads the first's result
