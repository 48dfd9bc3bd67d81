"""Turning a partition of a graph's nodes into ordered FusedGroups with their inputs and outputs."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from autofusion.decide.plan import ZERO_COST, CostBreakdown, FusedGroup, RuleRef
from autofusion.graph.graph import FrozenMap, Graph
from autofusion.kinds import GroupFacts
from autofusion.kinds.builtin import natural_kind
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry


def group_io(graph: Graph, nodes: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(inputs read from memory, outputs written) of a set of nodes, in a deterministic order."""
    members = set(nodes)
    index = graph.node_index
    ordered = [graph.node_by_name[n] for n in sorted(members, key=index.__getitem__)]
    produced = {o for n in ordered for o in n.outputs if o}
    inputs: dict[str, None] = {}
    for n in ordered:
        for i in n.inputs:
            if i and i not in produced:
                inputs[i] = None
    graph_outputs = set(graph.outputs)
    outputs: dict[str, None] = {}
    for n in ordered:
        for o in n.outputs:
            if not o:
                continue
            outside = any(c.name not in members for c in graph.consumers.get(o, ()))
            if outside or o in graph_outputs:
                outputs[o] = None
    return tuple(inputs), tuple(outputs)


def default_template(graph: Graph, nodes: Sequence[str], registry: OpRegistry | None = None) -> str:
    """The kind a group of these ops needs when no rule names one (legal or not: callers that need
    legality ask the GroupChecker)."""
    registry = registry or default_registry()
    members = frozenset(nodes)
    return natural_kind(GroupFacts(graph, members, {n: registry[graph.node_by_name[n].op] for n in members}))


def kernel_name(graph: Graph, nodes: Sequence[str], index: int) -> str:
    """Deterministic, readable, C-safe name such as ``k3_matmul_add_gelu``."""
    ops = [graph.node_by_name[n].op.lower() for n in nodes]
    short = "_".join(dict.fromkeys(ops))[:48]
    return f"k{index}_" + re.sub(r"[^a-z0-9_]", "_", short)


def order_groups(graph: Graph, partition: Sequence[Sequence[str]]) -> list[list[str]]:
    """Groups (node lists in graph order) sorted topologically; ValueError if groups form a cycle."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    groups = [sorted(g, key=index.__getitem__) for g in partition if g]
    owner = {n: gi for gi, g in enumerate(groups) for n in g}
    missing = set(index) - set(owner)
    if missing:
        raise ValueError(f"partition misses nodes {sorted(missing)[:5]}")
    succ: list[set[int]] = [set() for _ in groups]
    indeg = [0] * len(groups)
    for gi, g in enumerate(groups):
        for n in g:
            for o in graph.node_by_name[n].outputs:
                for c in graph.consumers.get(o, ()):
                    cj = owner[c.name]
                    if cj != gi and cj not in succ[gi]:
                        succ[gi].add(cj)
                        indeg[cj] += 1
    ready = sorted((gi for gi in range(len(groups)) if indeg[gi] == 0), key=lambda gi: index[groups[gi][0]])
    out: list[list[str]] = []
    while ready:
        gi = ready.pop(0)
        out.append(groups[gi])
        for cj in sorted(succ[gi], key=lambda c: index[groups[c][0]]):
            indeg[cj] -= 1
            if indeg[cj] == 0:
                ready.append(cj)
        ready.sort(key=lambda c: index[groups[c][0]])
    if len(out) != len(groups):
        raise ValueError("fused groups form a cycle")
    return out


def build_groups(
    graph: Graph,
    partition: Sequence[Sequence[str]],
    template_of: Callable[[Sequence[str]], str] | None = None,
    rules_of: Callable[[Sequence[str]], tuple[RuleRef, ...]] | None = None,
    cost_of: Callable[[Sequence[str]], CostBreakdown] | None = None,
    kind_of: Callable[[Sequence[str]], str] | None = None,
    registry: OpRegistry | None = None,
    decision_of: Callable[[Sequence[str]], tuple[RuleRef | None, FrozenMap[str, Any]]] | None = None,
) -> tuple[FusedGroup, ...]:
    """FusedGroups for a partition, in topological order, with deterministic names."""
    groups = []
    for i, nodes in enumerate(order_groups(graph, partition)):
        inputs, outputs = group_io(graph, nodes)
        template = template_of(nodes) if template_of else default_template(graph, nodes, registry)
        kind = kind_of(nodes) if kind_of else ("single" if len(nodes) == 1 else "linear")
        decided_by, params = decision_of(nodes) if decision_of else (None, FrozenMap())
        groups.append(FusedGroup(
            name=kernel_name(graph, nodes, i),
            nodes=tuple(nodes),
            inputs=inputs,
            outputs=outputs,
            template=template,
            kind=kind,
            rules=rules_of(nodes) if rules_of else (),
            params=params,
            cost=cost_of(nodes) if cost_of else ZERO_COST,
            decided_by=decided_by,
        ))
    return tuple(groups)
