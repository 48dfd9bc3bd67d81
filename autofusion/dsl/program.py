"""From the statements of all loaded files to a checked :class:`~autofusion.dsl.ir.RuleSet`.

Order of work: class table, name resolution, term checks, pattern expansion with the rule checks,
then the whole-program checks (duplicate names, shadowed rules, unbounded rewrites). A statement
with an error stays out of the RuleSet, and out of numerical verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from autofusion.dsl import guards as g
from autofusion.dsl.checks import RuleChecker, TermChecker
from autofusion.dsl.diagnostics import Sink
from autofusion.dsl.expand import Expander
from autofusion.dsl.growth import check_growth
from autofusion.dsl.ir import Branch, FusionRule, Loop, NoFuse, PatternDef, PatternRef, Rewrite, RuleSet, Var, walk
from autofusion.dsl.lower import Statement
from autofusion.dsl.match import canonical, covers
from autofusion.dsl.resolve import BUILTIN_CLASSES, Resolver, build_classes, collect_patterns
from autofusion.graph.graph import FrozenMap
from autofusion.kinds import KindRegistry
from autofusion.ops.registry import OpRegistry


@dataclass
class Compiled:
    """One statement after expansion: ``rule`` is the RuleSet's node; ``ok`` when it had no error."""

    statement: Statement
    rule: Any
    ok: bool = True


@dataclass
class Program:
    ruleset: RuleSet
    compiled: list[Compiled] = field(default_factory=list)


class _Errors:
    """Counts errors a statement causes, so a broken rule stays out of the RuleSet."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.mark = 0

    def start(self) -> None:
        self.mark = sum(d.is_error for d in self.sink.items)

    def clean(self) -> bool:
        return sum(d.is_error for d in self.sink.items) == self.mark


def compile_program(statements: list[Statement], files: list[str], registry: OpRegistry, sink: Sink,
                    kinds: KindRegistry | None = None) -> Program:
    """Check and assemble every statement (imports already resolved, in load order)."""
    classes = build_classes(statements, registry, sink)
    resolver = Resolver(registry, classes, {st.name for st in statements if st.kind == "pattern"}, sink)
    terms = TermChecker(registry, classes, sink)
    errors = _Errors(sink)
    broken: set[int] = set()
    for st in statements:
        errors.start()
        _guarded(sink, st, lambda st=st: _resolve_and_check(resolver, terms, st))
        if st.broken or not errors.clean():
            broken.add(id(st))
    patterns = collect_patterns(statements)
    expander = Expander(patterns, sink)
    rules = RuleChecker(registry, sink, kinds)
    compiled: list[Compiled] = []
    for st in statements:
        if st.kind in ("import", "class"):
            continue
        errors.start()
        result = _guarded(sink, st, lambda st=st: _compile(st, expander, rules))
        if result is None:
            continue
        compiled.append(Compiled(st, result, errors.clean() and id(st) not in broken))
    _check_names(statements, registry, sink)
    _check_shadowing(compiled, classes, sink)
    check_growth([c.rule for c in compiled if c.ok and isinstance(c.rule, Rewrite)], sink)
    ok = [c for c in compiled if c.ok]
    fusions = [c.rule for c in ok if isinstance(c.rule, FusionRule)]
    fusions = sorted(fusions, key=lambda r: -r.priority)  # stable: load order within a priority
    ruleset = RuleSet(
        classes=FrozenMap(classes),
        patterns=FrozenMap({n: p for n, p in patterns.items()}),
        rewrites=tuple(c.rule for c in ok if isinstance(c.rule, Rewrite)),
        fusions=tuple(fusions),
        nofuse=tuple(c.rule for c in ok if isinstance(c.rule, NoFuse)),
        files=tuple(files),
    )
    return Program(ruleset, compiled)


def _guarded(sink: Sink, st: Statement, fn: Any) -> Any:
    """Run one statement's work; a bug becomes an F024 diagnostic instead of a traceback."""
    try:
        return fn()
    except RecursionError:
        sink.add("F024", f"{st.kind} {st.name} is nested too deeply to check", st.span)
    except Exception as e:  # the checker must survive its own bugs; the message names the cause
        sink.add("F024", f"internal error while checking {st.kind} {st.name}: {type(e).__name__}: {e}", st.span)
    return None


def _resolve_and_check(resolver: Resolver, terms: TermChecker, st: Statement) -> None:
    resolver.statement(st)
    _check_terms(terms, st)


def _check_terms(terms: TermChecker, st: Statement) -> None:
    node = st.node
    if st.kind == "pattern":
        body = node.body
        parts = ([body.shared_term] if isinstance(body, Branch) and body.shared_term else []) + (
            list(body.members) if isinstance(body, Branch) else list(body.body) if isinstance(body, Loop) else [body])
        for t in parts:
            terms.check(t, allow_step=True)
    elif st.kind == "rewrite":
        terms.check(node.lhs, True)
        terms.check(node.rhs, True)
    elif st.kind == "nofuse":
        terms.check(node.target, True)
    elif st.kind == "fuse":
        for t in node.terms():
            terms.check(t, True)


def _compile(st: Statement, expander: Expander, rules: RuleChecker) -> Any:
    node = st.node
    if st.kind == "pattern":
        body, guards = expander.body(node.body, (node.name,))
        inherited = g.conjoin(*guards)
        if expander.take_failed():
            return replace(node, body=body)  # its uses report the problem; nothing sound to check here
        if isinstance(body, Branch):
            terms = ([body.shared_term] if body.shared_term else []) + list(body.members)
            extra = [body.shared]
        elif isinstance(body, Loop):
            terms, extra = list(body.body), list(body.carried)
        else:
            terms, extra = [body], []
        rules.pattern(node, terms, inherited, extra)
        return replace(node, body=body, guard=g.conjoin(node.guard, inherited))
    if st.kind == "rewrite":
        lhs, lg = expander.term(node.lhs)
        rhs, _ = expander.term(node.rhs)
        inherited = g.conjoin(*lg)
        rw = replace(node, lhs=lhs, rhs=rhs, guard=g.conjoin(node.guard, inherited))
        rules.rewrite(node, rw, st, inherited)
        rules.no_steps([lhs, rhs])
        return rw
    if st.kind == "nofuse":
        target, tg = expander.term(node.target)
        inherited = g.conjoin(*tg)
        nf = replace(node, target=target, guard=g.conjoin(node.guard, inherited))
        rules.nofuse(node, nf, inherited)
        return nf
    rule, inherited = _expand_fusion(node, expander)
    if rule is None:
        return None
    rules.fusion(node, rule, st, inherited)
    return rule


def _expand_fusion(node: FusionRule, expander: Expander) -> tuple[FusionRule | None, g.Guard | None]:
    if node.kind == "linear" and isinstance(node.pattern, PatternRef):
        pdef: PatternDef | None = expander.patterns.get(node.pattern.name)
        if pdef is not None and pdef.kind != "term":
            whole = expander.whole(node.pattern)
            if whole is None:
                return None, None
            body, inherited = whole
            guard = g.conjoin(node.guard, inherited)
            if isinstance(body, Branch):
                return _export_shared(replace(node, kind="branch", pattern=None, shared=body.shared,
                                              shared_term=body.shared_term, members=body.members, guard=guard)), inherited
            return replace(node, kind="loop", pattern=None, carried=body.carried, body=body.body,
                           step_inputs=_steps(body.body), guard=guard), inherited
    if node.kind == "linear":
        pattern, gs = expander.term(node.pattern)  # type: ignore[arg-type]
        inherited = g.conjoin(*gs)
        return replace(node, pattern=pattern, guard=g.conjoin(node.guard, inherited)), inherited
    if node.kind == "branch":
        body, gs = expander.body(Branch(node.shared or "", node.shared_term, node.members))
        inherited = g.conjoin(*gs)
        return _export_shared(replace(node, shared_term=body.shared_term, members=body.members,
                                      guard=g.conjoin(node.guard, inherited))), inherited
    if node.kind == "loop":
        body, gs = expander.body(Loop(node.carried, node.body))
        inherited = g.conjoin(*gs)
        return replace(node, body=body.body, step_inputs=_steps(body.body),
                       guard=g.conjoin(node.guard, inherited)), inherited
    return node, None


def _export_shared(rule: FusionRule) -> FusionRule:
    """A member that is the bare shared name means: the shared tensor is also an output."""
    shared = Var(rule.shared or "")
    if shared not in rule.members:
        return rule
    return replace(rule, members=tuple(m for m in rule.members if m != shared), shared_output=True)


def _steps(terms: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.name for t in terms for s in walk(t) if isinstance(s, Var) and s.step))


def _check_names(statements: list[Statement], registry: OpRegistry, sink: Sink) -> None:
    seen: dict[str, Statement] = {}
    for st in statements:
        if st.kind == "import":
            continue
        if st.kind in ("class", "pattern") and (st.name in registry or st.name in BUILTIN_CLASSES):
            what = "an op" if st.name in registry else "a built-in class"
            sink.add("F008", f"{st.kind} {st.name} takes the name of {what}", st.name_span)
            continue
        first = seen.get(st.name)
        if first is not None:
            sink.add("F008", f"{st.name} is already defined ({first.kind} at {first.name_span})", st.name_span)
        else:
            seen[st.name] = st


def _check_shadowing(compiled: list[Compiled], classes: dict[str, Any], sink: Sink) -> None:
    def ops_of(name: str) -> frozenset[str]:
        cls = classes.get(name)
        return cls.ops if cls is not None else frozenset({name})

    earlier: list[Compiled] = []
    for c in compiled:
        if not c.ok or isinstance(c.rule, PatternDef):
            continue
        for e in earlier:
            if _shadows(e.rule, c.rule, ops_of):
                sink.add("F009", f"{c.statement.kind} {c.rule.name} never applies: {e.statement.kind} "
                         f"{e.rule.name} at {e.statement.name_span} already covers it", c.statement.name_span)
                break
        earlier.append(c)


def _shadows(a: Any, b: Any, ops_of: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, Rewrite):
        same = canonical((a.lhs, a.rhs), a.guard) == canonical((b.lhs, b.rhs), b.guard)
        flipped = a.bidirectional and canonical((a.rhs, a.lhs), a.guard) == canonical((b.lhs, b.rhs), b.guard)
        return (same and (a.bidirectional or not b.bidirectional)) or flipped
    if isinstance(a, NoFuse):
        return covers(a.target, a.guard, b.target, b.guard, ops_of)
    if a.kind != b.kind or a.priority < b.priority:
        return False
    if a.kind == "linear":
        return covers(a.pattern, a.guard, b.pattern, b.guard, ops_of)
    if a.kind == "class":
        return (a.host == b.host and ops_of(b.consumer) <= ops_of(a.consumer)
                and ops_of(b.producer) <= ops_of(a.producer) and (a.guard is None or a.guard == b.guard))
    return canonical(a.terms(), a.guard) == canonical(b.terms(), b.guard)
