"""The ``autofusion.strategies`` entry point: first-fit merging.

Where the built-in greedy strategy always takes the merge that saves most, first-fit walks the
allowed merges in graph order and takes every one that lowers the modelled cost, until none does.
"""

from __future__ import annotations

from autofusion.decide.partition import Partition
from autofusion.decide.strategies import Region


class FirstFit:
    name = "first-fit"

    def solve(self, region: Region, partition: Partition) -> list[frozenset[str]]:
        p = partition.copy()
        changed = True
        while changed:
            changed = False
            for a, b in region.pairs:
                ga, gb = p.members(a), p.members(b)
                if ga == gb or not p.can_merge(a, b):
                    continue
                merged = ga | gb
                if not region.checker.check(merged).ok:
                    continue
                if region.cost(merged) < region.cost(ga) + region.cost(gb):
                    p.merge(a, b)
                    changed = True
        return list({p.members(n) for n in region.nodes})
