"""Symbolic sizes in generated C: each symbol an ``int64_t`` every kernel reads at run time.

A plan over symbolic sizes renders once for every binding. Before rendering, each symbol is renamed
to a C identifier (``seq`` -> ``S_seq``), so a size prints as a C expression (``64*S_batch*S_seq``)
wherever the renderers print one: loop bounds, strides, offsets. Each kernel starts by reading the
sizes of its call (``af_sizes``, set by ``af_run_sized``). What only tunes a kernel (threads or not,
chunk and block sizes) reads :func:`hint`: the size at a representative binding.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from autofusion.graph.dims import Dim, evaluate, is_static, symbol
from autofusion.graph.graph import Const, FrozenMap, Graph

SIZE_PREFIX = "S_"
MAX_SIZES = 16  # symbols one library takes (af_sizes has this many slots)

_hints: ContextVar[Mapping[str, int] | None] = ContextVar("_hints", default=None)
_given: ContextVar[bool] = ContextVar("_given", default=True)
# a typical call, for choices over sizes known at run time when optimize was given none (typical())
TYPICAL_ROWS = 128  # a GEMM's rows or columns: beyond a few hundred, the large-M choice holds anyway
TYPICAL_CALLS = 16  # products of a batched GEMM (batch x heads)
TYPICAL_IMAGES = 1  # a convolution's batch: blocks that give every thread work at batch 1


def c_names(symbols: tuple[str, ...]) -> dict[str, str]:
    """Each symbol's C identifier: ``S_`` and its name with anything but letters and digits as ``_``."""
    out: dict[str, str] = {}
    for s in symbols:
        base = SIZE_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", s)
        name, k = base, 1
        while name in out.values():
            k += 1
            name = f"{base}_{k}"
        out[s] = name
    return out


def for_c(graph: Graph, names: Mapping[str, str]) -> Graph:
    """``graph`` with its symbols renamed to their C identifiers (types, symbolic constants, bounds)."""
    table = {symbol(old): symbol(new) for old, new in names.items()}

    def dim(d: Dim) -> Dim:
        return d if isinstance(d, int) else d.xreplace(table)

    types = {k: t.with_shape(tuple(dim(d) for d in t.shape)) for k, t in graph.types.items()}
    consts = {}
    for k, c in graph.constants.items():
        if c.is_symbolic:
            values = [v if isinstance(v, int) else dim(v) for v in c.array.reshape(-1).tolist()]
            c = Const(np.array(values, dtype=object).reshape(c.array.shape))
        consts[k] = c
    bounds = {names[k]: v for k, v in graph.bounds.items()}
    return graph.replace(types=FrozenMap(types), constants=FrozenMap(consts), bounds=FrozenMap(bounds))


@contextmanager
def hinting(binding: Mapping[str, int], given: bool = True) -> Iterator[None]:
    """Render with run-time sizes while open: every kernel reads the sizes ``binding`` names (C
    names, in ``af_sizes`` order), and :func:`hint` evaluates sizes at its values. ``given``: the
    user named these sizes (``optimize(sizes=...)``); else they are the model's largest, and
    :func:`typical` takes smaller ones for choices that should fit a typical call."""
    token, typical_token = _hints.set(dict(binding)), _given.set(given)
    try:
        yield
    finally:
        _hints.reset(token)
        _given.reset(typical_token)


def declared() -> list[tuple[str, int]]:
    """(C name, slot in af_sizes) of each size kernels read now (none for a static plan)."""
    return [(name, i) for i, name in enumerate(_hints.get() or {})]


def at_least(value: Dim, threshold: int) -> bool | str:
    """Whether ``value >= threshold``: a bool for a fixed size; for a symbolic one, the C condition,
    decided per call (an OpenMP ``if`` clause: a short sequence does not fork threads for nothing)."""
    if is_static(value):
        return bool(value >= threshold)
    return f"({value}) >= {threshold}"


def all_of(*conditions: bool | str) -> bool | str:
    """The conjunction of :func:`at_least` results: a bool when fixed, else a C condition."""
    if any(c is False for c in conditions):
        return False
    parts = [c for c in conditions if isinstance(c, str)]
    return " && ".join(parts) if parts else True


def per_chunk(iterations: Dim, chunks: int) -> int | str:
    """Iterations per dynamically scheduled chunk when the loop is cut in ``chunks``: an int for a
    fixed count, the C expression for a symbolic one."""
    if is_static(iterations):
        return max(1, iterations // chunks)
    return f"AF_PER_CHUNK({iterations}, {chunks})"


_POWER = re.compile(r"\b(S_\w+|AF_\w+\([^()]*\))\*\*(\d+)")


def c_powers(text: str) -> str:
    """C for sympy's powers of sizes in ``text`` (``S_seq**2`` -> ``(S_seq*S_seq)``): a stride of
    an attention score is ``S_seq**2``, and C has no power operator."""
    return _POWER.sub(lambda m: "(" + "*".join([m[1]] * int(m[2])) + ")", text)


# integer functions of sizes that C computes: the value for ints, and the macro that prints it
_C_FUNCTIONS: dict[str, Any] = {
    "AF_ALIGN_UP": lambda n: (n + 63) // 64 * 64,  # up to a multiple of 64, a cache line
    "AF_CEIL_DIV": lambda a, b: -(-a // b),  # a / b rounded up, for positive a and b
}


@functools.cache
def _c_function(macro: str) -> Any:
    """A sympy function of sizes that evaluates as ``_C_FUNCTIONS[macro]`` on integers and prints as
    the C macro (af_runtime.h) otherwise."""
    import sympy

    value = _C_FUNCTIONS[macro]

    def evaluated(cls: Any, *args: Any) -> Any:
        return value(*map(int, args)) if all(getattr(a, "is_Integer", False) for a in args) else None

    def printed(self: Any, printer: Any) -> str:
        return f"{macro}({', '.join(printer.doprint(a) for a in self.args)})"

    return type(macro, (sympy.Function,), {"is_integer": True, "is_positive": True,
                                           "eval": classmethod(evaluated), "_sympystr": printed})


def _apply(macro: str, *args: Dim) -> Dim:
    if all(is_static(a) for a in args):
        return _C_FUNCTIONS[macro](*args)
    return _c_function(macro)(*args)


def ceil_div(a: Dim, b: Dim) -> Dim:
    """``a / b`` rounded up (tiles of ``b`` covering ``a``); symbolic operands give an expression C can print."""
    return _apply("AF_CEIL_DIV", a, b)


def align_up(n: Dim) -> Dim:
    """``n`` rounded up to a multiple of 64; a symbolic ``n`` stays an expression C can print."""
    return _apply("AF_ALIGN_UP", n)


def hint(d: Any) -> int:
    """The size ``d`` has at the representative binding: for choices that tune a kernel, never for
    what it computes (loop bounds and strides print ``d`` itself)."""
    if is_static(d):
        return int(d)
    binding = _hints.get()
    if binding is None:
        raise ValueError(f"size {d} is symbolic and no representative binding is set")
    return evaluate(d, binding)


def typical(d: Any, cap: int) -> int:
    """:func:`hint`, at most ``cap`` for a size known only at run time whose representative value
    is the model's largest (no sizes given to optimize): the rows of a GEMM or the images of a
    convolution are chosen for (and tuned at) a typical call, not the largest the model allows."""
    value = hint(d)
    return value if is_static(d) or _given.get() else min(value, cap)
