"""A plan for a graph with symbolic sizes, at one binding of them.

``optimize`` on a graph with symbolic sizes gives one plan valid for every binding. At a binding
the graph's shape arithmetic folds (``Range(0, seq)`` becomes a constant), so the bound plan keeps
every group with the nodes that remain, in the same kernels, under the same names and templates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from autofusion.decide.groups import group_io
from autofusion.decide.plan import Plan
from autofusion.graph.graph import FrozenMap
from autofusion.ir.symbolic import bind, is_symbolic


def bind_plan(plan: Plan, binding: Mapping[str, int]) -> Plan:
    """``plan`` at ``binding`` (symbol name -> size): the static plan the runtime compiles. The same
    plan when its graph has no symbolic sizes; BindError for a binding the graph cannot take."""
    if not is_symbolic(plan.graph):
        return plan
    graph = bind(plan.graph, binding, plan.registry)
    groups = []
    for g in plan.groups:
        nodes = tuple(n for n in g.nodes if n in graph.node_by_name)
        if not nodes:
            continue  # all of it was shape arithmetic, a constant now
        inputs, outputs = group_io(graph, nodes)
        groups.append(replace(g, nodes=nodes, inputs=inputs, outputs=outputs))
    unfused = tuple(u for u in plan.unfused if u.producer in graph.node_by_name and u.consumer in graph.node_by_name)
    stats = {**plan.stats, "binding": dict(binding)}
    return replace(plan, graph=graph, groups=tuple(groups), unfused=unfused, stats=FrozenMap(stats))
