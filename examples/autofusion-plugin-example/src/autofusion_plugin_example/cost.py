"""The ``autofusion.cost_models`` entry point: a kernel costs its memory traffic plus a launch.

The factory is called with the op registry in use (built-in ops plus plugin ops).
"""

from __future__ import annotations

from collections.abc import Sequence

from autofusion.decide.groups import group_io
from autofusion.decide.plan import CostBreakdown
from autofusion.ir import Graph
from autofusion.ops import OpRegistry

BANDWIDTH = 20e9  # bytes per second
LAUNCH = 2e-6  # seconds per kernel


class BytesOnlyCostModel:
    name = "bytes-only"

    def __init__(self, registry: OpRegistry) -> None:
        self.registry = registry

    def group_cost(self, graph: Graph, nodes: Sequence[str]) -> CostBreakdown:
        if all(self.registry[graph.node_by_name[n].op].view for n in nodes):
            return CostBreakdown(0.0, 0, 0, 0, self.name)  # reshapes move no data
        inputs, outputs = group_io(graph, nodes)
        nbytes = sum(graph.types[t].nbytes for t in (*inputs, *outputs))
        return CostBreakdown(LAUNCH + nbytes / BANDWIDTH, nbytes, 0, 1, self.name)
