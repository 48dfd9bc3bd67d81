"""Pattern composition: inlining named patterns into the rules that use them.

``bias_act(y, w2, c)`` becomes the body of ``bias_act`` with its parameters replaced by the
arguments, its other names renamed ``_<pattern><n>_<name>`` (so two uses never share a private
tensor), and its guard added to the rule's guard. A bare use (``bias_act``) keeps the pattern's
own names, so the rule's guard can read them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autofusion.dsl import guards as g
from autofusion.dsl.diagnostics import Sink
from autofusion.dsl.ir import AttrMatch, Branch, Literal, Loop, OpTerm, PatternDef, PatternRef, Term, Var, walk


class Expander:
    """Expands PatternRefs; problems (recursion, arity, kinds) go to ``sink`` as F003/F019/F025."""

    def __init__(self, patterns: dict[str, PatternDef], sink: Sink) -> None:
        self.patterns = patterns
        self.sink = sink
        self.counter = 0
        self.failed = False

    def _error(self, code: str, message: str, span: Any) -> None:
        self.failed = True
        self.sink.add(code, message, span)

    def take_failed(self) -> bool:
        """Whether an expansion failed since the last call (and reset)."""
        failed, self.failed = self.failed, False
        return failed

    def term(self, t: Term, stack: tuple[str, ...] = ()) -> tuple[Term, list[g.Guard]]:
        """``t`` with every PatternRef inlined, and the guards the inlined patterns bring."""
        if isinstance(t, OpTerm):
            guards: list[g.Guard] = []
            args = []
            for a in t.args:
                ea, ga = self.term(a, stack)
                args.append(ea)
                guards += ga
            return replace(t, args=tuple(args)), guards
        if isinstance(t, PatternRef):
            return self.ref(t, stack)
        return t, []

    def ref(self, ref: PatternRef, stack: tuple[str, ...]) -> tuple[Term, list[g.Guard]]:
        pdef = self.patterns.get(ref.name)
        if pdef is None:
            return Var("_error", span=ref.span), []
        if ref.name in stack:
            self._error("F019", f"pattern {ref.name} uses itself ({' -> '.join((*stack, ref.name))})", ref.span)
            return Var("_error", span=ref.span), []
        if pdef.kind != "term":
            self._error("F019", f"pattern {ref.name} is a {pdef.kind}; use it as a whole fusion body, "
                          "not inside a term", ref.span)
            return Var("_error", span=ref.span), []
        body, guards = self.term(pdef.body, (*stack, ref.name))  # type: ignore[arg-type]
        guard = g.conjoin(pdef.guard, *guards)
        mapping = self.substitution(pdef, ref, [body], guard)
        if mapping is None:
            return Var("_error", span=ref.span), []
        terms, guard = mapping
        root = terms[0]
        if ref.output or ref.capture:
            if not isinstance(root, OpTerm):
                self._error("F025", f"pattern {ref.name} is not an op; it cannot be indexed or captured", ref.span)
                return root, [guard] if guard is not None else []
            if ref.output and root.output:
                self._error("F025", f"pattern {ref.name} already selects output {root.output}", ref.span)
            if ref.capture and root.capture and root.capture != ref.capture:
                guard = g.rename(guard, {root.capture: ref.capture}) if guard is not None else None
            root = replace(root, output=ref.output or root.output, capture=ref.capture or root.capture)
        return root, [guard] if guard is not None else []

    def substitution(self, pdef: PatternDef, ref: PatternRef, terms: list[Term],
                     guard: g.Guard | None) -> tuple[list[Term], g.Guard | None] | None:
        """``terms`` and ``guard`` with parameters replaced by ``ref``'s arguments (None on error)."""
        if ref.args is None:
            return terms, guard
        params = pdef.params
        if params is None:
            self._error("F003", f"pattern {pdef.name} declares no parameters; use it bare or declare "
                          f"{pdef.name}(x, ...)", ref.span)
            return None
        if len(ref.args) != len(params):
            self._error("F003", f"pattern {pdef.name} takes {len(params)} argument(s), got {len(ref.args)}",
                          ref.span)
            return None
        self.counter += 1
        prefix = f"_{pdef.name}{self.counter}_"
        guarded = {n.name for n in g.names_in(guard)}
        args: dict[str, Term] = {}
        renames: dict[str, str] = {}
        for p, a in zip(params, ref.args):
            if p in guarded:
                if isinstance(a, Var):
                    renames[p] = a.name
                elif isinstance(a, OpTerm):
                    if a.capture is None:
                        a = replace(a, capture=f"{prefix}{p}")
                    renames[p] = a.capture  # type: ignore[assignment]
                else:
                    self._error("F019", f"pattern {pdef.name}'s guard inspects {p}; pass a tensor, not a "
                                  "literal", a.span)
                    return None
            args[p] = a
        for t in terms:
            for name in _names(t):
                if name not in args and name not in renames:
                    renames[name] = prefix + name
        for n in g.names_in(guard):
            if n.name not in renames:
                renames[n.name] = prefix + n.name
        new_terms = [_subst(t, args, renames) for t in terms]
        return new_terms, (g.rename(guard, renames) if guard is not None else None)

    def body(self, body: Any, stack: tuple[str, ...] = ()) -> tuple[Any, list[g.Guard]]:
        """Expand a term, Branch or Loop body."""
        if isinstance(body, Branch):
            guards: list[g.Guard] = []
            shared = None
            if body.shared_term is not None:
                shared, gs = self.term(body.shared_term, stack)
                guards += gs
            members = []
            for m in body.members:
                em, gm = self.term(m, stack)
                members.append(em)
                guards += gm
            return Branch(body.shared, shared, tuple(members)), guards
        if isinstance(body, Loop):
            guards = []
            terms = []
            for b in body.body:
                eb, gb = self.term(b, stack)
                terms.append(eb)
                guards += gb
            return Loop(body.carried, tuple(terms), body.step_inputs), guards
        return self.term(body, stack)

    def whole(self, ref: PatternRef) -> tuple[Any, g.Guard | None] | None:
        """A branch or loop pattern used as a whole fusion body, expanded (None on error)."""
        pdef = self.patterns[ref.name]
        body, guards = self.body(pdef.body, (ref.name,))
        guard = g.conjoin(pdef.guard, *guards)
        if isinstance(body, Branch):
            terms = [Var(body.shared), *([body.shared_term] if body.shared_term is not None else []), *body.members]
        else:
            terms = [*(Var(c) for c in body.carried), *body.body]
        result = self.substitution(pdef, ref, terms, guard)
        if result is None:
            return None
        new, guard = result
        if isinstance(body, Branch):
            shared = new[0]
            if not isinstance(shared, Var):
                self._error("F019", f"the shared tensor of branch {ref.name} must be passed a variable", ref.span)
                return None
            k = 2 if body.shared_term is not None else 1
            return Branch(shared.name, new[1] if k == 2 else None, tuple(new[k:])), guard
        n = len(body.carried)
        carried = new[:n]
        if not all(isinstance(c, Var) for c in carried):
            self._error("F019", f"the carried values of loop {ref.name} must be passed variables", ref.span)
            return None
        return Loop(tuple(c.name for c in carried), tuple(new[n:]), body.step_inputs), guard  # type: ignore[union-attr]


def _names(t: Term) -> list[str]:
    out = []
    for s in walk(t):
        if isinstance(s, Var):
            out.append(s.name)
        if isinstance(s, OpTerm):
            if s.capture:
                out.append(s.capture)
            out += [m.value.name for m in s.attrs if isinstance(m.value, Var)]
    return out


def _subst(t: Term, args: dict[str, Term], renames: dict[str, str]) -> Term:
    if isinstance(t, Var):
        if t.name in args:
            a = args[t.name]
            if t.step and isinstance(a, Var):
                return replace(a, step=True)
            return a
        return replace(t, name=renames.get(t.name, t.name))
    if isinstance(t, OpTerm):
        attrs = tuple(
            AttrMatch(m.name, Var(renames.get(m.value.name, m.value.name), span=m.value.span), m.span)
            if isinstance(m.value, Var) else m for m in t.attrs)
        capture = renames.get(t.capture, t.capture) if t.capture else None
        return replace(t, args=tuple(_subst(a, args, renames) for a in t.args), attrs=attrs, capture=capture)
    if isinstance(t, Literal):
        return t
    return t
