"""Pattern terms of the rule IR as egglog rules that record their matches, and the side conditions
(literal values, attributes, guards) checked on each recorded match in Python.

egglog finds every structural match (op names, class membership through the ``in-class``
relation, argument positions, shared variables) and writes one row per match into a relation of
the rule's own. The engine reads the rows from the serialized e-graph and keeps the matches whose
literals, attributes and guard hold for the tensors' types and values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autofusion.dsl.guards import Bindings, Guard, verdict
from autofusion.dsl.ir import Literal, OpTerm, PatternRef, RuleSet, Term, Var
from autofusion.engine.egraph import Serialized
from autofusion.engine.encode import f64, multi_output, parse_attrs, quote
from autofusion.graph.types import TensorType
from autofusion.ops.registry import OpRegistry


class Untranslatable(ValueError):
    """A pattern the engine cannot express as an e-graph query (reported, never silently dropped)."""


@dataclass
class OpSlot:
    term: OpTerm
    value: str  # egglog variable holding the op's (output) value
    attrs: str  # egglog variable holding its attribute text
    opname: str | None  # egglog variable holding the op name when the term names a class
    rest: str = ""  # egglog variable for the further inputs of an open term


@dataclass
class CompiledPattern:
    """One egglog rule for one pattern term, and how to read its rows back."""

    relation: str
    program: str
    root: str
    columns: list[tuple[str, str]]  # (egglog variable, sort)
    ops: list[OpSlot]
    vars: dict[str, str]  # pattern variable -> egglog variable
    literals: list[tuple[Literal, str]]


MAX_SWAPPABLE = 3  # a pattern with more commutative ops takes both orders only where no literal is (2**k rules)


def _scalar_literal(term: Term) -> bool:
    return isinstance(term, Literal) and not isinstance(term.value, tuple)


class PatternCompiler:
    """Compiles a pattern term into egglog rules (one per argument order of its commutative ops)
    that all record into one relation with the same columns."""

    def __init__(self, rules: RuleSet, registry: OpRegistry) -> None:
        self.rules = rules
        self.registry = registry
        self._n = 0

    def _commutative(self, op: str) -> bool:
        """Whether the op's two inputs may be swapped (OpDef.commutative): patterns match either order."""
        d = self.registry.get(op)
        return d is not None and d.commutative

    def _var(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def compile(self, term: Term, relation: str, ruleset: str, rule_name: str) -> CompiledPattern:
        ops: list[OpSlot] = []
        vars_: dict[str, str] = {}
        literals: list[tuple[Literal, str]] = []
        names: dict[Term, str] = {}  # structurally equal sub-terms are one e-class: named once
        root = self._name(term, names, ops, vars_, literals)
        columns = [(root, "Expr")]
        seen = {root}
        for slot in ops:
            for v, sort in ((slot.value, "Expr"), (slot.attrs, "String"), (slot.opname, "String")):
                if v is not None and v not in seen:
                    columns.append((v, sort))
                    seen.add(v)
        for v in [*vars_.values(), *(v for _, v in literals)]:
            if v not in seen:
                columns.append((v, "Expr"))
                seen.add(v)
        commutative: list[OpTerm] = [s.term for s in ops if self._commutative(s.term.op) and len(s.term.args) == 2]
        # beyond MAX_SWAPPABLE, an op with a scalar literal matches it second, where the encoder puts
        # scalar constants (a torch GELU, mul(0.5, x) ... add(1.0, tanh(...)), has six such ops), and
        # only the others take both orders
        fixed: set[OpTerm] = set()
        swappable = commutative
        if len(commutative) > MAX_SWAPPABLE:
            swappable = [t for t in commutative if not any(_scalar_literal(a) for a in t.args)]
            fixed = {t for t in commutative if _scalar_literal(t.args[0]) and not _scalar_literal(t.args[1])}
        slots: dict[Term, OpSlot] = {s.term: s for s in ops}
        head = f"({relation} {' '.join(v for v, _ in columns)})"
        lines = [f"(relation {relation} ({' '.join(sort for _, sort in columns)}))"]
        variants = 2 ** len(swappable) if len(swappable) <= MAX_SWAPPABLE else 1
        for mask in range(variants):
            swaps: set[Term] = {t for i, t in enumerate(swappable) if mask >> i & 1}
            swaps.update(fixed)
            facts: list[str] = []
            self._emit(term, names, slots, vars_, swaps, facts, set())
            lines.append(f"(rule ({' '.join(facts)}) ({head}) :ruleset {ruleset} :name {quote(f'{rule_name}/{mask}')})")
        return CompiledPattern(relation, "\n".join(lines), root, columns, ops, vars_, literals)

    def _name(self, term: Term, names: dict[Term, str], ops: list[OpSlot], vars_: dict[str, str],
              literals: list[tuple[Literal, str]]) -> str:
        """Give every distinct sub-term its egglog variable once, whatever the argument order."""
        if not isinstance(term, Var) and term in names:
            return names[term]
        if isinstance(term, Var):
            v = vars_.get(term.name)
            if v is None:
                v = vars_[term.name] = self._var("v")
            return v
        if isinstance(term, Literal):
            v = self._var("l")
            literals.append((term, v))
            names[term] = v
            return v
        if isinstance(term, PatternRef):
            raise Untranslatable(f"pattern {term.name!r} was not expanded")
        if term.op in self.rules.classes:
            opname: str | None = self._var("o")
        elif term.op in self.registry:
            opname = None
        else:
            raise Untranslatable(f"unknown op or class {term.op!r}")
        value = self._var("e")
        names[term] = value
        slot = OpSlot(term, value, self._var("s"), opname, self._var("r"))
        for a in term.args:
            self._name(a, names, ops, vars_, literals)
        ops.append(slot)
        return value

    def _emit(self, term: Term, names: dict[Term, str], slots: dict[Term, OpSlot], vars_: dict[str, str],
              swaps: set[Term], facts: list[str], done: set[Term]) -> str:
        """Atoms root first, then each list cell, then the children. The input count is checked on
        the ``Op`` and the list's ``Nil`` is never named: every one-element tail shares that one
        e-class, and egglog 13's planner joined through it, quadratic (and worse) in graph size."""
        if isinstance(term, Var):
            return vars_[term.name]
        if isinstance(term, Literal):
            v = names[term]
            if not isinstance(term.value, tuple) and term not in done:
                done.add(term)  # scalar literals are filtered in the e-graph (fp32-rounded), checked again in Python
                facts.append(f"(= {v} (Num {f64(float(np.float32(term.value)))} {v}_dtype {v}_shape))")
            return v
        assert isinstance(term, OpTerm)
        slot = slots[term]
        if term in done:
            return slot.value
        done.add(term)
        args = list(term.args)
        if term in swaps:
            args.reverse()
        children = [self._value(a, names, slots, vars_) for a in args]
        cells = [f"{slot.value}_a{k}" for k in range(len(children))]
        tail = slot.rest if term.open else f"{slot.value}_a{len(children)}"
        if slot.opname is not None:
            op_text, proj = slot.opname, term.output > 0
        else:
            op_text, proj = quote(term.op), term.output > 0 or multi_output(self.registry, term.op)
        arity = f"{slot.value}_n" if term.open else str(len(children))
        op_expr = f"(Op {op_text} {slot.attrs} {cells[0] if cells else tail} {arity})"
        facts.append(f"(= {slot.value} (Proj {op_expr} {term.output}))" if proj else f"(= {slot.value} {op_expr})")
        if slot.opname is not None:
            facts.append(f"(in-class {slot.opname} {quote(term.op)})")
        for k, child in enumerate(children):
            facts.append(f"(= {cells[k]} (Cons {child} {cells[k + 1] if k + 1 < len(cells) else tail}))")
        for a in args:
            self._emit(a, names, slots, vars_, swaps, facts, done)
        return slot.value

    @staticmethod
    def _value(term: Term, names: dict[Term, str], slots: dict[Term, OpSlot], vars_: dict[str, str]) -> str:
        """The egglog variable of a sub-term (already named by ``_name``)."""
        if isinstance(term, Var):
            return vars_[term.name]
        if isinstance(term, Literal):
            return names[term]
        return slots[term].value


@dataclass
class EClassFacts:
    """What Python knows of each e-class of a snapshot: handles, types, constant values."""

    handles: dict[str, list[int]]  # eclass -> handles
    types: dict[str, TensorType]
    values: dict[str, np.ndarray]
    consts: set[str]


@dataclass
class Match:
    rule: str
    root: str  # e-class
    vars: dict[str, str]  # pattern variable -> e-class
    ops: list[tuple[OpTerm, str, str, Mapping[str, Any]]]  # (term, value e-class, op, attributes)
    values: dict[str, Any] = field(default_factory=dict)  # attribute variables
    env: Bindings = field(default_factory=Bindings)  # what a guard sees of this match


def merged_env(matches: list[Match]) -> Bindings:
    """One guard environment for several matches read together (a branch rule's members)."""
    types: dict[str, TensorType] = {}
    consts: set[str] = set()
    attrs: dict[str, Mapping[str, Any]] = {}
    values: dict[str, Any] = {}
    for m in matches:
        types.update(m.env.types)
        consts |= m.env.consts
        attrs.update(m.env.attrs)
        values.update(m.env.values)
    return Bindings(types=types, consts=frozenset(consts), attrs=attrs, values=values)


@dataclass
class Rejections:
    """The rows of a pattern whose side conditions failed."""

    count: int = 0
    # cells of the rows whose guard depends on symbolic sizes (holds for some bindings, not others)
    undecided: list[dict[str, Any]] = field(default_factory=list)


def read_matches(
    pattern: CompiledPattern,
    snapshot: Serialized,
    facts: EClassFacts,
    registry: OpRegistry,
    guard: Guard | None,
    rule: str,
) -> tuple[list[Match], Rejections]:
    """Matches whose side conditions hold, and the rows that failed them."""
    out: list[Match] = []
    rejected = Rejections()
    seen: set[tuple[str, ...]] = set()
    for row in snapshot.rows(pattern.relation):
        cells: dict[str, Any] = {}
        for (var, sort), child in zip(pattern.columns, row):
            cells[var] = snapshot.eclass(child) if sort == "Expr" else snapshot.primitive(child)
        key = tuple(str(cells[v]) for v, _ in pattern.columns)
        if key in seen:
            continue
        seen.add(key)
        m = _check(pattern, cells, facts, registry, guard, rule)
        if isinstance(m, Match):
            out.append(m)
            continue
        rejected.count += 1
        if m is UNDECIDED:
            rejected.undecided.append(cells)
    return out, rejected


UNDECIDED = object()  # a row whose guard depends on the sizes bound at run time


def _check(pattern: CompiledPattern, cells: dict[str, Any], facts: EClassFacts, registry: OpRegistry,
           guard: Guard | None, rule: str) -> Match | object | None:
    """The match of one row; None when it fails, UNDECIDED when its guard depends on run-time sizes."""
    types: dict[str, TensorType] = {}
    consts: set[str] = set()
    captured_attrs: dict[str, Mapping[str, Any]] = {}
    values: dict[str, Any] = {}
    ops: list[tuple[OpTerm, str, str, Mapping[str, Any]]] = []
    for slot in pattern.ops:
        op = slot.term.op if slot.opname is None else str(cells[slot.opname])
        opdef = registry.get(op)
        attrs = dict(parse_attrs(str(cells[slot.attrs])))
        if opdef is not None:
            for k, d in opdef.attrs.items():
                if d is not None:
                    attrs.setdefault(k, d)
        for m in slot.term.attrs:
            have = attrs.get(m.name)
            if isinstance(m.value, Var):
                if have is None:
                    return None
                values[m.value.name] = have
            elif not _same_value(have, m.value):
                return None
        eclass = cells[slot.value]
        if slot.term.capture:
            t = facts.types.get(eclass)
            if t is not None:
                types[slot.term.capture] = t
            captured_attrs[slot.term.capture] = attrs
        ops.append((slot.term, eclass, op, attrs))
    for lit, var in pattern.literals:
        value = facts.values.get(cells[var])
        if value is None or not _literal_matches(lit, value):
            return None
    vars_ = {name: cells[v] for name, v in pattern.vars.items()}
    for name, eclass in vars_.items():
        t = facts.types.get(eclass)
        if t is not None:
            types[name] = t
        if eclass in facts.consts:
            consts.add(name)
    env = Bindings(types=types, consts=frozenset(consts), attrs=captured_attrs, values=values)
    ok = verdict(guard, env)
    if ok is not True:
        return None if ok is False else UNDECIDED
    return Match(rule, cells[pattern.root], vars_, ops, values, env)


def _same_value(have: Any, want: Any) -> bool:
    if have is None:
        return False
    if isinstance(want, (tuple, list)) or isinstance(have, (tuple, list)):
        if not isinstance(have, (tuple, list)) or not isinstance(want, (tuple, list)) or len(have) != len(want):
            return False
        return all(_same_value(a, b) for a, b in zip(have, want))
    if isinstance(want, float) or isinstance(have, float):
        try:
            return math.isclose(float(have), float(want), rel_tol=1e-6, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return bool(have == want)


def _literal_matches(lit: Literal, value: np.ndarray) -> bool:
    if isinstance(lit.value, tuple):
        flat = value.reshape(-1)
        return flat.size == len(lit.value) and all(
            math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(flat, lit.value))
    if value.size == 0:
        return False
    flat = value.reshape(-1).astype(np.float64)
    want = float(np.float32(lit.value)) if value.dtype == np.float32 else float(lit.value)
    return bool(np.all(np.isclose(flat, want, rtol=1e-6, atol=1e-12)))
