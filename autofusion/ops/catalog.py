"""Collects the built-in op definitions from each op-class module."""

from __future__ import annotations

from autofusion.ops import opaque, pointwise, reduction, reorganize
from autofusion.ops.registry import OpDef


def all_ops() -> list[OpDef]:
    return [*pointwise.ops(), *reduction.ops(), *reorganize.ops(), *opaque.ops()]
