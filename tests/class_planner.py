"""A rule-free greedy fusion plan, the tests' helper for exercising the code generator on whole models.

The real decider (``autofusion.decide``) chooses groups from rules and a cost model; this one
merges greedily along producer -> consumer edges with fixed class rules, never forming a cycle:

* elementwise ops (pointwise, broadcast, reorganise) join each other;
* a MatMul/Gemm/Conv core absorbs the elementwise ops consuming it (its epilogue) and the
  view/transpose ops feeding it; at most one core per group;
* a reduction absorbs its elementwise prologue and epilogue; at most one reduction per group and
  never with a core;
* optionally, MatMuls sharing one input with constant weights become one ``horizontal_gemm``.

>>> # plan = greedy_plan(graph); CompiledModel(plan).run(feeds)
"""

from __future__ import annotations

from collections.abc import Sequence

from autofusion.codegen.reductions import REDUCTION_OPS
from autofusion.decide.groups import build_groups
from autofusion.decide.plan import ZERO_COST, Plan, RuleRef
from autofusion.graph.graph import Graph
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpClass, OpRegistry

_ELEMENTWISE = (OpClass.POINTWISE, OpClass.BROADCAST, OpClass.REORGANIZE)


class _Groups:
    """Union-find over nodes with the group DAG kept acyclic."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.parent = {n.name: n.name for n in graph.nodes}
        self.members = {n.name: {n.name} for n in graph.nodes}

    def find(self, n: str) -> str:
        while self.parent[n] != n:
            self.parent[n] = self.parent[self.parent[n]]
            n = self.parent[n]
        return n

    def _succ(self, root: str) -> set[str]:
        out = set()
        for name in self.members[root]:
            for o in self.graph.node_by_name[name].outputs:
                for c in self.graph.consumers.get(o, ()):
                    r = self.find(c.name)
                    if r != root:
                        out.add(r)
        return out

    def _reaches(self, start: str, target: str, skip: str) -> bool:
        """Whether ``target`` is reachable from ``start`` through groups other than ``skip``."""
        stack, seen = [s for s in self._succ(start) if s != skip], set()
        while stack:
            r = stack.pop()
            if r == target:
                return True
            if r in seen:
                continue
            seen.add(r)
            stack.extend(self._succ(r))
        return False

    def can_merge(self, a: str, b: str) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        return not self._reaches(ra, rb, rb) and not self._reaches(rb, ra, ra)

    def merge(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        self.parent[rb] = ra
        self.members[ra] |= self.members.pop(rb)


def _kinds(graph: Graph, names: set[str], registry: OpRegistry) -> tuple[int, int, bool]:
    """(cores, reductions, only elementwise/layout) of a set of nodes."""
    ops = [graph.node_by_name[n].op for n in names]
    cores = sum(bool(registry[op].core) for op in ops)
    reductions = sum(op in REDUCTION_OPS for op in ops)
    plain = all(not registry[op].core and op not in REDUCTION_OPS and registry[op].op_class in _ELEMENTWISE
                for op in ops)
    return cores, reductions, plain


def greedy_plan(graph: Graph, registry: OpRegistry | None = None, horizontal: bool = False) -> Plan:
    """A fused plan of ``graph`` by the greedy class rules of the module docstring."""
    registry = registry or default_registry()
    uf = _Groups(graph)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    if horizontal:
        by_input: dict[str, list[str]] = {}
        for n in graph.nodes:
            if n.op == "MatMul" and graph.is_const(n.inputs[1]) and graph.types[n.inputs[1]].rank == 2:
                by_input.setdefault(n.inputs[0], []).append(n.name)
        for names in by_input.values():
            for other in names[1:]:
                if uf.can_merge(names[0], other):
                    uf.merge(names[0], other)
    for node in graph.nodes:
        for t in node.inputs:
            prod = graph.producers.get(t) if t else None
            if prod is None:
                continue
            a, b = uf.members[uf.find(prod.name)], uf.members[uf.find(node.name)]
            if uf.find(prod.name) == uf.find(node.name):
                continue
            ca, ra, pa = _kinds(graph, a, registry)
            cb, rb, pb = _kinds(graph, b, registry)
            if ca + cb > 1 and not (horizontal and ca and cb and _all_cores_share(graph, a | b, registry)):
                continue
            if (ca or cb) and (ra or rb):
                continue
            if ra + rb > 1:
                continue
            consumer_op = node.op
            producer_ops = {graph.node_by_name[n].op for n in a}
            if cb and not ca:  # into a core group: only layout prologues (views, transposes) of its operands
                layout = all(registry[op].view or op == "Transpose" for op in producer_ops)
                if not layout or not registry[consumer_op].core:
                    continue
            elif ca and not cb:  # out of a core group: elementwise epilogue
                if not pb:
                    continue
            elif not (pa or pb or ra or rb):
                continue
            elif not ((pa or ra) and (pb or rb)):
                continue
            if any(graph.node_by_name[n].op in ("LSTM",) or (
                    registry[graph.node_by_name[n].op].op_class is OpClass.OPAQUE
                    and not registry[graph.node_by_name[n].op].core) for n in a | b):
                continue
            if uf.can_merge(prod.name, node.name):
                uf.merge(prod.name, node.name)
    partition = [sorted(m, key=order.__getitem__) for m in uf.members.values()]

    def template(nodes: Sequence[str]) -> str:
        ops = [graph.node_by_name[n].op for n in nodes]
        defs = [registry[op] for op in ops]
        cores = [d.core for d in defs if d.core]
        if all(d.view for d in defs):
            return "view"
        if len(cores) > 1:
            return "horizontal_gemm"
        if cores:
            return f"{cores[0]}_epilogue"
        if len(nodes) == 1 and defs[0].op_class is OpClass.OPAQUE:
            return "opaque"
        if any(op in REDUCTION_OPS for op in ops):
            return "reduction"
        return "pointwise"

    def rules(nodes: Sequence[str]) -> tuple[RuleRef, ...]:
        return (RuleRef("greedy_" + template(nodes), __file__, 1),) if len(nodes) > 1 else ()

    groups = build_groups(graph, partition, template_of=template, rules_of=rules, registry=registry)
    return Plan(graph, groups, ZERO_COST, ZERO_COST, strategy="greedy")


def _all_cores_share(graph: Graph, names: set[str], registry: OpRegistry) -> bool:
    cores = [graph.node_by_name[n] for n in names if registry[graph.node_by_name[n].op].core]
    return all(c.op == "MatMul" for c in cores) and len({c.inputs[0] for c in cores}) == 1
