"""Pattern-against-pattern matching: is one pattern an instance of another?

Used by the checker to find shadowed rules and rewrites that feed themselves. A variable of the
general pattern matches any sub-term (the same one at every occurrence); an op or class matches
any op of a subset; a literal matches an equal literal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autofusion.dsl import guards as g
from autofusion.dsl.ir import Literal, OpTerm, Term, Var, walk

OpsOf = Callable[[str], frozenset[str]]


def instance(general: Term, specific: Term, ops_of: OpsOf, subst: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The substitution that makes ``general`` match everything ``specific`` matches, or None."""
    subst = {} if subst is None else subst
    return subst if _match(general, specific, ops_of, subst) else None


def _match(gen: Term, spec: Term, ops_of: OpsOf, subst: dict[str, Any]) -> bool:
    if isinstance(gen, Var):
        if gen.name in subst:
            return bool(subst[gen.name] == spec)
        subst[gen.name] = spec
        return True
    if isinstance(gen, Literal):
        return isinstance(spec, Literal) and gen.value == spec.value
    if not isinstance(gen, OpTerm) or not isinstance(spec, OpTerm):
        return False
    if gen.output != spec.output or not ops_of(spec.op) <= ops_of(gen.op):
        return False
    if gen.open:
        if len(spec.args) < len(gen.args):
            return False
    elif spec.open or len(spec.args) != len(gen.args):
        return False
    spec_attrs = {m.name: m.value for m in spec.attrs}
    for m in gen.attrs:
        if isinstance(m.value, Var):
            key = "@" + m.value.name
            got = spec_attrs.get(m.name, m.value)
            if key in subst and subst[key] != got:
                return False
            subst[key] = got
        elif m.name not in spec_attrs or spec_attrs[m.name] != m.value:
            return False
    return all(_match(a, b, ops_of, subst) for a, b in zip(gen.args, spec.args))


def renamed_guard(guard: g.Guard | None, subst: dict[str, Any]) -> g.Guard | None | bool:
    """``guard`` in the names of the specific pattern, or False when a name maps to a non-variable."""
    if guard is None:
        return None
    mapping: dict[str, str] = {}
    for n in g.names_in(guard):
        target = subst.get(n.name, subst.get("@" + n.name))
        if isinstance(target, Var):
            mapping[n.name] = target.name
        elif target is not None:
            return False
    return g.rename(guard, mapping)


def covers(general: Term, g_guard: g.Guard | None, specific: Term, s_guard: g.Guard | None,
           ops_of: OpsOf) -> bool:
    """Whether every match of (specific, s_guard) is also a match of (general, g_guard)."""
    subst = instance(general, specific, ops_of)
    if subst is None:
        return False
    if g_guard is None:
        return True
    renamed = renamed_guard(g_guard, subst)
    return renamed is not False and renamed == s_guard


def proper_subterms(t: Term) -> list[Term]:
    """Sub-terms of ``t`` other than ``t`` itself."""
    return list(walk(t))[1:]


def canonical(terms: tuple[Term, ...], guard: g.Guard | None) -> tuple[Any, ...]:
    """A form equal for rules that differ only in variable names (for duplicate detection)."""
    names: dict[str, str] = {}

    def name(n: str) -> str:
        return names.setdefault(n, f"v{len(names)}")

    def canon(t: Term) -> Any:
        if isinstance(t, Var):
            return ("var", name(t.name), t.step)
        if isinstance(t, Literal):
            return ("lit", t.value)
        if isinstance(t, OpTerm):
            attrs = tuple(sorted((m.name, ("var", name(m.value.name)) if isinstance(m.value, Var) else m.value)
                                 for m in t.attrs))
            cap = name(t.capture) if t.capture else None
            return ("op", t.op, tuple(canon(a) for a in t.args), attrs, cap, t.output, t.open)
        return ("?", repr(t))

    shape = tuple(canon(t) for t in terms)
    renamed = g.rename(guard, names) if guard is not None else None
    return shape, renamed
