"""The differential runner: optimise, compile and run each case, compare with the reference.

Each case ends in one of four outcomes: ``ok`` (every backend matches the reference interpreter),
``mismatch`` (some backend computed a different answer), ``refused`` (the pipeline rejected the
case with one of its documented errors, e.g. CodegenError for an unsupported op), or ``failure``
(any other exception: a bug). Mismatches and failures carry the case's seed for replay.

A backend that differs from the float32 reference is checked once more against the reference
computed in float64: the float32 reference has rounding of its own, which an ill-conditioned op
amplifies (LayerNormalization of a row whose values are all equal divides rounding noise by
sqrt(epsilon)). Only an answer that matches neither is a mismatch; one that matches the float64
reference is ``ok`` and counted in ``float64_rechecked``.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.fuzz.cases import case_for
from autofusion.fuzz.generator import FuzzCase
from autofusion.ir import run_graph
from autofusion.runtime.compare import ATOL, RTOL  # the tolerance every comparison with the reference uses


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case; ``detail`` says what differed or what was raised."""

    seed: int
    strategy: str
    outcome: str  # ok | mismatch | refused | failure
    detail: str = ""
    backend: str = ""
    triton_steps: tuple[str, ...] = ()  # what ran each step under --triton: a kernel's kind, torch, host or view


@dataclass
class CampaignReport:
    """Counts over a campaign; ``mismatches`` and ``failures`` list each case to replay."""

    cases: int = 0
    ok: int = 0
    refused: int = 0
    seconds: float = 0.0
    float64_rechecked: list[int] = field(default_factory=list)  # seeds of ok cases that matched only in float64
    mismatches: list[CaseResult] = field(default_factory=list)
    failures: list[CaseResult] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)  # error type -> count
    by_strategy: dict[str, int] = field(default_factory=dict)
    triton_steps: dict[str, int] = field(default_factory=dict)  # Triton kernel kinds (and torch/host/view) run
    workers: int = 1  # processes the campaign ran on (a Ray cluster's CPUs)

    def merge(self, other: CampaignReport) -> None:
        """Add the counts and findings of ``other`` (a campaign over other seeds)."""
        self.cases += other.cases
        self.ok += other.ok
        self.refused += other.refused
        self.float64_rechecked += other.float64_rechecked
        self.mismatches += other.mismatches
        self.failures += other.failures
        for mine, theirs in ((self.refusals, other.refusals), (self.by_strategy, other.by_strategy),
                             (self.triton_steps, other.triton_steps)):
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count

    def add(self, result: CaseResult) -> None:
        """Count ``result`` (one case's outcome) into the report."""
        self.cases += 1
        self.by_strategy[result.strategy] = self.by_strategy.get(result.strategy, 0) + 1
        for step in result.triton_steps:
            self.triton_steps[step] = self.triton_steps.get(step, 0) + 1
        if result.outcome == "ok":
            self.ok += 1
            if result.detail:
                self.float64_rechecked.append(result.seed)
        elif result.outcome == "refused":
            self.refused += 1
            kind = result.detail.split(":", 1)[0]
            self.refusals[kind] = self.refusals.get(kind, 0) + 1
        elif result.outcome == "mismatch":
            self.mismatches.append(result)
        else:
            self.failures.append(result)

    def to_json(self) -> dict[str, object]:
        """The report as JSON-ready data (``cases``, ``mismatches`` with seeds, ...)."""
        def rows(results: list[CaseResult]) -> list[dict[str, object]]:
            return [{"seed": r.seed, "strategy": r.strategy, "backend": r.backend, "detail": r.detail}
                    for r in results]
        return {"cases": self.cases, "ok": self.ok, "float64_rechecked": len(self.float64_rechecked),
                "float64_rechecked_seeds": self.float64_rechecked,
                "refused": self.refused, "refusals": self.refusals,
                "mismatches": rows(self.mismatches), "failures": rows(self.failures),
                "by_strategy": self.by_strategy, "triton_steps": self.triton_steps, "workers": self.workers, "seconds": round(self.seconds, 3),
                "cases_per_second": round(self.cases / self.seconds, 3) if self.seconds else 0.0}


def refusal_errors() -> tuple[type[BaseException], ...]:
    """The errors by which the pipeline clearly declines a case (not bugs)."""
    from autofusion.codegen.errors import CodegenError
    from autofusion.runtime import CompileError

    return (CodegenError, CompileError)


def _compare(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> str:
    """'' when every output matches, else a description of the first difference."""
    for name, ref in reference.items():
        got = actual.get(name)
        if got is None:
            return f"{name}: missing"
        got = np.asarray(got)
        if got.shape != ref.shape or got.dtype != ref.dtype:
            return f"{name}: got {got.dtype}{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}"
        if not np.allclose(got, ref, rtol=RTOL, atol=ATOL, equal_nan=True):
            err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
            return f"{name}: max abs error {err:.3g}"
    return ""


def float64_reference(graph: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The reference interpreter's ops on float32 tensors promoted to float64, outputs rounded to
    their declared types; None when an op's numpy code does not take the promotion."""
    from autofusion.ops import default_registry

    registry = default_registry()

    def up(a: Any) -> np.ndarray:
        a = np.asarray(a)
        return a.astype(np.float64) if a.dtype == np.float32 else a

    env = {k: up(c.array) for k, c in graph.constants.items()}
    env.update({k: up(v) for k, v in feeds.items()})
    try:
        with np.errstate(all="ignore"):
            for node in graph.nodes:
                results = registry[node.op].reference([env[i] if i else None for i in node.inputs], node.attrs)
                for name, value in zip(node.outputs, results):
                    if name:
                        env[name] = up(value)
        return {o: np.asarray(env[o]).astype(graph.types[o].dtype.numpy) for o in graph.outputs}
    except Exception:  # an op written for float32 only: no second opinion
        return None


def _differs(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray], case: FuzzCase,
             rechecked: list[bool]) -> str:
    """The difference from the float32 reference, unless the float64 reference agrees with ``actual``."""
    diff = _compare(reference, actual)
    if diff:
        exact = float64_reference(case.graph, case.feeds)
        if exact is not None and not _compare(exact, actual):
            rechecked.append(True)
            return ""
    return diff


def run_case(case: FuzzCase, cache: str | Path | None = None, rules: object = None,
             triton: bool = False) -> CaseResult:
    """Optimise ``case`` with its strategy, run it compiled (and unfused now and then), compare;
    with ``triton`` also through the Triton backend (under ``TRITON_INTERPRET=1`` on the CPU)."""
    from autofusion.api import optimize
    from autofusion.codegen.cores import FixedChooser
    from autofusion.runtime import CompiledModel, UnfusedRunner

    stage = "reference"
    rechecked: list[bool] = []
    try:
        reference = run_graph(case.graph, case.feeds)
        stage = "optimize"
        plan = optimize(case.graph, rules, strategy=case.strategy)  # type: ignore[arg-type]
        stage = "compiled"
        cores = FixedChooser(case.cores) if case.cores is not None else None
        model = CompiledModel(plan, threads=case.threads, cache=cache, tune=False, cores=cores)
        diff = _differs(reference, model.run(case.feeds), case, rechecked)
        if diff:
            return CaseResult(case.seed, case.strategy, "mismatch", diff, stage)
        if case.check_unfused:
            stage = "unfused"
            unfused = UnfusedRunner(case.graph, threads=case.threads, cache=cache, tune=False)
            diff = _differs(reference, unfused.run(case.feeds), case, rechecked)
            if diff:
                return CaseResult(case.seed, case.strategy, "mismatch", diff, stage)
        if triton:
            stage = "triton"
            triton_model = _triton_model(plan)
            steps = triton_steps(triton_model)
            diff = _differs(reference, triton_model(case.feeds), case, rechecked)
            if diff:
                return CaseResult(case.seed, case.strategy, "mismatch", diff, stage, steps)
            stage = "triton replay"  # the second call runs the steps bound to the planned buffers
            diff = _differs(reference, triton_model(case.feeds), case, rechecked)
            if diff:
                return CaseResult(case.seed, case.strategy, "mismatch", diff, stage, steps)
            return CaseResult(case.seed, case.strategy, "ok", "matched the float64 reference" if rechecked else "",
                              stage, steps)
    except refusal_errors() as e:
        return CaseResult(case.seed, case.strategy, "refused", f"{type(e).__name__}: {e}"[:300], stage)
    except Exception as e:  # any other exception is a bug, reported with its seed
        tb = traceback.format_exception(e)[-3:]
        return CaseResult(case.seed, case.strategy, "failure", f"{type(e).__name__}: {e} | {''.join(tb)}"[:800],
                          stage)
    return CaseResult(case.seed, case.strategy, "ok", "matched the float64 reference" if rechecked else "", stage)


def triton_steps(model: Any) -> tuple[str, ...]:
    """What runs each step of a TritonModel: its kernel's kind, or torch, host or view."""
    return tuple(s.kernel.group.template if s.kernel is not None else "view" if s.group.template == "view"
                 else "torch" if s.torch else "host" for s in model.steps)


def _triton_model(plan: object) -> Any:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported
    from autofusion.runtime.triton_runner import TritonModel

    return TritonModel(plan, fallback=True)  # type: ignore[arg-type]


def run_campaign(cases: int, seed: int, cache: str | Path | None = None, max_ops: int = 7,
                 rules: object = None, triton: bool = False, shapes: str = "small") -> CampaignReport:
    """Run cases ``seed .. seed + cases - 1`` drawn by ``shapes`` (fuzz/cases.py); case ``s``
    replays alone as ``cases=1, seed=s`` with the same ``shapes``."""
    from autofusion.api import load_ruleset

    report = CampaignReport()
    t0 = time.perf_counter()
    rules = load_ruleset(rules)  # type: ignore[arg-type]  # parsed once, not once per case
    for s in range(seed, seed + cases):
        report.add(run_case(case_for(s, shapes, max_ops), cache, rules, triton))
    report.seconds = time.perf_counter() - t0
    return report
