"""Optimizing a graph with symbolic sizes: guards decided for every binding or left undecided (the rule
then does not apply, and explain says so), a plan priced at a representative binding, valid at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dynamic_models import DYNAMIC, dynamic_feeds

from autofusion import optimize
from autofusion.decide.binding import bind_plan
from autofusion.decide.explain import explain_report
from autofusion.dsl.guards import Bindings, Call, Compare, IntLit, ListLit, Name, verdict
from autofusion.engine.space import UnfusedReason
from autofusion.frontends.onnx_import import load_onnx
from autofusion.graph.dims import bounded, compare, symbol, upper_bound
from autofusion.graph.graph import Graph
from autofusion.graph.types import DType, TensorType
from autofusion.ir import GraphBuilder
from autofusion.ir.symbolic import DEFAULT_REPRESENTATIVE_SIZE, BindError, representative_binding, with_bounds

SEQ, BATCH = symbol("seq"), symbol("batch")


def test_size_comparisons_hold_for_every_binding_or_are_left_open() -> None:
    assert compare("==", SEQ, 768) is None and compare("!=", SEQ, SEQ) is False
    assert compare(">=", SEQ, 1) is True and compare("<", SEQ, SEQ + 1) is True
    assert compare("<=", 2 * SEQ, SEQ) is False and compare("==", 2 * SEQ, SEQ * 2) is True
    assert compare("<=", SEQ, 768) is None  # no bound yet
    with bounded({"seq": 512}):
        assert compare("<=", SEQ, 768) is True and compare("==", SEQ, 768) is False
        assert compare("<", 64 * SEQ, 1 << 20) is True and upper_bound(64 * SEQ + 3) == 32771
        assert compare("<=", BATCH * SEQ, 768) is None  # batch has no bound
        assert compare(">", 0.5 * SEQ, 300) is False and compare(">", 0.5 * SEQ, 0.25) is True
    assert upper_bound(SEQ) is None


def _guard(op: str, fn: str, *args: object, rhs: object) -> Compare:
    call = Call(fn, (Name("x"), *(IntLit(a) for a in args)))  # type: ignore[arg-type]
    right = ListLit(tuple(IntLit(v) for v in rhs)) if isinstance(rhs, list) else IntLit(rhs)  # type: ignore[arg-type]
    return Compare(op, call, right)


def test_a_guard_over_symbolic_sizes_holds_fails_or_is_undecided() -> None:
    env = Bindings(types={"x": TensorType((SEQ, 768), DType.FLOAT32)})
    assert verdict(_guard("==", "dim", -1, rhs=768), env) is True  # a fixed axis decides
    assert verdict(_guard("==", "dim", 0, rhs=768), env) is None
    assert verdict(_guard("!=", "dim", 0, rhs=768), env) is None  # not "true": seq may be 768
    assert verdict(_guard("<=", "numel", rhs=1 << 20), env) is None
    assert verdict(_guard("==", "shape", rhs=[768]), env) is False  # ranks differ for every binding
    assert verdict(_guard("==", "shape", rhs=[768, 768]), env) is None
    with bounded({"seq": 512}):
        assert verdict(_guard("<=", "numel", rhs=1 << 20), env) is True
        assert verdict(_guard("in", "dim", 0, rhs=[768, 1024]), env) is False


RULES = """
fuse small_gemm_relu: MatMul(x, w) -> Relu -> template "gemm_epilogue" where numel(x) <= 4096
"""


def _mlp() -> Graph:
    b = GraphBuilder("mlp")
    x = b.input("x", (SEQ, 16))
    w = b.const(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    return b.build([b.op("Relu", b.op("MatMul", x, w))])


def test_a_fusion_rule_whose_guard_depends_on_the_sizes_does_not_fire_until_a_bound_decides_it(tmp_path: Path) -> None:
    rules = tmp_path / "small.fuse"
    rules.write_text(RULES)
    graph = _mlp()
    plan = optimize(graph, [rules])
    assert plan.kernels == 2 and plan.stats["fusion_undecided"] == {"small_gemm_relu": 1}
    report = explain_report(plan)
    assert report["undecided_guards"] == {"small_gemm_relu": 1}
    assert report["priced_at"] == {"seq": DEFAULT_REPRESENTATIVE_SIZE}
    bounded_plan = optimize(with_bounds(graph, {"seq": 256}), [rules])  # 256 x 16 <= 4096 for every seq
    assert bounded_plan.kernels == 1 and bounded_plan.stats["fusion_undecided"] == {}
    assert optimize(with_bounds(graph, {"seq": 257}), [rules]).kernels == 2
    from autofusion.runtime.model import CompiledModel

    (w,) = [c.array for c in graph.constants.values()]
    for seq in (1, 5, 256):
        bound = bind_plan(bounded_plan, {"seq": seq})
        assert bound.kernels == 1 and bound.graph.types["x"].shape == (seq, 16)
        x = np.random.default_rng(seq).standard_normal((seq, 16)).astype(np.float32)
        (got,) = CompiledModel(bound).run({"x": x}).values()
        np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


def test_a_nofuse_rule_undecided_keeps_its_ops_apart_and_says_why() -> None:
    graph = load_onnx(DYNAMIC[0], symbolic=True)  # bert: batch has no bound, so numel(scores) has none
    plan = optimize(graph)
    assert plan.stats["fusion_undecided"] == {"huge_softmax": 2}
    apart = [u for u in plan.unfused if u.reason == UnfusedReason.GUARD_UNDECIDED]
    assert len(apart) == 2 and {graph.node_by_name[u.consumer].op for u in apart} == {"Softmax"}
    assert all(u.detail == "huge_softmax" for u in apart)
    decided = optimize(with_bounds(graph, {"batch": 4}))  # 4 x 2 x 64 x 64 scores at most
    assert decided.stats["fusion_undecided"] == {}
    assert not any(u.reason == UnfusedReason.GUARD_UNDECIDED for u in decided.unfused)


def test_the_representative_binding_is_the_hint_the_bound_or_the_default() -> None:
    graph = load_onnx(DYNAMIC[0], symbolic=True)
    assert representative_binding(graph) == {"batch": DEFAULT_REPRESENTATIVE_SIZE, "seq": 64}
    assert representative_binding(graph, {"batch": 2, "seq": 9}) == {"batch": 2, "seq": 9}
    with pytest.raises(BindError, match="exceeds 64"):
        representative_binding(graph, {"seq": 100})
    assert optimize(graph).stats["priced_at"] == {"batch": DEFAULT_REPRESENTATIVE_SIZE, "seq": 64}
    for bad, message in (({"heads": 2}, "no size 'heads'"), ({"batch": 0}, "at least 1")):
        with pytest.raises(BindError, match=message):
            with_bounds(graph, bad)
    assert dict(with_bounds(graph, {"seq": 100, "batch": 3}).bounds) == {"batch": 3, "seq": 64}  # the tighter


@pytest.mark.parametrize("path", [DYNAMIC[1], DYNAMIC[2]], ids=[DYNAMIC[1].stem, DYNAMIC[2].stem])
def test_one_symbolic_plan_compiles_and_runs_at_each_binding_as_onnxruntime(path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from autofusion.runtime.model import CompiledModel

    graph = load_onnx(path, symbolic=True)
    plan = optimize(graph)
    static = optimize(load_onnx(path, dims={"batch": 2, "seq": 9}))
    assert abs(plan.kernels - static.kernels) <= 10  # the mask arithmetic a static import folds
    session = ort.InferenceSession(str(path))
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 7), (3, 9), (2, 1)):
        bound = bind_plan(plan, {"batch": batch, "seq": seq})
        assert [g.name for g in bound.groups] == [g.name for g in plan.groups if any(
            n in bound.graph.node_by_name for n in g.nodes)]
        feeds = dynamic_feeds(graph, batch, seq, rng)
        got = CompiledModel(bound, tune=False).run(feeds)[bound.graph.outputs[0]]
        (want,) = session.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{path.stem} at {batch} x {seq}")
