"""The decider: legality, strategies against brute force, cost-model sensitivity, reasons."""

from __future__ import annotations

import numpy as np
import pytest

from autofusion.decide.cost import AnalyticCostModel, HardwareProfile
from autofusion.decide.legality import GroupChecker
from autofusion.decide.optimize import decide
from autofusion.decide.partition import Partition
from autofusion.decide.plan import RuleRef, UnfusedReason
from autofusion.engine.space import FusionSpace, Permission
from autofusion.graph.graph import FrozenMap
from autofusion.ir import DType, Graph, GraphBuilder
from autofusion.ops import OpClass, default_registry

RULE = RuleRef("test_rule", "test.fuse", 1)


def class_space(graph: Graph) -> FusionSpace:
    """Every edge into a pointwise or reduction consumer is allowed (a class rule, in Python)."""
    reg = default_registry()
    edges = {}
    for node in graph.nodes:
        for o in node.outputs:
            for c in graph.consumers.get(o, ()):
                if reg[c.op].op_class in (OpClass.POINTWISE, OpClass.REDUCTION) or reg[c.op].view:
                    edges[(node.name, c.name)] = (Permission(RULE),)
    return FusionSpace(graph, FrozenMap(edges))


def mlp_block(hidden: int = 64, rows: int = 32) -> Graph:
    rng = np.random.default_rng(0)
    b = GraphBuilder("block")
    x = b.input("x", (rows, hidden), DType.FLOAT32)
    w = b.const(rng.standard_normal((hidden, hidden)).astype(np.float32))
    bias = b.const(rng.standard_normal(hidden).astype(np.float32))
    h = b.op("Add", b.op("MatMul", x, w), bias)
    g = b.op("Mul", b.op("Sigmoid", h), h)
    y = b.op("Add", g, x)
    return b.build([b.op("ReduceSum", b.op("Exp", y), b.const(np.array([-1], np.int64)), keepdims=1)])


def brute_force(space: FusionSpace, cost, checker: GroupChecker) -> float:
    names = [n.name for n in space.graph.nodes]

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for p in partitions(rest):
            for i in range(len(p)):
                yield p[:i] + [[first, *p[i]]] + p[i + 1:]
            yield [[first], *p]

    best = float("inf")
    for p in partitions(names):
        groups = [frozenset(g) for g in p]
        if not all(checker.check(g).ok for g in groups):
            continue
        connected = all(_connected(space, g) for g in groups)
        if not connected or not Partition(space.graph, [sorted(g) for g in groups]).is_acyclic():
            continue
        best = min(best, sum(cost(g) for g in groups))
    return best


def _connected(space: FusionSpace, group: frozenset[str]) -> bool:
    if len(group) == 1:
        return True
    start = next(iter(group))
    seen, stack = {start}, [start]
    adj = space.neighbours()
    while stack:
        for m in adj.get(stack.pop(), ()):
            if m in group and m not in seen:
                seen.add(m)
                stack.append(m)
    return seen == group


@pytest.mark.parametrize("strategy", ["greedy", "dp", "beam", "exact"])
def test_every_strategy_fuses_the_block_and_plans_are_acyclic(strategy: str) -> None:
    g = mlp_block()
    plan = decide(class_space(g), strategy=strategy)
    assert plan.kernels < len(g.nodes)
    assert plan.cost_after.seconds < plan.cost_before.seconds
    assert plan.cost_after.bytes < plan.cost_before.bytes
    templates = {grp.template for grp in plan.groups}
    assert "gemm_epilogue" in templates or "reduction" in templates
    covered = sorted(n for grp in plan.groups for n in grp.nodes)
    assert covered == sorted(n.name for n in g.nodes)


def _random_graph(seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"rand{seed}")
    shapes = [(8, 16), (1, 16), (8, 1)]
    tensors = [b.input("x", (8, 16), DType.FLOAT32)]
    unary = ["Relu", "Exp", "Tanh", "Neg", "Sigmoid"]
    for _ in range(int(rng.integers(4, 8))):
        kind = rng.integers(0, 4)
        a = tensors[int(rng.integers(0, len(tensors)))]
        if kind == 0:
            tensors.append(b.op(unary[int(rng.integers(0, len(unary)))], a))
        elif kind == 1:
            c = tensors[int(rng.integers(0, len(tensors)))]
            tensors.append(b.op("Add", a, c))
        elif kind == 2:
            shape = shapes[int(rng.integers(0, len(shapes)))]
            tensors.append(b.op("Mul", a, b.const(rng.standard_normal(shape).astype(np.float32))))
        else:
            tensors.append(b.op("ReduceMax", a, b.const(np.array([1], np.int64)), keepdims=1))
    return b.build([tensors[-1], tensors[len(tensors) // 2]])


@pytest.mark.parametrize("seed", range(12))
def test_exact_and_dp_are_optimal_by_brute_force(seed: int) -> None:
    g = _random_graph(seed)
    space = class_space(g)
    model = AnalyticCostModel()
    checker = GroupChecker(space)

    def cost(nodes: frozenset[str]) -> float:
        return model.group_cost(g, sorted(nodes)).seconds

    optimum = brute_force(space, cost, checker)
    for strategy in ("exact", "dp"):
        plan = decide(space, model, strategy=strategy, reuse_regions=False)
        assert plan.cost_after.seconds == pytest.approx(optimum, rel=1e-9), strategy
    for strategy in ("greedy", "beam"):
        plan = decide(space, model, strategy=strategy)
        assert plan.cost_after.seconds >= optimum * (1 - 1e-9)


def _broadcast_graph() -> Graph:
    """A small producer (per row) feeding a large broadcast consumer: fusing it recomputes it."""
    b = GraphBuilder("bcast")
    x = b.input("x", (256, 1024), DType.FLOAT32)
    s = b.input("s", (256, 1), DType.FLOAT32)
    heavy = b.op("Erf", b.op("Tanh", b.op("Exp", s)))
    return b.build([b.op("Mul", x, heavy)])


def test_cost_model_constants_change_the_plan() -> None:
    g = _broadcast_graph()
    space = class_space(g)
    base = HardwareProfile.load("cpu-2core")
    slow_memory = AnalyticCostModel(base.replace(dram_bandwidth=1e8, launch_seconds=1e-3,
                                                 caches=()))
    slow_compute = AnalyticCostModel(base.replace(peak_flops=1e8, launch_seconds=0.0, sync_seconds=0.0))
    fused = decide(space, slow_memory, strategy="exact")
    apart = decide(space, slow_compute, strategy="exact")
    assert fused.kernels == 1
    assert apart.kernels > 1
    reasons = {u.reason for u in apart.unfused}
    assert reasons == {UnfusedReason.COST}


def test_launch_cost_alone_changes_the_plan() -> None:
    g = _broadcast_graph()
    space = class_space(g)
    base = HardwareProfile.load("cpu-2core").replace(peak_flops=2e9)
    cheap_launch = decide(space, AnalyticCostModel(base.replace(launch_seconds=0.0, sync_seconds=0.0)), "exact")
    dear_launch = decide(space, AnalyticCostModel(base.replace(launch_seconds=1.0)), "exact")
    assert dear_launch.kernels < cheap_launch.kernels


def test_reasons_name_missing_rules_and_size_cap() -> None:
    g = mlp_block()
    space = FusionSpace(g)  # no permissions at all
    plan = decide(space)
    assert plan.kernels == sum(1 for n in g.nodes if not default_registry()[n.op].view)
    assert {u.reason for u in plan.unfused} == {UnfusedReason.NO_RULE}
    capped = decide(class_space(g), size_cap=1)
    assert UnfusedReason.SIZE_CAP in {u.reason for u in capped.unfused}


def test_identical_regions_are_solved_once() -> None:
    rng = np.random.default_rng(1)
    b = GraphBuilder("layers")
    x = b.input("x", (16, 32), DType.FLOAT32)
    for _ in range(6):
        w = b.const(rng.standard_normal((32, 32)).astype(np.float32))
        x = b.op("MatMul", b.op("Tanh", b.op("Add", x, b.const(np.ones(32, np.float32)))), w)
    g = b.build([x])
    plan = decide(class_space(g))
    assert plan.stats["regions"] == 6 and plan.stats["regions_reused"] == 4  # MatMul_i + next Add, Tanh
    # Add+Tanh of layer 0, then each MatMul with the next layer's Add+Tanh as its epilogue
    assert plan.kernels == 7
    assert sorted(g.template for g in plan.groups).count("gemm_epilogue") == 5


def test_partition_copies_are_copy_on_write() -> None:
    b = GraphBuilder("chain")
    x = b.input("x", (4,), DType.FLOAT32)
    for _ in range(6):
        x = b.op("Relu", x)
    g = b.build([x])
    names = [n.name for n in g.nodes]
    base = Partition(g)
    base.merge(names[0], names[1])
    q = base.copy()
    q.merge(names[1], names[2])
    r = q.copy()  # a copy of a copy sees the first copy's merges, not later ones
    q.merge(names[4], names[5])
    assert base.members(names[2]) == {names[2]}
    assert q.members(names[0]) == set(names[:3]) and r.members(names[0]) == set(names[:3])
    assert r.members(names[5]) == {names[5]}
    assert sorted(map(sorted, q.groups())) == sorted([sorted(names[:3]), [names[3]], sorted(names[4:])])
    assert q.is_acyclic() and len(r.groups()) == 4
    saved = base.save(names[:3])
    base.merge(names[0], names[2])
    base.restore(saved)
    assert sorted(map(sorted, base.groups())) == sorted([sorted(names[:2])] + [[n] for n in names[2:]])
    with pytest.raises(AssertionError, match="changed under its copy"):
        q.members(names[3])  # the base changed (save/restore) while the copy was in use


def test_greedy_restarts_recover_what_a_myopic_first_merge_shuts_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """random29's regions (benchmarks), priced by a profile fitted on a Zen 4 (kept here, so that a new
    shipped profile does not move the regions): plain greedy ends 9.8 % above exact on one of them;
    banning one of its early merges and running again finds the optimum."""
    from pathlib import Path

    from autofusion.bench.quality import region_costs, summarise
    from autofusion.bench.random_graphs import random_graph
    from autofusion.decide import strategies
    from autofusion.decide.cost import AnalyticCostModel, HardwareProfile

    monkeypatch.setitem(strategies.BUILTIN_STRATEGIES, "greedy0", lambda: strategies.Greedy(restarts=0))
    model = AnalyticCostModel(HardwareProfile.load(Path(__file__).parent / "data" / "profiles" / "zen4-2core.json"))
    regions = region_costs(random_graph(29, ops=32), strategies=("greedy0", "greedy", "exact"), cost_model=model)
    assert summarise(regions, "greedy0").max_percent > 2.0
    assert summarise(regions, "greedy").max_percent == 0.0


def test_a_pooling_op_may_end_a_convolutions_kernel_only_after_it() -> None:
    """Conv -> Relu -> MaxPool renders as conv_epilogue; a pooling op before the convolution (a
    prologue) or two pooling ops are refused."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("pools")
    x = b.input("x", (1, 3, 16, 16), DType.FLOAT32)
    p0 = b.op("MaxPool", x, kernel_shape=(2, 2), strides=(2, 2))
    c = b.op("Conv", p0, b.const(rng.standard_normal((8, 3, 3, 3)).astype(np.float32)), pads=(1, 1, 1, 1))
    r = b.op("Relu", c)
    p1 = b.op("MaxPool", r, kernel_shape=(2, 2), strides=(2, 2))
    g = b.build([b.op("AveragePool", p1, kernel_shape=(2, 2))])
    edges = {}
    for node in g.nodes:
        for o in node.outputs:
            for consumer in g.consumers.get(o, ()):
                edges[(node.name, consumer.name)] = (Permission(RULE),)
    checker = GroupChecker(FusionSpace(g, FrozenMap(edges)))
    pool0, conv, relu, pool1, pool2 = (n.name for n in g.nodes)
    assert checker.check([conv, relu, pool1]).template == "conv_epilogue"
    before = checker.check([pool0, conv, relu])
    assert not before.ok and before.reason is UnfusedReason.TEMPLATE
    assert not checker.check([conv, relu, pool1, pool2]).ok
