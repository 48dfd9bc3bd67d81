"""What the Triton test modules share: one-group plans, seeded feeds, a check against the reference.

Import it after the module's importorskip guards for torch and triton (``check`` builds a
TritonModel).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autofusion.decide.plan import ZERO_COST, FusedGroup, Plan
from autofusion.graph.graph import Graph
from autofusion.ir import run_graph


def one_group_plan(graph: Graph, template: str, name: str = "g0") -> Plan:
    """A plan with every node of ``graph`` in one group."""
    nodes = tuple(n.name for n in graph.nodes)
    inputs = tuple(dict.fromkeys(graph.inputs + tuple(graph.constants)))
    group = FusedGroup(name, nodes, inputs, graph.outputs, template)
    return Plan(graph, (group,), ZERO_COST, ZERO_COST)


def feeds_for(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t: rng.standard_normal(graph.type_of(t).shape).astype(graph.type_of(t).dtype.numpy)
            for t in graph.inputs}


def check(plan: Plan, seed: int = 0) -> Any:
    """The plan's TritonModel, every group one kernel (fallback=False), its outputs checked."""
    from autofusion.runtime.triton_runner import TritonModel

    model = TritonModel(plan, fallback=False)
    feeds = feeds_for(plan.graph, seed)
    got, want = model(feeds), run_graph(plan.graph, feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)
    return model
