"""Numerical verification: every rewrite is run on random inputs, every pattern is built.

For a rewrite, both sides become IR graphs over the same inputs (constants where the guard asks
for ``const``) and the reference interpreter runs them; outputs must agree in shape, dtype and
value. Input shapes come from :mod:`autofusion.dsl.instantiate`: a few uniform trials (every
dimension the same size, positive values) and perturbed ones (mixed sizes, broadcasting 1s,
normally distributed values, so sign- and shape-dependent mistakes show). A disagreement is F022
with the counterexample; finding no shapes at all is F023. Fusion, nofuse and named patterns are
built and run the same way, and a loop body must return its carried values' types.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autofusion.dsl import guards as g
from autofusion.dsl.checks import const_names
from autofusion.dsl.diagnostics import Sink
from autofusion.dsl.instantiate import Env, GraphMaker, NoInstance, Trial, max_outputs
from autofusion.dsl.ir import Branch, FusionRule, Loop, NoFuse, OpTerm, PatternDef, Rewrite, Term, Var, walk
from autofusion.dsl.program import Program
from autofusion.dsl.symbolic_check import SymbolicMismatch, check_symbolic
from autofusion.graph.graph import Graph
from autofusion.graph.types import DType
from autofusion.ir.interpreter import InterpreterError, run_graph
from autofusion.ops.registry import OpRegistry

# a guard met by one of an op's example values (Reshape's target shape) is met in a drawn order:
# 16 trials missed a 1-in-6 example for one rule name in four (the name seeds the draws)
UNIFORM_TRIALS = 32
PERTURBED_TRIALS = 16
WANTED_CASES = 4
# a rule over an op with example values (Reshape's target shape) draws one per case: 16 cases meet
# each of the few targets that type-check (a 3-D tensor's two merges of neighbouring axes), which 4
# could miss
EXAMPLE_CASES = 16
BASES = (4, 3, 2, 8)


@dataclass
class Case:
    """One instantiation of a rule: the bound inputs and, for a rewrite, how the sides compared."""

    env: Env
    ok: bool = True
    error: float = 0.0
    reason: str = ""
    detail: list[str] = field(default_factory=list)
    sides: tuple[Graph, Graph] | None = None  # the two graphs the case ran, for the symbolic check


def rank_hints(guard: g.Guard | None) -> dict[str, int]:
    """Ranks a guard's conjuncts ask for: ``rank(x) == 3``, ``numel(e) == 1``, ``shape(g) == [..]``."""
    hints: dict[str, int] = {}
    parts = guard.args if isinstance(guard, g.BoolOp) and guard.op == "and" else (guard,) if guard else ()
    for p in parts:
        if not isinstance(p, g.Compare) or p.op not in ("==", ">="):
            continue
        call, value = (p.lhs, p.rhs) if isinstance(p.lhs, g.Call) else (p.rhs, p.lhs)
        if not isinstance(call, g.Call) or not call.args or not isinstance(call.args[0], g.Name):
            continue
        name = call.args[0].name
        if call.fn == "rank" and isinstance(value, g.IntLit):
            hints[name] = value.value
        elif call.fn == "numel" and p.op == "==" and isinstance(value, g.IntLit) and value.value == 1:
            hints[name] = 0
        elif call.fn == "shape" and p.op == "==" and isinstance(value, g.ListLit):
            hints[name] = len(value.items)
    return hints


def _dtypes(guard: g.Guard | None) -> list[DType]:
    """float32, then any dtype a guard names (so ``dtype(x) == "float16"`` can be met)."""
    named = []

    def walk(e: g.Guard) -> None:
        if isinstance(e, g.StrLit) and e.value in g.DTYPE_NAMES and e.value != "float32":
            named.append(DType(e.value))
        for c in g.children(e):
            walk(c)

    if guard is not None:
        walk(guard)
    return [DType.FLOAT32, *dict.fromkeys(named)]


class Verifier:
    def __init__(self, registry: OpRegistry, ops_of: Callable[[str], frozenset[str]], sink: Sink) -> None:
        self.registry = registry
        self.ops_of = ops_of
        self.sink = sink

    def trials(self, name: str, guard: g.Guard | None) -> Any:
        """Trial choices, a generator that is sent back the env of each success (or None).

        Uniform trials run until one succeeds; then perturbed trials keep its ranks and vary the
        sizes. Positive and normally distributed values alternate, so that rules that only hold
        for positive inputs (``Relu(x) => x``) fail.
        """
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        consts = sorted(const_names(guard))
        dtypes = _dtypes(guard)
        wanted = rank_hints(guard)
        hints: dict[str, int] = {}
        for i in range(UNIFORM_TRIALS):
            env = yield self._trial(rng, i, consts, dtypes, wanted, perturbed=False)
            if env is not None:
                hints = {**wanted, **{n: b.type.rank for n, b in env.vars.items()}}  # the guard's, for captures
                break
        if not hints:
            return
        for i in range(PERTURBED_TRIALS):
            yield self._trial(rng, i + 1, consts, dtypes, hints, perturbed=True)

    @staticmethod
    def _trial(rng: np.random.Generator, i: int, consts: list[str], dtypes: list[DType],
               hints: dict[str, int], perturbed: bool) -> Trial:
        keep = frozenset(c for c in consts if i % 4 != 3 or rng.random() < 0.5)  # mostly as asked
        return Trial(rng, base=BASES[i % len(BASES)], perturbed=perturbed, dtype=dtypes[i % len(dtypes)],
                     const_vars=keep, rank_hints=hints, positive=i % 2 == 0, shuffle=i > 0)

    # -- rewrites -------------------------------------------------------------------------------

    def rewrite(self, rw: Rewrite) -> None:
        ok_cases: list[Case] = []
        gen = self.trials(rw.name, rw.guard)
        outputs = max_outputs([rw.lhs, rw.rhs])
        env_for_hints = None
        tried = 0
        wanted = EXAMPLE_CASES if self._draws_examples(rw.lhs) else WANTED_CASES
        while True:
            try:
                trial = gen.send(env_for_hints) if tried else next(gen)
            except StopIteration:
                break
            tried += 1
            case = self.rewrite_case(rw, trial, outputs)
            env_for_hints = case.env if case is not None else None
            if case is None:
                continue
            if not case.ok:
                self.report_mismatch(rw, case)
                return
            ok_cases.append(case)
            if len(ok_cases) >= wanted:
                break
        if not ok_cases:
            self.sink.add("F023", f"rewrite {rw.name} was not verified: no input shapes were found for which the "
                          f"left side type-checks and the guard holds ({tried} trials)", rw.span)
        self.symbolic(rw, ok_cases)

    def _draws_examples(self, term: Term) -> bool:
        """Whether ``term`` has an op whose inputs take example values (instantiate.py)."""
        return any(isinstance(t, OpTerm) and t.op in self.registry and self.registry[t.op].example_values is not None
                   for t in walk(term))

    def symbolic(self, rw: Rewrite, cases: list[Case]) -> None:
        """Each passing case again with its sizes symbolic (see dsl/symbolic_check.py)."""
        rng = np.random.default_rng(zlib.crc32(rw.name.encode()) + 1)
        for case in cases:
            assert case.sides is not None
            left, right = case.sides
            agree = lambda a, b, env=case.env: (c := compare(env, a, b)) is None or c.ok  # noqa: E731
            found = check_symbolic(left, right, rw.guard, case.env, self.registry, rng, agree)
            if found is not None:
                self.report_symbolic(rw, found, case.env)
                return

    def report_symbolic(self, rw: Rewrite, found: SymbolicMismatch, env: Env) -> None:
        reason, detail = found.reason, list[str]()
        if found.left is not None and found.right is not None:
            case = compare(env, found.left, found.right)
            reason, detail = (case.reason, case.detail) if case is not None else ("the sides differ", [])
        sizes = ", ".join(f"{k}={v}" for k, v in found.sizes.items())
        notes = ["symbolic inputs: " + ", ".join(f"{n}: {t}" for n, t in found.inputs.items()),
                 f"at sizes {sizes}", *detail]
        self.sink.add("F022", f"rewrite {rw.name} does not hold when sizes are symbolic: {reason}", rw.span,
                      notes, {"inputs": found.inputs, "sizes": found.sizes})

    def rewrite_case(self, rw: Rewrite, trial: Trial, outputs: Any) -> Case | None:
        env = Env()
        left = GraphMaker(self.registry, self.ops_of, trial, env, True, outputs)
        try:
            l_out = left.build(rw.lhs)
        except NoInstance:
            return None
        if not g.holds(rw.guard, env.bindings(left.types, self.registry)):
            return None
        feeds = left.feeds()
        try:
            l_val = run_graph(left.graph([l_out]), feeds, self.registry)[l_out]
        except InterpreterError:
            return None
        right = GraphMaker(self.registry, self.ops_of, trial, env, False, outputs)
        try:
            r_out = right.build(rw.rhs)
            r_val = run_graph(right.graph([r_out]), feeds, self.registry)[r_out]
        except NoInstance as e:
            return Case(env, False, float("inf"), f"the right side does not type-check ({e})")
        except InterpreterError as e:
            return Case(env, False, float("inf"), f"the right side fails to run ({e})")
        case = compare(env, l_val, r_val)
        if case is not None:
            case.sides = (left.graph([l_out]), right.graph([r_out]))
        return case

    def report_mismatch(self, rw: Rewrite, case: Case) -> None:
        shapes = {n: str(b.type) + (" const" if b.const else "") + _small_ints(b.value, b.const)
                  for n, b in case.env.vars.items() if not n.startswith("_open")}
        inputs = ", ".join(f"{n}: {s}" for n, s in shapes.items()) or "none"
        notes = [f"counterexample inputs: {inputs}"]
        if case.env.attrs:
            notes.append("attributes: " + ", ".join(f"{k}={v!r}" for k, v in case.env.attrs.items()))
        notes += case.detail
        err = "inf" if case.error == float("inf") else f"{case.error:.3g}"
        self.sink.add("F022", f"rewrite {rw.name} does not hold: {case.reason} (max error {err})", rw.span,
                      notes, {"inputs": shapes, "max_error": case.error, "attributes": dict(case.env.attrs)})

    # -- patterns -------------------------------------------------------------------------------

    def structure(self, name: str, what: str, span: Any, roots: list[Term], guard: g.Guard | None,
                  shared: tuple[str, Term | None] | None = None, carried: tuple[str, ...] = ()) -> None:
        """Build and run ``roots``; for loops, the updates must keep the carried values' types."""
        if shared is None and all(isinstance(r, OpTerm) and not r.args for r in roots):
            return  # a bare op or class name: nothing to put together
        gen = self.trials(name, guard)
        outputs = max_outputs(roots + ([shared[1]] if shared and shared[1] is not None else []))
        env_for_hints, tried, built, mismatch = None, 0, False, ""
        while True:
            try:
                trial = gen.send(env_for_hints) if tried else next(gen)
            except StopIteration:
                break
            tried += 1
            env = Env()
            maker = GraphMaker(self.registry, self.ops_of, trial, env, True, outputs)
            env_for_hints = None
            try:
                if shared is not None and shared[1] is not None:
                    maker.bind(shared[0], maker.build(shared[1]))
                outs = [maker.build(r) for r in roots]
            except NoInstance:
                continue
            try:
                run_graph(maker.graph(list(dict.fromkeys(outs))), maker.feeds(), self.registry)
            except InterpreterError:
                continue
            built = True
            if not g.holds(guard, env.bindings(maker.types, self.registry)):
                continue  # well-formed; the guard may only hold for sizes the search does not try
            if carried:
                wrong = [(c, env.vars[c].type, maker.types[o]) for c, o in zip(carried, outs)
                         if c in env.vars and env.vars[c].type != maker.types[o]]
                if wrong:
                    c, before, after = wrong[0]
                    mismatch = f"{c}: {before} becomes {after}"
                    continue
            env_for_hints = env
            return
        if mismatch:
            self.sink.add("F023", f"{what} {name}: no instance was found where each update has its carried "
                          f"value's type (e.g. {mismatch})", span)
        elif not built:
            self.sink.add("F023", f"{what} {name} was not checked as a graph: no input shapes were found for "
                          f"which it type-checks and its guard holds ({tried} trials)", span)

    def fusion(self, rule: FusionRule) -> None:
        if rule.kind == "linear" and rule.pattern is not None:
            self.structure(rule.name, "rule", rule.span, [rule.pattern], rule.guard)
        elif rule.kind == "branch":
            self.structure(rule.name, "rule", rule.span, list(rule.members), rule.guard,
                           shared=(rule.shared or "", rule.shared_term))
        elif rule.kind == "loop":
            self.structure(rule.name, "rule", rule.span, list(rule.body), rule.guard, carried=rule.carried)

    def pattern(self, p: PatternDef) -> None:
        body = p.body
        if isinstance(body, Branch):
            self.structure(p.name, "pattern", p.span, list(body.members), p.guard,
                           shared=(body.shared, body.shared_term))
        elif isinstance(body, Loop):
            self.structure(p.name, "pattern", p.span, list(body.body), p.guard, carried=body.carried)
        elif not isinstance(body, Var):
            self.structure(p.name, "pattern", p.span, [body], p.guard)


def _small_ints(value: np.ndarray, const: bool) -> str:
    """`` = [1, 4, 4]`` for a constant of a few integers (a Reshape's shape), which its type alone
    does not tell; empty otherwise."""
    if not const or not np.issubdtype(value.dtype, np.integer) or value.size > 8:
        return ""
    return f" = {value.tolist()}"


def compare(env: Env, a: np.ndarray, b: np.ndarray) -> Case | None:
    """How two outputs compare; None when the case says nothing (every value NaN or infinite)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return Case(env, False, float("inf"),
                    f"the left side gives {a.dtype}{list(a.shape)}, the right side {b.dtype}{list(b.shape)}")
    if a.size == 0:
        return Case(env)
    if not np.issubdtype(a.dtype, np.floating):
        bad = np.argwhere(a != b)
        if len(bad):
            i = tuple(int(x) for x in bad[0])
            return Case(env, False, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))),
                        "the sides differ", [f"at index {i}: left {a[i]!r}, right {b[i]!r}"])
        return Case(env)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not fa.any() and not fb.any():
        return None
    if (fa != fb).any() or (np.isnan(a) != np.isnan(b)).any():
        i = tuple(int(x) for x in np.argwhere((fa != fb) | (np.isnan(a) != np.isnan(b)))[0])
        return Case(env, False, float("inf"), "one side is finite where the other is not",
                    [f"at index {i}: left {a[i]!r}, right {b[i]!r}"])
    both = fa & fb
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = np.where(both, np.abs(a64 - b64), 0.0)
    rtol = 1e-2 if a.dtype == np.float16 else 1e-3
    scale = max(1.0, float(np.max(np.abs(np.where(both, b64, 0.0)))))
    tol = rtol * np.abs(np.where(both, b64, 0.0)) + 1e-4 * scale
    err = float(diff.max())
    if (diff > tol).any():
        i = tuple(int(x) for x in np.argwhere(diff > tol)[0])
        return Case(env, False, err, "the sides differ",
                    [f"at index {i}: left {a64[i]:.6g}, right {b64[i]:.6g}"])
    return Case(env, True, err)


def verify_program(program: Program, registry: OpRegistry, sink: Sink) -> None:
    """Verify every rule that passed the other checks; a bug becomes F024, never a traceback."""
    verifier = Verifier(registry, program.ruleset.ops_of, sink)
    for c in program.compiled:
        if not c.ok:
            continue
        rule = c.rule
        try:
            if isinstance(rule, Rewrite):
                verifier.rewrite(rule)
            elif isinstance(rule, FusionRule):
                verifier.fusion(rule)
            elif isinstance(rule, NoFuse):
                verifier.structure(rule.name, "nofuse", rule.span, [rule.target], rule.guard)
            elif isinstance(rule, PatternDef):
                verifier.pattern(rule)
        except RecursionError:
            sink.add("F024", f"{c.statement.kind} {c.statement.name} is nested too deeply to verify", c.statement.span)
        except Exception as e:  # verification bugs must not end in a traceback
            sink.add("F024", f"internal error while verifying {c.statement.kind} {c.statement.name}: "
                     f"{type(e).__name__}: {e}", c.statement.span)
