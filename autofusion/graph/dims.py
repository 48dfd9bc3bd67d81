"""Dimensions: an int, or an expression over named sizes known only at run time (``batch``, ``seq``).

A symbolic dimension is a sympy expression over positive integer symbols (``2 * seq``,
``batch * seq``); sympy keeps sums and products canonical, so two spellings of one size compare
equal. Graphs with symbolic dimensions come from models exported with dynamic axes; ``bind``
(autofusion.ir.symbolic) turns one into the static graph of a binding. sympy is imported only when
a symbolic dimension is met.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeAlias

Dim: TypeAlias = "int | Any"  # an int, or a sympy expression (see module doc)


class SymbolicDimError(ValueError):
    """A symbolic dimension where a number is needed, or a symbol without a binding."""


def _sympy() -> Any:
    import sympy

    return sympy


def symbol(name: str) -> Any:
    """The size named ``name``: a positive integer not known before run time."""
    return _sympy().Symbol(name, integer=True, positive=True)


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` is a sympy expression over symbols (not a plain number)."""
    return type(value).__module__.startswith("sympy") and not value.is_Number


def as_value(value: Any) -> Dim:
    """An integer value of a shape tensor (may be negative: a Reshape's -1): Python, numpy and sympy
    integers become ``int``; an integer sympy expression over symbols stays one. ValueError for
    anything else."""
    if isinstance(value, bool):
        raise ValueError(f"a size is an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if type(value).__module__.startswith("numpy") and getattr(value, "dtype", None) is not None \
            and value.dtype.kind in "iu":
        return int(value)
    if type(value).__module__.startswith("sympy") and value.is_integer is True:
        return int(value) if value.is_Integer else value
    raise ValueError(f"a size is an integer or an integer expression of symbolic sizes, got {value!r}")


def as_dim(value: Any) -> Dim:
    """``value`` as a dimension (see :func:`as_value`); ValueError for a negative one."""
    d = as_value(value)
    if (d < 0) if isinstance(d, int) else d.is_negative:
        raise ValueError(f"a dimension must be non-negative, got {d}")
    return d


def free_symbols(dims: Iterable[Dim]) -> frozenset[str]:
    """Names of the symbols ``dims`` depend on."""
    return frozenset(s.name for d in dims if not isinstance(d, int) for s in d.free_symbols)


def evaluate(d: Dim, binding: Mapping[str, int]) -> int:
    """The size ``d`` has under ``binding`` (symbol name -> size)."""
    if isinstance(d, int):
        return d
    missing = sorted(s.name for s in d.free_symbols if s.name not in binding)
    if missing:
        raise SymbolicDimError(f"no size bound for {', '.join(map(repr, missing))} (in {d})")
    value = d.subs({s: int(binding[s.name]) for s in d.free_symbols})
    if not value.is_Integer:
        raise SymbolicDimError(f"{d} is not an integer under {dict(binding)}: {value}")
    return int(value)


def decide(relation: Any) -> bool | None:
    """The truth of a comparison of dimensions (``a == b`` as ``sympy.Eq(a, b)``, ``a <= b``), or None
    when it depends on the sizes bound at run time."""
    if isinstance(relation, bool):
        return relation
    sympy = _sympy()
    if relation is sympy.true:
        return True
    if relation is sympy.false:
        return False
    return None


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """Whether two dimensions are equal for every binding (True), for none (False), or it depends."""
    if is_static(a) and is_static(b):
        return a == b
    return decide(_sympy().Eq(a, b))


# -- assumptions: what a model's shapes take for granted of its sizes ------------------------------

_assumed: ContextVar[dict[str, int] | None] = ContextVar("_assumed", default=None)
_known: ContextVar[Mapping[str, int] | None] = ContextVar("_known", default=None)


@contextmanager
def bounded(bounds: Mapping[str, int]) -> Iterator[None]:
    """Let comparisons of sizes use ``bounds`` (a graph's, e.g. ``seq <= 64``) while open: the stages
    after the import re-infer shapes and must take for granted what the import did."""
    token = _known.set({**(_known.get() or {}), **bounds})
    try:
        yield
    finally:
        _known.reset(token)


def _number(v: Any) -> int | float:
    return int(v) if v.is_Integer else float(v)


def _range(d: Dim) -> tuple[int | float | None, int | float | None]:
    """The least and largest value ``d`` takes for positive sizes within the bounds in force, where
    ``d`` is monotone in every symbol (a polynomial whose non-constant terms share one sign); a side
    without a finite value is None."""
    if isinstance(d, int):
        return d, d
    poly = d.as_poly()
    if poly is None or poly.is_zero:
        return None, None
    signs = {c > 0 for m, c in zip(poly.monoms(), poly.coeffs()) if any(m)}
    if len(signs) != 1:
        return None, None
    known = _known.get() or {}
    ones = _number(d.subs({s: 1 for s in d.free_symbols}))
    top = None
    if all(s.name in known for s in d.free_symbols):
        top = _number(d.subs({s: known[s.name] for s in d.free_symbols}))
    return (ones, top) if signs == {True} else (top, ones)


def compare(op: str, a: Dim | float, b: Dim | float) -> bool | None:
    """``a op b`` (``== != < <= > >=``) for every binding within the bounds in force, or None when
    it depends on the sizes bound at run time."""
    if op in (">", ">="):
        return compare("<" if op == ">" else "<=", b, a)
    if op == "!=":
        same = compare("==", a, b)
        return None if same is None else not same
    sympy = _sympy()
    relation = {"==": sympy.Eq, "<": sympy.Lt, "<=": sympy.Le}[op](a, b)
    known = decide(relation)
    if known is not None:
        return known
    low, high = _range(sympy.sympify(a - b))
    if op == "==":
        return False if (low is not None and low > 0) or (high is not None and high < 0) else None
    strict = op == "<"
    if high is not None and (high < 0 if strict else high <= 0):
        return True
    if low is not None and (low >= 0 if strict else low > 0):
        return False
    return None


@contextmanager
def assumptions() -> Iterator[dict[str, int]]:
    """Collect, while open, the upper bounds shape inference takes for granted: where a slice's end
    is a symbol beyond which the model cannot go (``position_ids[:, :seq]`` of a 512-row table takes
    ``seq <= 512``). Yields the bounds by symbol name, tightest first."""
    bounds: dict[str, int] = {}
    token = _assumed.set(bounds)
    try:
        yield bounds
    finally:
        _assumed.reset(token)


def at_most(d: Dim, limit: int) -> bool:
    """Whether ``d <= limit`` for every binding allowed so far; where that depends on one symbol's
    size and assumptions are being collected, the bound is assumed (and True returned)."""
    if isinstance(d, int):
        return d <= limit
    known = compare("<=", d, limit)
    if known is not None:
        return known
    bounds = _assumed.get()
    syms = list(d.free_symbols)
    if len(syms) == 1 and d == syms[0]:
        if bounds is not None:
            bounds[syms[0].name] = min(limit, bounds.get(syms[0].name, limit))
            return True
        raise SymbolicDimError(f"whether {d} <= {limit} depends on the size bound at run time")
    raise SymbolicDimError(f"whether {d} <= {limit} depends on the sizes bound at run time")


def slice_length(size: Dim, start: Dim, end: Dim, step: int) -> Dim:
    """``len(range(size)[start:end:step])`` with symbolic sizes: ONNX clamps like Python slicing. A
    symbolic end is taken to lie within ``size`` (see :func:`assumptions`)."""
    if all(isinstance(v, int) for v in (size, start, end)):
        return len(range(size)[start:end:step])
    if step != 1:
        raise SymbolicDimError(f"a slice of step {step} with symbolic bounds ({start}:{end} of {size})")

    def clamp(v: Dim) -> Dim:
        if isinstance(v, int) and v < 0:
            v = size + v
            return v if not isinstance(v, int) else max(v, 0)
        if isinstance(v, int) and isinstance(size, int):
            return min(v, size)
        if isinstance(v, int) and v >= 2**62:  # "to the end"
            return size
        if isinstance(size, int):
            return v if at_most(v, size) else size
        within = decide(v <= size)
        if within is None:
            raise SymbolicDimError(f"whether {v} <= {size} depends on the sizes bound at run time")
        return v if within else size

    lo, hi = clamp(start), clamp(end)
    length = hi - lo
    if isinstance(length, int):
        return max(length, 0)
    if decide(length >= 0) is not True:
        raise SymbolicDimError(f"a slice {start}:{end} of {size} may be empty, depending on the sizes")
    return length
