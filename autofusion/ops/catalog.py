"""Collects the built-in op definitions from each op-class module."""

from __future__ import annotations

from autofusion.ops import broadcast, indexing, opaque, pointwise, reduction, reorganize
from autofusion.ops.registry import OpDef


def all_ops() -> list[OpDef]:
    """Every built-in op: pointwise, broadcast, reduction, reorganize (incl. indexing) and opaque."""
    return [*pointwise.ops(), *broadcast.ops(), *reduction.ops(), *reorganize.ops(), *indexing.ops(),
            *opaque.ops()]
