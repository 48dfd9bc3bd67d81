"""What a kind's ``accepts`` reads about a candidate group: its nodes, their op facts, how they connect."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from autofusion.graph.graph import Graph, Node
from autofusion.ops.registry import OpClass, OpDef


@dataclass(frozen=True)
class GroupFacts:
    """A candidate group of ``graph``: ``defs`` gives each member's OpDef; ``loop`` says the engine
    found the group as a recurrence (a loop candidate of a loop rule)."""

    graph: Graph
    nodes: frozenset[str]
    defs: Mapping[str, OpDef]
    loop: bool = False

    def node(self, name: str) -> Node:
        return self.graph.node_by_name[name]

    def is_view(self, name: str) -> bool:
        return self.defs[name].view

    @cached_property
    def compute(self) -> tuple[str, ...]:
        """Members that compute (views aside), in graph order."""
        index = self.graph.node_index
        return tuple(sorted((n for n in self.nodes if not self.is_view(n)), key=index.__getitem__))

    def of_class(self, op_class: OpClass) -> tuple[str, ...]:
        return tuple(n for n in self.compute if self.defs[n].op_class is op_class)

    @cached_property
    def opaque(self) -> tuple[str, ...]:
        return self.of_class(OpClass.OPAQUE)

    @cached_property
    def reductions(self) -> tuple[str, ...]:
        return self.of_class(OpClass.REDUCTION)

    @cached_property
    def outputs(self) -> tuple[str, ...]:
        """Tensors the group writes: read outside it, or graph outputs."""
        g, out = self.graph, []
        for n in self.compute:
            for o in self.node(n).outputs:
                if o and (o in g.outputs or any(c.name not in self.nodes for c in g.consumers.get(o, ()))):
                    out.append(o)
        return tuple(out)

    def feeds_each_other(self, targets: Iterable[str]) -> bool:
        """Whether one of ``targets`` reaches another through members of the group."""
        g, wanted = self.graph, set(targets)
        for n in wanted:
            stack = [c.name for o in g.node_by_name[n].outputs for c in g.consumers.get(o, ())]
            seen: set[str] = set()
            while stack:
                m = stack.pop()
                if m in seen or m not in self.nodes:
                    continue
                if m in wanted:
                    return True
                seen.add(m)
                stack.extend(c.name for o in g.node_by_name[m].outputs for c in g.consumers.get(o, ()))
        return False

    def fed_from_inside(self, name: str) -> bool:
        """Whether a computing member of the group produces one of ``name``'s inputs."""
        return bool(self.inside_producers(name))

    def inside_producers(self, name: str) -> tuple[str, ...]:
        """The computing members of the group that produce ``name``'s inputs."""
        found = []
        for i in self.node(name).inputs:
            p = self.graph.producers.get(i)
            if p is not None and p.name in self.nodes and not self.is_view(p.name):
                found.append(p.name)
        return tuple(found)
