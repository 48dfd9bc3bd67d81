"""How close the fast strategies come to the exact one: the modelled cost each finds per region.

Every region of the fusion space (a connected set of allowed merges) is solved by every strategy
from the same all-singletons start, and each partition is priced under the same cost model. A
region where the exact strategy had to fall back (too many candidate groups) has no exact cost
and is counted apart, never in the gaps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from autofusion.api import RulesArg, load_ruleset
from autofusion.decide.cost import AnalyticCostModel, CostModel
from autofusion.decide.legality import DEFAULT_SIZE_CAP, GroupChecker
from autofusion.decide.optimize import region_signature, regions_of
from autofusion.decide.partition import Partition
from autofusion.decide.strategies import Region, get_strategy
from autofusion.engine import fusion_space, saturate_rewrites
from autofusion.graph.graph import Graph
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

STRATEGIES: tuple[str, ...] = ("greedy", "dp", "beam", "exact")


@dataclass(frozen=True)
class RegionCosts:
    """One structurally distinct region: its size, how many regions share its structure, and the
    modelled seconds of the partition each strategy chose (with the notes of any fallback)."""

    first_node: str
    nodes: int
    copies: int
    costs: dict[str, float]
    notes: dict[str, tuple[str, ...]]

    @property
    def exact_solved(self) -> bool:
        """The exact strategy solved this region itself (it did not fall back to beam search)."""
        return "exact" in self.costs and not any(n.startswith("exact:") for n in self.notes.get("exact", ()))

    def gap_percent(self, strategy: str) -> float | None:
        """How far ``strategy``'s cost lies above the exact one, in percent (None without an exact cost)."""
        if not self.exact_solved or strategy not in self.costs:
            return None
        exact = self.costs["exact"]
        if exact <= 0:
            return 0.0 if self.costs[strategy] <= 0 else float("inf")
        return (self.costs[strategy] - exact) / exact * 100.0


def region_costs(graph: Graph, rules: RulesArg = None, strategies: Sequence[str] = STRATEGIES,
                 cost_model: CostModel | None = None, size_cap: int = DEFAULT_SIZE_CAP,
                 registry: OpRegistry | None = None) -> list[RegionCosts]:
    """Every structurally distinct region of ``graph``'s fusion space, solved by each strategy."""
    registry = registry or default_registry()
    ruleset = load_ruleset(rules, registry)
    rewritten = saturate_rewrites(graph, ruleset, registry).graph
    space, _ = fusion_space(rewritten, ruleset, registry)
    model = cost_model or AnalyticCostModel(registry=registry)
    checker = GroupChecker(space, registry, size_cap)
    cache: dict[frozenset[str], float] = {}

    def seconds(nodes: frozenset[str]) -> float:
        c = cache.get(nodes)
        if c is None:
            c = model.group_cost(rewritten, sorted(nodes)).seconds
            cache[nodes] = c
        return c

    by_signature: dict[object, list[tuple[str, ...]]] = {}
    for nodes in regions_of(space):
        by_signature.setdefault(region_signature(space, nodes), []).append(nodes)
    out = []
    for copies in by_signature.values():
        nodes = copies[0]
        members = set(nodes)
        pairs = tuple((a, b) for a, b in list(space.edges) + list(space.siblings) if a in members and b in members)
        costs: dict[str, float] = {}
        notes: dict[str, tuple[str, ...]] = {}
        for name in strategies:
            region = Region(nodes, pairs, checker, seconds)
            groups = get_strategy(name).solve(region, Partition(rewritten))
            _check_cover(name, nodes, groups)
            costs[name] = region.partition_cost(groups)
            notes[name] = tuple(region.notes)
        out.append(RegionCosts(nodes[0], len(nodes), len(copies), costs, notes))
    return out


def _check_cover(strategy: str, nodes: Sequence[str], groups: Sequence[frozenset[str]]) -> None:
    """A strategy's groups must cover the region exactly once, or its cost means nothing."""
    seen = [n for g in groups for n in g]
    if sorted(seen) != sorted(nodes):
        raise AssertionError(f"strategy {strategy} returned groups that do not partition the region at {nodes[0]}")


@dataclass(frozen=True)
class GapSummary:
    """Gaps to the exact cost over the regions the exact strategy solved (copies counted)."""

    strategy: str
    regions: int
    max_percent: float
    mean_percent: float
    min_percent: float  # below zero only if the strategy beat the exact solver (it should not)
    worse_regions: int
    fallback_regions: int  # regions where the strategy noted it solved them another way


NOISE_PERCENT = 1e-9  # float rounding of summed costs


def summarise(regions: Sequence[RegionCosts], strategy: str) -> GapSummary:
    gaps: list[float] = []
    for r in regions:
        g = r.gap_percent(strategy)
        if g is not None:
            gaps.extend([0.0 if abs(g) < NOISE_PERCENT else g] * r.copies)
    fallbacks = sum(r.copies for r in regions if r.notes.get(strategy))
    if not gaps:
        return GapSummary(strategy, 0, 0.0, 0.0, 0.0, 0, fallbacks)
    return GapSummary(strategy, len(gaps), max(gaps), statistics.fmean(gaps), min(gaps),
                      sum(1 for g in gaps if g > 0), fallbacks)
