"""Parse trees to statements: the rule IR before names are resolved.

Bare names stay :class:`NameRef` until :mod:`autofusion.dsl.resolve` knows every op, class and
pattern; calls are :class:`~autofusion.dsl.ir.OpTerm` even when they name a pattern. Arrow chains
are desugared here: in ``A -> B(y) -> C`` each step's first input is the previous step, and a
step written as a bare name takes any further inputs (``open``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lark import Token, Tree

from autofusion.dsl import guards as g
from autofusion.dsl.diagnostics import Sink
from autofusion.dsl.ir import (
    AttrMatch,
    Branch,
    ClassDef,
    FusionRule,
    Literal,
    Loop,
    NoFuse,
    OpTerm,
    PatternDef,
    Rewrite,
    Var,
)
from autofusion.dsl.span import NO_SPAN, Span
from autofusion.graph.graph import FrozenMap


@dataclass(frozen=True)
class NameRef:
    """A bare name in a term: a variable, an op or class (open), or a pattern; resolved later."""

    name: str
    output: int = 0
    capture: str | None = None
    span: Span = field(default=NO_SPAN, compare=False)


@dataclass
class Statement:
    """One top-level statement with what the checks need beyond the IR node."""

    kind: str  # import | class | pattern | rewrite | fuse | nofuse
    name: str
    node: Any  # str (import path) | ClassDef | PatternDef | Rewrite | FusionRule | NoFuse
    span: Span
    name_span: Span
    file: str
    doc: str = ""
    wildcards: frozenset[str] = frozenset()
    template_span: Span | None = None
    param_spans: tuple[tuple[str, Span], ...] = ()  # each template param's name and where it is written
    member_spans: tuple[Span, ...] = ()
    broken: bool = False  # lowering already found an error in it

MAX_INT_DIGITS = 4000  # below Python's int/str conversion limit (4300 digits)


class Lowerer:
    """Lowers the statements of one file; problems go to ``sink``."""

    def __init__(self, file: str, sink: Sink) -> None:
        self.file = file
        self.sink = sink
        self._wild = 0
        self._wildcards: set[str] = set()

    # -- positions ------------------------------------------------------------------------------

    def span(self, item: Tree | Token) -> Span:
        if isinstance(item, Token):
            return Span(self.file, item.line or 1, item.column or 1, item.end_line or item.line or 1,
                        item.end_column or (item.column or 1) + len(item))
        m = item.meta
        if getattr(m, "empty", True):
            return Span.point(self.file)
        return Span(self.file, m.line, m.column, m.end_line, m.end_column)

    # -- statements -----------------------------------------------------------------------------

    def statement(self, tree: Tree, doc: str) -> Statement | None:
        self._wildcards = set()
        method = getattr(self, "_" + str(tree.data), None)
        if method is None:
            return None
        errors = sum(d.is_error for d in self.sink.items)
        st: Statement = method(tree, doc)
        st.wildcards = frozenset(self._wildcards)
        st.broken = sum(d.is_error for d in self.sink.items) > errors
        return st

    def _import_stmt(self, tree: Tree, doc: str) -> Statement:
        tok = tree.children[0]
        return Statement("import", "", _unquote(str(tok)), self.span(tree), self.span(tok), self.file, doc)

    def _class_stmt(self, tree: Tree, doc: str) -> Statement:
        name, *members = [c for c in tree.children if isinstance(c, Token)]
        node = ClassDef(str(name), frozenset(), tuple(str(m) for m in members), doc=doc, span=self.span(tree))
        return Statement("class", str(name), node, self.span(tree), self.span(name), self.file, doc,
                         member_spans=tuple(self.span(m) for m in members))

    def _pattern_stmt(self, tree: Tree, doc: str) -> Statement:
        name, params, body, guard = tree.children
        plist = None
        if params is not None:
            plist = tuple(str(p) for p in params.children if isinstance(p, Token))
        node = PatternDef(str(name), plist, self.body(body), self.guard(guard), doc, self.span(tree))
        return Statement("pattern", str(name), node, self.span(tree), self.span(name), self.file, doc)

    def _rewrite_stmt(self, tree: Tree, doc: str) -> Statement:
        name, lhs, arrow, rhs, guard, priority = tree.children
        node = Rewrite(str(name), self.chain(lhs), self.chain(rhs), str(arrow) == "<=>", self.guard(guard), doc,
                       self.priority(priority), self.span(tree))
        return Statement("rewrite", str(name), node, self.span(tree), self.span(name), self.file, doc)

    def _nofuse_stmt(self, tree: Tree, doc: str) -> Statement:
        name, target, guard = tree.children
        node = NoFuse(str(name), self.chain(target), self.guard(guard), doc, self.span(tree))
        return Statement("nofuse", str(name), node, self.span(tree), self.span(name), self.file, doc)

    def _fuse_stmt(self, tree: Tree, doc: str) -> Statement:
        name, body, template, guard, priority = tree.children
        tname, tspan = "", None
        params: FrozenMap[str, Any] = FrozenMap()
        pspans: tuple[tuple[str, Span], ...] = ()
        if template is not None:
            tok, tparams = template.children[1], template.children[2]
            tname, tspan = _unquote(str(tok)), self.span(tok)
            if tparams is not None:
                written = [p for p in tparams.children if isinstance(p, Tree)]
                params = FrozenMap((str(p.children[0]), self.const_value(p.children[1])) for p in written)
                pspans = tuple((str(p.children[0]), self.span(p)) for p in written)
        common: dict[str, Any] = dict(template=tname, params=params, priority=self.priority(priority),
                                      guard=self.guard(guard), doc=doc, span=self.span(tree))
        lowered = self.body(body)
        if isinstance(body, Tree) and body.data == "class_rule":
            consumer, host, producer = body.children
            node = FusionRule(str(name), "class", consumer=str(consumer), producer=str(producer),
                              host=str(host.children[0]), **common)
        elif isinstance(lowered, Branch):
            node = FusionRule(str(name), "branch", shared=lowered.shared, shared_term=lowered.shared_term,
                              members=lowered.members, **common)
        elif isinstance(lowered, Loop):
            node = FusionRule(str(name), "loop", carried=lowered.carried, body=lowered.body,
                              step_inputs=lowered.step_inputs, **common)
        else:
            node = FusionRule(str(name), "linear", pattern=lowered, **common)
        return Statement("fuse", str(name), node, self.span(tree), self.span(name), self.file, doc,
                         template_span=tspan, param_spans=pspans)

    def priority(self, tree: Tree | None) -> int:
        if tree is None:
            return 0
        sign_int = tree.children[0]
        text = "".join(str(t) for t in sign_int.children if t is not None)
        return self.integer(text, tree)

    # -- bodies ---------------------------------------------------------------------------------

    def body(self, tree: Tree) -> Any:
        if tree.data == "branch":
            name, shared_term, *members = [c for c in tree.children]
            terms = tuple(self.chain(m) for m in members if isinstance(m, Tree))
            return Branch(str(name), self.chain(shared_term) if shared_term is not None else None, terms)
        if tree.data == "loop":
            return self.loop(tree)
        if tree.data == "class_rule":
            return None
        return self.chain(tree)

    def loop(self, tree: Tree) -> Loop:
        carried = [c for c in tree.children if isinstance(c, Token)]
        updates = [c for c in tree.children if isinstance(c, Tree) and c.data == "update"]
        names = [str(c) for c in carried]
        for i, tok in enumerate(carried):
            if str(tok) in names[:i]:
                self.sink.add("F021", f"{tok} is carried twice", self.span(tok))
        body: dict[str, Any] = {}
        for u in updates:
            target, term = u.children
            if str(target) not in names:
                self.sink.add("F021", f"update of {target}, which the loop does not carry "
                              f"(carried: {', '.join(names)})", self.span(target))
            elif str(target) in body:
                self.sink.add("F021", f"{target} is updated twice", self.span(target))
            else:
                body[str(target)] = self.chain(term)
        for tok in carried:
            if str(tok) not in body and str(tok) not in names[: names.index(str(tok))]:
                self.sink.add("F021", f"carried value {tok} has no update `{tok} = ...`", self.span(tok))
        ordered = tuple(n for n in dict.fromkeys(names) if n in body)
        return Loop(ordered, tuple(body[n] for n in ordered), ())

    # -- terms ----------------------------------------------------------------------------------

    def chain(self, tree: Tree) -> Any:
        steps = [c for c in tree.children if isinstance(c, Tree)]
        result = self.term(steps[0])
        for step in steps[1:]:
            result = self.term(step, previous=result)
        return result

    def term(self, tree: Tree, previous: Any = None) -> Any:
        atom, index, capture_tok = tree.children
        capture = str(capture_tok) if capture_tok is not None else None
        output, step_index = 0, None
        if index is not None:
            tok = index.children[0]
            if getattr(tok, "type", "") == "INT":
                output = self.integer(str(tok), tree)
            else:
                step_index = tok
        span = self.span(tree)
        if previous is not None:
            term = self.chain_step(atom, previous, span)
        else:
            term = self.atom(atom)
        if term is None:
            return Var("_error", span=span)
        if step_index is not None:
            if not isinstance(term, NameRef) or capture:
                self.sink.add("F021", "a per-step index [t] applies to a variable only", self.span(step_index))
            else:
                return Var(term.name, step=True, span=span)
        if isinstance(term, (OpTerm, NameRef)):
            return _with(term, output=output or term.output, capture=capture or term.capture, span=span)
        if capture or output:
            what = "a number" if isinstance(term, Literal) else "this term"
            self.sink.add("F001", f"only an op can be captured or indexed, not {what}", span)
        return term

    def chain_step(self, atom: Tree, previous: Any, span: Span) -> Any:
        if atom.data == "name":
            return OpTerm(str(atom.children[0]), (previous,), open=True, span=span)
        if atom.data == "call":
            op = self.atom(atom)
            return _with(op, args=(previous, *op.args))
        self.sink.add("F001", "each step of an arrow chain must be an op, class or pattern name", span)
        return None

    def atom(self, tree: Tree) -> Any:
        data = tree.data
        if data == "name":
            name = str(tree.children[0])
            if name == "_":
                return self.wildcard(self.span(tree))
            return NameRef(name, span=self.span(tree))
        if data == "literal":
            return Literal(self.literal_value(tree.children[0]), self.span(tree))
        if data == "chain":
            return self.chain(tree)
        if data == "call":
            name_tok, *rest = tree.children
            name = str(name_tok)
            args: list[Any] = []
            attrs: list[AttrMatch] = []
            is_open = False
            for a in rest:
                if not isinstance(a, Tree):
                    continue
                if is_open and a.data not in ("kwarg", "rest"):
                    self.sink.add("F001", "'...' must come after the last input", self.span(a))
                if a.data == "kwarg":
                    key, value = a.children
                    attrs.append(AttrMatch(str(key), self.attr_value(value), self.span(a)))
                elif a.data == "rest":
                    is_open = True
                else:
                    if attrs:
                        self.sink.add("F001", "inputs come before attributes (name=value)", self.span(a))
                    args.append(self.chain(a))
            return OpTerm(str(name), tuple(args), tuple(attrs), open=is_open, span=self.span(tree))
        return self.chain(tree)

    def wildcard(self, span: Span) -> Var:
        self._wild += 1
        name = f"_w{self._wild}"
        self._wildcards.add(name)
        return Var(name, span=span)

    def literal_value(self, tree: Tree) -> Any:
        if tree.data == "list_value":
            items = [self.const_value(c) for c in tree.children if c is not None]
            if any(isinstance(v, str) for v in items):
                self.sink.add("F001", "a list in a term holds numbers only", self.span(tree))
                return tuple(v for v in items if not isinstance(v, str))
            return tuple(items)
        return self.number(tree)

    def number(self, tree: Tree) -> int | float:
        text = "".join(str(t) for t in tree.children if t is not None)
        return self.integer(text, tree) if getattr(tree.children[-1], "type", "") == "INT" else float(text)

    def integer(self, text: str, tree: Tree) -> int:
        """An integer literal; one too long for Python to convert is a syntax error, not a crash."""
        if len(text.lstrip("+-")) > MAX_INT_DIGITS:
            self.sink.add("F001", f"integer literal of {len(text)} digits is too long (at most {MAX_INT_DIGITS})",
                          self.span(tree))
            return 0
        return int(text)

    def const_value(self, tree: Tree | Token) -> Any:
        if isinstance(tree, Token):
            return _unquote(str(tree)) if tree.type == "STRING" else str(tree)
        if tree.data == "signed_number":
            return self.number(tree)
        if tree.data == "string":
            return _unquote(str(tree.children[0]))
        if tree.data == "list_value":
            return tuple(self.const_value(c) for c in tree.children if c is not None)
        if tree.data in ("true", "false"):
            return int(tree.data == "true")
        return str(tree)

    def attr_value(self, tree: Tree) -> Any:
        if isinstance(tree, Tree) and tree.data == "attr_name":
            name = str(tree.children[0])
            if name == "_":
                return self.wildcard(self.span(tree))
            return Var(name, span=self.span(tree))
        return self.const_value(tree)

    # -- guards ---------------------------------------------------------------------------------

    def guard(self, tree: Tree | None) -> g.Guard | None:
        if tree is None:
            return None
        return self.expr(tree.children[0])

    def expr(self, tree: Tree | Token) -> g.Guard:
        span = self.span(tree)
        if isinstance(tree, Token):  # a lone NAME/INT never reaches here; grammar aliases them
            return g.Name(str(tree), span)
        d, ch = tree.data, tree.children
        if d in ("or_", "and_"):
            op = d[:-1]
            parts: list[g.Guard] = []
            for c in ch:
                e = self.expr(c)
                parts.extend(e.args if isinstance(e, g.BoolOp) and e.op == op else (e,))
            return g.BoolOp(op, tuple(parts), span)
        if d == "not_":
            return g.BoolOp("not", (self.expr(ch[0]),), span)
        if d == "compare":
            return g.Compare(str(ch[1]), self.expr(ch[0]), self.expr(ch[2]), span)
        if d == "contains":
            return g.Compare("in", self.expr(ch[0]), self.expr(ch[1]), span)
        if d in ("add", "sub", "mul", "div", "mod"):
            op = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%"}[d]
            return g.Arith(op, self.expr(ch[0]), self.expr(ch[1]), span)
        if d == "neg":
            inner = self.expr(ch[0])
            if isinstance(inner, g.IntLit):
                return g.IntLit(-inner.value, span)
            if isinstance(inner, g.FloatLit):
                return g.FloatLit(-inner.value, span)
            return g.Arith("neg", inner, None, span)
        if d == "subscript":
            return g.Index(self.expr(ch[0]), self.expr(ch[1]), span)
        if d == "number":
            text = str(ch[0])
            if getattr(ch[0], "type", "") == "INT":
                return g.IntLit(self.integer(text, tree), span)
            return g.FloatLit(float(text), span)
        if d == "string":
            return g.StrLit(_unquote(str(ch[0])), span)
        if d in ("true", "false"):
            return g.BoolLit(d == "true", span)
        if d == "gname":
            return g.Name(str(ch[0]), span)
        if d == "gcall":
            return g.Call(str(ch[0]), tuple(self.expr(c) for c in ch[1:] if c is not None), span)
        if d == "glist":
            return g.ListLit(tuple(self.expr(c) for c in ch if c is not None), span)
        if len(ch) == 1:
            return self.expr(ch[0])
        self.sink.add("F024", f"unhandled guard node {d}", span)
        return g.BoolLit(True, span)


def _with(term: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(term, **changes)


def _unquote(text: str) -> str:
    body = text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text
    return body.replace('\\"', '"').replace("\\\\", "\\")
