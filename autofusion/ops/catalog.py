"""Collects the built-in op definitions from each op-class module into the default registry (above
the registry module, which the op modules import)."""

from __future__ import annotations

import functools

from autofusion.ops import broadcast, indexing, opaque, pointwise, reduction, reorganize
from autofusion.ops.registry import OpDef, OpRegistry


def all_ops() -> list[OpDef]:
    """Every built-in op: pointwise, broadcast, reduction, reorganize (incl. indexing) and opaque."""
    return [*pointwise.ops(), *broadcast.ops(), *reduction.ops(), *reorganize.ops(), *indexing.ops(),
            *opaque.ops()]


@functools.cache
def default_registry() -> OpRegistry:
    """The built-in ops (every op of the supported ONNX exports). Cached: registries are immutable."""
    return OpRegistry(all_ops())
