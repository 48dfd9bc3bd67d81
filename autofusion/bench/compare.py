"""Every strategy under every cost model, before fusing: each plan's kernels, predicted time, memory
and energy, and (measured) what the distinct plans really take. What ``autofusion compare`` shows.

Predicted time is the plan's modelled cost; predicted memory the buffer planner's footprint of
the plan with untuned cores (the workspace and, while the kernel with the largest per-thread blocks
runs, the threads' blocks; weights, inputs and outputs aside); predicted energy
``HardwareProfile.joules`` (the package's power for the predicted time, plus the modelled bytes at
the profile's joules per byte: an estimate, its constants and their source in the profile).
Measured time is the median of round-robin runs of each distinct plan in one process; beside it,
the runtime's buffer plan of the compiled (tuned) model: what it allocates for a call, by its own
accounting, not a measurement of the process.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from autofusion.bench.timing import round_robin_medians
from autofusion.decide.cost import CostModel, HardwareProfile, model_profile
from autofusion.decide.plan import Plan
from autofusion.graph.graph import Graph


@dataclass(frozen=True)
class PlanRow:
    """One strategy under one cost model: its plan, predicted and (when measured) measured."""

    strategy: str
    cost_model: str
    calibration: str  # where the model's constants came from (a calibration file, a profile)
    kernels: int
    predicted_seconds: float
    predicted_peak_bytes: int
    predicted_joules: float
    optimize_seconds: float
    plan_id: int  # rows with one id have the same groups (one plan, compiled and measured once)
    measured_seconds: float | None = None
    runtime_peak_bytes: int | None = None  # the compiled model's buffer plan, tuned cores included
    # the same plan priced with its matrix products at the rate the tuner measured for them here
    predicted_seconds_tuned_cores: float | None = None
    tuned_core_flops_per_second: float | None = None

    @property
    def time_error(self) -> float | None:
        """(predicted - measured) / measured, when measured."""
        return _error(self.predicted_seconds, self.measured_seconds)

    @property
    def tuned_time_error(self) -> float | None:
        """The same error of the prediction with the cores at their tuned rate."""
        return _error(self.predicted_seconds_tuned_cores, self.measured_seconds)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "time_error": self.time_error, "tuned_time_error": self.tuned_time_error}


def _error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def with_core_rate(model: CostModel, flops_per_second: float) -> CostModel | None:
    """``model`` with its matrix products priced at ``flops_per_second`` (a copy; None for a model
    without a hardware profile to change)."""
    profile = getattr(model, "profile", None)
    if isinstance(profile, HardwareProfile):
        priced = copy.copy(model)
        priced.profile = profile.replace(matmul_peak_flops=flops_per_second)  # type: ignore[attr-defined]
        return priced
    analytic = getattr(model, "analytic", None)  # a learned model: its correction applies on top
    repriced = with_core_rate(analytic, flops_per_second) if analytic is not None else None
    if repriced is None:
        return None
    priced = copy.copy(model)
    priced.analytic = repriced  # type: ignore[attr-defined]
    return priced


def plan_seconds(plan: Plan, model: CostModel) -> float:
    """What ``model`` predicts for ``plan``'s groups (the plan's own prediction, for its own model)."""
    return sum(model.group_cost(plan.graph, list(g.nodes)).seconds for g in plan.groups)


def profile_of(model: CostModel) -> HardwareProfile:
    """The hardware profile whose energy constants price a plan of ``model``: its own, its analytic
    part's (a learned model), else the shipped CPU one."""
    return model_profile(model) or HardwareProfile.load("cpu-2core")


def plan_key(plan: Plan) -> frozenset[frozenset[str]]:
    return frozenset(frozenset(g.nodes) for g in plan.groups)


def compare_plans(graph: Graph, strategies: Sequence[str], cost_models: Mapping[str, CostModel],
                  plan: Callable[[Graph, str, CostModel], Plan], threads: int,
                  footprint: Callable[[Plan], int]) -> tuple[list[PlanRow], dict[int, Plan]]:
    """(rows, distinct plans by id): ``plan(graph, strategy, model)`` optimizes, ``footprint(plan)``
    is the buffer planner's bytes for ``threads``."""
    rows: list[PlanRow] = []
    ids: dict[frozenset[frozenset[str]], int] = {}
    plans: dict[int, Plan] = {}
    footprints: dict[int, int] = {}
    for model_name, model in cost_models.items():
        for strategy in strategies:
            started = time.perf_counter()
            chosen = plan(graph, strategy, model)
            seconds = time.perf_counter() - started
            key = plan_key(chosen)
            if key not in ids:
                ids[key] = len(ids)
                plans[ids[key]] = chosen
                footprints[ids[key]] = footprint(chosen)
            pid = ids[key]
            predicted = chosen.cost_after
            rows.append(PlanRow(strategy, model_name, str(getattr(model, "source", "")), chosen.kernels,
                                predicted.seconds, footprints[pid],
                                profile_of(model).joules(predicted.seconds, predicted.bytes), seconds, pid))
    return rows, plans


def measure_plans(rows: Sequence[PlanRow], runners: Mapping[int, Callable[[], object]],
                  allocated: Mapping[int, int], rounds: int, min_seconds: float = 0.2) -> list[PlanRow]:
    """Rows with the median time of each plan's runner, timed round-robin (``rounds`` rounds, each at
    least ``min_seconds`` of calls per plan) so that drift on a shared machine touches all alike."""
    for run in runners.values():
        run()  # warm: first-touch pages, caches, thread pool
    medians = round_robin_medians(runners, rounds, min_seconds)
    return [replace(r, measured_seconds=medians.get(r.plan_id), runtime_peak_bytes=allocated.get(r.plan_id))
            for r in rows]


DEFAULT_STRATEGY = "greedy"  # what optimize() runs when the caller names none


def summary(rows: Sequence[PlanRow]) -> dict[str, Any]:
    """Errors of the measured rows: median and worst absolute relative error of predicted time (and
    of the prediction with tuned cores, where the tuner measured them); and the regret of the
    default strategy under each cost model: how much slower its plan measured than the fastest plan
    compared."""
    errors = [abs(e) for r in rows if (e := r.time_error) is not None]
    if not errors:
        return {"measured": 0}
    out: dict[str, Any] = {"measured": len(errors), "median_abs_time_error": float(np.median(errors)),
                           "max_abs_time_error": float(max(errors))}
    best = min(r.measured_seconds for r in rows if r.measured_seconds is not None)
    regret = {r.cost_model: r.measured_seconds / best - 1 for r in rows
              if r.strategy == DEFAULT_STRATEGY and r.measured_seconds is not None}
    if regret:
        out["best_measured_seconds"] = best
        out["default_strategy_regret"] = regret
    tuned = [abs(e) for r in rows if (e := r.tuned_time_error) is not None]
    if tuned:
        out.update(median_abs_tuned_time_error=float(np.median(tuned)), max_abs_tuned_time_error=float(max(tuned)))
    return out


def scatter_svg(rows: Sequence[PlanRow], width: int = 420, height: int = 320) -> str:
    """Predicted against measured time, one point per distinct plan, with the y = x line."""
    points = {r.plan_id: r for r in rows if r.measured_seconds is not None}
    if not points:
        return ""
    values = [v for r in points.values() for v in (r.predicted_seconds, r.measured_seconds or 0.0)]
    lo, hi = min(values) * 0.9, max(values) * 1.1
    pad = 40

    def xy(predicted: float, measured: float) -> tuple[float, float]:
        fx = (measured - lo) / (hi - lo) if hi > lo else 0.5
        fy = (predicted - lo) / (hi - lo) if hi > lo else 0.5
        return pad + fx * (width - 2 * pad), height - pad - fy * (height - 2 * pad)

    (x0, y0), (x1, y1) = xy(lo, lo), xy(hi, hi)
    marks = []
    for r in points.values():
        x, y = xy(r.predicted_seconds, r.measured_seconds or 0.0)
        label = f"plan {r.plan_id}: {r.kernels} kernels, predicted {r.predicted_seconds * 1e3:.3f} ms, " \
                f"measured {(r.measured_seconds or 0.0) * 1e3:.3f} ms"
        marks.append(f'<circle class="plan" cx="{x:.1f}" cy="{y:.1f}" r="5"><title>{label}</title></circle>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="predicted against measured time">'
            f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="#999" stroke-dasharray="4"/>'
            f'<text x="{width / 2:.0f}" y="{height - 8}" text-anchor="middle">measured (ms)</text>'
            f'<text x="12" y="{height / 2:.0f}" transform="rotate(-90 12 {height / 2:.0f})" '
            f'text-anchor="middle">predicted (ms)</text>' + "".join(marks) + "</svg>")


def html_page(title: str, rows: Sequence[PlanRow]) -> str:
    """A self-contained page: the table and, when measured, the scatter plot."""
    from html import escape

    head = ("strategy", "cost model", "kernels", "predicted ms", "predicted peak", "predicted J", "optimize s",
            "plan", "measured ms", "error")
    body = []
    for r in rows:
        err = r.time_error
        cells = (r.strategy, r.cost_model, r.kernels, f"{r.predicted_seconds * 1e3:.3f}",
                 f"{r.predicted_peak_bytes / 2**20:.2f} MiB", f"{r.predicted_joules:.4f}", f"{r.optimize_seconds:.2f}",
                 r.plan_id, "" if r.measured_seconds is None else f"{r.measured_seconds * 1e3:.3f}",
                 "" if err is None else f"{err:+.1%}")
        body.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    table = ("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>" + "".join(body) + "</table>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
            "circle.plan{fill:#3b7dd8}</style></head>"
            f"<body><h1>{escape(title)}</h1>{table}{scatter_svg(rows)}</body></html>\n")
