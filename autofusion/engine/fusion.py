"""Fusion rules matched on a graph in the e-graph: which merges the rules allow, as a FusionSpace.

Linear patterns allow every edge inside a match; class rules allow each producer->consumer edge
between their classes; branch rules allow the members that consume one shared tensor to share a
kernel (siblings); no-fuse rules pin nodes to kernels of their own; loop rules are found as chains
of matching cells along the carried values. Guards are checked on every recorded match.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from autofusion.dsl.guards import Guard, verdict
from autofusion.dsl.ir import FusionKind, FusionRule, NoFuse, OpTerm, RuleSet, Term, Var
from autofusion.engine.egraph import prepared_session
from autofusion.engine.encode import DECLARATIONS, Encoder, Workdir
from autofusion.engine.loops import chain_cells
from autofusion.engine.match import (
    CompiledPattern,
    EClassFacts,
    Match,
    PatternCompiler,
    Untranslatable,
    merged_env,
    read_matches,
)
from autofusion.engine.rewrite import class_facts, handles_of
from autofusion.engine.space import Blocked, FusionSpace, LoopCandidate, Permission, RuleRef, UnfusedReason
from autofusion.graph.graph import FrozenMap, Graph
from autofusion.ops.registry import OpRegistry

# a fusion rule ready to read back: the rule, its kind, its compiled patterns and its guard
_Compiled = tuple[FusionRule, FusionKind, list[CompiledPattern], Guard | None]

MAX_CLASS_ARITY = 4  # input positions a class rule looks at (every op of the built-in models fits)


@dataclass
class MatchReport:
    fired: dict[str, int] = field(default_factory=dict)  # rule -> matches kept
    rejected: dict[str, int] = field(default_factory=dict)  # rule -> matches failing guards
    undecided: dict[str, int] = field(default_factory=dict)  # rule -> of those, guards depending on run-time sizes
    skipped: dict[str, str] = field(default_factory=dict)  # rule -> why it was not translated
    seconds: float = 0.0


def rule_ref(rule: FusionRule) -> RuleRef:
    return RuleRef(rule.name, rule.span.file, rule.span.line)


def _class_terms(rule: FusionRule) -> list[OpTerm]:
    """A class rule as one pattern per input position of the consumer."""
    mover, host_class = rule.consumer or "", rule.producer or ""
    producer, consumer = (host_class, mover) if rule.host == "producer" else (mover, host_class)
    out = []
    for k in range(MAX_CLASS_ARITY):
        args: tuple[Term, ...] = tuple(Var(f"_a{i}") for i in range(k))
        args += (OpTerm(producer, open=True, capture="producer"),)
        out.append(OpTerm(consumer, args=args, open=True, capture="consumer"))
    return out


class FusionMatcher:
    def __init__(self, graph: Graph, rules: RuleSet, registry: OpRegistry) -> None:
        self.graph = graph
        self.rules = rules
        self.registry = registry
        self.report = MatchReport()
        self.encoder = Encoder(registry)
        self.tensor_of: dict[str, str] = {}  # e-class -> tensor
        self._index = {n.name: i for i, n in enumerate(graph.nodes)}

    def run(self) -> FusionSpace:
        start = time.perf_counter()
        compiled, nofuse_patterns, program = self._compile()
        snapshot = self._saturate(program)
        facts = self._facts(snapshot)
        edges, siblings, blocked, loops = self._permissions(compiled, snapshot, facts)
        nofuse, undecided = self._nofuse(nofuse_patterns, snapshot, facts)
        for key in list(edges):
            if key[0] in nofuse or key[1] in nofuse:
                del edges[key]
                rule = undecided.get(key[0]) or undecided.get(key[1])
                blocked[key] = Blocked(UnfusedReason.GUARD_UNDECIDED, rule) if rule else Blocked(UnfusedReason.NOFUSE, "")
        for key in list(siblings):
            if key[0] in nofuse or key[1] in nofuse:
                del siblings[key]
        self.report.seconds = time.perf_counter() - start
        return FusionSpace(
            self.graph,
            FrozenMap({k: tuple(dict.fromkeys(v)) for k, v in edges.items()}),
            FrozenMap({k: tuple(dict.fromkeys(v)) for k, v in siblings.items()}),
            FrozenMap({k: v for k, v in blocked.items() if k not in edges}),
            frozenset(nofuse),
            tuple(loops),
        )

    def _compile(self) -> tuple[list[_Compiled], list[tuple[NoFuse, CompiledPattern]], list[str]]:
        """Every fusion and nofuse rule as egglog rules (untranslatable ones skipped, with the reason),
        and the program that declares them."""
        compiler = PatternCompiler(self.rules, self.registry)
        compiled: list[_Compiled] = []
        program = [DECLARATIONS, class_facts(self.rules), "(ruleset fusion)"]
        n = 0
        for rule in self.rules.fusions:
            patterns = []
            try:
                for t in self._terms(rule):
                    n += 1
                    patterns.append(compiler.compile(t, f"fm{n}", "fusion", f"{rule.name}#{n}"))
            except Untranslatable as e:
                self.report.skipped[rule.name] = str(e)
                continue
            program.extend(p.program for p in patterns)
            compiled.append((rule, rule.kind, patterns, rule.guard))
        nofuse_patterns = []
        for nf in self.rules.nofuse:
            n += 1
            try:
                p = compiler.compile(nf.target, f"fm{n}", "fusion", f"{nf.name}#{n}")
            except Untranslatable as e:
                self.report.skipped[nf.name] = str(e)
                continue
            program.append(p.program)
            nofuse_patterns.append((nf, p))
        return compiled, nofuse_patterns, program

    def _saturate(self, program: list[str]) -> Any:
        """The graph's e-graph after the fusion rules ran, serialized."""
        workdir = Workdir()
        self.encoder.graph(self.graph)
        try:
            with prepared_session("\n".join(program)) as session:  # rules compiled once per process
                session.run(self.encoder.program(workdir.path))
                session.run_rules("fusion")
                return session.serialize()
        finally:
            workdir.close()

    def _facts(self, snapshot: Any) -> EClassFacts:
        """What guards may read of each e-class: its tensor's type and, for constants, value."""
        handles = handles_of(snapshot)
        tensor_of_handle = {h: t for t, h in self.encoder.handle_of.items() if t}
        types, values, consts = {}, {}, set()
        for eclass, hs in handles.items():
            for h in hs:
                tensor = tensor_of_handle.get(h)
                if tensor is None:
                    continue
                self.tensor_of.setdefault(eclass, tensor)
                types[eclass] = self.graph.types[tensor]
                v = self.graph.const_value(tensor)
                if v is not None:
                    values[eclass] = v
                    consts.add(eclass)
        return EClassFacts(handles, types, values, consts)

    def _permissions(self, compiled: list[_Compiled], snapshot: Any, facts: EClassFacts
                     ) -> tuple[dict[tuple[str, str], list[Permission]], dict[tuple[str, str], list[Permission]],
                                dict[tuple[str, str], Blocked], list[LoopCandidate]]:
        """(edges, siblings, blocked, loops): what each rule's matches allow, and what its guards refused."""
        edges: dict[tuple[str, str], list[Permission]] = {}
        siblings: dict[tuple[str, str], list[Permission]] = {}
        blocked: dict[tuple[str, str], Blocked] = {}
        loops: list[LoopCandidate] = []
        for rule, kind, patterns, guard in compiled:
            perm = Permission(rule_ref(rule), rule.template, "branch" if kind == "branch" else "linear", rule.priority,
                              rule.params)
            all_matches: list[list[Match]] = []
            # a branch's guard reads every member at once: it is checked when members are combined
            row_guard = None if kind == "branch" else guard
            for p in patterns:
                ms, rejected = read_matches(p, snapshot, facts, self.registry, row_guard, rule.name)
                if rejected.count:
                    self._count_rejected(rule.name, rejected.count, len(rejected.undecided))
                    if kind == "class":
                        for row_pair in self._pairs_of(p, rejected.undecided):
                            blocked.setdefault(row_pair, Blocked(UnfusedReason.GUARD_UNDECIDED, rule.name))
                        for row_pair in self._structural_pairs(p, snapshot):
                            blocked.setdefault(row_pair, Blocked(UnfusedReason.GUARD, rule.name))
                all_matches.append(ms)
                self.report.fired[rule.name] = self.report.fired.get(rule.name, 0) + len(ms)
            if kind == "branch":
                self._branch(rule, perm, all_matches, edges, siblings)
            elif kind == "loop":
                loops.extend(chain_cells(self.graph, rule, rule_ref(rule), all_matches, self._node_of))
            elif kind in ("linear", "class"):
                for ms in all_matches:
                    for m in ms:
                        for a, b in self._internal_edges(m):
                            edges.setdefault((a, b), []).append(perm)
        return edges, siblings, blocked, loops

    def _nofuse(self, patterns: list[tuple[NoFuse, CompiledPattern]], snapshot: Any,
                facts: EClassFacts) -> tuple[set[str], dict[str, str]]:
        """The nodes a nofuse rule's matches cover; of those, the ones whose guard depends on
        symbolic sizes (kept apart unless fusing is right for every binding), with the rule."""
        nofuse: set[str] = set()
        undecided: dict[str, str] = {}
        for nf, p in patterns:
            ms, rejected = read_matches(p, snapshot, facts, self.registry, nf.guard, nf.name)
            for m in ms:
                nofuse.update(self._node_of(c) for _, c, _, _ in m.ops)
            for cells in rejected.undecided:
                for slot in p.ops:
                    undecided.setdefault(self._node_of(cells[slot.value]), nf.name)
            if rejected.undecided:
                self.report.undecided[nf.name] = self.report.undecided.get(nf.name, 0) + len(rejected.undecided)
        undecided = {n: r for n, r in undecided.items() if n and n not in nofuse}  # a decided nofuse wins
        nofuse.discard("")
        return nofuse | set(undecided), undecided

    def _terms(self, rule: FusionRule) -> list[Term]:
        if rule.kind == "class":
            return list(_class_terms(rule))
        if rule.kind == "linear":
            return [rule.pattern] if rule.pattern is not None else []
        if rule.kind == "branch":
            return list(rule.members) + ([rule.shared_term] if rule.shared_term is not None else [])
        return list(rule.body)  # a loop's cell: its instances are chained in engine.loops

    def _node_of(self, eclass: str) -> str:
        tensor = self.tensor_of.get(eclass)
        producer = self.graph.producers.get(tensor) if tensor else None
        return producer.name if producer is not None else ""

    def _internal_edges(self, m: Match) -> list[tuple[str, str]]:
        """Producer -> consumer node pairs inside one match (op terms nested in op terms)."""
        value_of = {term: eclass for term, eclass, _, _ in m.ops}
        out = []
        for term, eclass, _, _ in m.ops:
            consumer = self._node_of(eclass)
            for arg in term.args:
                if isinstance(arg, OpTerm) and arg in value_of:
                    producer = self._node_of(value_of[arg])
                    if producer and consumer and producer != consumer:
                        out.append((producer, consumer))
        return out

    def _count_rejected(self, rule: str, rejected: int, undecided: int) -> None:
        self.report.rejected[rule] = self.report.rejected.get(rule, 0) + rejected
        if undecided:
            self.report.undecided[rule] = self.report.undecided.get(rule, 0) + undecided

    def _pairs_of(self, pattern: CompiledPattern, rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """(producer, consumer) of class-rule rows given by their cells."""
        producer, consumer = pattern.ops[0].value, pattern.ops[-1].value
        pairs = [(self._node_of(cells[producer]), self._node_of(cells[consumer])) for cells in rows]
        return [(p, c) for p, c in pairs if p and c]

    def _structural_pairs(self, pattern, snapshot) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
        """(producer, consumer) of every row of a class-rule pattern, guard or not."""
        consumer_col = next(i for i, (v, _) in enumerate(pattern.columns) if v == pattern.ops[-1].value)
        producer_col = next(i for i, (v, _) in enumerate(pattern.columns) if v == pattern.ops[0].value)
        out = []
        for row in snapshot.rows(pattern.relation):
            p = self._node_of(snapshot.eclass(row[producer_col]))
            c = self._node_of(snapshot.eclass(row[consumer_col]))
            if p and c:
                out.append((p, c))
        return out

    def _branch(self, rule: FusionRule, perm: Permission, matches: list[list[Match]],
                edges: dict[tuple[str, str], list[Permission]],
                siblings: dict[tuple[str, str], list[Permission]]) -> None:
        shared = rule.shared or ""
        n_members = len(rule.members)
        by_shared: dict[str, list[Match]] = {}
        for ms in matches[:n_members]:
            for m in ms:
                key = m.vars.get(shared)
                if key is not None:
                    by_shared.setdefault(key, []).append(m)
        producers: dict[str, list[Match]] = {}
        for ms in matches[n_members:]:
            for m in ms:
                producers.setdefault(m.root, []).append(m)
        for key, ms in by_shared.items():
            ms = self._guarded_members(rule, ms)
            roots = list(dict.fromkeys(self._node_of(m.root) for m in ms))
            roots = sorted((r for r in roots if r), key=self._index.__getitem__)
            if len(roots) < 2 and key not in producers:
                continue
            for m in ms:
                for a, b in self._internal_edges(m):
                    edges.setdefault((a, b), []).append(perm)
            for i, a in enumerate(roots):
                for b in roots[i + 1:]:
                    siblings.setdefault((a, b), []).append(perm)
            source = self._node_of(key)
            if key in producers and source:
                for m in producers[key]:
                    for a, b in self._internal_edges(m):
                        edges.setdefault((a, b), []).append(perm)
                for m in ms:
                    first = self._consumer_of(m, key)
                    if first:
                        edges.setdefault((source, first), []).append(perm)

    def _guarded_members(self, rule: FusionRule, ms: list[Match]) -> list[Match]:
        """Matches that take part in some assignment of distinct matches to the members for which
        the rule's guard holds (at most a bounded number of assignments is tried)."""
        if rule.guard is None:
            return ms
        members = len(rule.members)
        kept: dict[int, Match] = {}
        undecided = False
        for combo in itertools.islice(itertools.permutations(ms, min(members, len(ms))), 5000):
            if len({m.root for m in combo}) != len(combo):
                continue
            ok = verdict(rule.guard, merged_env(list(combo)))
            undecided |= ok is None
            if ok:
                for m in combo:
                    kept[id(m)] = m
        if not kept:
            self._count_rejected(rule.name, len(ms), len(ms) if undecided else 0)
        return list(kept.values())

    def _consumer_of(self, m: Match, shared_class: str) -> str:
        """The node of a member match that reads the shared tensor."""
        for term, eclass, _, _ in m.ops:
            for arg in term.args:
                if isinstance(arg, Var) and m.vars.get(arg.name) == shared_class:
                    return self._node_of(eclass)
        return ""


def fusion_space(graph: Graph, rules: RuleSet, registry: OpRegistry) -> tuple[FusionSpace, MatchReport]:
    """The merges ``rules`` allow on ``graph``."""
    matcher = FusionMatcher(graph, rules, registry)
    space = matcher.run()
    return space, matcher.report
