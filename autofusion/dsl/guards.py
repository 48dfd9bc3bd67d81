"""Guards: the small expression language after ``where``, as frozen data with a Python evaluator.

A guard reads a binding of a pattern: the :class:`~autofusion.ir.TensorType` of every tensor
variable and captured node, which tensors are constants, the attributes of captured nodes and the
values of attribute variables. ``guard.evaluate(env)`` computes its value; :func:`holds` is the
form the engine uses (a guard that cannot be evaluated, e.g. ``dim(x, 5)`` of a rank-2 tensor, is
false rather than an error).

>>> from autofusion.ir import DType, TensorType
>>> g = Compare(">=", Call("rank", (Name("x"),)), IntLit(2))
>>> g.evaluate(Bindings(types={"x": TensorType((4, 8), DType.FLOAT32)}))
True
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autofusion.dsl.span import NO_SPAN, Span
from autofusion.graph.dims import compare, is_symbolic
from autofusion.graph.types import DType, TensorType


class GuardError(ValueError):
    """A guard could not be evaluated for a binding (missing name, index out of range, ...)."""


class GuardUndecided(GuardError):
    """A guard over symbolic sizes (``dim(x, 1) == 768`` of ``seq``) that holds for some bindings
    and not for others: the rule does not fire, and ``explain`` says so."""


@dataclass(frozen=True)
class Bindings:
    """What a guard sees of one match. Names not listed are unbound."""

    types: Mapping[str, TensorType] = field(default_factory=dict)  # tensor vars and captures
    consts: frozenset[str] = frozenset()  # names bound to constant tensors
    attrs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # capture -> node attributes
    values: Mapping[str, Any] = field(default_factory=dict)  # attribute variables -> value

    def tensor(self, name: str) -> TensorType:
        t = self.types.get(name)
        if t is None:
            raise GuardError(f"no tensor bound to {name!r}")
        return t


class Ty(enum.Enum):
    """Static types of guard expressions (the checker's type system)."""

    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "string"
    SHAPE = "shape"
    LIST = "list"
    TENSOR = "tensor"
    NODE = "node"
    ANY = "value"


NUMERIC = frozenset({Ty.INT, Ty.FLOAT, Ty.ANY})


@dataclass(frozen=True)
class Function:
    """A guard function: parameter types, result type, and what it computes."""

    params: tuple[Ty, ...]
    result: Ty
    doc: str
    variadic: bool = False  # the last parameter repeats (min, max)


FUNCTIONS: Mapping[str, Function] = {
    "rank": Function((Ty.TENSOR,), Ty.INT, "number of dimensions"),
    "shape": Function((Ty.TENSOR,), Ty.SHAPE, "the shape as a list, e.g. shape(x)[-1]"),
    "dim": Function((Ty.TENSOR, Ty.INT), Ty.INT, "one dimension; negative indices count from the end"),
    "numel": Function((Ty.TENSOR,), Ty.INT, "number of elements"),
    "size_bytes": Function((Ty.TENSOR,), Ty.INT, "size in bytes"),
    "dtype": Function((Ty.TENSOR,), Ty.STR, 'element type name, e.g. "float32"'),
    "is_float": Function((Ty.TENSOR,), Ty.BOOL, "element type is a floating-point type"),
    "const": Function((Ty.TENSOR,), Ty.BOOL, "the tensor is a constant (weights, folded values)"),
    "attr": Function((Ty.NODE, Ty.STR), Ty.ANY, 'an attribute of a captured node, e.g. attr(n, "axis")'),
    "len": Function((Ty.LIST,), Ty.INT, "length of a list or shape"),
    "min": Function((Ty.FLOAT,), Ty.FLOAT, "smallest of its arguments", variadic=True),
    "max": Function((Ty.FLOAT,), Ty.FLOAT, "largest of its arguments", variadic=True),
    "abs": Function((Ty.FLOAT,), Ty.FLOAT, "absolute value"),
}


class _Node:
    """Shared behaviour of guard nodes."""

    def evaluate(self, env: Bindings) -> Any:
        """The value of this expression for ``env``; raises GuardError when it has none."""
        return evaluate(self, env)  # type: ignore[arg-type]


@dataclass(frozen=True)
class IntLit(_Node):
    value: int
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class FloatLit(_Node):
    value: float
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class StrLit(_Node):
    value: str
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class BoolLit(_Node):
    value: bool
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class ListLit(_Node):
    items: tuple[Guard, ...]
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class Name(_Node):
    """A tensor variable, a captured node or an attribute variable of the pattern."""

    name: str
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class Call(_Node):
    fn: str
    args: tuple[Guard, ...]
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class Index(_Node):
    value: Guard
    index: Guard
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class Arith(_Node):
    """``lhs op rhs`` for op in ``+ - * / %``; ``neg`` negates ``lhs`` (``rhs`` is None)."""

    op: str
    lhs: Guard
    rhs: Guard | None
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class Compare(_Node):
    """``lhs op rhs`` for op in ``== != < <= > >= in``."""

    op: str
    lhs: Guard
    rhs: Guard
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class BoolOp(_Node):
    """``and`` / ``or`` over ``args``; ``not`` has one argument."""

    op: str
    args: tuple[Guard, ...]
    span: Span = field(default=NO_SPAN, compare=False)


Guard = IntLit | FloatLit | StrLit | BoolLit | ListLit | Name | Call | Index | Arith | Compare | BoolOp


def conjoin(*guards: Guard | None) -> Guard | None:
    """``g1 and g2 and ...`` of the guards that are not None (None when there are none)."""
    parts: list[Guard] = []
    for g in guards:
        if g is None:
            continue
        parts.extend(g.args if isinstance(g, BoolOp) and g.op == "and" else (g,))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else BoolOp("and", tuple(parts), parts[0].span)


def names_in(guard: Guard | None) -> list[Name]:
    """Every :class:`Name` in ``guard``, in source order."""
    out: list[Name] = []

    def walk(g: Guard) -> None:
        if isinstance(g, Name):
            out.append(g)
        for child in children(g):
            walk(child)

    if guard is not None:
        walk(guard)
    return out


def children(g: Guard) -> tuple[Guard, ...]:
    if isinstance(g, ListLit):
        return g.items
    if isinstance(g, Call):
        return g.args
    if isinstance(g, Index):
        return (g.value, g.index)
    if isinstance(g, Arith):
        return (g.lhs,) if g.rhs is None else (g.lhs, g.rhs)
    if isinstance(g, Compare):
        return (g.lhs, g.rhs)
    if isinstance(g, BoolOp):
        return g.args
    return ()


def rename(guard: Guard, mapping: Mapping[str, str]) -> Guard:
    """``guard`` with the names in ``mapping`` replaced (pattern composition renames variables)."""
    if isinstance(guard, Name):
        new = mapping.get(guard.name)
        return guard if new is None else Name(new, guard.span)
    if isinstance(guard, ListLit):
        return ListLit(tuple(rename(i, mapping) for i in guard.items), guard.span)
    if isinstance(guard, Call):
        return Call(guard.fn, tuple(rename(a, mapping) for a in guard.args), guard.span)
    if isinstance(guard, Index):
        return Index(rename(guard.value, mapping), rename(guard.index, mapping), guard.span)
    if isinstance(guard, Arith):
        rhs = None if guard.rhs is None else rename(guard.rhs, mapping)
        return Arith(guard.op, rename(guard.lhs, mapping), rhs, guard.span)
    if isinstance(guard, Compare):
        return Compare(guard.op, rename(guard.lhs, mapping), rename(guard.rhs, mapping), guard.span)
    if isinstance(guard, BoolOp):
        return BoolOp(guard.op, tuple(rename(a, mapping) for a in guard.args), guard.span)
    return guard


def holds(guard: Guard | None, env: Bindings) -> bool:
    """Whether ``guard`` is true for ``env``; no guard holds, an unevaluable guard does not."""
    return verdict(guard, env) is True


def verdict(guard: Guard | None, env: Bindings) -> bool | None:
    """:func:`holds`, or None when the guard depends on symbolic sizes bound only at run time."""
    if guard is None:
        return True
    try:
        return bool(evaluate(guard, env))
    except GuardUndecided:
        return None
    except (GuardError, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return False


# ---- evaluation ----------------------------------------------------------------------------------


def _tensor_arg(g: Guard, env: Bindings) -> TensorType:
    if not isinstance(g, Name):
        raise GuardError("expected a tensor name")
    return env.tensor(g.name)


def _call(g: Call, env: Bindings) -> Any:
    fn, args = g.fn, g.args
    if fn not in FUNCTIONS:
        raise GuardError(f"unknown guard function {fn!r}")
    if fn in ("rank", "shape", "numel", "size_bytes", "dtype", "is_float", "const", "dim"):
        t = _tensor_arg(args[0], env)
        if fn == "rank":
            return t.rank
        if fn == "shape":
            return list(t.shape)
        if fn == "numel":
            return t.numel
        if fn == "size_bytes":
            return t.nbytes
        if fn == "dtype":
            return str(t.dtype)
        if fn == "is_float":
            return t.dtype.is_float
        if fn == "const":
            assert isinstance(args[0], Name)
            return args[0].name in env.consts
        i = evaluate(args[1], env)
        if not isinstance(i, int) or not -t.rank <= i < t.rank:
            raise GuardError(f"dim index {i!r} out of range for rank {t.rank}")
        return t.shape[i]
    if fn == "attr":
        node = args[0]
        if not isinstance(node, Name) or node.name not in env.attrs:
            raise GuardError("attr() needs a captured node")
        key = evaluate(args[1], env)
        attrs = env.attrs[node.name]
        if key not in attrs or attrs[key] is None:
            raise GuardError(f"node {node.name!r} has no attribute {key!r}")
        return _plain(attrs[key])
    values = [evaluate(a, env) for a in args]
    if fn == "len":
        return len(values[0])
    if fn in ("min", "max"):
        return _extreme(fn, values)
    return abs(values[0])


def _extreme(fn: str, values: list[Any]) -> Any:
    """min/max, of symbolic sizes too when one of them is below every other for all bindings."""
    if not any(is_symbolic(v) for v in values):
        return min(values) if fn == "min" else max(values)
    for v in values:
        if all(w is v or compare("<=" if fn == "min" else ">=", v, w) for w in values):
            return v
    raise GuardUndecided(f"{fn}({', '.join(map(str, values))}) depends on the sizes bound at run time")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _number(v: Any) -> bool:
    """An int or float, or a symbolic size (an integer expression known at run time)."""
    return not isinstance(v, bool) and (isinstance(v, (int, float)) or is_symbolic(v))


def _arith(op: str, a: Any, b: Any) -> Any:
    for v in (a, b):
        if not _number(v):
            raise GuardError(f"arithmetic on a non-number {v!r}")
    if is_symbolic(a) or is_symbolic(b):
        if op in ("/", "%") and compare("==", b, 0) is not False:
            raise GuardUndecided(f"{a} {op} {b}: the divisor may be zero")
        return {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "%": a % b}[op]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    return math.fmod(a, b) if isinstance(a, float) or isinstance(b, float) else a % b


def _compare(op: str, a: Any, b: Any) -> bool:
    if op == "in":
        if not isinstance(b, (list, tuple, str)):
            raise GuardError("'in' needs a list on its right")
        if not is_symbolic(a) and not any(is_symbolic(v) for v in b):
            return a in b
        return _any_of(_equal(a, v) for v in b)
    if op in ("==", "!=") and (_symbolic_list(a) or _symbolic_list(b)):
        same = _equal(a, b)
        if same is None:
            raise GuardUndecided(f"{a} {op} {b} depends on the sizes bound at run time")
        return same if op == "==" else not same
    if is_symbolic(a) or is_symbolic(b):
        if op not in ("==", "!=") and not (_number(a) and _number(b)):
            raise GuardError(f"ordering compares numbers, got {a!r} and {b!r}")
        if not (_number(a) and _number(b)):
            return op == "!="  # a size against a string or list
        known = compare(op, a, b)
        if known is None:
            raise GuardUndecided(f"{a} {op} {b} depends on the sizes bound at run time")
        return known
    if op == "==":
        return bool(a == b)
    if op == "!=":
        return bool(a != b)
    for v in (a, b):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GuardError(f"ordering compares numbers, got {v!r}")
    return bool({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op])


def _symbolic_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and any(is_symbolic(x) or _symbolic_list(x) for x in v)


def _equal(a: Any, b: Any) -> bool | None:
    """Whether ``a == b`` for every binding of the symbolic sizes in them (None: it depends)."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)) or len(a) != len(b):
            return False
        return _all_of(_equal(x, y) for x, y in zip(a, b))
    if is_symbolic(a) or is_symbolic(b):
        return compare("==", a, b) if _number(a) and _number(b) else False
    return bool(a == b)


def _all_of(verdicts: Iterable[bool | None]) -> bool | None:
    """False if any is False, else None if any is None, else True."""
    seen = list(verdicts)
    return False if False in seen else None if None in seen else True


def _any_of(verdicts: Iterable[bool | None]) -> bool:
    seen = list(verdicts)
    if True in seen:
        return True
    if None in seen:
        raise GuardUndecided("membership depends on the sizes bound at run time")
    return False


def evaluate(g: Guard, env: Bindings) -> Any:
    """The value of guard expression ``g`` under ``env``."""
    if isinstance(g, (IntLit, FloatLit, StrLit, BoolLit)):
        return g.value
    if isinstance(g, ListLit):
        return [evaluate(i, env) for i in g.items]
    if isinstance(g, Name):
        if g.name in env.values:
            return _plain(env.values[g.name])
        raise GuardError(f"{g.name!r} is not a value (use rank(), shape(), ... on tensors)")
    if isinstance(g, Call):
        return _call(g, env)
    if isinstance(g, Index):
        seq, i = evaluate(g.value, env), evaluate(g.index, env)
        if not isinstance(seq, list) or not isinstance(i, int) or not -len(seq) <= i < len(seq):
            raise GuardError(f"index {i!r} out of range")
        return seq[i]
    if isinstance(g, Arith):
        if g.op == "neg":
            return _arith("-", 0, evaluate(g.lhs, env))
        assert g.rhs is not None
        return _arith(g.op, evaluate(g.lhs, env), evaluate(g.rhs, env))
    if isinstance(g, Compare):
        return _compare(g.op, evaluate(g.lhs, env), evaluate(g.rhs, env))
    if isinstance(g, BoolOp):
        if g.op == "not":
            return not _truth(evaluate(g.args[0], env))
        if g.op == "and":
            return all(_truth(evaluate(a, env)) for a in g.args)
        return any(_truth(evaluate(a, env)) for a in g.args)
    raise GuardError(f"not a guard expression: {g!r}")


def _truth(v: Any) -> bool:
    if not isinstance(v, bool):
        raise GuardError(f"expected a condition, got {v!r}")
    return v


DTYPE_NAMES = frozenset(str(d) for d in DType)


def unparse(g: Guard) -> str:
    """Source text of a guard (used in messages and ``autofusion-rules list``)."""
    if isinstance(g, StrLit):
        return '"' + g.value + '"'
    if isinstance(g, BoolLit):
        return "true" if g.value else "false"
    if isinstance(g, (IntLit, FloatLit)):
        return repr(g.value)
    if isinstance(g, ListLit):
        return "[" + ", ".join(unparse(i) for i in g.items) + "]"
    if isinstance(g, Name):
        return g.name
    if isinstance(g, Call):
        return f"{g.fn}(" + ", ".join(unparse(a) for a in g.args) + ")"
    if isinstance(g, Index):
        return f"{unparse(g.value)}[{unparse(g.index)}]"
    if isinstance(g, Arith):
        if g.op == "neg":
            return f"-{unparse(g.lhs)}"
        assert g.rhs is not None
        return f"({unparse(g.lhs)} {g.op} {unparse(g.rhs)})"
    if isinstance(g, Compare):
        return f"{unparse(g.lhs)} {g.op} {unparse(g.rhs)}"
    if isinstance(g, BoolOp):
        if g.op == "not":
            return f"not {unparse(g.args[0])}"
        return "(" + f" {g.op} ".join(unparse(a) for a in g.args) + ")"
    return "?"
