"""The unfused plan: every node its own kernel (what runs without fusion); and its opposite, the
whole graph as one kernel (a matrix product with the layout ops it reads through, as a tuner times it)."""

from __future__ import annotations

from autofusion.decide.groups import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.graph.graph import Graph
from autofusion.ops.registry import OpRegistry


def unfused_plan(graph: Graph, registry: OpRegistry | None = None) -> Plan:
    groups = build_groups(graph, [[n.name] for n in graph.nodes], registry=registry)
    return Plan(graph, groups, ZERO_COST, ZERO_COST, strategy="unfused")


def one_kernel_plan(graph: Graph, registry: OpRegistry | None = None) -> Plan:
    """Every node of ``graph`` in one kernel, of the kind its ops call for."""
    groups = build_groups(graph, [[n.name for n in graph.nodes]], registry=registry)
    return Plan(graph, groups, ZERO_COST, ZERO_COST, strategy="one kernel")
