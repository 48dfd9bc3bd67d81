"""The decider's driver: split the fusion space into regions, solve each (structurally identical
regions once), check the whole plan, and explain every adjacent pair left unfused."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from autofusion.decide.cost import AnalyticCostModel, CostModel
from autofusion.decide.groups import build_groups
from autofusion.decide.legality import DEFAULT_SIZE_CAP, GroupChecker
from autofusion.decide.partition import Partition
from autofusion.decide.plan import CostBreakdown, Plan, UnfusedPair, UnfusedReason
from autofusion.decide.strategies import EPS, Region, Strategy, get_strategy
from autofusion.engine.space import FusionSpace
from autofusion.graph.graph import FrozenMap, Graph
from autofusion.graph.types import TensorType
from autofusion.ir.symbolic import at_binding, representative_binding
from autofusion.kinds import KindError, KindRegistry
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry


@dataclass(frozen=True)
class DecideOptions:
    strategy: str = "greedy"
    size_cap: int = DEFAULT_SIZE_CAP
    reuse_regions: bool = True


def regions_of(space: FusionSpace) -> list[tuple[str, ...]]:
    """Connected components of the allowed-merge graph, each in topological order."""
    index = {n.name: i for i, n in enumerate(space.graph.nodes)}
    adj = space.neighbours()
    seen: set[str] = set()
    out = []
    for n in space.graph.nodes:
        if n.name in seen or n.name not in adj:
            continue
        comp, stack = [], [n.name]
        seen.add(n.name)
        while stack:
            m = stack.pop()
            comp.append(m)
            for k in adj.get(m, ()):
                if k not in seen:
                    seen.add(k)
                    stack.append(k)
        out.append(tuple(sorted(comp, key=index.__getitem__)))
    return out


def region_signature(space: FusionSpace, nodes: Sequence[str],
                     pairs: Sequence[tuple[str, str]] | None = None) -> tuple:  # type: ignore[type-arg]
    """Structure of a region without weights' values: equal signatures, same best partition.
    ``pairs``, the region's permitted pairs when known, saves a scan of the whole space."""
    g = space.graph
    pos = {n: i for i, n in enumerate(nodes)}
    sig = []
    for n in nodes:
        node = g.node_by_name[n]
        ins: list[tuple[str, int | TensorType | None, int | bool]] = []
        for t in node.inputs:
            p = g.producers.get(t)
            if p is not None and p.name in pos:
                ins.append(("r", pos[p.name], p.outputs.index(t)))
            else:
                ins.append(("x", g.types[t] if t else None, g.is_const(t) if t else False))
        outs = []
        for o in node.outputs:
            users = g.consumers.get(o, ())
            outs.append((g.types.get(o), o in g.outputs, sum(1 for c in users if c.name not in pos)))
        sig.append((node.op, node.attrs, tuple(ins), tuple(outs)))
    perms = []
    if pairs is None:
        pairs = [k for k in [*space.edges, *space.siblings] if k[0] in pos and k[1] in pos]
    for a, b in set(pairs):
        for permitted in (space.edges, space.siblings):
            ps = permitted.get((a, b))
            if ps is not None:
                perms.append((pos[a], pos[b], tuple(p.rule.name for p in ps)))
    return (tuple(sig), tuple(sorted(perms)))


def decide(
    space: FusionSpace,
    cost_model: CostModel | None = None,
    strategy: str | Strategy = "greedy",
    size_cap: int = DEFAULT_SIZE_CAP,
    registry: OpRegistry | None = None,
    reuse_regions: bool = True,
    kinds: KindRegistry | None = None,
    sizes: Mapping[str, int] | None = None,
) -> Plan:
    """Choose a fusion plan within ``space`` under ``cost_model``; ``kinds`` are the kernel kinds
    rules may name (default: the built-in ones). A graph with symbolic sizes gets a plan valid for
    every binding, priced at ``sizes`` when given, else at a large and a small binding (_Pricing)."""
    registry = registry or default_registry()
    graph = space.graph
    model = cost_model or AnalyticCostModel(registry=registry)
    solver = get_strategy(strategy) if isinstance(strategy, str) else strategy
    checker = GroupChecker(space, registry, size_cap, kinds)
    pricing = _Pricing(space, model, checker, registry, size_cap, kinds, sizes)
    cost_cache: dict[frozenset[str], CostBreakdown] = {}

    def cost_of(nodes: frozenset[str]) -> CostBreakdown:
        c = cost_cache.get(nodes)
        if c is None:
            c = cost_cache[nodes] = pricing.cost(nodes)
        return c

    def seconds(nodes: frozenset[str]) -> float:
        return cost_of(nodes).seconds

    started = time.perf_counter()
    partition = Partition(graph)
    solved: dict[tuple, list[list[int]]] = {}  # type: ignore[type-arg]
    notes: list[str] = []
    reused = 0
    regions = regions_of(space)
    pairs_by_region = _pairs_by_region(space, regions)
    for nodes, pairs in zip(regions, pairs_by_region):
        sig = region_signature(space, nodes, pairs) if reuse_regions else None
        known = solved.get(sig) if sig is not None else None
        if known is not None and _apply(partition, nodes, known):
            reused += 1
            continue
        region = Region(nodes, pairs, checker, seconds)
        region_groups = solver.solve(region, partition)
        notes.extend(region.notes)
        pos = {n: i for i, n in enumerate(nodes)}
        layout = [sorted(pos[n] for n in g) for g in region_groups]  # topological order keeps each step convex
        if not _apply(partition, nodes, layout):
            notes.append(f"region at {nodes[0]}: solution formed a cycle with earlier regions; left unfused")
            continue
        if sig is not None:
            solved[sig] = layout
    _apply_loops(space, checker, partition, seconds, notes)
    groups = build_groups(
        graph,
        [sorted(g) for g in partition.groups()],
        template_of=lambda ns: checker.check(ns).template,
        rules_of=checker.rules_of,
        cost_of=lambda ns: cost_of(frozenset(ns)),
        kind_of=lambda ns: _kind(space, checker, ns),
        registry=registry,
        decision_of=lambda ns: (checker.check(ns).decided_by, checker.check(ns).params),
    )
    before = _total(cost_of(frozenset([n.name])) for n in graph.nodes)
    after = _total(g.cost for g in groups)
    unfused = explain_unfused(space, checker, partition, seconds)
    stats = {
        "regions": len(regions),
        "regions_reused": reused,
        "decide_seconds": time.perf_counter() - started,
        "cost_model": getattr(model, "name", type(model).__name__),
        "notes": notes,
    }
    if pricing.bindings[0]:
        stats["priced_at"] = pricing.bindings[0]  # symbolic sizes: the bindings the plan was priced at
        stats["priced_also_at"] = pricing.bindings[1:]
    return Plan(graph, groups, before, after, unfused, getattr(solver, "name", str(strategy)), FrozenMap(stats),
                checker.kinds, registry)


class _Pricing:
    """Group costs. A graph with symbolic sizes is priced at its representative binding and, unless
    ``sizes`` names the one to price at, also with every size 1: a group's seconds are the mean of
    its seconds at each, each relative to the whole graph's there (in the first one's units), so
    the plan suits short sequences and small batches as well as the largest."""

    def __init__(self, space: FusionSpace, model: CostModel, checker: GroupChecker, registry: OpRegistry,
                 size_cap: int, kinds: KindRegistry | None, sizes: Mapping[str, int] | None) -> None:
        graph = space.graph
        first = representative_binding(graph, sizes)
        ones = {s: 1 for s in first}
        self.bindings = [first] if sizes or not first or first == ones else [first, ones]
        self.model = model
        self._priced: list[tuple[Graph, GroupChecker]] = []
        for b in self.bindings:
            priced = at_binding(graph, b)
            pricer = checker if priced is graph else GroupChecker(replace(space, graph=priced), registry, size_cap,
                                                                  kinds)
            self._priced.append((priced, pricer))
        self._scale = [1.0] * len(self._priced)
        if len(self._priced) > 1:
            totals = [sum(self._at(i, frozenset([n.name])).seconds for n in graph.nodes)
                      for i in range(len(self._priced))]
            self._scale = [totals[0] / t if t > 0 else 0.0 for t in totals]

    def _at(self, i: int, nodes: frozenset[str]) -> CostBreakdown:
        priced, pricer = self._priced[i]
        return _kind_cost(pricer, nodes, lambda ns: self.model.group_cost(priced, sorted(ns)))

    def cost(self, nodes: frozenset[str]) -> CostBreakdown:
        costs = [self._at(i, nodes) for i in range(len(self._priced))]
        if len(costs) == 1:
            return costs[0]
        seconds = sum(c.seconds * k for c, k in zip(costs, self._scale)) / len(costs)
        return replace(costs[0], seconds=seconds)


def _kind_cost(checker: GroupChecker, nodes: frozenset[str],
               price: Callable[[Collection[str]], CostBreakdown]) -> CostBreakdown:
    """The group's cost: its kind's own estimate when the kind gives one, else the cost model's."""
    if len(nodes) > 1:
        verdict = checker.check(nodes)
        kind = checker.kinds.get(verdict.template) if verdict.ok else None
        if kind is not None and kind.cost is not None:
            try:
                cost = kind.cost(checker.facts(nodes), price)
            except Exception as e:
                raise KindError(f"kernel kind {kind.name!r}: cost() raised {type(e).__name__}: {e}") from None
            if not isinstance(cost, CostBreakdown):
                raise KindError(f"kernel kind {kind.name!r}: cost() returned {type(cost).__name__}, "
                                "not a CostBreakdown")
            return cost
    return price(nodes)


def _pairs_by_region(space: FusionSpace, regions: list[tuple[str, ...]]) -> list[tuple[tuple[str, str], ...]]:
    where = {n: i for i, r in enumerate(regions) for n in r}
    buckets: list[list[tuple[str, str]]] = [[] for _ in regions]
    for a, b in list(space.edges) + list(space.siblings):
        if a in where and where[a] == where.get(b):
            buckets[where[a]].append((a, b))
    return [tuple(b) for b in buckets]


def _apply(partition: Partition, nodes: Sequence[str], layout: list[list[int]]) -> bool:
    """Merge the groups of ``layout`` (positions in ``nodes``) if the plan stays acyclic; otherwise
    leave ``partition`` as it was (only the groups of ``nodes`` change, so only they are saved)."""
    saved = partition.save(nodes)
    for g in layout:
        for i in g[1:]:
            if not partition.can_merge(nodes[g[0]], nodes[i]):
                partition.restore(saved)
                return False
            partition.merge(nodes[g[0]], nodes[i])
    return True


def _apply_loops(space: FusionSpace, checker: GroupChecker, partition: Partition, seconds, notes: list[str]) -> None:  # type: ignore[no-untyped-def]
    """A loop kernel replaces the groups of its steps when the model says it is cheaper."""
    for loop in space.loops:
        nodes = loop.nodes
        current = {partition.members(n) for n in nodes}
        if any(not g <= nodes for g in current):
            notes.append(f"loop {loop.rule.name}: steps share kernels with nodes outside the loop; not fused")
            continue
        # the loop kernel stores its carried values every step: it never costs more than its steps as
        # separate kernels, however much the whole-group estimate charges for inlining across steps
        loop_seconds = min(seconds(nodes), sum(seconds(frozenset(step)) for step in loop.steps))
        if loop_seconds >= sum(seconds(g) for g in current) - EPS:
            continue
        ordered = sorted(nodes, key=partition.index.__getitem__)
        saved = partition.save(ordered)
        for n in ordered[1:]:  # all at once: halfway, a step's input slice joined alone could form a cycle
            partition.merge(ordered[0], n)
        if not partition.is_acyclic():
            partition.restore(saved)
            notes.append(f"loop {loop.rule.name}: one kernel would form a cycle with other kernels; not fused")


def _kind(space: FusionSpace, checker: GroupChecker, nodes: Sequence[str]) -> str:
    if len(nodes) == 1:
        return "single"
    members = frozenset(nodes)
    if any(loop.nodes == members for loop in space.loops):
        return "loop"
    if checker.check(members).template == "horizontal_gemm":
        return "branch"
    g = space.graph
    outside_users = 0
    for n in nodes:
        for o in g.node_by_name[n].outputs:
            if o in g.outputs or any(c.name not in members for c in g.consumers.get(o, ())):
                outside_users += 1
    return "branch" if outside_users > 1 else "linear"


def _total(costs) -> CostBreakdown:  # type: ignore[no-untyped-def]
    out = CostBreakdown(0.0, 0, 0, 0)
    model = "analytic"
    for c in costs:
        out = out + c
        model = c.model
    return CostBreakdown(out.seconds, out.bytes, out.flops, out.launches, model)


def explain_unfused(space: FusionSpace, checker: GroupChecker, partition: Partition, seconds) -> tuple[UnfusedPair, ...]:  # type: ignore[no-untyped-def]
    """For every data edge between two kernels, the reason they stayed apart."""
    g = space.graph
    out = []
    for node in g.nodes:
        for o in node.outputs:
            for c in g.consumers.get(o, ()):
                a, b = node.name, c.name
                ga, gb = partition.members(a), partition.members(b)
                if ga == gb or checker.is_view(a) and len(ga) == 1 and checker.check(ga).template == "view":
                    continue
                out.append(UnfusedPair(a, b, *_reason(space, checker, partition, seconds, a, b, ga, gb)))
    return tuple(dict.fromkeys(out))


def _reason(space, checker, partition, seconds, a, b, ga, gb) -> tuple[UnfusedReason, str]:  # type: ignore[no-untyped-def]
    blocked = space.blocked.get((a, b))
    if (a, b) not in space.edges:
        if blocked is not None:
            return blocked.reason, blocked.detail
        if a in space.nofuse or b in space.nofuse:
            return UnfusedReason.NOFUSE, ""
        return UnfusedReason.NO_RULE, f"{g_op(space, a)} -> {g_op(space, b)}"
    verdict = checker.check(ga | gb)
    if not verdict.ok:
        return verdict.reason or UnfusedReason.TEMPLATE, verdict.detail
    if not partition.can_merge(a, b):
        return UnfusedReason.CYCLE, ""
    delta = seconds(ga | gb) - seconds(ga) - seconds(gb)
    return UnfusedReason.COST, f"merging changes modelled time by {delta * 1e6:+.2f} us"


def g_op(space: FusionSpace, name: str) -> str:
    return space.graph.node_by_name[name].op


def graph_kernels(graph: Graph, registry: OpRegistry | None = None) -> int:
    """Kernels of the unfused graph: every node but pure views."""
    registry = registry or default_registry()
    return sum(1 for n in graph.nodes if not registry[n.op].view)
