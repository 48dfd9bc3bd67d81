"""The ``autofusion.backends`` entry point: runs a plan kernel by kernel with the ops' numpy code.

Only each kernel's outputs are kept between kernels, as generated code would keep them in memory;
its intermediates live only while the kernel runs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autofusion.decide.plan import Plan
from autofusion.plugins import registry_with_plugins


class CompiledPlan:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.registry = registry_with_plugins()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        graph = self.plan.graph
        memory: dict[str, np.ndarray] = {k: c.array for k, c in graph.constants.items()}
        memory.update({k: np.asarray(v) for k, v in feeds.items()})
        for group in self.plan.groups:
            local = {t: memory[t] for t in group.inputs}
            for name in group.nodes:
                node = graph.node_by_name[name]
                args = [local[i] if i else None for i in node.inputs]
                for out, value in zip(node.outputs, self.registry[node.op].reference(args, node.attrs)):
                    if out:
                        local[out] = np.asarray(value)
            memory.update({t: local[t] for t in group.outputs})
        return {o: memory[o] for o in graph.outputs}


class KernelInterpreter:
    name = "kernel-interpreter"

    def compile(self, plan: Plan) -> CompiledPlan:
        return CompiledPlan(plan)
