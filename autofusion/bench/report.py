"""A benchmark run as one JSON object and as tables: medians, memory, kernels and the ratios."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autofusion.bench.harness import BenchResult, RunnerResult
from autofusion.bench.runners import RUNNER_NAMES


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _ratio(a: float | int | None, b: float | int | None) -> float | None:
    if a is None or b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def _best(r: RunnerResult) -> float | None:
    return min(r.times_ms) if r.times_ms else None


def ratios(result: BenchResult) -> dict[str, Any]:
    """How the fused runner compares: speedups (other median / fused median), memory and kernels."""
    fused = result.get("fused")
    out: dict[str, Any] = {}
    if fused is None:
        return out
    speedup = {r.name: _ratio(r.median_ms, fused.median_ms) for r in result.runners if r.name != "fused"}
    out["fused_speedup"] = {k: v for k, v in speedup.items() if v is not None}
    best = {r.name: _ratio(_best(r), _best(fused)) for r in result.runners if r.name != "fused"}
    out["fused_speedup_best"] = {k: v for k, v in best.items() if v is not None}  # on each runner's fastest run
    unfused = result.get("unfused")
    if unfused is not None:
        pairs = {
            "outside_opaque_unfused_over_fused": _ratio(unfused.outside_opaque_ms, fused.outside_opaque_ms),
            "outside_opaque_best_unfused_over_fused": _ratio(unfused.extra.get("outside_opaque_best_ms"),
                                                             fused.extra.get("outside_opaque_best_ms")),
            "peak_bytes_fused_over_unfused": _ratio(fused.peak_bytes, unfused.peak_bytes),
            "kernels_fused_over_unfused": _ratio(fused.kernels, unfused.kernels),
        }
        out.update({k: v for k, v in pairs.items() if v is not None})
    ort_all = result.get("ort_all")
    if ort_all is not None:
        k = _ratio(fused.kernels, ort_all.kernels)
        if k is not None:
            out["kernels_fused_over_ort_all"] = k
    return out


def runner_json(r: RunnerResult) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "median_ms": _num(r.median_ms),
        "peak_bytes": r.peak_bytes,
        "kernels": r.kernels,
        "min_ms": _num(min(r.times_ms)) if r.times_ms else None,
        "times_ms": [_num(t) for t in r.times_ms],
        "peak_method": r.peak_method,
        "kernels_method": r.kernels_method,
        "setup_s": r.setup_seconds,
        "max_abs_error": _num(r.max_abs_error),
        "outputs_ok": r.outputs_ok,
        "check": r.check,
    }
    if r.name in ("unfused", "fused"):
        entry["outside_opaque_ms"] = _num(r.outside_opaque_ms) if r.outside_opaque_ms is not None else None
        entry["outside_opaque_method"] = r.outside_opaque_method
    for k, v in r.extra.items():
        entry[k] = _num(v) if isinstance(v, float) else v
    return entry


def to_json(result: BenchResult, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The whole run; ``meta`` adds what the caller knows (model, sizes, plan summary, machine)."""
    fused = result.get("fused")
    return {
        **meta,
        "threads": result.threads,
        "repeat": result.repeat,
        "rounds": result.rounds,
        "warmup": result.warmup,
        "runners": {r.name: runner_json(r) for r in sorted(result.runners, key=_order)},
        "skipped": dict(result.skipped),
        "failed": dict(result.failed),
        "max_abs_error": _num(fused.max_abs_error) if fused is not None else None,
        "outputs_ok": not result.mismatches and not result.failed,
        "mismatches": result.mismatches,
        "tolerance": {"rtol": result.rtol, "atol": result.atol},
        "ratios": ratios(result),
        "thread_limits": list(result.thread_limits),
        "load_average_before": result.load_before,
        "load_average_after": result.load_after,
        "seconds": result.seconds,
    }


def _order(r: RunnerResult) -> tuple[int, str]:
    return (RUNNER_NAMES.index(r.name) if r.name in RUNNER_NAMES else len(RUNNER_NAMES), r.name)


def short_method(method: str) -> str:
    """``planned``, ``rss``, ``tracemalloc``: the word before the explanation."""
    return method.split(":", 1)[0] if method else ""
