"""A partition of graph nodes into groups, with the acyclicity test every strategy shares."""

from __future__ import annotations

from collections.abc import Iterable

from autofusion.graph.graph import Graph


class Partition:
    """Mutable union of nodes into groups (used inside a strategy only; plans are immutable).

    Topological indices bound cycle searches: a group
    whose first node comes after the target group's last node cannot reach it.

    ``copy`` is copy-on-write: the copy keeps only the groups it changed over a shared base, so a
    strategy that tries merges in one region of a 20,000-node graph copies that region, not the
    graph. The base must not change while copies of it are in use (checked).
    """

    def __init__(self, graph: Graph, groups: Iterable[Iterable[str]] | None = None) -> None:
        self.graph = graph
        self.index = {n.name: i for i, n in enumerate(graph.nodes)}
        self._base: Partition | None = None
        self._base_version = 0
        self._version = 0
        self._owner: dict[str, str] = {n.name: n.name for n in graph.nodes}
        self._members: dict[str, set[str]] = {n.name: {n.name} for n in graph.nodes}
        self._gone: set[str] = set()  # representatives merged away (overlays only)
        self._succ_cache: dict[str, tuple[str, ...]] = {}
        for g in groups or ():
            g = sorted(g, key=self.index.__getitem__)
            for n in g[1:]:
                self.merge(g[0], n)

    def copy(self) -> Partition:
        p = Partition.__new__(Partition)
        p.graph, p.index, p._succ_cache = self.graph, self.index, self._succ_cache
        p._base = self._base or self
        p._base_version = p._base._version
        p._version = 0
        p._owner = dict(self._owner) if self._base else {}
        p._members = {k: set(v) for k, v in self._members.items()} if self._base else {}
        p._gone = set(self._gone) if self._base else set()
        return p

    def _owner_of(self, node: str) -> str:
        rep = self._owner.get(node)
        if rep is not None:
            return rep
        base = self._base
        assert base is not None and base._version == self._base_version, "partition changed under its copy"
        return base._owner[node]

    def _group(self, rep: str) -> set[str]:
        """Members of a group, read-only (write through ``_own``)."""
        got = self._members.get(rep)
        if got is not None:
            return got
        assert self._base is not None and rep not in self._gone
        return self._base._members[rep]

    def _own(self, rep: str) -> set[str]:
        """Members of a group this partition may change (copied from the base on first write)."""
        got = self._members.get(rep)
        if got is None:
            got = self._members[rep] = set(self._group(rep))
        return got

    def _reps(self) -> list[str]:
        if self._base is None:
            return list(self._members)
        return [r for r in self._base._members if r not in self._members and r not in self._gone] + list(self._members)

    def save(self, nodes: Iterable[str]) -> dict[str, set[str]]:
        """The groups of ``nodes``, for ``restore`` after merges among them only."""
        return {rep: set(self._group(rep)) for rep in {self._owner_of(n) for n in nodes}}

    def restore(self, saved: dict[str, set[str]]) -> None:
        self._version += 1
        for rep, members in saved.items():
            self._members[rep] = set(members)
            self._gone.discard(rep)
            for m in members:
                self._owner[m] = rep

    def members(self, node: str) -> frozenset[str]:
        return frozenset(self._group(self._owner_of(node)))

    def groups(self) -> list[frozenset[str]]:
        return [frozenset(self._group(r)) for r in self._reps()]

    def key(self) -> frozenset[frozenset[str]]:
        return frozenset(frozenset(m) for m in map(self._group, self._reps()) if len(m) > 1)

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
            rep = self._owner_of(n)
            if rep in seen_groups:
                continue
            seen_groups.add(rep)
            members = self._group(rep)
            if min(self.index[m] for m in members) > limit:
                continue
            for m in members:
                for c in self._node_succ(m):
                    if c not in members:
                        frontier.append(c)
        return False

    def can_merge(self, a: str, b: str) -> bool:
        """Merging the groups of ``a`` and ``b`` keeps the group graph acyclic."""
        ra, rb = self._owner_of(a), self._owner_of(b)
        if ra == rb:
            return True
        ga, gb = self._group(ra), self._group(rb)
        # a path ga -> (other groups) -> gb, or gb -> ... -> ga, would become a cycle
        return not (self._reaches(ga, gb, max(self.index[m] for m in gb), gb)
                    or self._reaches(gb, ga, max(self.index[m] for m in ga), ga))

    def merge(self, a: str, b: str) -> str:
        ra, rb = self._owner_of(a), self._owner_of(b)
        if ra == rb:
            return ra
        if len(self._group(ra)) < len(self._group(rb)):
            ra, rb = rb, ra
        self._version += 1
        moved = self._group(rb)
        for n in moved:
            self._owner[n] = ra
        self._own(ra).update(moved)
        self._members.pop(rb, None)
        if self._base is not None:
            self._gone.add(rb)
        return ra

    def is_acyclic(self) -> bool:
        """Whole-partition check (used to validate reused or combined solutions)."""
        reps = self._reps()
        succ: dict[str, set[str]] = {r: set() for r in reps}
        indeg = dict.fromkeys(reps, 0)
        for r in reps:
            for n in self._group(r):
                for c in self._node_succ(n):
                    rc = self._owner_of(c)
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
