"""A partition of graph nodes into groups, with the acyclicity test every strategy shares."""

from __future__ import annotations

from collections.abc import Iterable

from autofusion.ir.graph import Graph


class Partition:
    """Mutable union of nodes into groups (used inside a strategy only; plans are immutable).

    Topological indices bound cycle searches: a group
    whose first node comes after the target group's last node cannot reach it.
    """

    def __init__(self, graph: Graph, groups: Iterable[Iterable[str]] | None = None) -> None:
        self.graph = graph
        self.index = {n.name: i for i, n in enumerate(graph.nodes)}
        self._owner: dict[str, str] = {}
        self._members: dict[str, set[str]] = {}
        for n in graph.nodes:
            self._owner[n.name] = n.name
            self._members[n.name] = {n.name}
        for g in groups or ():
            g = sorted(g, key=self.index.__getitem__)
            for n in g[1:]:
                self.merge(g[0], n)
        self._succ_cache: dict[str, tuple[str, ...]] = {}

    def copy(self) -> Partition:
        p = Partition.__new__(Partition)
        p.graph, p.index = self.graph, self.index
        p._owner = dict(self._owner)
        p._members = {k: set(v) for k, v in self._members.items()}
        p._succ_cache = self._succ_cache
        return p

    def members(self, node: str) -> frozenset[str]:
        return frozenset(self._members[self._owner[node]])

    def groups(self) -> list[frozenset[str]]:
        return [frozenset(m) for m in self._members.values()]

    def key(self) -> frozenset[frozenset[str]]:
        return frozenset(frozenset(m) for m in self._members.values() if len(m) > 1)

    def _node_succ(self, node: str) -> tuple[str, ...]:
        s = self._succ_cache.get(node)
        if s is None:
            g = self.graph
            s = tuple(dict.fromkeys(c.name for o in g.node_by_name[node].outputs for c in g.consumers.get(o, ())))
            self._succ_cache[node] = s
        return s

    def _reaches(self, start: set[str], target: set[str], limit: int, skip: set[str]) -> bool:
        """Is there a path of groups from ``start`` (members) to ``target`` leaving start first?"""
        frontier = [c for n in start for c in self._node_succ(n) if c not in start and c not in skip]
        seen_groups: set[str] = set()
        while frontier:
            n = frontier.pop()
            if n in target:
                return True
            rep = self._owner[n]
            if rep in seen_groups:
                continue
            seen_groups.add(rep)
            members = self._members[rep]
            if min(self.index[m] for m in members) > limit:
                continue
            for m in members:
                for c in self._node_succ(m):
                    if c not in members:
                        frontier.append(c)
        return False

    def can_merge(self, a: str, b: str) -> bool:
        """Merging the groups of ``a`` and ``b`` keeps the group graph acyclic."""
        ra, rb = self._owner[a], self._owner[b]
        if ra == rb:
            return True
        ga, gb = self._members[ra], self._members[rb]
        # a path ga -> (other groups) -> gb, or gb -> ... -> ga, would become a cycle
        return not (self._reaches(ga, gb, max(self.index[m] for m in gb), gb)
                    or self._reaches(gb, ga, max(self.index[m] for m in ga), ga))

    def merge(self, a: str, b: str) -> str:
        ra, rb = self._owner[a], self._owner[b]
        if ra == rb:
            return ra
        if len(self._members[ra]) < len(self._members[rb]):
            ra, rb = rb, ra
        for n in self._members[rb]:
            self._owner[n] = ra
        self._members[ra] |= self._members.pop(rb)
        return ra

    def is_acyclic(self) -> bool:
        """Whole-partition check (used to validate reused or combined solutions)."""
        reps = list(self._members)
        succ: dict[str, set[str]] = {r: set() for r in reps}
        indeg = dict.fromkeys(reps, 0)
        for r in reps:
            for n in self._members[r]:
                for c in self._node_succ(n):
                    rc = self._owner[c]
                    if rc != r and rc not in succ[r]:
                        succ[r].add(rc)
                        indeg[rc] += 1
        ready = [r for r in reps if indeg[r] == 0]
        seen = 0
        while ready:
            r = ready.pop()
            seen += 1
            for c in succ[r]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        return seen == len(reps)
