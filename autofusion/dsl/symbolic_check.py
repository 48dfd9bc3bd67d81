"""A verified rewrite checked again with symbolic sizes, as the engine meets it in a model with
dynamic axes.

Each case the numeric check passed is rebuilt with its input sizes as symbols (one symbol per size,
so axes that broadcast together stay equal; sizes that a constant, an integer value or an attribute
also spells stay fixed, since the rule may rely on them). Where the guard holds for every binding
(``verdict`` is true: the engine would rewrite), the right side must type-check over the symbols,
give the left side's output type for every binding, and agree with it numerically at the case's
sizes and at drawn ones. A guard undecided over symbols is not checked further: the engine leaves
such a match alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autofusion.dsl import guards as g
from autofusion.dsl.instantiate import Env
from autofusion.graph.dims import Dim, compare, symbol
from autofusion.graph.graph import Graph
from autofusion.graph.types import TensorType
from autofusion.ir.builder import graph_from_nodes
from autofusion.ir.interpreter import InterpreterError, run_graph
from autofusion.ir.symbolic import BindError, bind
from autofusion.ops.registry import OpRegistry, ShapeError

DRAWN_BINDINGS = 2  # besides the case's own sizes
MAX_ELEMENTS = 1 << 18  # a drawn binding whose inputs would be larger is not run


@dataclass(frozen=True)
class SymbolicMismatch:
    """Why the rewrite fails over symbolic sizes, with the symbolic inputs and the sizes tried."""

    reason: str
    inputs: dict[str, str]
    sizes: dict[str, int]
    left: np.ndarray | None = None
    right: np.ndarray | None = None


Agree = Callable[[np.ndarray, np.ndarray], bool]


def check_symbolic(left: Graph, right: Graph, guard: g.Guard | None, env: Env, registry: OpRegistry,
                   rng: np.random.Generator, agree: Agree) -> SymbolicMismatch | None:
    """None where the rewrite holds over symbolic sizes (or the case has none to make symbolic);
    ``agree`` says whether two outputs are the same values, as the numeric check judges them."""
    sizes = _symbolic_sizes(left, right)
    if not sizes:
        return None
    names = {v: f"s{v}" for v in sizes}
    inputs = {i: _symbolic(left.types[i], names) for i in left.inputs}
    try:
        sym_left = graph_from_nodes("verify_left", inputs, left.constants, left.nodes, left.outputs, registry)
    except ShapeError:
        return None  # the left side's ops cannot take these sizes symbolically: no model shows them so
    if g.verdict(guard, env.bindings(sym_left.types, registry)) is not True:
        return None
    spelled = {n: str(inputs[b.tensor]) for n, b in env.vars.items() if b.tensor in inputs}  # by rule variable
    case_sizes = {name: v for v, name in names.items()}
    if any(i not in inputs for i in right.inputs):
        return None
    try:
        sym_right = graph_from_nodes("verify_right", {i: inputs[i] for i in right.inputs}, right.constants,
                                     right.nodes, right.outputs, registry)
    except ShapeError as e:
        return SymbolicMismatch(f"the right side does not type-check with symbolic sizes ({e})", spelled, case_sizes)
    lt, rt = sym_left.types[left.outputs[0]], sym_right.types[right.outputs[0]]
    if not _same_type(lt, rt):
        return SymbolicMismatch(f"the left side gives {lt}, the right side {rt}", spelled, case_sizes)
    for binding in [case_sizes, *_drawn(case_sizes, rng)]:
        found = _run_both(sym_left, sym_right, binding, registry, rng, agree)
        if isinstance(found, str):
            return SymbolicMismatch(found, spelled, binding)
        if found is not None:
            return SymbolicMismatch("", spelled, binding, *found)
    return None


def _symbolic_sizes(left: Graph, right: Graph) -> list[int]:
    """The input sizes that become symbols: above 1 and spelled nowhere else in either side."""
    fixed: set[int] = set()
    for graph in (left, right):
        for c in graph.constants.values():
            fixed.update(int(d) for d in c.array.shape)
            if np.issubdtype(c.array.dtype, np.integer):
                fixed.update(int(v) for v in np.abs(c.array).reshape(-1)[:64])
        for node in graph.nodes:
            fixed.update(_ints(dict(node.attrs).values()))
    shapes = (left.types[i].shape for i in left.inputs)
    return sorted({int(d) for shape in shapes for d in shape if isinstance(d, int) and d > 1} - fixed)


def _ints(values: Iterable[Any]) -> Iterable[int]:
    for v in values:
        if isinstance(v, (bool, np.bool_)):
            continue
        if isinstance(v, (int, np.integer)):
            yield abs(int(v))
        elif isinstance(v, (tuple, list)):
            yield from _ints(v)


def _symbolic(t: TensorType, names: Mapping[int, str]) -> TensorType:
    shape: tuple[Dim, ...] = tuple(symbol(names[d]) if isinstance(d, int) and d in names else d for d in t.shape)
    return TensorType(shape, t.dtype)


def _same_type(a: TensorType, b: TensorType) -> bool:
    return (a.dtype == b.dtype and len(a.shape) == len(b.shape)
            and all(compare("==", x, y) is True for x, y in zip(a.shape, b.shape)))


def _drawn(sizes: Mapping[str, int], rng: np.random.Generator) -> list[dict[str, int]]:
    """Other bindings: each size drawn on its own from 1 (a sequence of one) to well beyond the
    trials' sizes, so that sizes equal in the case differ here and rows get long."""
    return [{name: int(rng.integers(1, 3 * v + 5)) for name, v in sizes.items()} for _ in range(DRAWN_BINDINGS)]


def _run_both(left: Graph, right: Graph, binding: Mapping[str, int], registry: OpRegistry,
              rng: np.random.Generator, agree: Agree) -> tuple[np.ndarray, np.ndarray] | str | None:
    """The two outputs at ``binding`` where they differ, why the right side fails to run there where
    the left side runs, else None."""
    try:
        bl, br = bind(left, binding, registry), bind(right, binding, registry)
    except BindError:
        return None
    if sum(bl.types[i].numel for i in bl.inputs) > MAX_ELEMENTS:
        return None
    feeds = {i: _values(bl.types[i], rng) for i in bl.inputs}
    try:
        a = run_graph(bl, feeds, registry)[bl.outputs[0]]
    except InterpreterError:
        return None
    try:
        b = run_graph(br, {i: feeds[i] for i in br.inputs}, registry)[br.outputs[0]]
    except InterpreterError as e:
        return f"the right side fails to run ({e})"
    return None if agree(a, b) else (a, b)


def _values(t: TensorType, rng: np.random.Generator) -> np.ndarray:
    """Inputs the rule's ops can take: positive floats (Sqrt, Log), small positive integers, bools."""
    shape = tuple(int(d) for d in t.shape)
    dtype = t.dtype.numpy
    if np.issubdtype(dtype, np.floating):
        return rng.uniform(0.5, 2.0, shape).astype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    return rng.integers(1, 4, shape).astype(dtype)

