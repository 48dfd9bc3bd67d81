"""Legality of one fused group, enforced by the engine rather than by each rule: every internal edge
allowed by a rule, a template that can render the group, a size cap. Acyclicity between groups is
checked over whole partitions (see ``acyclic``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autofusion.decide.plan import RuleRef, UnfusedReason
from autofusion.engine.space import FusionSpace, Permission
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpClass, OpRegistry

DEFAULT_SIZE_CAP = 48


@dataclass(frozen=True)
class Verdict:
    ok: bool
    template: str = ""
    reason: UnfusedReason | None = None
    detail: str = ""


class GroupChecker:
    """Decides whether a set of nodes may be one kernel, and which template renders it."""

    def __init__(self, space: FusionSpace, registry: OpRegistry | None = None,
                 size_cap: int = DEFAULT_SIZE_CAP) -> None:
        self.space = space
        self.graph = space.graph
        self.registry = registry or default_registry()
        self.size_cap = size_cap
        self._defs = {n.name: self.registry[n.op] for n in self.graph.nodes}
        self._cache: dict[frozenset[str], Verdict] = {}
        self._loops = {c.nodes: c for c in space.loops}
        self._perms_of: dict[str, list[tuple[str, tuple[Permission, ...]]]] = {}
        for (a, b), perms in list(space.edges.items()) + list(space.siblings.items()):
            self._perms_of.setdefault(a, []).append((b, perms))

    def is_view(self, node: str) -> bool:
        return self._defs[node].view

    def check(self, nodes: Iterable[str]) -> Verdict:
        key = frozenset(nodes)
        v = self._cache.get(key)
        if v is None:
            v = self._check(key)
            self._cache[key] = v
        return v

    def _check(self, nodes: frozenset[str]) -> Verdict:
        if len(nodes) == 1:
            (n,) = nodes
            return Verdict(True, "view" if self.is_view(n) else _single_template(self._defs[n].op_class))
        loop = self._loops.get(nodes)
        if loop is not None:
            return Verdict(True, loop.template)
        compute = [n for n in nodes if not self.is_view(n)]
        if len(compute) > self.size_cap:
            return Verdict(False, reason=UnfusedReason.SIZE_CAP, detail=f"{len(compute)} ops > cap {self.size_cap}")
        if nodes & self.space.nofuse:
            return Verdict(False, reason=UnfusedReason.NOFUSE)
        bad = self._unpermitted_edge(nodes)
        if bad is not None:
            return Verdict(False, reason=UnfusedReason.NO_RULE, detail=f"{bad[0]} -> {bad[1]} has no rule")
        if not compute:
            return Verdict(True, "view")
        return self._template(nodes, compute)

    def _unpermitted_edge(self, nodes: frozenset[str]) -> tuple[str, str] | None:
        g = self.graph
        for n in nodes:
            for o in g.node_by_name[n].outputs:
                for c in g.consumers.get(o, ()):
                    if c.name in nodes and c.name != n and not (self.is_view(n) or self.is_view(c.name)):
                        if (n, c.name) not in self.space.edges:
                            return (n, c.name)
        return None

    def _template(self, nodes: frozenset[str], compute: Sequence[str]) -> Verdict:
        g = self.graph
        opaque = [n for n in compute if self._defs[n].op_class is OpClass.OPAQUE]
        reductions = [n for n in compute if self._defs[n].op_class is OpClass.REDUCTION]
        if not opaque:
            if len(reductions) > 1:
                return Verdict(False, reason=UnfusedReason.TEMPLATE, detail="more than one reduction in a kernel")
            return Verdict(True, "reduction" if reductions else "pointwise")
        if reductions:
            return Verdict(False, reason=UnfusedReason.TEMPLATE, detail="an opaque core and a reduction")
        pools = [n for n in opaque if self._defs[n].pooling]
        if len(opaque) == 2 and len(pools) == 1 and any(self._defs[n].core == "conv" for n in opaque):
            conv = next(n for n in opaque if n not in pools)
            if not self._feeds_each_other([conv, pools[0]], nodes):  # (a pool before the conv: a prologue, below)
                return Verdict(False, reason=UnfusedReason.TEMPLATE, detail="a pooling op apart from the convolution")
            opaque = [conv]  # the pooling op is the end of the convolution's epilogue
        cores = {self._defs[n].core for n in opaque}
        if len(opaque) > 1:
            first_inputs = {g.node_by_name[n].inputs[0] for n in opaque}
            if cores == {"gemm"} and len(first_inputs) == 1 and not self._feeds_each_other(opaque, nodes):
                return Verdict(True, "horizontal_gemm")
            return Verdict(False, reason=UnfusedReason.TEMPLATE, detail="several opaque cores")
        core = opaque[0]
        if not self._defs[core].core:
            return Verdict(False, reason=UnfusedReason.TEMPLATE, detail=f"{g.node_by_name[core].op} takes no epilogue")
        # the core reads its inputs from memory: nothing in the group may feed it (views aside)
        for i in g.node_by_name[core].inputs:
            p = g.producers.get(i)
            if p is not None and p.name in nodes and not self.is_view(p.name):
                return Verdict(False, reason=UnfusedReason.TEMPLATE, detail="prologue into an opaque core")
        return Verdict(True, f"{self._defs[core].core}_epilogue")

    def _feeds_each_other(self, opaque: Sequence[str], nodes: frozenset[str]) -> bool:
        g = self.graph
        targets = set(opaque)
        for n in opaque:
            stack = [c.name for o in g.node_by_name[n].outputs for c in g.consumers.get(o, ())]
            seen: set[str] = set()
            while stack:
                m = stack.pop()
                if m in seen or m not in nodes:
                    continue
                if m in targets:
                    return True
                seen.add(m)
                stack.extend(c.name for o in g.node_by_name[m].outputs for c in g.consumers.get(o, ()))
        return False

    def rules_of(self, nodes: Iterable[str]) -> tuple[RuleRef, ...]:
        """The rules whose permissions are used inside the group, in a stable order."""
        members = set(nodes)
        for loop in self.space.loops:
            if loop.nodes == members:
                return (loop.rule,)
        refs: dict[RuleRef, None] = {}
        for a in members:
            for b, perms in self._perms_of.get(a, ()):
                if b in members:
                    for p in perms:
                        refs[p.rule] = None
        return tuple(sorted(refs, key=lambda r: (r.file, r.line, r.name)))


def _single_template(op_class: OpClass) -> str:
    return {OpClass.REDUCTION: "reduction", OpClass.OPAQUE: "opaque"}.get(op_class, "pointwise")
