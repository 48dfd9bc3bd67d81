"""Legality of one fused group, enforced by the engine rather than by each rule: every internal edge
allowed by a rule, a kernel kind that accepts the group, a size cap. Acyclicity between groups is
checked over whole partitions (see ``acyclic``).

The kind of a group is the one its rules name: of the kinds named by the permissions inside the
group, the one of highest priority that accepts it (equal priorities: the registry's order). A
group whose rules name no kind (class rules that keep the host's) takes the kind its op mix needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autofusion.decide.plan import RuleRef, UnfusedReason
from autofusion.engine.space import FusionSpace, Permission
from autofusion.graph.graph import FrozenMap
from autofusion.kinds import Acceptance, GroupFacts, KernelKind, KindError, KindRegistry, default_kinds
from autofusion.kinds.builtin import natural_kind
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

DEFAULT_SIZE_CAP = 48


@dataclass(frozen=True)
class Verdict:
    ok: bool
    template: str = ""
    reason: UnfusedReason | None = None
    detail: str = ""
    decided_by: RuleRef | None = None  # the rule whose kind won; None when the op mix chose it
    params: FrozenMap[str, Any] = FrozenMap()
    priority: int = 0  # the deciding rule's priority (ties between equal costs go to the higher)


@dataclass(frozen=True)
class _Claim:
    """A kind the rules of a group name, with the strongest permission naming it."""

    kind: str
    priority: int
    rule: RuleRef
    params: FrozenMap[str, Any]


class GroupChecker:
    """Decides whether a set of nodes may be one kernel, and which kind renders it."""

    def __init__(self, space: FusionSpace, registry: OpRegistry | None = None,
                 size_cap: int = DEFAULT_SIZE_CAP, kinds: KindRegistry | None = None) -> None:
        self.space = space
        self.graph = space.graph
        self.registry = registry or default_registry()
        self.kinds = kinds or default_kinds()
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

    def facts(self, nodes: frozenset[str]) -> GroupFacts:
        return GroupFacts(self.graph, nodes, {n: self._defs[n] for n in nodes}, nodes in self._loops)

    def _check(self, nodes: frozenset[str]) -> Verdict:
        if len(nodes) == 1:
            return self._natural(nodes)
        loop = self._loops.get(nodes)
        if loop is not None:
            return self._claimed(nodes, [_Claim(loop.template, 0, loop.rule, loop.params)])
        compute = [n for n in nodes if not self.is_view(n)]
        if len(compute) > self.size_cap:
            return Verdict(False, reason=UnfusedReason.SIZE_CAP, detail=f"{len(compute)} ops > cap {self.size_cap}")
        if nodes & self.space.nofuse:
            return Verdict(False, reason=UnfusedReason.NOFUSE)
        bad = self._unpermitted_edge(nodes)
        if bad is not None:
            return Verdict(False, reason=UnfusedReason.NO_RULE, detail=f"{bad[0]} -> {bad[1]} has no rule")
        claims = self._claims(nodes) if compute else []
        return self._claimed(nodes, claims) if claims else self._natural(nodes)

    def _natural(self, nodes: frozenset[str]) -> Verdict:
        facts = self.facts(nodes)
        name = natural_kind(facts)
        kind = self.kinds.get(name)
        if kind is None:  # an op whose core no registered kind renders
            return Verdict(False, reason=UnfusedReason.TEMPLATE, detail=f"no kernel kind {name!r} is registered")
        verdict = _accepts(kind, facts)
        if not verdict.ok:
            return Verdict(False, reason=UnfusedReason.TEMPLATE, detail=verdict.detail)
        return Verdict(True, name)

    def _claimed(self, nodes: frozenset[str], claims: list[_Claim]) -> Verdict:
        """The first claim, by priority then kind order, whose kind accepts the group."""
        facts = self.facts(nodes)
        refusals = []
        for claim in sorted(claims, key=lambda c: (-c.priority, self.kinds.rank(c.kind), c.rule.name)):
            kind = self.kinds.get(claim.kind)
            if kind is None:
                refusals.append(f"{claim.rule.name} names kind {claim.kind!r}, which is not registered")
                continue
            answer = _accepts(kind, facts)
            if answer.ok:
                return Verdict(True, claim.kind, decided_by=claim.rule, params=claim.params, priority=claim.priority)
            refusals.append(f"{claim.rule.name} names {claim.kind}: {answer.detail}")
        return Verdict(False, reason=UnfusedReason.TEMPLATE, detail="; ".join(refusals))

    def _claims(self, nodes: frozenset[str]) -> list[_Claim]:
        """One claim per kind named inside the group: its highest-priority permission's rule and params."""
        best: dict[str, _Claim] = {}
        for p in sorted(self._permissions(nodes), key=lambda p: (-p.priority, _order(p.rule))):
            if p.template and p.template not in best:
                best[p.template] = _Claim(p.template, p.priority, p.rule, p.params)
        return list(best.values())

    def _permissions(self, nodes: frozenset[str]) -> list[Permission]:
        return [p for a in sorted(nodes) for b, perms in self._perms_of.get(a, ()) if b in nodes for p in perms]

    def _unpermitted_edge(self, nodes: frozenset[str]) -> tuple[str, str] | None:
        g = self.graph
        for n in nodes:
            for o in g.node_by_name[n].outputs:
                for c in g.consumers.get(o, ()):
                    if c.name in nodes and c.name != n and not (self.is_view(n) or self.is_view(c.name)):
                        if (n, c.name) not in self.space.edges:
                            return (n, c.name)
        return None

    def rules_of(self, nodes: Iterable[str]) -> tuple[RuleRef, ...]:
        """The rules whose permissions are used inside the group, in a stable order."""
        members = frozenset(nodes)
        loop = self._loops.get(members)
        if loop is not None:
            return (loop.rule,)
        refs = dict.fromkeys(p.rule for p in self._permissions(members))
        return tuple(sorted(refs, key=_order))


def _accepts(kind: KernelKind, facts: GroupFacts) -> Acceptance:
    """``kind.accepts(facts)``; a kind that fails (a plugin's) is a KindError naming it."""
    try:
        answer = kind.accepts(facts)
    except Exception as e:
        raise KindError(f"kernel kind {kind.name!r}: accepts() raised {type(e).__name__}: {e}") from None
    if not isinstance(answer, Acceptance):
        raise KindError(f"kernel kind {kind.name!r}: accepts() returned {type(answer).__name__}, not an Acceptance")
    return answer


def _order(rule: RuleRef) -> tuple[str, int, str]:
    return (rule.file, rule.line, rule.name)
