"""Equality saturation of the algebraic rewrites, and extraction of the rewritten graph.

Each iteration egglog records every structural match of every rewrite's left side; Python checks
literals, attributes and guards on the recorded matches, builds the right side with inferred types
and unions it with the matched root. Saturation stops at a fixpoint or at the first bound hit
(iterations, e-graph size, seconds), checked between iterations. Extraction then picks one
e-node per e-class (fewest kernels, constant subterms free, cycles skipped) and rebuilds an IR graph.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autofusion.dsl.ir import Literal, OpTerm, PatternRef, Rewrite, RuleSet, Term, Var
from autofusion.engine.egraph import EggSession, Serialized, prepared_session
from autofusion.engine.encode import DECLARATIONS, Encoder, Workdir, multi_output, parse_attrs, quote
from autofusion.engine.match import CompiledPattern, EClassFacts, Match, PatternCompiler, Untranslatable, read_matches
from autofusion.graph.graph import Const, Graph, Node, freeze_attrs
from autofusion.graph.types import DType, TensorType
from autofusion.ir.builder import graph_from_nodes
from autofusion.ir.infer import infer_node
from autofusion.ir.passes import fold_constants
from autofusion.ops.registry import OpRegistry, ShapeError


@dataclass(frozen=True)
class Limits:
    """Bounds on saturation, checked between iterations. ``enodes`` bounds the e-graph's rows
    (terms and facts); by default it is ``ENODES_FLOOR`` or ``ENODES_GROWTH`` times the loaded
    graph's rows, whichever is larger, so a 20,000-op graph (250,000 rows) may still be rewritten."""

    iterations: int = 12
    enodes: int | None = None
    seconds: float = 20.0

    def enode_bound(self, loaded: int) -> int:
        return self.enodes if self.enodes is not None else max(ENODES_FLOOR, ENODES_GROWTH * loaded)


ENODES_FLOOR = 200_000
ENODES_GROWTH = 4


@dataclass
class SaturationReport:
    iterations: int = 0
    stop: str = "saturated"  # saturated | iterations | enodes | seconds
    fired: dict[str, int] = field(default_factory=dict)  # rule -> rewrites applied
    rejected: dict[str, int] = field(default_factory=dict)  # rule -> matches failing a guard
    undecided: dict[str, int] = field(default_factory=dict)  # rule -> of those, guards depending on run-time sizes
    skipped: dict[str, str] = field(default_factory=dict)  # rule -> why it could not be translated
    enodes: int = 0
    seconds: float = 0.0


@dataclass
class RewriteResult:
    graph: Graph
    report: SaturationReport
    provenance: dict[str, tuple[str, ...]]  # node name -> rewrites that produced it
    extract_seconds: float = 0.0


@dataclass
class _Handle:
    type: TensorType | None
    value: np.ndarray | None = None
    const: bool = False
    tensor: str | None = None  # the original tensor it names
    rule: str | None = None  # the rewrite that created it


class Saturator:
    def __init__(self, graph: Graph, rules: RuleSet, registry: OpRegistry, limits: Limits) -> None:
        self.graph = graph
        self.rules = rules
        self.registry = registry
        self.limits = limits
        self.session: EggSession  # lent by prepared_session while the saturation runs
        self.encoder = Encoder(registry)
        self.handles: dict[int, _Handle] = {}
        self.workdir = Workdir()
        self.report = SaturationReport()
        self.patterns: list[tuple[Rewrite, Term, Term, CompiledPattern]] = []
        self._applied: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()

    # -- setup ----------------------------------------------------------------------------------

    def prelude(self) -> str:
        """Declarations, op classes and one recording rule per rewrite direction: the same text for
        the same rules, so ``prepared_session`` compiles it once per process."""
        compiler = PatternCompiler(self.rules, self.registry)
        program = [DECLARATIONS, class_facts(self.rules), "(ruleset rewrites)"]
        for i, rw in enumerate(self.rules.rewrites):
            directions = [(rw.lhs, rw.rhs)] + ([(rw.rhs, rw.lhs)] if rw.bidirectional else [])
            for k, (lhs, rhs) in enumerate(directions):
                try:
                    if isinstance(lhs, (Var, Literal)):
                        raise Untranslatable("a left side that is a bare variable or literal matches everything")
                    cp = compiler.compile(lhs, f"rw{i}_{k}", "rewrites", f"{rw.name}#{k}")
                except Untranslatable as e:
                    self.report.skipped[rw.name] = str(e)
                    continue
                program.append(cp.program)
                self.patterns.append((rw, lhs, rhs, cp))
        return "\n".join(program)

    def load(self) -> None:
        """The graph's terms into ``self.session`` (which has run ``prelude()``)."""
        enc = self.encoder
        enc.graph(self.graph)
        for tensor, h in enc.handle_of.items():
            if not tensor:
                self.handles[h] = _Handle(None)
                continue
            value = self.graph.const_value(tensor)
            self.handles[h] = _Handle(self.graph.types[tensor], value, value is not None, tensor)
        for node in self.graph.nodes:  # a node is constant when all its inputs are
            if node.inputs and all(i and self.handles[enc.handle_of[i]].const for i in node.inputs):
                for o in node.outputs:
                    if o:
                        self.handles[enc.handle_of[o]].const = True
        self.session.run(enc.program(self.workdir.path))

    # -- saturation -----------------------------------------------------------------------------

    def saturate(self) -> None:
        start = time.perf_counter()
        limits = self.limits
        bound = limits.enode_bound(self.session.size())
        while True:
            if self.report.iterations >= limits.iterations:
                self.report.stop = "iterations"
                break
            if time.perf_counter() - start > limits.seconds:
                self.report.stop = "seconds"
                break
            self.session.run_rules("rewrites")
            snapshot = self.session.serialize()
            facts = self.facts(snapshot)
            applied = 0
            for rw, _lhs, rhs, cp in self.patterns:
                matches, rejected = read_matches(cp, snapshot, facts, self.registry, rw.guard, rw.name)
                if rejected.count:
                    self.report.rejected[rw.name] = self.report.rejected.get(rw.name, 0) + rejected.count
                if rejected.undecided:
                    self.report.undecided[rw.name] = self.report.undecided.get(rw.name, 0) + len(rejected.undecided)
                for m in matches:
                    key = (rw.name + cp.relation, m.root, tuple(sorted(m.vars.items())))
                    if key in self._applied:
                        continue
                    self._applied.add(key)
                    if isinstance(rhs, Var) and (m.vars.get(rhs.name) == m.root or facts.types.get(
                            m.vars.get(rhs.name, "")) != facts.types.get(m.root)):
                        continue  # already equal, or not the same type (e.g. x + 0 that broadcasts x)
                    made = self._instantiate(rw, rhs, m, facts)
                    if made is None:
                        continue
                    self.encoder.add_union(facts.handles[m.root][0], made)
                    applied += 1
                    self.report.fired[rw.name] = self.report.fired.get(rw.name, 0) + 1
            self.report.iterations += 1
            if not applied:
                self.report.stop = "saturated"
                break
            self.session.run(self.encoder.program(self.workdir.path))
            self.report.enodes = self.session.size()
            if self.report.enodes > bound:
                self.report.stop = "enodes"
                break
        self.report.enodes = self.session.size()
        self.report.seconds = time.perf_counter() - start

    def facts(self, snapshot: Serialized) -> EClassFacts:
        handles = handles_of(snapshot)
        types: dict[str, TensorType] = {}
        values: dict[str, np.ndarray] = {}
        consts: set[str] = set()
        for eclass, hs in handles.items():
            for h in hs:
                info = self.handles.get(h)
                if info is None:
                    continue
                if info.type is not None and eclass not in types:
                    types[eclass] = info.type
                if info.value is not None and eclass not in values:
                    values[eclass] = info.value
                if info.const:
                    consts.add(eclass)
        return EClassFacts(handles, types, values, consts)

    # -- right sides ----------------------------------------------------------------------------

    def _instantiate(self, rw: Rewrite, rhs: Term, m: Match, facts: EClassFacts) -> int | None:
        """Commands creating the right side for match ``m``; its handle, or None if it does not
        type-check (the match is then skipped, like a failing guard)."""
        root_type = facts.types.get(m.root)
        try:
            h = self._build(rw, rhs, m, facts, root_type)
        except (ShapeError, KeyError, ValueError, TypeError) as e:
            self.report.rejected[rw.name] = self.report.rejected.get(rw.name, 0) + 1
            self.report.skipped.setdefault(f"{rw.name} (instance)", f"right side does not type-check: {e}")
            return None
        if root_type is not None and self.handles[h].type not in (None, root_type):
            self.report.rejected[rw.name] = self.report.rejected.get(rw.name, 0) + 1
            return None
        return h

    def _build(self, rw: Rewrite, term: Term, m: Match, facts: EClassFacts, like: TensorType | None) -> int:
        enc = self.encoder
        if isinstance(term, Var):
            if term.name in m.vars:
                return facts.handles[m.vars[term.name]][0]
            if term.name in m.values:  # an attribute variable used as a tensor: a scalar constant
                return self._scalar(float(m.values[term.name]), like, rw.name)
            raise KeyError(f"variable {term.name!r} is not bound by the left side")
        if isinstance(term, Literal):
            if isinstance(term.value, tuple):
                arr = np.array(term.value, dtype=np.int64)
                h = enc.add_vec(arr)
                self.handles[h] = _Handle(TensorType.of(arr), arr, True, rule=rw.name)
                return h
            return self._scalar(float(term.value), like, rw.name)
        if isinstance(term, PatternRef):
            raise ValueError(f"pattern {term.name!r} was not expanded")
        assert isinstance(term, OpTerm)
        if term.op not in self.registry:
            raise ValueError(f"right side uses {term.op!r}, which is not a concrete op")
        args = [self._build(rw, a, m, facts, like) for a in term.args]
        attrs: dict[str, Any] = {}
        for a in term.attrs:
            if isinstance(a.value, Var):
                if a.value.name in m.values:
                    attrs[a.name] = m.values[a.value.name]
                elif a.value.name in m.vars:  # a scalar constant tensor of the left side
                    v = facts.values.get(m.vars[a.value.name])
                    if v is None or v.size != 1:
                        raise ValueError(f"{a.value.name!r} is not a scalar constant")
                    attrs[a.name] = float(v.reshape(-1)[0])
                else:
                    raise KeyError(a.value.name)
            else:
                attrs[a.name] = a.value
        keys = [str(h) for h in args]
        node = Node(term.op, tuple(keys), ("out",), freeze_attrs(attrs), "rhs")
        types = {str(h): ty for h in args if (ty := self.handles[h].type) is not None}
        consts = {str(h): Const(val) for h in args if (val := self.handles[h].value) is not None}
        outs = infer_node(node, types, consts, self.registry)
        const = bool(args) and all(self.handles[a].const for a in args)
        op_h = enc.add_op(term.op, node.attrs, args)
        if term.output > 0 or multi_output(self.registry, term.op):
            self.handles[op_h] = _Handle(None, rule=rw.name)
            h = enc.add_proj(op_h, term.output)
            self.handles[h] = _Handle(outs[term.output], const=const, rule=rw.name)
            return h
        self.handles[op_h] = _Handle(outs[0], const=const, rule=rw.name)
        return op_h

    def _scalar(self, value: float, like: TensorType | None, rule: str) -> int:
        dtype = like.dtype if like is not None else DType.FLOAT32
        arr = np.array(value, dtype=dtype.numpy)
        h = self.encoder.add_num(float(arr), str(arr.dtype))
        self.handles[h] = _Handle(TensorType.of(arr), arr, True, rule=rule)
        return h


def handles_of(snapshot: Serialized) -> dict[str, list[int]]:
    """E-class -> the integer handles (Ref terms) it holds."""
    out: dict[str, list[int]] = {}
    for node in snapshot.nodes.values():
        if node["op"] == "Ref":
            out.setdefault(str(node["eclass"]), []).append(int(snapshot.primitive(node["children"][0])))
    return out


def class_facts(rules: RuleSet) -> str:
    """Commands stating op-class membership (the ``in-class`` relation)."""
    return "\n".join(f"(in-class {quote(op)} {quote(cls)})" for cls, c in sorted(rules.classes.items()) for op in sorted(c.ops))


def saturate_rewrites(graph: Graph, rules: RuleSet, registry: OpRegistry, limits: Limits | None = None) -> RewriteResult:
    """Apply ``rules.rewrites`` to ``graph`` by equality saturation and extract the best graph."""
    sat = Saturator(graph, rules, registry, limits or Limits())
    if not rules.rewrites:
        sat.report.stop = "no rewrites"
        return RewriteResult(graph, sat.report, {}, 0.0)
    try:
        with prepared_session(sat.prelude()) as session:
            sat.session = session
            sat.load()
            if sat.patterns:
                sat.saturate()
            else:
                sat.report.stop = "no rewrites"
            t0 = time.perf_counter()
            if not sat.report.fired:
                return RewriteResult(graph, sat.report, {}, time.perf_counter() - t0)
            snapshot = session.serialize()
        new_graph, provenance = Extractor(sat, snapshot).graph()
    finally:
        sat.workdir.close()
    return RewriteResult(new_graph, sat.report, provenance, time.perf_counter() - t0)


class Extractor:
    """Chooses one e-node per e-class and rebuilds an IR graph from the choices."""

    EXPR_OPS = ("Op", "Proj", "In", "Cst", "Num", "Vec")

    def __init__(self, sat: Saturator, snapshot: Serialized) -> None:
        self.sat = sat
        self.s = snapshot
        self.facts = sat.facts(snapshot)
        self.best: dict[str, tuple[float, str]] = {}
        self.projections: dict[str, dict[int, str]] = {}  # op e-class -> output index -> e-class
        for nid in snapshot.by_op.get("Proj", ()):
            kids = snapshot.children(nid)
            op_cls = snapshot.eclass(kids[0])
            self.projections.setdefault(op_cls, {})[int(snapshot.primitive(kids[1]))] = snapshot.eclass(nid)
        # an Args e-class holds one Cons (or Nil) besides many ArgsFrom aliases: index it once
        self._cons = {snapshot.eclass(n): n for n in snapshot.by_op.get("Cons", ())}
        self._args: dict[str, list[str]] = {}
        self.const_classes = self._const_classes()

    def _arg_classes(self, nid: str) -> list[str]:
        out = self._args.get(nid)
        if out is None:
            out = []
            args = self.s.eclass(self.s.children(nid)[2])
            while args in self._cons and len(out) < 4096:
                head, tail = self.s.children(self._cons[args])
                out.append(self.s.eclass(head))
                args = self.s.eclass(tail)
            self._args[nid] = out
        return out

    def _const_classes(self) -> set[str]:
        consts = set(self.facts.consts)
        users: dict[str, list[str]] = {}
        ops = self.s.by_op.get("Op", ())
        for nid in ops:
            for c in self._arg_classes(nid):
                users.setdefault(c, []).append(nid)
        work = list(consts)
        while work:  # an Op whose inputs are all constant is constant (folded before it runs)
            cls = work.pop()
            for nid in users.get(cls, ()):
                owner = self.s.eclass(nid)
                if owner not in consts and all(c in consts for c in self._arg_classes(nid)):
                    consts.add(owner)
                    work.append(owner)
        return consts

    def _node_cost(self, nid: str, cls: str) -> float | None:
        op = self.s.op(nid)
        if op in ("In", "Cst"):
            return 0.0
        if op in ("Num", "Vec"):
            return 1e-6  # prefer the original named constant when both exist
        if op == "Proj":
            return self._class_cost(self.s.eclass(self.s.children(nid)[0]))
        own = 0.0 if cls in self.const_classes else (0.05 if self._is_view(nid) else 1.0)
        total = own
        for c in self._arg_classes(nid):
            cc = self._class_cost(c)
            if cc is None:
                return None
            total += cc
        return total

    def _is_view(self, nid: str) -> bool:
        opdef = self.sat.registry.get(str(self.s.primitive(self.s.children(nid)[0])))
        return bool(opdef and opdef.view)

    def _class_cost(self, cls: str) -> float | None:
        b = self.best.get(cls)
        return None if b is None else b[0]

    def _solve(self) -> None:
        """Cheapest e-node per e-class by a worklist: a class is revisited only when a child
        got cheaper, so long chains cost one pass and cycles never resolve to themselves."""
        s = self.s
        parents: dict[str, list[str]] = {}
        work: list[str] = []
        for op in self.EXPR_OPS:
            for nid in s.by_op.get(op, ()):
                if op == "Op":
                    children = self._arg_classes(nid)
                elif op == "Proj":
                    children = [s.eclass(s.children(nid)[0])]
                else:
                    children = []
                for c in children:
                    parents.setdefault(c, []).append(nid)
                if not children:
                    work.append(nid)
        budget = 50 * max(1, len(s.nodes))
        while work and budget > 0:
            budget -= 1
            nid = work.pop()
            cls = s.eclass(nid)
            cost = self._node_cost(nid, cls)
            if cost is None:
                continue
            old = self.best.get(cls)
            if old is None or cost < old[0] - 1e-9:
                self.best[cls] = (cost, nid)
                work.extend(parents.get(cls, ()))

    def graph(self) -> tuple[Graph, dict[str, tuple[str, ...]]]:
        self._solve()
        g = self.sat.graph
        handle_of = self.sat.encoder.handle_of
        class_of_handle = {h: cls for cls, hs in self.facts.handles.items() for h in hs}
        names: dict[str, str] = {}  # e-class -> tensor name
        for tensor in [*g.outputs, *g.inputs, *g.constants, *(o for n in g.nodes for o in n.outputs)]:
            if tensor and tensor in handle_of:
                names.setdefault(class_of_handle[handle_of[tensor]], tensor)
        rules_of_class: dict[str, list[str]] = {}
        for cls, hs in self.facts.handles.items():
            for h in hs:
                r = self.sat.handles.get(h)
                if r is not None and r.rule:
                    rules_of_class.setdefault(cls, []).append(r.rule)
        builder = _Rebuild(self, names, rules_of_class)
        roots = [class_of_handle[handle_of[out]] for out in g.outputs]
        for cls in self._post_order(roots):  # children first, so building never recurses deeply
            builder.tensor(cls)
        for out, cls in zip(g.outputs, roots):  # outputs merged into one e-class keep their own names
            builder.alias(out, builder.tensor(cls))
        return builder.finish()

    def _children(self, cls: str) -> list[str]:
        best = self.best.get(cls)
        if best is None:
            return []
        nid = best[1]
        op = self.s.op(nid)
        if op == "Op":
            return self._arg_classes(nid)
        if op == "Proj":
            return [self.s.eclass(self.s.children(nid)[0])]
        return []

    def _post_order(self, roots: list[str]) -> list[str]:
        order: list[str] = []
        seen: set[str] = set()
        stack: list[tuple[str, bool]] = [(r, False) for r in reversed(roots)]
        while stack:
            cls, expanded = stack.pop()
            if expanded:
                order.append(cls)
                continue
            if cls in seen:
                continue
            seen.add(cls)
            stack.append((cls, True))
            stack.extend((c, False) for c in reversed(self._children(cls)) if c not in seen)
        return order


class _Rebuild:
    def __init__(self, ex: Extractor, names: dict[str, str], rules_of_class: Mapping[str, list[str]]) -> None:
        self.ex = ex
        self.s = ex.s
        self.names = names
        self.rules_of_class = rules_of_class
        self.nodes: list[Node] = []
        self.consts: dict[str, np.ndarray] = {}
        self.inputs: list[str] = []
        self.done: dict[str, str] = {}
        self.op_done: dict[str, list[str]] = {}
        self.provenance: dict[str, tuple[str, ...]] = {}
        self.used_names = set(names.values()) | {n.name for n in ex.sat.graph.nodes}
        self._n = 0

    def _fresh(self, base: str) -> str:
        while True:
            self._n += 1
            name = f"{base}_{self._n}"
            if name not in self.used_names:
                self.used_names.add(name)
                return name

    def tensor(self, cls: str) -> str:
        if cls in self.done:
            return self.done[cls]
        best = self.ex.best.get(cls)
        if best is None:
            raise RuntimeError(f"extraction found no acyclic term for e-class {cls}")
        nid = best[1]
        op = self.s.op(nid)
        name = self.names.get(cls)
        g = self.ex.sat.graph
        if op == "In":
            name = self.ex.sat.encoder.leaf_name[int(self.s.primitive(self.s.children(nid)[0]))]
            if name and name not in self.inputs:
                self.inputs.append(name)
        elif op == "Cst":
            name = self.ex.sat.encoder.leaf_name[int(self.s.primitive(self.s.children(nid)[0]))]
            self.consts[name] = g.constants[name].array
        elif op in ("Num", "Vec"):
            value = self.ex.facts.values.get(cls)
            if value is None:
                kids = self.s.children(nid)
                if op == "Num":
                    shape = json.loads(str(self.s.primitive(kids[2])))
                    value = np.full(shape, self.s.primitive(kids[0]), dtype=np.dtype(str(self.s.primitive(kids[1]))))
                else:
                    value = np.array(json.loads(str(self.s.primitive(kids[0]))), dtype=np.int64)
            name = name if name and name not in g.producers else self._fresh("const")
            self.consts[name] = value
        elif op == "Proj":
            op_cls = self.s.eclass(self.s.children(nid)[0])
            index = int(self.s.primitive(self.s.children(nid)[1]))
            op_node = self.ex.best[op_cls][1] if op_cls in self.ex.best else self._any_op(op_cls)
            name = self._op(op_cls, op_node)[index]
        else:
            name = self._op(cls, nid, single=name)[0]
        self.done[cls] = name
        return name

    def alias(self, output: str, tensor: str) -> None:
        """Define graph output ``output`` as a copy of ``tensor`` when extraction named it otherwise."""
        if output != tensor and output not in {o for n in self.nodes for o in n.outputs}:
            self.nodes.append(Node("Identity", (tensor,), (output,), freeze_attrs({}), self._fresh("alias")))

    def _any_op(self, cls: str) -> str:
        return next(n for n in self.s.classes[cls] if self.s.op(n) == "Op")

    def _op(self, cls: str, nid: str, single: str | None = None) -> list[str]:
        if cls in self.op_done:
            return self.op_done[cls]
        kids = self.s.children(nid)
        op = str(self.s.primitive(kids[0]))
        attrs = parse_attrs(str(self.s.primitive(kids[1])))
        if multi_output(self.ex.sat.registry, op):
            projs = self.ex.projections.get(cls, {})
            outs = [""] * (max(projs) + 1 if projs else 1)
            for k, proj_cls in projs.items():
                outs[k] = self.names.get(proj_cls) or self._fresh(f"{op.lower()}_out{k}")
                self.done[proj_cls] = outs[k]
        else:
            outs = [single or self._fresh(op.lower())]
        self.op_done[cls] = outs
        inputs = [self.tensor(c) for c in self.ex._arg_classes(nid)]
        rules = tuple(dict.fromkeys(self.rules_of_class.get(cls, [])))
        original = self.ex.sat.graph.producers.get(next((o for o in outs if o), ""))
        if original is not None and original.op == op and original.attrs == attrs:
            node_name = original.name
        else:
            node_name = self._fresh(f"{rules[0] if rules else 'rw'}_{op.lower()}")
            if rules:
                self.provenance[node_name] = rules
        self.nodes.append(Node(op, tuple(inputs), tuple(outs), attrs, node_name))
        return outs

    def finish(self) -> tuple[Graph, dict[str, tuple[str, ...]]]:
        g = self.ex.sat.graph
        inputs = {n: g.types[n] for n in g.inputs}  # keep every declared input, used or not
        graph = graph_from_nodes(g.name, inputs, self.consts, self.nodes, list(g.outputs), self.ex.sat.registry,
                                 g.bounds)
        return fold_constants(graph, self.ex.sat.registry), self.provenance
