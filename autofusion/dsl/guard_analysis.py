"""Static analysis of guards: type checking, and deciding guards that are always false or true.

Types follow :class:`~autofusion.dsl.guards.Ty`. The truth analysis folds constants and keeps an
interval (or a set of allowed strings, or a required truth value) per atomic expression of a
conjunction: ``rank(x) > 3 and rank(x) < 2`` leaves an empty integer interval for ``rank(x)``;
``numel(x) * 4 < 0`` is false because ``numel`` is never negative.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autofusion.dsl import guards as g
from autofusion.dsl.diagnostics import Sink, did_you_mean
from autofusion.dsl.guards import FUNCTIONS, NUMERIC, Ty

# ---- types ---------------------------------------------------------------------------------------


class TypeChecker:
    """Infers guard types; reports F006 (unbound name), F016 (unknown function), F017 (type error)."""

    def __init__(self, kinds: Mapping[str, Ty], sink: Sink, context: str) -> None:
        self.kinds = kinds  # name -> TENSOR | NODE | ANY (attribute variable)
        self.sink = sink
        self.context = context
        self.ok = True

    def error(self, code: str, message: str, node: g.Guard) -> Ty:
        self.ok = False
        self.sink.add(code, message, node.span)
        return Ty.ANY

    def check_condition(self, guard: g.Guard) -> bool:
        t = self.infer(guard)
        if t not in (Ty.BOOL, Ty.ANY):
            self.error("F017", f"a guard must be a condition, this is a {t.value}", guard)
        return self.ok

    def infer(self, e: g.Guard) -> Ty:
        if isinstance(e, g.IntLit):
            return Ty.INT
        if isinstance(e, g.FloatLit):
            return Ty.FLOAT
        if isinstance(e, g.StrLit):
            return Ty.STR
        if isinstance(e, g.BoolLit):
            return Ty.BOOL
        if isinstance(e, g.ListLit):
            for item in e.items:
                self.value(item)
            return Ty.LIST
        if isinstance(e, g.Name):
            return self.name(e)
        if isinstance(e, g.Call):
            return self.call(e)
        if isinstance(e, g.Index):
            base, index = self.value(e.value), self.value(e.index)
            if base not in (Ty.SHAPE, Ty.LIST, Ty.ANY):
                return self.error("F017", f"only lists and shapes can be indexed, not a {base.value}", e)
            if index not in (Ty.INT, Ty.ANY):
                return self.error("F017", f"an index must be an integer, not a {index.value}", e.index)
            return Ty.INT if base is Ty.SHAPE else Ty.ANY
        if isinstance(e, g.Arith):
            sides = [e.lhs] if e.rhs is None else [e.lhs, e.rhs]
            types = [self.value(s) for s in sides]
            for s, t in zip(sides, types):
                if t not in NUMERIC:
                    return self.error("F017", f"arithmetic needs numbers, got a {t.value}", s)
            if Ty.ANY in types:
                return Ty.ANY
            return Ty.INT if all(t is Ty.INT for t in types) and e.op != "/" else Ty.FLOAT
        if isinstance(e, g.Compare):
            return self.compare(e)
        if isinstance(e, g.BoolOp):
            for a in e.args:
                t = self.value(a)
                if t not in (Ty.BOOL, Ty.ANY):
                    self.error("F017", f"'{e.op}' joins conditions, not a {t.value}", a)
            return Ty.BOOL
        return self.error("F024", "unknown guard node", e)

    def value(self, e: g.Guard) -> Ty:
        """Type of ``e`` used as a value (a tensor or node name is not one)."""
        t = self.infer(e)
        if t in (Ty.TENSOR, Ty.NODE):
            assert isinstance(e, g.Name)
            return self.error("F017", f"{e.name} is a tensor; use rank({e.name}), shape({e.name}), "
                              f"dtype({e.name}), ... to read it", e)
        return t

    def name(self, e: g.Name) -> Ty:
        kind = self.kinds.get(e.name)
        if kind is None:
            known = [k for k in self.kinds if not k.startswith("_")]
            return self.error("F006", f"guard reads {e.name!r}, which {self.context} does not bind"
                              f"{did_you_mean(e.name, known)}", e)
        return kind

    def call(self, e: g.Call) -> Ty:
        fn = FUNCTIONS.get(e.fn)
        if fn is None:
            for a in e.args:
                self.infer(a)
            return self.error("F016", f"unknown guard function {e.fn!r}{did_you_mean(e.fn, FUNCTIONS)}", e)
        n = len(e.args)
        if (fn.variadic and n < 1) or (not fn.variadic and n != len(fn.params)):
            count = "at least 1" if fn.variadic else str(len(fn.params))
            return self.error("F017", f"{e.fn}() takes {count} argument(s), got {n}", e)
        for i, a in enumerate(e.args):
            want = fn.params[min(i, len(fn.params) - 1)]
            if want in (Ty.TENSOR, Ty.NODE):
                if not isinstance(a, g.Name):
                    self.error("F017", f"{e.fn}() takes a tensor name here", a)
                    continue
                kind = self.name(a)
                if kind is Ty.ANY and a.name in self.kinds:
                    self.error("F017", f"{a.name} is an attribute value, not a tensor", a)
                elif want is Ty.NODE and kind is Ty.TENSOR:
                    self.error("F017", f"{e.fn}() needs a captured node (`Op(...) as {a.name}`), "
                               f"{a.name} is a tensor", a)
                continue
            got = self.value(a)
            if not _assignable(got, want):
                self.error("F017", f"{e.fn}() argument {i + 1} must be a {want.value}, got a {got.value}", a)
        return fn.result

    def compare(self, e: g.Compare) -> Ty:
        lt, rt = self.value(e.lhs), self.value(e.rhs)
        if e.op == "in":
            if rt not in (Ty.LIST, Ty.SHAPE, Ty.ANY):
                self.error("F017", f"'in' needs a list on its right, got a {rt.value}", e.rhs)
        elif e.op in ("==", "!="):
            if not _comparable(lt, rt):
                self.error("F017", f"comparing a {lt.value} with a {rt.value} is always "
                           f"{'false' if e.op == '==' else 'true'}", e)
        else:
            for side, t in ((e.lhs, lt), (e.rhs, rt)):
                if t not in NUMERIC:
                    self.error("F017", f"'{e.op}' orders numbers, not a {t.value}", side)
        return Ty.BOOL


def _assignable(got: Ty, want: Ty) -> bool:
    if got is Ty.ANY or want is Ty.ANY or got is want:
        return True
    if want in (Ty.FLOAT, Ty.INT):
        return got in (Ty.INT, Ty.FLOAT) if want is Ty.FLOAT else got is Ty.INT
    if want is Ty.LIST:
        return got in (Ty.LIST, Ty.SHAPE)
    return False


def _comparable(a: Ty, b: Ty) -> bool:
    if Ty.ANY in (a, b) or a is b:
        return True
    groups = ({Ty.INT, Ty.FLOAT}, {Ty.LIST, Ty.SHAPE})
    return any(a in grp and b in grp for grp in groups)


# ---- truth ---------------------------------------------------------------------------------------


class Truth(enum.Enum):
    FALSE = "always false"
    TRUE = "always true"
    UNKNOWN = "depends on the match"


_NONNEG_INT_FNS = frozenset({"rank", "numel", "size_bytes", "dim", "len"})
_UNKNOWN = object()


@dataclass
class _Interval:
    lo: float = -math.inf
    hi: float = math.inf
    integer: bool = False

    def meet(self, op: str, c: float) -> None:
        if op == "==":
            self.lo, self.hi = max(self.lo, c), min(self.hi, c)
            return
        if self.integer:
            if op == "<":
                self.hi = min(self.hi, math.ceil(c) - 1)
            elif op == "<=":
                self.hi = min(self.hi, math.floor(c))
            elif op == ">":
                self.lo = max(self.lo, math.floor(c) + 1)
            elif op == ">=":
                self.lo = max(self.lo, math.ceil(c))
            return
        eps = 1e-12 * max(1.0, abs(c))  # strict bounds on reals, tightened a hair
        if op == "<":
            self.hi = min(self.hi, c - eps)
        elif op == "<=":
            self.hi = min(self.hi, c)
        elif op == ">":
            self.lo = max(self.lo, c + eps)
        elif op == ">=":
            self.lo = max(self.lo, c)

    @property
    def empty(self) -> bool:
        if self.integer and self.lo == self.hi and not float(self.lo).is_integer():
            return True
        return self.lo > self.hi


def fold(e: g.Guard) -> Any:
    """The constant value of ``e``, or _UNKNOWN when it depends on the match."""
    if isinstance(e, (g.IntLit, g.FloatLit, g.StrLit, g.BoolLit)):
        return e.value
    if isinstance(e, g.ListLit):
        items = [fold(i) for i in e.items]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
    try:
        if isinstance(e, g.Arith):
            lhs = fold(e.lhs)
            rhs = fold(e.rhs) if e.rhs is not None else 0
            if lhs is _UNKNOWN or rhs is _UNKNOWN:
                return _UNKNOWN
            return g.evaluate(e, g.Bindings())
        if isinstance(e, g.Compare):
            lhs, rhs = fold(e.lhs), fold(e.rhs)
            if lhs is _UNKNOWN or rhs is _UNKNOWN:
                return _UNKNOWN
            return g.evaluate(e, g.Bindings())
        if isinstance(e, g.Call) and e.fn in ("min", "max", "abs", "len"):
            vals = [fold(a) for a in e.args]
            return _UNKNOWN if any(v is _UNKNOWN for v in vals) else g.evaluate(e, g.Bindings())
    except (g.GuardError, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return _UNKNOWN
    return _UNKNOWN


def bounds(e: g.Guard) -> _Interval:
    """An interval containing every value numeric expression ``e`` can take."""
    c = fold(e)
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return _Interval(c, c, isinstance(c, int))
    if isinstance(e, g.Call) and e.fn in _NONNEG_INT_FNS:
        return _Interval(0, math.inf, True)
    if isinstance(e, g.Index) and isinstance(e.value, g.Call) and e.value.fn == "shape":
        return _Interval(0, math.inf, True)
    if isinstance(e, g.Arith):
        a = bounds(e.lhs)
        if e.op == "neg":
            return _Interval(-a.hi, -a.lo, a.integer)
        assert e.rhs is not None
        b = bounds(e.rhs)
        integer = a.integer and b.integer
        if e.op == "+":
            return _Interval(a.lo + b.lo, a.hi + b.hi, integer)
        if e.op == "-":
            return _Interval(a.lo - b.hi, a.hi - b.lo, integer)
        if e.op == "*" and a.lo >= 0 and b.lo >= 0:
            return _Interval(a.lo * b.lo, a.hi * b.hi if a.hi and b.hi else 0.0, integer)
        if e.op == "%" and b.lo > 0 and a.lo >= 0:
            return _Interval(0, b.hi - 1 if integer else b.hi, integer)
    return _Interval()


def _atom_key(e: g.Guard) -> Any:
    if isinstance(e, g.Index) and isinstance(e.value, g.Call) and e.value.fn == "shape":
        return ("dim", e.value.args, fold(e.index))  # shape(x)[i] is dim(x, i)
    if isinstance(e, g.Call) and e.fn == "dim":
        return ("dim", e.args[:1], fold(e.args[1]) if len(e.args) > 1 else None)
    if isinstance(e, g.Call) and e.fn == "len" and e.args and isinstance(e.args[0], g.Call) \
            and e.args[0].fn == "shape":
        return ("rank", e.args[0].args)  # len(shape(x)) is rank(x)
    if isinstance(e, g.Call) and e.fn == "rank":
        return ("rank", e.args)
    return e


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def truth(e: g.Guard) -> Truth:
    """Whether ``e`` is false or true for every possible match, or depends on it."""
    c = fold(e)
    if isinstance(c, bool):
        return Truth.TRUE if c else Truth.FALSE
    if isinstance(e, g.BoolOp):
        if e.op == "not":
            inner = truth(e.args[0])
            return {Truth.TRUE: Truth.FALSE, Truth.FALSE: Truth.TRUE}.get(inner, Truth.UNKNOWN)
        if e.op == "or":
            parts = [truth(a) for a in e.args]
            if Truth.TRUE in parts:
                return Truth.TRUE
            return Truth.FALSE if all(p is Truth.FALSE for p in parts) else Truth.UNKNOWN
        return _conjunction(e.args)
    return _conjunction((e,))


def _conjunction(parts: tuple[g.Guard, ...]) -> Truth:
    intervals: dict[Any, _Interval] = {}
    strings: dict[Any, set[str] | None] = {}
    excluded: dict[Any, set[Any]] = {}
    flags: dict[Any, bool] = {}
    all_true = True
    for p in parts:
        t = _single(p)
        if t is Truth.FALSE:
            return Truth.FALSE
        if t is Truth.TRUE:
            continue
        all_true = False
        if isinstance(p, g.BoolOp) and p.op == "not" and isinstance(p.args[0], g.Call):
            key = _atom_key(p.args[0])
            if flags.get(key, False) is True:
                return Truth.FALSE
            flags[key] = False
            continue
        if isinstance(p, g.Call) and p.fn in ("const", "is_float"):
            key = _atom_key(p)
            if flags.get(key, True) is False:
                return Truth.FALSE
            flags[key] = True
            continue
        if not isinstance(p, g.Compare):
            continue
        lhs, op, rhs = p.lhs, p.op, p.rhs
        if fold(lhs) is not _UNKNOWN and fold(rhs) is _UNKNOWN and op != "in":
            lhs, rhs, op = rhs, lhs, _FLIP[op]
        const = fold(rhs)
        if const is _UNKNOWN:
            continue
        key = _atom_key(lhs)
        if isinstance(const, str) or (op == "in" and isinstance(const, list)):
            allowed = {const} if isinstance(const, str) else set(const)
            if op == "!=":
                excluded.setdefault(key, set()).add(const)
            elif op in ("==", "in"):
                prev = strings.get(key)
                strings[key] = allowed if prev is None else prev & allowed
            if strings.get(key) is not None and not (strings[key] - excluded.get(key, set())):  # type: ignore[operator]
                return Truth.FALSE
            continue
        if isinstance(const, bool) or not isinstance(const, (int, float)):
            continue
        if op == "!=":
            excluded.setdefault(key, set()).add(const)
            iv = intervals.get(key)
            if iv is not None and iv.lo == iv.hi and iv.lo in excluded[key]:
                return Truth.FALSE
            continue
        base = bounds(lhs)
        iv = intervals.setdefault(key, _Interval(base.lo, base.hi, base.integer))
        iv.meet(op, const)
        if iv.empty or (iv.lo == iv.hi and iv.lo in excluded.get(key, set())):
            return Truth.FALSE
    return Truth.TRUE if all_true else Truth.UNKNOWN


def _single(p: g.Guard) -> Truth:
    """Truth of one conjunct on its own: constants, bounds of the atom, impossible dtypes."""
    if isinstance(p, g.BoolOp):
        return truth(p)
    c = fold(p)
    if isinstance(c, bool):
        return Truth.TRUE if c else Truth.FALSE
    if not isinstance(p, g.Compare):
        return Truth.UNKNOWN
    lhs, rhs, op = p.lhs, p.rhs, p.op
    if fold(lhs) is not _UNKNOWN and fold(rhs) is _UNKNOWN and op != "in":
        lhs, rhs, op = rhs, lhs, _FLIP[op]
    const = fold(rhs)
    if isinstance(lhs, g.Call) and lhs.fn == "dtype" and const is not _UNKNOWN:
        names = {const} if isinstance(const, str) else set(const) if isinstance(const, list) else set()
        if op in ("==", "in") and names and not names & g.DTYPE_NAMES:
            return Truth.FALSE
        if op == "!=" and isinstance(const, str) and const not in g.DTYPE_NAMES:
            return Truth.TRUE
    if const is _UNKNOWN or isinstance(const, (bool, str, list)) or op in ("in", "==", "!="):
        if op in ("==", "!=") and isinstance(const, (int, float)) and not isinstance(const, bool):
            b = bounds(lhs)
            outside = const < b.lo or const > b.hi or (b.integer and not float(const).is_integer())
            if outside:
                return Truth.FALSE if op == "==" else Truth.TRUE
        return Truth.UNKNOWN
    b = bounds(lhs)
    if op == "<":
        return Truth.FALSE if b.lo >= const else Truth.TRUE if b.hi < const else Truth.UNKNOWN
    if op == "<=":
        return Truth.FALSE if b.lo > const else Truth.TRUE if b.hi <= const else Truth.UNKNOWN
    if op == ">":
        return Truth.FALSE if b.hi <= const else Truth.TRUE if b.lo > const else Truth.UNKNOWN
    if op == ">=":
        return Truth.FALSE if b.hi < const else Truth.TRUE if b.lo >= const else Truth.UNKNOWN
    return Truth.UNKNOWN


def tautologies(e: g.Guard) -> list[g.Guard]:
    """Conjuncts of ``e`` that are true for every match (excluding literal ``true``)."""
    parts = e.args if isinstance(e, g.BoolOp) and e.op == "and" else (e,)
    return [p for p in parts if not isinstance(p, g.BoolLit) and _single(p) is Truth.TRUE]
