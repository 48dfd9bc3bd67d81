"""Graphs with symbolic sizes: what they depend on, and the static graph of one binding.

A model imported with its dynamic axes kept (``load_onnx(path, symbolic=True)``) has shapes over
symbols (``float32[batch,seq,768]``), symbolic constants (a Reshape's target ``[batch, seq, 12,
64]``) and nodes that a static import folds (``Range(0, seq)``). :func:`bind` gives the graph of one
binding: every size evaluated, the shape arithmetic folded, the result verified, as the static
import at those sizes would be.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autofusion.graph.dims import SymbolicDimError, evaluate, free_symbols
from autofusion.graph.graph import Const, FrozenMap, Graph
from autofusion.ir.passes import fold_constants
from autofusion.ir.verify import verify
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry


class BindError(ValueError):
    """A binding that the graph cannot take: a symbol without a size, a size out of range."""


def symbols_of(graph: Graph) -> tuple[str, ...]:
    """The symbols the graph's sizes depend on, sorted."""
    names = set(free_symbols(d for t in graph.types.values() for d in t.shape))
    for c in graph.constants.values():
        if c.is_symbolic:
            names |= free_symbols(v for v in c.array.reshape(-1).tolist() if not isinstance(v, int))
    return tuple(sorted(names))


def is_symbolic(graph: Graph) -> bool:
    return any(not t.is_static for t in graph.types.values()) or any(c.is_symbolic for c in graph.constants.values())


def check_binding(graph: Graph, binding: Mapping[str, int]) -> dict[str, int]:
    """``binding`` restricted to the graph's symbols, checked: each bound, a positive int, within the
    graph's bounds. Raises BindError naming the symbol."""
    symbols = symbols_of(graph)
    missing = [s for s in symbols if s not in binding]
    if missing:
        raise BindError(f"no size given for {', '.join(map(repr, missing))} (the graph's sizes: "
                        f"{', '.join(symbols)})")
    out: dict[str, int] = {}
    for name in symbols:
        value = binding[name]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise BindError(f"size {name!r} must be an int, got {value!r}")
        if value < 1:
            raise BindError(f"size {name!r} = {value}: the graph needs at least 1")
        limit = graph.bounds.get(name)
        if limit is not None and value > limit:
            raise BindError(f"size {name!r} = {value} exceeds {limit}, the most the model takes")
        out[name] = int(value)
    return out


def bind(graph: Graph, binding: Mapping[str, int], registry: OpRegistry | None = None) -> Graph:
    """The static graph of ``graph`` at ``binding`` (symbol name -> size); the same graph when it
    has no symbols."""
    if not is_symbolic(graph):
        return graph
    sizes = check_binding(graph, binding)
    registry = registry or default_registry()
    try:
        types = {k: t.with_shape(tuple(evaluate(d, sizes) for d in t.shape)) for k, t in graph.types.items()}
        consts = {k: Const(_evaluated(c, sizes)) if c.is_symbolic else c for k, c in graph.constants.items()}
    except SymbolicDimError as e:
        raise BindError(str(e)) from None
    static = graph.replace(types=FrozenMap(types), constants=FrozenMap(consts), bounds=FrozenMap())
    return verify(fold_constants(static, registry), registry)


def _evaluated(c: Const, sizes: Mapping[str, int]) -> np.ndarray:
    values = [evaluate(v, sizes) for v in c.array.reshape(-1).tolist()]
    return np.array(values, np.int64).reshape(c.array.shape)
