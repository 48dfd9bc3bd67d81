"""The fusion space: which merges the rules allow on a graph, as the engine finds them (and the
decider reads them): permissions with their rules' provenance, blocked edges and why.

The engine matches the rule set against the (rewritten) graph and reports permissions as data; the
decider only chooses among them. Keys are node names.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autofusion.graph.graph import FrozenMap, Graph


@dataclass(frozen=True)
class RuleRef:
    """Provenance: the rule that allowed a fusion, and where it is written."""

    name: str
    file: str = ""
    line: int = 0

    def __str__(self) -> str:
        return f"{self.name} ({self.file}:{self.line})" if self.file else self.name


class UnfusedReason(enum.StrEnum):
    """Why two adjacent nodes ended in different kernels."""

    CYCLE = "would-form-cycle"
    SIZE_CAP = "over-size-cap"
    COST = "cost-says-no"
    NO_RULE = "no-rule-covers"
    GUARD = "guard-rejects"
    GUARD_UNDECIDED = "guard-undecided"  # the guard depends on symbolic sizes bound at run time
    NOFUSE = "no-fuse-scope"
    TEMPLATE = "no-template-for-group"
    MEMORY = "over-memory-bound"


@dataclass(frozen=True)
class Permission:
    """A rule allows ``producer``'s node to be computed in the kernel of ``consumer`` (or, for a
    horizontal permission, two consumers of one tensor to share a kernel)."""

    rule: RuleRef
    template: str = ""
    kind: str = "linear"  # linear | branch | loop
    priority: int = 0
    params: FrozenMap[str, Any] = field(default_factory=FrozenMap)  # the rule's (name=value) for its kind


@dataclass(frozen=True)
class Blocked:
    """Why a data edge has no permission: a guard said no, or a no-fuse scope covers it."""

    reason: UnfusedReason
    detail: str = ""


@dataclass(frozen=True)
class LoopCandidate:
    """A recurrence found in the graph: ``steps`` lists each time step's nodes."""

    rule: RuleRef
    template: str
    steps: tuple[tuple[str, ...], ...]
    params: FrozenMap[str, Any] = field(default_factory=FrozenMap)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(n for step in self.steps for n in step)


@dataclass(frozen=True)
class FusionSpace:
    graph: Graph
    edges: FrozenMap[tuple[str, str], tuple[Permission, ...]] = field(default_factory=FrozenMap)
    siblings: FrozenMap[tuple[str, str], tuple[Permission, ...]] = field(default_factory=FrozenMap)
    blocked: FrozenMap[tuple[str, str], Blocked] = field(default_factory=FrozenMap)
    nofuse: frozenset[str] = frozenset()
    loops: tuple[LoopCandidate, ...] = ()

    def permissions(self, a: str, b: str) -> tuple[Permission, ...]:
        return self.edges.get((a, b), ()) + self.edges.get((b, a), ()) + self.siblings.get(
            (a, b), ()) + self.siblings.get((b, a), ())

    def neighbours(self) -> Mapping[str, tuple[str, ...]]:
        adj: dict[str, list[str]] = {}
        for a, b in list(self.edges) + list(self.siblings):
            adj.setdefault(a, []).append(b)
            adj.setdefault(b, []).append(a)
        return {k: tuple(dict.fromkeys(v)) for k, v in adj.items()}
