"""Semantic checks of resolved statements. Each check only appends diagnostics to a Sink."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autofusion.dsl import guards as g
from autofusion.dsl.diagnostics import Sink, did_you_mean
from autofusion.dsl.guard_analysis import Truth, TypeChecker, tautologies, truth
from autofusion.dsl.guards import Ty
from autofusion.dsl.ir import (
    ClassDef,
    FusionRule,
    NoFuse,
    OpTerm,
    PatternDef,
    Rewrite,
    Term,
    Var,
    captures,
    walk,
)
from autofusion.dsl.lower import Statement
from autofusion.kinds import KindRegistry, default_kinds
from autofusion.ops.registry import OpDef, OpRegistry


def _arity_text(lo: int, hi: int | None) -> str:
    if hi is None:
        return f"at least {lo}"
    return str(lo) if lo == hi else f"{lo} to {hi}"


class TermChecker:
    """Checks ops, arities, attributes and output indices of resolved (unexpanded) terms."""

    def __init__(self, registry: OpRegistry, classes: dict[str, ClassDef], sink: Sink) -> None:
        self.registry = registry
        self.classes = classes
        self.sink = sink

    def check(self, t: Any, allow_step: bool) -> None:
        for s in walk(t):
            if isinstance(s, OpTerm):
                self.op_term(s)
            elif isinstance(s, Var) and s.step and not allow_step:
                self.sink.add("F021", f"{s.name}[t] is a per-step input; it is only meaningful in a loop body",
                              s.span)

    def op_term(self, t: OpTerm) -> None:
        opdef = self.registry.get(t.op)
        if opdef is not None:
            self.concrete(t, opdef)
        elif t.op in self.classes:
            self.of_class(t, self.classes[t.op])

    def concrete(self, t: OpTerm, opdef: OpDef) -> None:
        n, lo, hi = len(t.args), opdef.min_inputs, opdef.max_inputs
        if (hi is not None and n > hi) or (not t.open and n < lo):
            self.sink.add("F003", f"{t.op} takes {_arity_text(lo, hi)} input(s), got {n}"
                          + ("" if t.open or n > (hi or n) else "; end with '...' to leave the rest open"), t.span)
        for m in t.attrs:
            if m.name not in opdef.attrs:
                have = ", ".join(sorted(opdef.attrs)) or "none"
                self.sink.add("F004", f"{t.op} has no attribute {m.name!r}{did_you_mean(m.name, opdef.attrs)} "
                              f"(its attributes: {have})", m.span)
            elif not isinstance(m.value, Var):
                self.attr_type(t.op, m.name, m.value, opdef.attrs[m.name], m.span)
        outputs = opdef.num_outputs
        if t.output and outputs is not None and t.output >= outputs:
            self.sink.add("F025", f"{t.op} has {outputs} output(s); index {t.output} does not exist", t.span)

    def attr_type(self, op: str, name: str, value: Any, default: Any, span: Any) -> None:
        if default is None:
            return
        bad = False
        if isinstance(default, str):
            bad = not isinstance(value, str)
        elif isinstance(default, tuple):
            bad = not isinstance(value, tuple)
        elif isinstance(default, (int, float)):
            bad = isinstance(value, (str, tuple)) or (
                isinstance(default, int) and isinstance(value, float) and not value.is_integer())
        if bad:
            self.sink.add("F005", f"{op}.{name} is a {type(default).__name__} (default {default!r}), "
                          f"not {value!r}", span)

    def of_class(self, t: OpTerm, cls: ClassDef) -> None:
        if not cls.ops:
            return
        n = len(t.args)
        fits = [o for o in cls.ops if o in self.registry and _admits(self.registry[o], n, t.open)]
        if not fits:
            self.sink.add("F003", f"no op of class {cls.name} takes {n} input(s)", t.span)
        for m in t.attrs:
            if not any(m.name in self.registry[o].attrs for o in cls.ops if o in self.registry):
                self.sink.add("F004", f"no op of class {cls.name} has attribute {m.name!r}", m.span)


def _admits(opdef: OpDef, n: int, is_open: bool) -> bool:
    hi = opdef.max_inputs
    return (hi is None or n <= hi) and (is_open or n >= opdef.min_inputs)


# ---- bindings and guards -------------------------------------------------------------------------


def binding_kinds(terms: Iterable[Term], extra_tensors: Iterable[str] = ()) -> dict[str, Ty]:
    """Names a pattern binds: tensor variables, captured nodes, attribute variables."""
    kinds: dict[str, Ty] = {n: Ty.TENSOR for n in extra_tensors}
    for t in terms:
        for s in walk(t):
            if isinstance(s, Var):
                kinds.setdefault(s.name, Ty.TENSOR)
            elif isinstance(s, OpTerm):
                if s.capture:
                    kinds[s.capture] = Ty.NODE
                for m in s.attrs:
                    if isinstance(m.value, Var):
                        kinds.setdefault(m.value.name, Ty.ANY)
    return kinds


def check_guard(guard: g.Guard | None, kinds: dict[str, Ty], sink: Sink, context: str,
                inherited: g.Guard | None = None) -> None:
    """Type check ``guard``; report when it (with the guards of used patterns) can never hold."""
    if guard is None and inherited is None:
        return
    if guard is not None:
        if not TypeChecker(kinds, sink, context).check_condition(guard):
            return
        for taut in tautologies(guard):
            sink.add("F011", f"this condition holds for every match: {g.unparse(taut)}", taut.span)
    whole = g.conjoin(guard, inherited)
    assert whole is not None
    if truth(whole) is Truth.FALSE:
        if inherited is not None and truth(inherited) is Truth.FALSE:
            return  # already reported at the pattern that brings it
        where = guard if guard is not None else whole
        sink.add("F010", f"the guard can never hold, so {context} never matches: {g.unparse(whole)}", where.span)


def used_names(guard: g.Guard | None, *terms: Term) -> set[str]:
    out = {n.name for n in g.names_in(guard)}
    for t in terms:
        for s in walk(t):
            if isinstance(s, Var):
                out.add(s.name)
            elif isinstance(s, OpTerm):
                out |= {m.value.name for m in s.attrs if isinstance(m.value, Var)}
    return out


def report_unused(own_terms: Iterable[Term], used: set[str], sink: Sink, attr_uses: set[str]) -> None:
    """F007 for captures and attribute variables of the rule's own terms that nothing reads."""
    for t in own_terms:
        for s in walk(t):
            if isinstance(s, OpTerm):
                if s.capture and not s.capture.startswith("_") and s.capture not in used:
                    sink.add("F007", f"capture {s.capture} is never used", s.span)
                for m in s.attrs:
                    v = m.value
                    if isinstance(v, Var) and not v.name.startswith("_") and v.name not in attr_uses:
                        sink.add("F007", f"attribute variable {v.name} is never used; write {m.name}=_ to "
                                 "accept any value", v.span)


# ---- rules ---------------------------------------------------------------------------------------


class RuleChecker:
    """Checks of expanded rules: bindings, structure, guards and templates."""

    def __init__(self, registry: OpRegistry, sink: Sink, kinds: KindRegistry | None = None) -> None:
        self.registry = registry
        self.sink = sink
        self.kinds = kinds or default_kinds()
        self.rule_kinds = frozenset(n for n in self.kinds.names() if n != "view")  # views are no rule's kind

    def params(self, rule: FusionRule, st: Statement) -> None:
        """Each template param is one the kind takes, with a value of its type (F026)."""
        spans = dict(st.param_spans)
        for name, why in self.kinds[rule.template].param_problems(rule.params):
            self.sink.add("F026", why, spans.get(name, st.template_span or st.span))

    def rewrite(self, raw: Rewrite, rw: Rewrite, st: Statement, inherited: g.Guard | None) -> None:
        sink = self.sink
        sides = [("left", rw.lhs, raw.lhs)] + ([("right", rw.rhs, raw.rhs)] if rw.bidirectional else [])
        for label, side, raw_side in sides:
            if not isinstance(side, OpTerm):
                sink.add("F018", f"the {label} side of a rewrite must be an op term, not a "
                         f"{'variable' if isinstance(side, Var) else 'literal'}", raw_side.span)
        builds = [rw.rhs] + ([rw.lhs] if rw.bidirectional else [])
        for side in builds:
            for s in walk(side):
                if isinstance(s, OpTerm) and s.op not in self.registry:
                    sink.add("F018", f"{s.op} is a class; a side that is built needs concrete ops", s.span)
                if isinstance(s, OpTerm) and s.open:
                    sink.add("F018", f"{s.op}(...) leaves inputs open; a side that is built needs every input",
                             s.span)
                if isinstance(s, Var) and s.name in st.wildcards:
                    sink.add("F018", "a wildcard '_' cannot be built", s.span)
        if any(isinstance(s, OpTerm) and s.capture for s in walk(raw.rhs)) and not rw.bidirectional:
            sink.add("F018", "captures belong on the left side of a rewrite", raw.rhs.span)
        lhs_kinds = binding_kinds([rw.lhs])
        self.rhs_bindings(rw.lhs, rw.rhs, lhs_kinds, rw.guard, "left")
        if rw.bidirectional:
            self.rhs_bindings(rw.rhs, rw.lhs, binding_kinds([rw.rhs]), rw.guard, "right")
        check_guard(raw.guard, lhs_kinds, sink, f"rewrite {rw.name}", inherited)
        attr_uses = used_names(rw.guard, rw.rhs) | ({n for n in binding_kinds([rw.lhs])} if rw.bidirectional else set())
        report_unused([raw.lhs], used_names(rw.guard), sink, attr_uses)

    def rhs_bindings(self, lhs: Term, rhs: Term, kinds: dict[str, Ty], guard: g.Guard | None, side: str) -> None:
        const_names = {a.name for c in _calls(guard, "const") for a in c.args if isinstance(a, g.Name)}
        for s in walk(rhs):
            if isinstance(s, Var) and s.name not in kinds and not s.name.startswith("_w"):
                self.sink.add("F006", f"{s.name} is not bound by the {side} side", s.span)
            if isinstance(s, OpTerm):
                for m in s.attrs:
                    v = m.value
                    if not isinstance(v, Var):
                        continue
                    kind = kinds.get(v.name)
                    if kind is None:
                        self.sink.add("F006", f"attribute value {v.name} is not bound by the {side} side", v.span)
                    elif kind is Ty.TENSOR and v.name not in const_names:
                        self.sink.add("F018", f"attribute {m.name}={v.name} takes a tensor's value; the guard "
                                      f"must require const({v.name})", v.span)

    def fusion(self, raw: FusionRule, rule: FusionRule, st: Statement, inherited: g.Guard | None) -> None:
        sink = self.sink
        if rule.template and rule.template not in self.rule_kinds:
            known = ", ".join(sorted(self.rule_kinds))
            sink.add("F012", f"unknown template {rule.template!r}{did_you_mean(rule.template, self.rule_kinds)} "
                     f"(known: {known})", st.template_span or st.span)
        elif not rule.template and rule.kind != "class":
            sink.add("F012", f"a {rule.kind} fusion needs '-> template \"NAME\"'", st.span)
        elif rule.template:
            self.params(rule, st)
        if rule.kind == "class":  # its guard reads the two nodes by role
            check_guard(rule.guard, {"consumer": Ty.NODE, "producer": Ty.NODE}, sink, f"rule {rule.name}")
            return
        terms = rule.terms()
        extra = [rule.shared] if rule.shared else []
        extra += list(rule.carried)
        kinds = binding_kinds(terms, extra)
        check_guard(raw.guard, kinds, sink, f"rule {rule.name}", inherited)
        report_unused(raw.terms(), used_names(rule.guard), sink, used_names(rule.guard))
        if rule.kind != "loop":
            self.no_steps(terms)
        if rule.kind == "branch":
            self.branch(rule, st)
        if rule.kind == "loop":
            self.loop(rule, st)

    def no_steps(self, terms: Iterable[Term]) -> None:
        for t in terms:
            for s in walk(t):
                if isinstance(s, Var) and s.step:
                    self.sink.add("F021", f"{s.name}[t] is a per-step input; it is only meaningful in a loop body",
                                  s.span)

    def branch(self, rule: FusionRule, st: Statement) -> None:
        outputs = len(rule.members) + rule.shared_output
        if outputs < 2 or not rule.members:
            self.sink.add("F020", f"branch {rule.name} has {outputs} output(s); a branch fuses two or more "
                          "consumers of one tensor into one kernel", st.span)
        if rule.shared_output and rule.shared_term is None:
            self.sink.add("F020", f"{rule.shared} is an input of branch {rule.name}; only a computed shared "
                          f"tensor (`branch {rule.shared} = ...`) can be an output", st.span)
        for m in rule.members:
            if not any(isinstance(s, Var) and s.name == rule.shared for s in walk(m)):
                self.sink.add("F020", f"this member does not consume the shared tensor {rule.shared}", m.span)
        if rule.shared_term is not None and any(isinstance(s, Var) and s.name == rule.shared
                                                for s in walk(rule.shared_term)):
            self.sink.add("F020", f"{rule.shared} cannot be computed from itself", rule.shared_term.span)

    def loop(self, rule: FusionRule, st: Statement) -> None:
        read = {s.name for t in rule.body for s in walk(t) if isinstance(s, Var) and not s.step}
        stepped = {s.name for t in rule.body for s in walk(t) if isinstance(s, Var) and s.step}
        for c in rule.carried:
            if c not in read:
                self.sink.add("F021", f"carried value {c} is never read by the loop body", st.span)
            if c in stepped:
                self.sink.add("F021", f"{c} is carried; it cannot also be a per-step input {c}[t]", st.span)

    def nofuse(self, raw: NoFuse, rule: NoFuse, inherited: g.Guard | None) -> None:
        kinds = binding_kinds([rule.target])
        check_guard(raw.guard, kinds, self.sink, f"nofuse {rule.name}", inherited)
        report_unused([raw.target], used_names(rule.guard), self.sink, used_names(rule.guard))
        self.no_steps([rule.target])

    def pattern(self, pdef: PatternDef, expanded_terms: list[Term], inherited: g.Guard | None,
                extra: Iterable[str]) -> None:
        kinds = binding_kinds(expanded_terms, extra)
        check_guard(pdef.guard, kinds, self.sink, f"pattern {pdef.name}", inherited)
        if pdef.params is not None:
            names = {s.name for t in expanded_terms for s in walk(t) if isinstance(s, Var)} | set(extra)
            names |= {c for t in expanded_terms for c, _ in captures(t)}
            for p in pdef.params:
                if p not in names and not p.startswith("_"):
                    self.sink.add("F007", f"parameter {p} of pattern {pdef.name} is never used", pdef.span)


def _calls(guard: g.Guard | None, fn: str) -> list[g.Call]:
    out: list[g.Call] = []

    def walk_g(e: g.Guard) -> None:
        if isinstance(e, g.Call) and e.fn == fn:
            out.append(e)
        for c in g.children(e):
            walk_g(c)

    if guard is not None:
        walk_g(guard)
    return out


def const_names(guard: g.Guard | None) -> set[str]:
    """Names the guard requires to be constants (``const(x)`` in a conjunction)."""
    return {a.name for c in _calls(guard, "const") for a in c.args if isinstance(a, g.Name)}

