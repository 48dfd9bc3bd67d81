"""The benchmark loop: prepare every runner, check its outputs against the reference, measure
memory on its first run, then for each runner in turn warm up and time it, and take medians.

Each runner is timed in one block rather than round-robin: thread pools (onnxruntime's, OpenMP's)
keep spinning for a while after a run, and interleaving would charge that to the next runner.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from autofusion.bench.environment import (
    MemoryProbe,
    fix_malloc_threshold,
    limit_threads,
    load_average,
    peak_rss_delta,
    peak_traced,
)
from autofusion.bench.opaque import FUSED_METHOD, UNFUSED_METHOD, has_kernel_hook, time_ops
from autofusion.bench.runners import BenchSetup, Outputs, Runner, RunnerFactory, RunnerSkipped, prepare
from autofusion.runtime import compare_outputs

RTOL = 1e-3  # float32 through a dozen layers: GEMM libraries differ in summation order
ATOL = 1e-4
PAUSE_SECONDS = 0.5  # idle thread pools spin for up to ~0.1 s; on a CPU quota that throttles the next runner


class Progress(Protocol):
    def start(self, total: int) -> None: ...

    def step(self, description: str) -> None: ...


class NoProgress:
    """Progress that shows nothing (output is not a terminal)."""

    def start(self, total: int) -> None:
        pass

    def step(self, description: str) -> None:
        pass


@dataclass(frozen=True)
class RunnerResult:
    """One runner's measurements."""

    name: str
    median_ms: float
    times_ms: tuple[float, ...]
    peak_bytes: int | None
    peak_method: str
    kernels: int | None
    kernels_method: str
    setup_seconds: float
    max_abs_error: float
    outputs_ok: bool
    check: str
    outside_opaque_ms: float | None = None
    outside_opaque_method: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchResult:
    """All runners of one benchmark run, plus those skipped (with why) or failed (with the error)."""

    runners: tuple[RunnerResult, ...]
    skipped: dict[str, str]
    failed: dict[str, str]
    repeat: int
    warmup: int
    threads: int
    rtol: float
    atol: float
    thread_limits: tuple[str, ...]
    load_before: list[float] | None
    load_after: list[float] | None
    seconds: float

    def get(self, name: str) -> RunnerResult | None:
        return next((r for r in self.runners if r.name == name), None)

    @property
    def mismatches(self) -> list[str]:
        return [r.name for r in self.runners if not r.outputs_ok]


@dataclass
class _Live:
    runner: Runner
    first_outputs: Outputs
    probe: MemoryProbe
    measured_extra: dict[str, Any]
    times: list[float] = field(default_factory=list)


def run_bench(setup: BenchSetup, names: Sequence[str], repeat: int = 10, warmup: int = 2,
              progress: Progress | None = None, rtol: float = RTOL, atol: float = ATOL,
              pause: float = PAUSE_SECONDS, factories: Mapping[str, RunnerFactory] | None = None) -> BenchResult:
    """Measure the runners ``names`` side by side on ``setup``; ``repeat`` timed runs after ``warmup``,
    with ``pause`` seconds of rest before each runner's block. ``factories`` adds or replaces runners."""
    progress = progress or NoProgress()
    started = time.perf_counter()
    limits = limit_threads(setup.threads)
    fix_malloc_threshold()
    load_before = load_average()
    progress.start(len(names) * (2 + warmup + repeat) + 2)
    progress.step("reference outputs")
    from autofusion.ir.interpreter import run_graph

    reference = run_graph(setup.graph, setup.feeds, setup.registry)
    live: list[_Live] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    for name in names:
        progress.step(f"preparing {name}")
        try:
            runner = prepare(name, setup, factories)
            outputs, probe, extra = _first_run(runner)
        except RunnerSkipped as e:
            skipped[name] = str(e)
            progress.step(f"{name} skipped")
            continue
        except Exception as e:  # a runner that should work and did not: reported, never hidden
            failed[name] = f"{type(e).__name__}: {e}"
            progress.step(f"{name} failed")
            continue
        live.append(_Live(runner, outputs, probe, extra))
        progress.step(f"checked {name}")
    for item in live:
        time.sleep(pause)  # the previous runner's thread pools stop spinning before this one is timed
        for _ in range(warmup):
            progress.step(f"warm-up {item.runner.name}")
            item.runner.call()
        for _ in range(repeat):
            progress.step(f"timing {item.runner.name}")
            t0 = time.perf_counter()
            item.runner.call()
            item.times.append(time.perf_counter() - t0)
    results = [_result(item, reference, rtol, atol) for item in live]
    progress.step("time outside opaque cores")
    results = _with_outside_opaque(setup, results, repeat)
    return BenchResult(tuple(results), skipped, failed, repeat, warmup, setup.threads, rtol, atol, tuple(limits),
                       load_before, load_average(), time.perf_counter() - started)


def _first_run(runner: Runner) -> tuple[Outputs, MemoryProbe, dict[str, Any]]:
    box: dict[str, Outputs] = {}

    def once() -> None:
        box["out"] = runner.call()

    extra: dict[str, Any] = {}
    if runner.memory == "rss":
        probe = peak_rss_delta(once)
    elif runner.memory == "tracemalloc":
        probe = peak_traced(once)
    else:
        probe = MemoryProbe(runner.planned_peak, runner.planned_method)
        measured = peak_traced(once)  # what the Python-side buffers of this runner actually held
        extra = {"measured_peak_bytes": measured.peak_bytes, "measured_peak_method": measured.method}
    return box["out"], probe, extra


def _result(item: _Live, reference: Outputs, rtol: float, atol: float) -> RunnerResult:
    with np.errstate(divide="ignore", invalid="ignore"):  # zero tolerances divide by zero in the check
        report = compare_outputs(reference, item.first_outputs, rtol, atol)
    errors = [d.max_abs for d in report.diffs]
    times_ms = tuple(t * 1e3 for t in item.times)
    r = item.runner
    extra = dict(item.measured_extra)
    return RunnerResult(r.name, statistics.median(times_ms) if times_ms else float("nan"), times_ms,
                        item.probe.peak_bytes, item.probe.method, r.kernels, r.kernels_method, r.setup_seconds,
                        max(errors, default=0.0), report.ok, report.summary(), extra=extra)


def _with_outside_opaque(setup: BenchSetup, results: list[RunnerResult], repeat: int) -> list[RunnerResult]:
    from dataclasses import replace

    by_name = {r.name: r for r in results}
    if not ({"unfused", "fused"} & set(by_name)):
        return results
    if not has_kernel_hook():
        return [replace(r, outside_opaque_method="unavailable: the op-by-op runner offers no per-kernel hook")
                if r.name in ("unfused", "fused") else r for r in results]
    source = time_ops(setup.graph, setup.feeds, repeat, setup.threads)
    same = setup.plan.graph is setup.graph or setup.plan.graph == setup.graph
    rewritten = source if same else time_ops(setup.plan.graph, setup.feeds, repeat, setup.threads)
    out = []
    for r in results:
        if r.name == "unfused":
            r = replace(r, outside_opaque_ms=source.other_calls * 1e3, outside_opaque_method=UNFUSED_METHOD,
                        extra={**r.extra, "opaque_core_ms": source.opaque_core * 1e3,
                               "outside_opaque_best_ms": source.other_calls_best * 1e3,
                               "opaque_core_best_ms": source.opaque_core_best * 1e3})
        elif r.name == "fused":
            r = replace(r, outside_opaque_ms=r.median_ms - rewritten.opaque_core * 1e3,
                        outside_opaque_method=FUSED_METHOD,
                        extra={**r.extra, "opaque_core_ms": rewritten.opaque_core * 1e3,
                               "outside_opaque_best_ms": min(r.times_ms, default=math.nan)
                               - rewritten.opaque_core_best * 1e3,
                               "opaque_core_best_ms": rewritten.opaque_core_best * 1e3})
        out.append(r)
    return out
