"""Graphs with symbolic sizes: what they depend on, and the static graph of one binding.

A model imported with its dynamic axes kept (``load_onnx(path)``) has shapes over
symbols (``float32[batch,seq,768]``), symbolic constants (a Reshape's target ``[batch, seq, 12,
64]``) and nodes that a static import folds (``Range(0, seq)``). :func:`bind` gives the graph of one
binding: every size evaluated, the shape arithmetic folded, the result verified, as the static
import at those sizes would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    for name in symbols:
        problem = _size_problem(graph, name, binding[name])
        if problem:
            raise BindError(problem)
    return {name: int(binding[name]) for name in symbols}


def _size_problem(graph: Graph, name: str, value: Any) -> str:
    """Why size ``name`` cannot be ``value`` (not an int, below 1, beyond the graph's bound), or ""."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return f"size {name!r} must be an int, got {value!r}"
    if value < 1:
        return f"size {name!r} = {value}: the graph needs at least 1"
    limit = graph.bounds.get(name)
    if limit is not None and value > limit:
        return f"size {name!r} = {value} exceeds {limit}, the most the model takes"
    return ""


def binding_of_shapes(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The binding the input arrays' ``shapes`` (by input name) give, checked against every input's
    symbolic shape: BindError naming the input and axis for another rank, a fixed size changed, a
    symbol given two sizes, a size out of the graph's bounds or below 1."""
    binding: dict[str, int] = {}
    seen: dict[str, str] = {}
    derived: list[tuple[str, int, Any, int]] = []  # sizes that are expressions, checked once all are bound
    for name in graph.inputs:
        if name not in shapes:
            raise BindError(f"missing input {name!r}")
        shape, declared = tuple(int(n) for n in shapes[name]), graph.types[name].shape
        spelled = "[" + ", ".join(map(str, declared)) + "]"
        if len(shape) != len(declared):
            raise BindError(f"input {name!r} has shape {list(shape)}; the model takes {spelled}: "
                            f"{len(declared)} dimension(s)")
        for axis, (d, size) in enumerate(zip(declared, shape)):
            here = f"input {name!r} axis {axis}"
            if isinstance(d, int):
                if size != d:
                    raise BindError(f"{here} is {size}; the model takes {spelled}, fixed at {d} there")
            elif d.is_Symbol:
                if d.name in binding and binding[d.name] != size:
                    raise BindError(f"{here} is {size}, but {d.name} is {binding[d.name]} in {seen[d.name]}")
                problem = _size_problem(graph, d.name, size)
                if problem:
                    raise BindError(f"{problem} (from {here})")
                binding.setdefault(d.name, size)
                seen.setdefault(d.name, here)
            else:
                derived.append((name, axis, d, size))
    binding = check_binding(graph, binding)  # a size only in expressions has none: named there
    for name, axis, d, size in derived:
        if evaluate(d, binding) != size:
            raise BindError(f"input {name!r} axis {axis} is {size}; the model takes {d} = {evaluate(d, binding)} there")
    return binding


def with_bounds(graph: Graph, bounds: Mapping[str, int]) -> Graph:
    """``graph`` taking for granted that each size in ``bounds`` is at most that much (the tighter
    of these and the graph's own bounds): guards over sizes (``numel(x) <= N``) that would depend on
    the binding can then be decided when optimizing. BindError for a size the graph does not have
    or a bound below 1."""
    symbols = symbols_of(graph)
    merged = dict(graph.bounds)
    for name, limit in bounds.items():
        if name not in symbols:
            raise BindError(f"the graph has no size {name!r} to bound (its sizes: {', '.join(symbols) or 'none'})")
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
            raise BindError(f"the bound of {name!r} must be an int of at least 1, got {limit!r}")
        merged[name] = min(int(limit), merged.get(name, int(limit)))
    return graph.replace(bounds=FrozenMap(sorted(merged.items())))


def bind(graph: Graph, binding: Mapping[str, int], registry: OpRegistry | None = None) -> Graph:
    """The static graph of ``graph`` at ``binding`` (symbol name -> size); the same graph when it
    has no symbols."""
    if not is_symbolic(graph):
        return graph
    registry = registry or default_registry()
    return verify(fold_constants(at_binding(graph, binding), registry), registry)


def at_binding(graph: Graph, binding: Mapping[str, int]) -> Graph:
    """``graph`` with every size evaluated at ``binding`` but its nodes as they are (what the cost
    model prices: the same node names as the symbolic graph); :func:`bind` folds it too."""
    if not is_symbolic(graph):
        return graph
    sizes = check_binding(graph, binding)
    try:
        types = {k: t.with_shape(tuple(evaluate(d, sizes) for d in t.shape)) for k, t in graph.types.items()}
        consts = {k: Const(_evaluated(c, sizes)) if c.is_symbolic else c for k, c in graph.constants.items()}
    except SymbolicDimError as e:
        raise BindError(str(e)) from None
    return graph.replace(types=FrozenMap(types), constants=FrozenMap(consts), bounds=FrozenMap())


# the size a symbol without a bound or a hint stands for when a plan is priced
DEFAULT_REPRESENTATIVE_SIZE = 128


def representative_binding(graph: Graph, hint: Mapping[str, int] | None = None) -> dict[str, int]:
    """The sizes at which a plan for ``graph`` is priced: ``hint``'s where given, else the symbol's
    bound (the largest size the model takes), else DEFAULT_REPRESENTATIVE_SIZE. The plan itself is
    valid for every binding; only the choice between valid plans reads these sizes."""
    hint = hint or {}
    return check_binding(graph, {s: hint.get(s, graph.bounds.get(s, DEFAULT_REPRESENTATIVE_SIZE))
                                 for s in symbols_of(graph)})


def _evaluated(c: Const, sizes: Mapping[str, int]) -> np.ndarray:
    values = [evaluate(v, sizes) for v in c.array.reshape(-1).tolist()]
    return np.array(values, np.int64).reshape(c.array.shape)
