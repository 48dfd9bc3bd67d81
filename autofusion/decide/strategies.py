"""Strategies that choose a partition of one region: greedy, dynamic programming, beam, exact ILP.

Every strategy gets a :class:`Region` (its nodes, the merges the rules allow, a legality checker,
a cost function) and the global :class:`Partition` so far, and returns the groups it picks. They are
looked up by name; plugins add more through the ``autofusion.strategies`` entry point group.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from autofusion.decide.legality import GroupChecker
from autofusion.decide.partition import Partition

EPS = 1e-12


@dataclass
class Region:
    """A connected set of nodes joined by allowed merges; solved independently of other regions."""

    nodes: tuple[str, ...]  # topological order
    pairs: tuple[tuple[str, str], ...]  # merges the rules allow (producer/consumer or siblings)
    checker: GroupChecker
    cost: Callable[[frozenset[str]], float]
    notes: list[str] = field(default_factory=list)

    def partition_cost(self, groups: Sequence[frozenset[str]]) -> float:
        return sum(self.cost(g) for g in groups)


class Strategy(Protocol):
    name: str

    def solve(self, region: Region, partition: Partition) -> list[frozenset[str]]:
        """Groups covering ``region.nodes``; ``partition`` holds other regions' choices (read-only)."""
        ...


def _merge_key(region: Region, p: Partition, a: str, b: str) -> tuple[float, int] | None:
    """(cost change, -priority) of merging the groups of ``a`` and ``b`` when the merge is worth
    taking: it lowers the cost, or leaves it equal and the merged group's rule has a positive
    priority (priority breaks ties); None otherwise."""
    ga, gb = p.members(a), p.members(b)
    if ga == gb:
        return None
    merged = ga | gb
    verdict = region.checker.check(merged)
    if not verdict.ok:
        return None
    d = region.cost(merged) - region.cost(ga) - region.cost(gb)
    if d > EPS or (d >= -EPS and verdict.priority <= 0):
        return None
    return (d, -verdict.priority)


def _tie_score(region: Region, group: frozenset[str]) -> int:
    """What a group is worth between partitions of equal cost, as greedy sees it: each merge in it
    counts its rule's priority when positive, and -1 when not (a merge that saves nothing is made
    only for a rule of positive priority)."""
    if len(group) == 1:
        return 0
    priority = region.checker.check(group).priority
    return (len(group) - 1) * (priority if priority > 0 else -1)


def _tie_rank(region: Region, groups: Sequence[frozenset[str]]) -> int:
    """How partitions of equal cost rank, lower first."""
    return -sum(_tie_score(region, g) for g in groups)


def _region_groups(region: Region, p: Partition) -> list[frozenset[str]]:
    return list({p.members(n) for n in region.nodes})


class Greedy:
    """Repeatedly apply the legal merge that lowers cost most (a heap with lazy re-evaluation).

    A myopic first choice can shut out a better partition (a pointwise op taken into one GEMM's
    epilogue that the next branch needed), so greedy runs again ``restarts`` times, each time with
    one of its first merges forbidden, and keeps the cheapest result."""

    name = "greedy"

    def __init__(self, restarts: int = 4) -> None:
        self.restarts = restarts

    def solve(self, region: Region, partition: Partition) -> list[frozenset[str]]:
        best, merges = self._run(region, partition, frozenset())
        best_cost = region.partition_cost(best)
        for pair in merges[: self.restarts]:
            groups, _ = self._run(region, partition, frozenset([pair]))
            cost = region.partition_cost(groups)
            if cost < best_cost - EPS or (cost <= best_cost + EPS and _tie_rank(region, groups) < _tie_rank(region, best)):
                best, best_cost = groups, cost
        return best

    @staticmethod
    def _run(region: Region, partition: Partition,
             banned: frozenset[tuple[str, str]]) -> tuple[list[frozenset[str]], list[tuple[str, str]]]:
        p = partition.copy()
        heap: list[tuple[float, int, int, str, str]] = []
        counter = itertools.count()
        touching: dict[str, list[tuple[str, str]]] = {}
        pairs = [pair for pair in region.pairs if pair not in banned]
        for pair in pairs:
            touching.setdefault(pair[0], []).append(pair)
            touching.setdefault(pair[1], []).append(pair)
        for a, b in pairs:
            key = _merge_key(region, p, a, b)
            if key is not None:
                heapq.heappush(heap, (*key, next(counter), a, b))
        merges: list[tuple[str, str]] = []
        while heap:
            d, rank, _, a, b = heapq.heappop(heap)
            now = _merge_key(region, p, a, b)
            if now is None:
                continue
            if now[0] > d + EPS or (now[0] >= d - EPS and now[1] > rank):  # stale: the groups changed
                heapq.heappush(heap, (*now, next(counter), a, b))
                continue
            if not p.can_merge(a, b):
                continue
            rep = p.merge(a, b)
            merges.append((a, b))
            for m in p.members(rep):  # re-offer merges that touch the grown group
                for x, y in touching.get(m, ()):
                    key = _merge_key(region, p, x, y)
                    if key is not None:
                        heapq.heappush(heap, (*key, next(counter), x, y))
        return _region_groups(region, p), merges


class Beam:
    """Beam search over merge sequences, keeping the ``width`` cheapest partitions at each depth."""

    name = "beam"

    def __init__(self, width: int = 4, max_steps: int = 400) -> None:
        self.width = width
        self.max_steps = max_steps

    def solve(self, region: Region, partition: Partition) -> list[frozenset[str]]:
        start = partition.copy()
        # (cost, tie rank, partition): the rank follows each merge, as the cost does
        beam = [(region.partition_cost(_region_groups(region, start)), _tie_rank(region, _region_groups(region, start)),
                 start)]
        best = beam[0]
        for _ in range(self.max_steps):
            children: dict[frozenset[frozenset[str]], tuple[float, int, Partition]] = {}
            for total, tie, p in beam:
                for a, b in region.pairs:
                    merge = _merge_key(region, p, a, b)
                    if merge is None or not p.can_merge(a, b):
                        continue
                    ga, gb = p.members(a), p.members(b)
                    q = p.copy()
                    q.merge(a, b)
                    key = q.key()
                    if key not in children:
                        rank = tie - _tie_score(region, ga | gb) + _tie_score(region, ga) + _tie_score(region, gb)
                        children[key] = (total + merge[0], rank, q)
            if not children:
                break
            beam = _cheapest(list(children.values()), self.width)
            if beam[0][0] < best[0] - EPS or (beam[0][0] <= best[0] + EPS and beam[0][1] < best[1]):
                best = beam[0]
        return _region_groups(region, best[2])


def _cheapest(found: list[tuple[float, int, Partition]], width: int) -> list[tuple[float, int, Partition]]:
    """The ``width`` cheapest partitions, the cheapest first; equal costs (within EPS) by tie rank."""
    ordered = sorted(found, key=lambda t: t[0])
    out: list[tuple[float, int, Partition]] = []
    i = 0
    while i < len(ordered) and len(out) < width:
        j = i
        while j + 1 < len(ordered) and ordered[j + 1][0] - ordered[i][0] <= EPS:
            j += 1
        out.extend(sorted(ordered[i:j + 1], key=lambda t: t[1]))
        i = j + 1
    return out[:width]


def enumerate_groups(region: Region, partition: Partition, limit: int = 20000) -> list[frozenset[str]] | None:
    """Every legal connected group of the region (singletons included), or None past ``limit``."""
    adj: dict[str, set[str]] = {n: set() for n in region.nodes}
    for a, b in region.pairs:
        adj[a].add(b)
        adj[b].add(a)
    found: set[frozenset[str]] = {frozenset([n]) for n in region.nodes}
    frontier = list(found)
    cap = region.checker.size_cap
    while frontier:
        nxt = []
        for g in frontier:
            for n in set().union(*(adj[m] for m in g)) - g:
                h = g | {n}
                if h in found or sum(1 for m in h if not region.checker.is_view(m)) > cap:
                    continue
                found.add(h)  # connected supersets are explored even when h itself is illegal
                nxt.append(h)
                if len(found) > limit * 4:
                    return None
        frontier = nxt
    legal = [g for g in found if region.checker.check(g).ok and _convex(g, partition)]
    return legal if len(legal) <= limit else None


def _convex(group: frozenset[str], partition: Partition) -> bool:
    if len(group) == 1:
        return True
    q = partition.copy()
    nodes = sorted(group, key=partition.index.__getitem__)  # topological order keeps each step convex
    for n in nodes[1:]:
        if not q.can_merge(nodes[0], n):
            return False
        q.merge(nodes[0], n)
    return True


class DynamicProgramming:
    """Exact DP over the set of nodes still to place: f(S) = min over ready legal groups G in S of
    cost(G) + f(S - G), where G is ready when no member waits on a node of S outside G. Groups are placed in a topological order, so the result is acyclic. Regions
    with more than ``max_nodes`` nodes are solved greedily (noted in the region's notes)."""

    name = "dp"

    def __init__(self, max_nodes: int = 18, max_states: int = 200000) -> None:
        self.max_nodes = max_nodes
        self.max_states = max_states

    def solve(self, region: Region, partition: Partition) -> list[frozenset[str]]:
        if len(region.nodes) > self.max_nodes:
            region.notes.append(f"dp: region of {len(region.nodes)} nodes > {self.max_nodes}, solved greedily")
            return Greedy().solve(region, partition)
        groups = enumerate_groups(region, partition)
        if groups is None:
            region.notes.append("dp: too many candidate groups, solved greedily")
            return Greedy().solve(region, partition)
        g = partition.graph
        preds = {n: {p.name for i in g.node_by_name[n].inputs if (p := g.producers.get(i)) is not None}
                 for n in region.nodes}
        by_node: dict[str, list[frozenset[str]]] = {n: [] for n in region.nodes}
        for grp in groups:
            for n in grp:
                by_node[n].append(grp)
        memo: dict[frozenset[str], tuple[float, tuple[frozenset[str], ...]]] = {}

        def best(rest: frozenset[str]) -> tuple[float, tuple[frozenset[str], ...]]:
            if not rest:
                return 0.0, ()
            hit = memo.get(rest)
            if hit is not None:
                return hit
            if len(memo) > self.max_states:
                raise _TooBig
            choice: tuple[float, tuple[frozenset[str], ...]] = (float("inf"), ())
            # a ready group's earliest member has no unplaced predecessor: start from such nodes
            sources = [n for n in rest if not preds[n] & rest]
            tried: set[frozenset[str]] = set()
            for src in sources:
                for grp in by_node[src]:
                    if grp in tried or not grp <= rest:
                        continue
                    tried.add(grp)
                    if any((preds[m] & rest) - grp for m in grp):
                        continue  # a member waits on an unplaced node outside the group
                    sub_cost, sub = best(rest - grp)
                    c = region.cost(grp) + sub_cost
                    if c < choice[0] - EPS or (c <= choice[0] + EPS and _tie_rank(region, (grp, *sub))
                                               < _tie_rank(region, choice[1])):
                        choice = (c, (grp, *sub))
            memo[rest] = choice
            return choice

        try:
            cost, chosen = best(frozenset(region.nodes))
        except _TooBig:
            region.notes.append("dp: state space too large, solved greedily")
            return Greedy().solve(region, partition)
        if cost == float("inf"):
            return [frozenset([n]) for n in region.nodes]
        return list(chosen)


class _TooBig(Exception):
    pass


def _acyclic_with(partition: Partition, chosen: Sequence[frozenset[str]]) -> bool:
    q = partition.copy()
    for gr in chosen:
        nodes = sorted(gr, key=q.index.__getitem__)
        for n in nodes[1:]:
            q.merge(nodes[0], n)
    return q.is_acyclic()


class ExactILP:
    """Set partitioning over every legal group with scipy's milp (HiGHS); cycles between chosen
    groups are cut lazily. Falls back to beam search when the region has too many groups."""

    name = "exact"

    def __init__(self, max_groups: int = 20000, max_rounds: int = 50) -> None:
        self.max_groups = max_groups
        self.max_rounds = max_rounds

    @staticmethod
    def _break_ties(region: Region, partition: Partition, groups: list[frozenset[str]], costs: np.ndarray,
                    rows: list, x: np.ndarray, chosen: list[frozenset[str]]) -> list[frozenset[str]]:  # type: ignore[type-arg]
        """Among the partitions as cheap as ``chosen`` (within EPS), the one greedy's tie-break ranks
        first: a second solve with the cost bounded by the optimum."""
        from scipy.optimize import Bounds, LinearConstraint, milp

        scores = np.array([-_tie_score(region, gr) for gr in groups], dtype=float)
        if not scores.any():
            return chosen
        best = float(costs @ (x > 0.5))
        bound = LinearConstraint(costs[None, :], -np.inf, best + EPS * 1e6 + 1e-9 * abs(best))
        res = milp(scores, constraints=[*rows, bound], integrality=np.ones(len(groups)), bounds=Bounds(0, 1))
        if res.x is None:
            return chosen
        alt = [groups[j] for j in np.flatnonzero(res.x > 0.5)]
        if _tie_rank(region, alt) < _tie_rank(region, chosen) and _acyclic_with(partition, alt):
            return alt
        return chosen

    def solve(self, region: Region, partition: Partition) -> list[frozenset[str]]:
        from scipy.optimize import Bounds, LinearConstraint, milp

        groups = enumerate_groups(region, partition, self.max_groups)
        if groups is None:
            region.notes.append("exact: too many candidate groups, solved by beam search")
            return Beam().solve(region, partition)
        index = {n: i for i, n in enumerate(region.nodes)}
        costs = np.array([region.cost(gr) for gr in groups]) * 1e6  # microseconds: solver tolerances are absolute
        cover = np.zeros((len(region.nodes), len(groups)))
        for j, gr in enumerate(groups):
            for n in gr:
                cover[index[n], j] = 1
        rows = [LinearConstraint(cover, 1, 1)]
        for _ in range(self.max_rounds):
            res = milp(costs, constraints=rows, integrality=np.ones(len(groups)), bounds=Bounds(0, 1),
                       options={"mip_rel_gap": 0.0})
            if res.x is None:
                region.notes.append(f"exact: solver failed ({res.message}), solved by beam search")
                return Beam().solve(region, partition)
            chosen = [groups[j] for j in np.flatnonzero(res.x > 0.5)]
            if _acyclic_with(partition, chosen):
                return self._break_ties(region, partition, groups, costs, rows, res.x, chosen)
            cut = np.zeros((1, len(groups)))
            multi = [j for j in np.flatnonzero(res.x > 0.5) if len(groups[j]) > 1]
            cut[0, multi] = 1
            rows.append(LinearConstraint(cut, 0, len(multi) - 1))  # not this combination again
        region.notes.append("exact: cycle cuts did not converge, solved by beam search")
        return Beam().solve(region, partition)


BUILTIN_STRATEGIES: dict[str, Callable[[], Strategy]] = {
    "greedy": Greedy,
    "dp": DynamicProgramming,
    "beam": Beam,
    "exact": ExactILP,
}


def get_strategy(name: str) -> Strategy:
    """A strategy by name: built-in, or from a plugin's ``autofusion.strategies`` entry point."""
    factory = BUILTIN_STRATEGIES.get(name)
    if factory is None:
        from importlib.metadata import entry_points

        for ep in entry_points(group="autofusion.strategies"):
            if ep.name == name:
                factory = ep.load()
                break
    if factory is None:
        known = ", ".join(sorted(BUILTIN_STRATEGIES))
        raise ValueError(f"unknown strategy {name!r} (built-in: {known})")
    return factory()
