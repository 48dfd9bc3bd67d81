"""Compare compiled runs with the reference interpreter.

>>> # report = compare_outputs(run_graph(g, feeds), CompiledModel(plan).run(feeds))
>>> # assert report.ok, report.summary()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from autofusion.decide.plan import Plan
from autofusion.runtime.cache import CompileCache

RTOL = 1e-4
ATOL = 1e-5


@dataclass(frozen=True)
class OutputDiff:
    """How one output differs from the reference."""

    name: str
    max_abs: float
    max_rel: float  # of |a - b| / (atol + rtol * |b|): at most 1 means within tolerance
    ok: bool
    note: str = ""


@dataclass(frozen=True)
class CompareReport:
    diffs: tuple[OutputDiff, ...]

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.diffs)

    def summary(self) -> str:
        return "; ".join(f"{d.name}: max |diff| {d.max_abs:.3g}, tolerance ratio {d.max_rel:.3g}"
                         + (f" ({d.note})" if d.note else "") + ("" if d.ok else " FAIL") for d in self.diffs)


def compare_outputs(reference: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    rtol: float = RTOL, atol: float = ATOL) -> CompareReport:
    """Each reference output against the actual one (shape, dtype, values within rtol/atol)."""
    diffs = []
    for name, ref in reference.items():
        got = actual.get(name)
        if got is None:
            diffs.append(OutputDiff(name, float("inf"), float("inf"), False, "missing"))
            continue
        got = np.asarray(got)
        if got.shape != ref.shape or got.dtype != ref.dtype:
            diffs.append(OutputDiff(name, float("inf"), float("inf"), False,
                                    f"got {got.dtype}{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}"))
            continue
        if ref.size == 0:
            diffs.append(OutputDiff(name, 0.0, 0.0, True))
            continue
        if ref.dtype.kind in "fc":
            with np.errstate(invalid="ignore"):
                diffs.append(_float_diff(name, got.astype(np.float64), ref.astype(np.float64), rtol, atol))
        else:
            wrong = int(np.count_nonzero(got != ref))
            diffs.append(OutputDiff(name, float(wrong), float(wrong), wrong == 0,
                                    f"{wrong} elements differ" if wrong else ""))
    return CompareReport(tuple(diffs))


def _float_diff(name: str, a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> OutputDiff:
    """NaN where the reference has NaN; infinities equal; elsewhere |a - b| <= atol + rtol * |b|."""
    same_nan = np.isnan(a) == np.isnan(b)
    err = np.where(np.isnan(b), 0.0, np.abs(a - b))
    err = np.where(np.isinf(b) & (a == b), 0.0, err)
    err = np.where(np.isnan(err), np.inf, err)
    bound = atol + rtol * np.abs(np.where(np.isinf(b), 1.0, b))
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero bound: exact equality is ratio 0
        ratio = np.where(err == 0.0, 0.0, err / bound)
    return OutputDiff(name, float(err.max()), float(ratio.max()), bool(same_nan.all() and ratio.max() <= 1.0))


def verify_plan(plan: Plan, feeds: Mapping[str, np.ndarray], unfused: bool = False,
                cache: CompileCache | str | None = None, threads: int | None = None,
                rtol: float = RTOL, atol: float = ATOL) -> CompareReport:
    """Compile ``plan`` (or run its graph op by op with ``unfused``) and compare with ``run_graph``."""
    from autofusion.ir.interpreter import run_graph
    from autofusion.runtime.model import CompiledModel
    from autofusion.runtime.unfused import UnfusedRunner

    reference = run_graph(plan.graph, feeds)
    runner = (UnfusedRunner(plan.graph, threads=threads, cache=cache) if unfused else
              CompiledModel(plan, threads=threads, cache=cache))
    return compare_outputs(reference, runner.run(feeds), rtol, atol)
