"""Kernels of real models in calibration: plans profiled where they run, pairs of plans of one
region drawn from them, the weights' traffic the cost model prices, and the fit's report on them."""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import pytest

from autofusion.calibrate.models import PlanSample, measure_case, parse_case, region_pairs
from autofusion.calibrate.run import CalibrationOptions, Measurements, fit, machine_prior
from autofusion.codegen.cores import cache_levels
from autofusion.decide.cost import AnalyticCostModel, CacheLevel, HardwareProfile, analytic_seconds
from autofusion.ir import DType, Graph, GraphBuilder
from autofusion.runtime import CompileCache

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")


def _chain() -> Graph:
    b = GraphBuilder("chain")
    x = b.input("x", (4, 8))
    y = b.op("Exp", b.op("Relu", b.op("Neg", x)))
    return b.build([y])


def _sample(graph: Graph, label: str, groups: list[list[str]], seconds: list[float]) -> PlanSample:
    return PlanSample("chain", "test", label, graph, tuple(tuple(g) for g in groups), tuple(seconds), sum(seconds))


def test_a_group_split_by_another_plan_is_a_pair_of_that_region() -> None:
    graph = _chain()
    a, b, c = (n.name for n in graph.nodes)
    fused = _sample(graph, "engine", [[a, b, c]], [3.0])
    apart = _sample(graph, "unfused", [[a], [b], [c]], [1.0, 1.5, 2.0])
    halves = _sample(graph, "small", [[a, b], [c]], [2.0, 2.0])
    pairs = region_pairs([fused, apart, halves])
    found = {(p.fused, p.split): p.seconds for p in pairs}
    assert found == {((a, b, c), ((a,), (b,), (c,))): (3.0, 4.5),
                     ((a, b, c), ((a, b), (c,))): (3.0, 4.0),
                     ((a, b), ((a,), (b,))): (2.0, 2.5)}


def test_no_pair_where_the_other_plan_reaches_outside_the_region_or_rewrote_the_graph() -> None:
    graph = _chain()
    a, b, c = (n.name for n in graph.nodes)
    left = _sample(graph, "engine", [[a, b], [c]], [2.0, 1.0])
    right = _sample(graph, "small", [[a], [b, c]], [1.0, 2.0])
    assert region_pairs([left, right]) == []
    other = GraphBuilder("chain")
    x = other.input("x", (4, 8))
    rewritten = other.build([other.op("Exp", other.op("Neg", x))])
    assert region_pairs([_sample(graph, "engine", [[a, b, c]], [3.0]),
                         _sample(rewritten, "unfused", [[n.name] for n in rewritten.nodes], [1.0, 1.0])]) == []


@pytest.mark.parametrize("text, message", [("bert-huge", "unknown model 'bert-huge'"),
                                           ("bert-tiny:x", "positive integer"), ("lstm:0", "positive integer")])
def test_a_bad_case_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_case(text)
    assert parse_case("bert-tiny:8") == ("bert-tiny", 8) and parse_case("lstm-tiny") == ("lstm-tiny", None)


def test_measure_case_profiles_three_plans_that_cover_the_graph() -> None:
    samples = measure_case("bert-tiny:8", AnalyticCostModel(), runs=2, threads=1, cache=CompileCache(CACHE))
    assert [s.label for s in samples] == ["unfused", "engine", "small"]
    for s in samples:
        names = sorted(n for g in s.groups for n in g)
        assert names == sorted(n.name for n in s.graph.nodes)  # a partition of the graph
        assert s.family == "bert" and s.run_seconds > 0 and len(s.step_seconds) == len(s.groups)
        assert sum(s.step_seconds) <= s.run_seconds * 1.5  # the steps are inside the run
        assert s.kernels()
    assert max(len(g) for g in samples[2].groups) <= 3
    assert len(samples[0].groups) > len(samples[1].groups)
    assert region_pairs(samples)  # the engine's groups split by the unfused plan at least


def test_weights_are_read_again_by_each_core_and_come_from_where_all_weights_fit() -> None:
    b = GraphBuilder("two_steps")
    x = b.input("x", (1, 64))
    w = b.const(np.ones((64, 64), np.float32))
    h = b.op("Tanh", b.op("MatMul", x, w))
    y = b.op("Tanh", b.op("MatMul", h, w))  # the same weight, a second core: an LSTM's loop in small
    graph = b.build([y])
    model = AnalyticCostModel()
    nodes = [n.name for n in graph.nodes]
    terms = model.terms(graph, nodes)
    weight = 64 * 64 * 4
    assert terms.reread_bytes == weight and terms.const_traffic == 2 * weight
    assert terms.traffic == terms.bytes + weight and terms.resident_bytes == graph.parameter_bytes == weight
    one = model.terms(graph, nodes[:2])
    assert one.reread_bytes == 0 and one.const_traffic == weight
    side = GraphBuilder("side_by_side")  # cores that need not wait for each other: one product, one read
    u, v = side.input("u", (1, 64)), side.input("v", (1, 64))
    w2 = side.const(np.ones((64, 64), np.float32))
    both = side.build([side.op("MatMul", u, w2), side.op("MatMul", v, w2)])
    assert model.terms(both, [n.name for n in both.nodes]).reread_bytes == 0
    # the same group listed in any order costs the same (a cost depends on the node set alone)
    steps = GraphBuilder("steps")
    t = steps.input("x", (1, 64))
    w3 = steps.const(np.ones((64, 64), np.float32))
    for _ in range(6):
        t = steps.op("Tanh", steps.op("MatMul", t, w3))
    chain = steps.build([t])
    names = [n.name for n in chain.nodes]
    costs = {model.group_cost(chain, order).seconds for order in (names, names[::-1], sorted(names))}
    assert len(costs) == 1 and model.terms(chain, names).reread_bytes == 5 * weight
    # an LSTM's loop: the input projections wait for no core and are computed LOOKAHEAD_STEPS steps at
    # once (their weight read once per that many steps), the recurrent ones a step at a time
    from autofusion.kinds.builtin import LOOKAHEAD_STEPS

    loop = GraphBuilder("loop")
    h = loop.input("h0", (1, 64))
    wi, wh = loop.const(np.ones((64, 64), np.float32)), loop.const(np.full((64, 64), 0.5, np.float32))
    for step in range(8):
        h = loop.op("Tanh", loop.op("Add", loop.op("MatMul", loop.input(f"x{step}", (1, 64)), wi),
                                    loop.op("MatMul", h, wh)))
    scan = loop.build([h])
    assert model.terms(scan, [n.name for n in scan.nodes]).reread_bytes == (7 + 8 // LOOKAHEAD_STEPS - 1) * weight
    # constants placed by the graph's weights in all: beyond the last cache, the DRAM rate applies
    tiny = HardwareProfile("tiny", 1e12, (CacheLevel("L1", 1 << 12, 1e12), CacheLevel("L2", 1 << 20, 1e12)),
                           1e9, 0.0, 0.0)
    big = terms.__class__(**{**terms.__dict__, "resident_bytes": 1 << 30})
    assert analytic_seconds(big, tiny).memory == pytest.approx(
        2 * weight / 1e9 + (terms.traffic - 2 * weight) / 1e12)
    assert analytic_seconds(terms, tiny).memory == pytest.approx(terms.traffic / 1e12)


def test_a_gather_reads_its_rows_of_the_table_and_its_indices_once() -> None:
    b = GraphBuilder("embed")
    ids = b.input("ids", (1, 8), DType.INT64)
    table = b.const(np.ones((1000, 64), np.float32))
    graph = b.build([b.op("Gather", table, ids)])
    terms = AnalyticCostModel().terms(graph, [n.name for n in graph.nodes])
    assert terms.bytes_in == 8 * 64 * 4 + 8 * 8  # the rows it picks and the indices, not the table
    assert terms.const_traffic == 8 * 64 * 4


def test_the_prior_takes_this_machines_cache_sizes() -> None:
    prior = machine_prior(HardwareProfile.load("cpu-2core"))
    assert tuple((c.level, c.bytes) for c in prior.caches) == cache_levels()
    assert prior.caches[0].bandwidth == HardwareProfile.load("cpu-2core").caches[0].bandwidth


def test_fit_reports_whole_runs_and_pairs_with_each_family_held_out() -> None:
    from autofusion.calibrate.run import KernelSample
    from autofusion.calibrate.specs import random_kernel

    rng = np.random.default_rng(4)
    cache = CompileCache(CACHE)
    plans = tuple(measure_case("lstm-tiny", AnalyticCostModel(), 2, 1, cache)
                  + measure_case("bert-tiny:8", AnalyticCostModel(), 2, 1, cache))
    kernels = []
    for i in range(12):  # stand-ins for generated kernels: their times follow a made-up rate
        spec = random_kernel(rng, 4096)
        kernels.append(KernelSample(spec.kind, spec.graph, 1e-6 * (1 + i % 5)))
    data = Measurements(tuple(kernels), (), 1e-7, 0, 1.0, 1, plans=plans)
    options = CalibrationOptions(model_cases=("lstm-tiny", "bert-tiny:8"), holdout=0.25)
    report = fit(data, options).report
    assert report["model_kernels"] == sum(len(p.kernels()) for p in plans)
    for kind in ("analytic", "learned"):
        rows = report[kind]["plans"]
        assert [(r["case"], r["plan"]) for r in rows] == [(p.case, p.label) for p in plans]
        assert all(r["predicted"] > 0 and r["predicted_held_out"] > 0 for r in rows)
        assert report[kind]["model_pairs"] >= report[kind]["model_pairs_clear"] and report[kind]["model_pairs"] > 0
        assert 0.0 <= report[kind]["model_pair_agreement_clear_held_out"] <= 1.0


def test_the_command_line_names_the_default_cases(capsys: pytest.CaptureFixture[str]) -> None:
    from autofusion.calibrate.models import DEFAULT_CASES
    from autofusion.cli.main import main

    assert main(["calibrate", "--help"]) == 0
    text = re.sub(r"-\s+", "-", " ".join(capsys.readouterr().out.split()))  # argparse wraps after a hyphen
    assert f"default: {','.join(DEFAULT_CASES)}" in text
