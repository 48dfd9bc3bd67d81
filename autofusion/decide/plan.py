"""The fusion plan: the decider's output and the code generator's input. Plain frozen data.

A plan partitions the nodes of a graph (usually the graph after algebraic rewrites) into fused
groups. Each group becomes one kernel rendered by one template; a tensor produced inside a group
and used outside it (or a graph output) is materialised, every other intermediate stays in the
kernel. Groups are listed in a topological order of the group graph.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from autofusion.engine.space import RuleRef, UnfusedReason
from autofusion.graph.graph import FrozenMap, Graph
from autofusion.kinds import KindRegistry, default_kinds
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

__all__ = ["RuleRef", "UnfusedReason"]  # (also named here: plans carry both)


@dataclass(frozen=True)
class CostBreakdown:
    """Modelled cost of a set of kernels; ``seconds`` is the model's total."""

    seconds: float
    bytes: int
    flops: int
    launches: int
    model: str = "analytic"

    def __add__(self, other: CostBreakdown) -> CostBreakdown:
        return CostBreakdown(self.seconds + other.seconds, self.bytes + other.bytes, self.flops + other.flops,
                             self.launches + other.launches, self.model)


ZERO_COST = CostBreakdown(0.0, 0, 0, 0)


@dataclass(frozen=True)
class FusedGroup:
    """One kernel: graph nodes computed together.

    ``nodes`` are node names in topological order; ``inputs`` the tensors it reads from memory
    (graph inputs, constants, other groups' outputs); ``outputs`` the tensors it writes.
    ``template`` names the kernel kind that renders it; ``rules`` the rules that allowed it;
    ``decided_by`` the rule whose kind and ``params`` won (None when the op mix chose the kind).
    """

    name: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    template: str
    kind: str = "single"  # single | linear | branch | loop
    rules: tuple[RuleRef, ...] = ()
    params: FrozenMap[str, Any] = field(default_factory=FrozenMap)
    cost: CostBreakdown = ZERO_COST
    decided_by: RuleRef | None = None

    @property
    def fused(self) -> bool:
        return len(self.nodes) > 1


@dataclass(frozen=True)
class UnfusedPair:
    producer: str  # node names
    consumer: str
    reason: UnfusedReason
    detail: str = ""


@dataclass(frozen=True)
class Plan:
    """A complete fusion plan for ``graph``."""

    graph: Graph
    groups: tuple[FusedGroup, ...]
    cost_before: CostBreakdown
    cost_after: CostBreakdown
    unfused: tuple[UnfusedPair, ...] = ()
    strategy: str = ""
    stats: FrozenMap[str, Any] = field(default_factory=FrozenMap)
    kinds: KindRegistry = field(default_factory=default_kinds, compare=False, repr=False)  # what renders the groups
    registry: OpRegistry = field(default_factory=default_registry, compare=False, repr=False)  # the graph's ops

    def __copy__(self) -> Plan:
        return replace(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> Plan:  # the registry and kinds are shared, not copied
        return replace(self, **{f.name: copy.deepcopy(getattr(self, f.name), memo) for f in fields(self)
                                if f.name not in ("kinds", "registry")})

    def __getstate__(self) -> dict[str, Any]:
        # the op registry and the kinds hold functions: a pickled plan (a bench worker's job) leaves
        # them out and takes the built-in ones back; bench/worker.py puts the plugins' back
        return {k: v for k, v in self.__dict__.items() if k not in ("kinds", "registry")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in {**state, "kinds": default_kinds(), "registry": default_registry()}.items():
            object.__setattr__(self, key, value)

    @property
    def kernels(self) -> int:
        """Kernels launched: groups made only of view ops (Reshape...) cost none."""
        return sum(1 for g in self.groups if g.template != "view")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (the graph itself is not serialised)."""

        def cost(c: CostBreakdown) -> dict[str, Any]:
            return asdict(c)

        return {
            "graph": self.graph.name,
            "strategy": self.strategy,
            "kernels": self.kernels,
            "cost_before": cost(self.cost_before),
            "cost_after": cost(self.cost_after),
            "groups": [
                {
                    "name": g.name,
                    "nodes": list(g.nodes),
                    "ops": [self.graph.node_by_name[n].op for n in g.nodes],
                    "inputs": list(g.inputs),
                    "outputs": list(g.outputs),
                    "template": g.template,
                    "kind": g.kind,
                    "rules": [asdict(r) for r in g.rules],
                    "params": dict(g.params),
                    "decided_by": asdict(g.decided_by) if g.decided_by else None,
                    "cost": cost(g.cost),
                }
                for g in self.groups
            ],
            "unfused": [
                {"producer": u.producer, "consumer": u.consumer, "reason": str(u.reason), "detail": u.detail}
                for u in self.unfused
            ],
            "stats": {k: v for k, v in self.stats.items() if _jsonable(v)},
        }


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False
