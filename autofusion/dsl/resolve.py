"""Name resolution: which names are ops, classes, patterns or variables, and the class table.

Ops come from the op registry (their names start with an uppercase letter), classes from the
registry's op classes plus ``class`` statements, patterns from ``pattern`` statements of every
loaded file. A bare lowercase name that is none of these is a tensor variable.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autofusion.dsl.diagnostics import Sink, did_you_mean
from autofusion.dsl.ir import Branch, ClassDef, FusionRule, Loop, OpTerm, PatternDef, PatternRef, Var
from autofusion.dsl.lower import NameRef, Statement
from autofusion.ops.registry import OpClass, OpRegistry

BUILTIN_CLASSES = (*(c.value for c in OpClass), "any")


def builtin_classes(registry: OpRegistry) -> dict[str, ClassDef]:
    """The registry's op classes, and ``any`` (every op)."""
    out = {c.value: ClassDef(c.value, frozenset(registry.of_class(c)), builtin=True,
                             doc=f"every {c.value} op of the registry") for c in OpClass}
    out["any"] = ClassDef("any", frozenset(registry.names), builtin=True, doc="every op of the registry")
    return out


def build_classes(statements: list[Statement], registry: OpRegistry, sink: Sink) -> dict[str, ClassDef]:
    """Built-in and user classes, members resolved to concrete ops (cycles and unknowns reported)."""
    classes = builtin_classes(registry)
    defs: dict[str, Statement] = {}
    for st in statements:
        if st.kind == "class" and st.name not in defs and st.name not in classes and st.name not in registry:
            defs[st.name] = st
    resolved: dict[str, frozenset[str]] = {}

    def ops_of(name: str, st: Statement, span: Any, stack: tuple[str, ...]) -> frozenset[str]:
        if name in registry:
            return frozenset({name})
        if name in classes:
            return classes[name].ops
        if name in stack:
            sink.add("F019", f"class {name} contains itself ({' -> '.join((*stack, name))})", span)
            return frozenset()
        if name in resolved:
            return resolved[name]
        if name in defs:
            d = defs[name]
            ops: set[str] = set()
            for member, mspan in zip(d.node.members, d.member_spans):
                ops |= ops_of(member, d, mspan, (*stack, name))
            resolved[name] = frozenset(ops)
            return resolved[name]
        known = [*registry.names, *classes, *defs]
        sink.add("F002", f"unknown op or class {name!r} in class {st.name}{did_you_mean(name, known)}", span)
        return frozenset()

    for name, st in defs.items():
        ops = ops_of(name, st, st.name_span, ())
        classes[name] = replace(st.node, ops=ops)
    return classes


class Resolver:
    """Turns NameRefs and calls into Vars, OpTerms and PatternRefs."""

    def __init__(self, registry: OpRegistry, classes: dict[str, ClassDef], pattern_names: set[str],
                 sink: Sink) -> None:
        self.registry = registry
        self.classes = classes
        self.pattern_names = pattern_names
        self.sink = sink

    def _unknown(self, name: str, span: Any) -> None:
        known = [*self.registry.names, *self.classes, *self.pattern_names]
        what = "op" if name[:1].isupper() else "class or pattern"
        self.sink.add("F002", f"unknown {what} {name!r}{did_you_mean(name, known)}", span)

    def term(self, t: Any) -> Any:
        if isinstance(t, NameRef):
            return self.name(t)
        if isinstance(t, OpTerm):
            args = tuple(self.term(a) for a in t.args)
            opdef = self.registry.get(t.op)
            if opdef is not None and t.open and opdef.max_inputs is not None and len(args) >= opdef.max_inputs:
                return replace(t, args=args, open=False)  # nothing is left open: Relu(x, ...) is Relu(x)
            if t.op in self.registry or t.op in self.classes:
                return replace(t, args=args)
            if t.op in self.pattern_names:
                if t.attrs:
                    self.sink.add("F004", f"pattern {t.op} takes no attributes", t.attrs[0].span)
                if t.open:
                    self.sink.add("F003", f"pattern {t.op} takes exactly its parameters; '...' is for ops", t.span)
                return PatternRef(t.op, args, t.output, t.capture, t.span)
            self._unknown(t.op, t.span)
            return replace(t, args=args)
        return t

    def name(self, t: NameRef) -> Any:
        n = t.name
        if n in self.registry or n in self.classes:
            opdef = self.registry.get(n)
            is_open = opdef is None or opdef.max_inputs is None or opdef.max_inputs > 0
            return OpTerm(n, (), (), t.capture, t.output, is_open, t.span)
        if n in self.pattern_names:
            return PatternRef(n, None, t.output, t.capture, t.span)
        if n[:1].isupper():
            self._unknown(n, t.span)
            return OpTerm(n, (), (), t.capture, t.output, True, t.span)
        if t.output:
            self.sink.add("F025", f"{n} is a tensor variable; only ops have numbered outputs", t.span)
        if t.capture:
            self.sink.add("F001", f"only an op can be captured with 'as', not the variable {n}", t.span)
        return Var(n, span=t.span)

    def body(self, body: Any) -> Any:
        if isinstance(body, Branch):
            shared = self.term(body.shared_term) if body.shared_term is not None else None
            return Branch(body.shared, shared, tuple(self.term(m) for m in body.members))
        if isinstance(body, Loop):
            return Loop(body.carried, tuple(self.term(b) for b in body.body), body.step_inputs)
        return self.term(body)

    def statement(self, st: Statement) -> None:
        node = st.node
        if st.kind == "pattern":
            st.node = replace(node, body=self.body(node.body))
        elif st.kind == "rewrite":
            st.node = replace(node, lhs=self.term(node.lhs), rhs=self.term(node.rhs))
        elif st.kind == "nofuse":
            st.node = replace(node, target=self.term(node.target))
        elif st.kind == "fuse":
            st.node = self.fusion(node, st)

    def fusion(self, node: FusionRule, st: Statement) -> FusionRule:
        if node.kind == "linear":
            return replace(node, pattern=self.term(node.pattern))
        if node.kind == "branch":
            shared = self.term(node.shared_term) if node.shared_term is not None else None
            return replace(node, shared_term=shared, members=tuple(self.term(m) for m in node.members))
        if node.kind == "loop":
            return replace(node, body=tuple(self.term(b) for b in node.body))
        for side in (node.consumer, node.producer):
            if side is not None and side not in self.registry and side not in self.classes:
                self._unknown(side, st.span)
        return node


def collect_patterns(statements: list[Statement]) -> dict[str, PatternDef]:
    """The first definition of each pattern name (duplicates are reported by the checks)."""
    out: dict[str, PatternDef] = {}
    for st in statements:
        if st.kind == "pattern" and st.name not in out:
            out[st.name] = st.node
    return out


__all__ = ["BUILTIN_CLASSES", "Resolver", "build_classes", "builtin_classes", "collect_patterns"]
