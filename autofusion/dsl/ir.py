"""The rule IR: what ``.fuse`` files mean, as frozen, hashable data the engine and decider consume.

Every node carries ``span`` (:class:`Span`: file, line, col, end_line, end_col). Spans never take
part in equality or hashing, so two rules written at different places compare equal when they say
the same thing. The DSL package never imports egglog; the engine translates this IR.

Structure (final)
-----------------

``RuleSet`` (the result of :func:`autofusion.dsl.load_rules`, imports resolved)
    ``classes: Mapping[str, ClassDef]`` built-in classes (``pointwise``, ``broadcast``,
    ``reduction``, ``reorganize``, ``opaque`` from the op registry, and ``any``) and user classes,
    each resolved to a frozenset of concrete op names; ``patterns: Mapping[str, PatternDef]``;
    ``rewrites: tuple[Rewrite, ...]``; ``fusions: tuple[FusionRule, ...]`` ordered by priority
    (higher first), then load order; ``nofuse: tuple[NoFuse, ...]``; ``files: tuple[str, ...]``;
    ``ops_of(name) -> frozenset[str]`` (the concrete ops of an op or class name).

Terms (``Term = OpTerm | Var | Literal | PatternRef``)
    ``OpTerm(op, args, attrs, capture, output, open)``: ``op`` is a concrete ONNX op or a class
    name (expand with ``ops_of``). ``args`` match the first inputs; with ``open`` the op may have
    more inputs than ``args`` (written ``...``; a bare op name and every step of an arrow chain
    is open, unless the op takes no further inputs), otherwise exactly ``len(args)``. ``output`` selects an output of a multi-output op
    (``Split(x, ...)[1]``). ``capture`` names the node (``Softmax(x) as s``) so guards can read it.
    ``Var(name, step)``: a tensor; the same name twice is the same tensor. ``step`` marks a
    per-time-step input of a loop body (``x[t]``). Names starting with ``_`` are anonymous
    (``_`` itself becomes a fresh ``_N``).
    ``Literal(value)``: a constant tensor. A scalar (int/float) matches any constant whose elements
    all equal it; a tuple is a 1-D constant (e.g. a Reshape shape ``[-1, 1, 1, 1]``).
    ``PatternRef(name, args, output, capture)``: use of a named pattern. In the rules of a RuleSet
    (``rewrites``, ``fusions``, ``nofuse``) every PatternRef is already expanded (its guard
    conjoined, its private names renamed ``_<pattern><n>_<name>``); PatternRef remains only inside
    ``RuleSet.patterns`` bodies.
    ``AttrMatch(name, value)``: the node's attribute ``name`` equals ``value`` (int, float, str,
    tuple), or, when ``value`` is a :class:`Var`, binds the attribute's value to that name. On the
    right side of a rewrite an attribute variable may appear as an input: it stands for a scalar
    constant with the attribute's value; and an attribute may take the value of a scalar constant
    tensor of the left side (``epsilon=eps`` with ``const(eps)`` in the guard).

Guards (:mod:`autofusion.dsl.guards`): ``BoolOp(and/or/not)``, ``Compare(== != < <= > >= in)``,
``Arith(+ - * / % neg)``, ``Call(fn, args)`` for fn in ``rank shape dim numel size_bytes dtype
is_float const attr len min max abs``, ``Index`` (``shape(x)[-1]``), ``Name``, ``IntLit``,
``FloatLit``, ``StrLit``, ``BoolLit``, ``ListLit``; ``guard.evaluate(Bindings)`` computes a value,
``holds(guard, bindings)`` a truth.

Rules
    ``Rewrite(name, lhs, rhs, bidirectional, guard, doc, priority, span)``.
    ``FusionRule(name, kind, template, params, priority, guard, doc, span, ...)`` with ``kind``:
    ``"linear"``: ``pattern: Term`` (the root is the last op of the chain; the whole tree becomes
    one kernel). ``"branch"``: ``shared: str`` (the tensor every member consumes),
    ``shared_term: Term | None`` (what computes it, when the rule says), ``members: tuple[Term,
    ...]``; one multi-output kernel. ``shared_output``: the shared tensor itself is also an
    output of the kernel (written as the bare shared name among the members; it has consumers
    outside the group, e.g. the next residual add), never a member term. ``"loop"``: ``carried: tuple[str, ...]`` and ``body:
    tuple[Term, ...]`` (``body[i]`` is the next value of ``carried[i]``), ``step_inputs``: the
    per-step inputs (``x[t]``); one kernel that runs the time loop inside. ``"class"``:
    ``consumer`` and ``producer`` (op or class names) and ``host`` (``"producer"``: a consumer of
    these ops may be computed inside its producer's kernel, an epilogue; ``"consumer"``: a
    producer may be computed inside its consumer's kernel, a prologue). ``template`` is ``""``
    only for class rules that keep the host's template.
    ``NoFuse(name, target, guard, doc, span)``: nodes matching ``target`` (a Term; a bare op or
    class name is an open OpTerm) are never fused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from typing import Literal as TypingLiteral

from autofusion.dsl.guards import Bindings, Guard, holds
from autofusion.dsl.span import NO_SPAN, Span
from autofusion.graph.graph import FrozenMap

AttrLiteral = int | float | str | tuple[Any, ...]


@dataclass(frozen=True)
class Var:
    """A tensor variable (or, as an AttrMatch value, an attribute variable)."""

    name: str
    step: bool = False
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class Literal:
    """A constant tensor: a scalar value, or a tuple for a 1-D constant."""

    value: int | float | tuple[int | float, ...]
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class AttrMatch:
    """Attribute ``name`` equals ``value``, or is bound to the name of a :class:`Var` value."""

    name: str
    value: AttrLiteral | Var
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class OpTerm:
    """An op (or op class) applied to argument terms; see the module docstring."""

    op: str
    args: tuple[Term, ...] = ()
    attrs: tuple[AttrMatch, ...] = ()
    capture: str | None = None
    output: int = 0
    open: bool = False
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class PatternRef:
    """Use of a named pattern; ``args`` None means the bare name (the pattern's own variables)."""

    name: str
    args: tuple[Term, ...] | None = None
    output: int = 0
    capture: str | None = None
    span: Span = field(default=NO_SPAN, compare=False)


Term = OpTerm | Var | Literal | PatternRef


@dataclass(frozen=True)
class Branch:
    """Several consumers of one shared tensor, fused into one multi-output kernel."""

    shared: str
    shared_term: Term | None
    members: tuple[Term, ...]


@dataclass(frozen=True)
class Loop:
    """A cell repeated over time steps: ``body[i]`` is the next value of ``carried[i]``."""

    carried: tuple[str, ...]
    body: tuple[Term, ...]
    step_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClassDef:
    """An op class: a name for a set of concrete ops."""

    name: str
    ops: frozenset[str]
    members: tuple[str, ...] = ()  # as written (op or class names); empty for built-in classes
    builtin: bool = False
    doc: str = ""
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class PatternDef:
    """A named pattern; ``params`` None means every variable of the body is a parameter."""

    name: str
    params: tuple[str, ...] | None
    body: Term | Branch | Loop
    guard: Guard | None = None
    doc: str = ""
    span: Span = field(default=NO_SPAN, compare=False)

    @property
    def kind(self) -> str:
        if isinstance(self.body, Branch):
            return "branch"
        if isinstance(self.body, Loop):
            return "loop"
        return "term"


@dataclass(frozen=True)
class Rewrite:
    """An equality between two patterns: ``lhs => rhs`` (or both ways when ``bidirectional``)."""

    name: str
    lhs: Term
    rhs: Term
    bidirectional: bool = False
    guard: Guard | None = None
    doc: str = ""
    priority: int = 0
    span: Span = field(default=NO_SPAN, compare=False)


FusionKind = TypingLiteral["linear", "branch", "loop", "class"]


@dataclass(frozen=True)
class FusionRule:
    """A region that may become one kernel, and the template that renders it."""

    name: str
    kind: FusionKind
    template: str = ""
    params: FrozenMap[str, Any] = field(default_factory=FrozenMap)
    priority: int = 0
    guard: Guard | None = None
    doc: str = ""
    span: Span = field(default=NO_SPAN, compare=False)
    pattern: Term | None = None  # linear
    shared: str | None = None  # branch
    shared_term: Term | None = None
    members: tuple[Term, ...] = ()
    shared_output: bool = False  # the shared tensor is also an output of the kernel
    carried: tuple[str, ...] = ()  # loop
    body: tuple[Term, ...] = ()
    step_inputs: tuple[str, ...] = ()
    consumer: str | None = None  # class
    producer: str | None = None
    host: str = "producer"

    def terms(self) -> tuple[Term, ...]:
        """Every pattern term of the rule (what the matcher has to find)."""
        if self.kind == "linear":
            return (self.pattern,) if self.pattern is not None else ()
        if self.kind == "branch":
            return ((self.shared_term,) if self.shared_term is not None else ()) + self.members
        return self.body


@dataclass(frozen=True)
class NoFuse:
    """Nodes matching ``target`` (and ``guard``) must stay in kernels of their own."""

    name: str
    target: Term
    guard: Guard | None = None
    doc: str = ""
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass(frozen=True)
class RuleSet:
    """Every rule of one or more ``.fuse`` files, imports resolved and patterns expanded."""

    classes: FrozenMap[str, ClassDef] = field(default_factory=FrozenMap)
    patterns: FrozenMap[str, PatternDef] = field(default_factory=FrozenMap)
    rewrites: tuple[Rewrite, ...] = ()
    fusions: tuple[FusionRule, ...] = ()
    nofuse: tuple[NoFuse, ...] = ()
    files: tuple[str, ...] = ()

    def ops_of(self, name: str) -> frozenset[str]:
        """The concrete ops ``name`` stands for: a class's members, or the op itself."""
        cls = self.classes.get(name)
        return cls.ops if cls is not None else frozenset({name})

    def rule_names(self) -> tuple[str, ...]:
        """Names of every rewrite, fusion rule and nofuse rule."""
        names: list[str] = [r.name for r in self.rewrites]
        names += [r.name for r in self.fusions]
        names += [r.name for r in self.nofuse]
        return tuple(names)


def walk(term: Term) -> Iterator[Term]:
    """``term`` and every sub-term, parents before children."""
    yield term
    if isinstance(term, OpTerm):
        for a in term.args:
            yield from walk(a)
    elif isinstance(term, PatternRef) and term.args:
        for a in term.args:
            yield from walk(a)


def term_vars(term: Term) -> list[Var]:
    """Tensor variables of ``term`` in source order (repeats included)."""
    return [t for t in walk(term) if isinstance(t, Var)]


def attr_vars(term: Term) -> list[Var]:
    """Attribute variables (``alpha=a``) of ``term`` in source order."""
    return [v for t in walk(term) if isinstance(t, OpTerm) for v in (m.value for m in t.attrs) if isinstance(v, Var)]


def captures(term: Term) -> list[tuple[str, Term]]:
    """(capture name, captured term) pairs of ``term``."""
    return [(t.capture, t) for t in walk(term) if isinstance(t, (OpTerm, PatternRef)) and t.capture]


def ops_used(term: Term) -> set[str]:
    """Op and class names that appear in ``term``."""
    return {t.op for t in walk(term) if isinstance(t, OpTerm)}


def unparse(term: Term) -> str:
    """Source text of a term in nested-call form."""
    if isinstance(term, Var):
        return f"{term.name}[t]" if term.step else term.name
    if isinstance(term, Literal):
        if isinstance(term.value, tuple):
            return "[" + ", ".join(repr(v) for v in term.value) + "]"
        return repr(term.value)
    parts = [unparse(a) for a in (term.args or ())]
    if isinstance(term, OpTerm):
        parts += [f"{m.name}={_attr_text(m.value)}" for m in term.attrs]
        if term.open:
            parts.append("...")
        text = f"{term.op}({', '.join(parts)})"
    else:
        text = term.name if term.args is None else f"{term.name}({', '.join(parts)})"
    if term.output:
        text += f"[{term.output}]"
    if term.capture:
        text += f" as {term.capture}"
    return text


def _attr_text(value: AttrLiteral | Var) -> str:
    if isinstance(value, Var):
        return value.name
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_attr_text(v) for v in value) + "]"
    return repr(value)


__all__ = [
    "AttrMatch",
    "Bindings",
    "Guard",
    "holds",
    "Branch",
    "ClassDef",
    "FusionRule",
    "Literal",
    "Loop",
    "NoFuse",
    "OpTerm",
    "PatternDef",
    "PatternRef",
    "Rewrite",
    "RuleSet",
    "Span",
    "Term",
    "Var",
    "attr_vars",
    "captures",
    "ops_used",
    "term_vars",
    "unparse",
    "walk",
]
