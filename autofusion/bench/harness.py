"""The benchmark loop: one runner after another, each prepared, checked against the reference and
probed for memory on its first run, warmed up, timed, and summarised by medians.

Each runner is timed in one block rather than round-robin: thread pools (onnxruntime's, OpenMP's)
keep spinning for a while after a run, and interleaving would charge that to the next runner. The
command line goes further and gives each runner its own process (``isolate``): with every runtime
loaded in one process, idle pools and torch.compile's background workers slowed the others
several times over on a 2-core machine.
"""

from __future__ import annotations

import math
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from autofusion.bench.device_runners import peak_device_bytes
from autofusion.bench.environment import (
    MemoryProbe,
    fix_malloc_threshold,
    limit_threads,
    load_average,
    peak_rss_delta,
    peak_traced,
    steady_allocator,
)
from autofusion.bench.opaque import (
    FUSED_METHOD,
    FUSED_STEP_METHOD,
    UNFUSED_METHOD,
    OpTimes,
    StepTimes,
    has_kernel_hook,
    time_ops,
    time_steps,
)
from autofusion.bench.runners import BenchSetup, Outputs, Runner, RunnerFactory, RunnerSkipped, prepare
from autofusion.bench.timing import wake
from autofusion.runtime import compare_outputs

RTOL = 1e-3  # float32 through a dozen layers: GEMM libraries differ in summation order
ATOL = 1e-4
PAUSE_SECONDS = 0.5  # idle thread pools spin for up to ~0.1 s; on a CPU quota that throttles the next runner
# after the warm-up runs, untimed calls for this long: in the first ~0.1 s after a runner is set up,
# the fused lstm's runs alternated 2.1 and 6.2 ms (Xeon, 2 vCPUs) where a settled process takes 2.1
SETTLE_SECONDS = 0.2


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
    rounds: int = 1

    def get(self, name: str) -> RunnerResult | None:
        return next((r for r in self.runners if r.name == name), None)

    @property
    def mismatches(self) -> list[str]:
        return [r.name for r in self.runners if not r.outputs_ok]


@dataclass(frozen=True)
class Measured:
    """What measuring one runner gave: a result, or why it was skipped or failed."""

    name: str
    result: RunnerResult | None = None
    skipped: str | None = None
    failed: str | None = None
    op_times: OpTimes | None = None
    step_times: StepTimes | None = None


def measure(name: str, setup: BenchSetup, reference: Outputs, repeat: int, warmup: int, rtol: float, atol: float,
            factories: Mapping[str, RunnerFactory] | None = None, step: Callable[[str], None] | None = None,
            per_kernel: bool = True) -> Measured:
    """Prepare runner ``name``, check and probe its first run, warm it up, time it ``repeat`` times;
    for the unfused and fused runners also (``per_kernel``) time their graphs kernel by kernel."""
    step = step or (lambda _: None)
    step(f"preparing {name}")
    try:
        runner = prepare(name, setup, factories)
        outputs, probe, extra = _first_run(runner, setup.device)
    except RunnerSkipped as e:
        return Measured(name, skipped=str(e))
    except Exception as e:  # a runner that should work and did not: reported, never hidden
        return Measured(name, failed=f"{type(e).__name__}: {e}")
    times: list[float] = []
    with steady_allocator():  # the memory probe above ran with the fixed threshold
        for _ in range(warmup):
            step(f"warm-up {name}")
            runner.call()
        wake(runner.call, SETTLE_SECONDS)
        for _ in range(repeat):
            step(f"timing {name}")
            t0 = time.perf_counter()
            runner.call()
            times.append(time.perf_counter() - t0)
    op_times = None
    if per_kernel and name in ("unfused", "fused") and has_kernel_hook():
        step(f"kernel by kernel {name}")
        graph = setup.graph if name == "unfused" else setup.plan.graph
        op_times = time_ops(graph, setup.feeds, repeat, setup.threads)
    step_times, step_error = None, None
    if name == "fused" and op_times is not None:
        step(f"group by group {name}")
        try:
            step_times = time_steps(setup.plan, setup.feeds, repeat, setup.threads)
        except Exception as e:  # the profiling build is extra: the estimate stands in, and the reason is kept
            step_error = f"{type(e).__name__}: {e}"
    result = _result(runner, outputs, probe, extra, times, reference, rtol, atol)
    if step_error is not None:
        result = replace(result, extra={**result.extra, "profiling_build_error": step_error})
    return Measured(name, result, op_times=op_times, step_times=step_times)


def run_bench(setup: BenchSetup, names: Sequence[str], repeat: int = 10, warmup: int = 2,
              progress: Progress | None = None, rtol: float = RTOL, atol: float = ATOL,
              pause: float = PAUSE_SECONDS, factories: Mapping[str, RunnerFactory] | None = None,
              isolate: bool = False, rounds: int = 1) -> BenchResult:
    """Measure the runners ``names`` one after another on ``setup``: ``repeat`` timed runs after
    ``warmup``, with ``pause`` seconds of rest before each. ``factories`` adds or replaces runners
    (in this process only). With ``isolate`` each runner runs in a fresh worker process, so no other
    runtime's thread pools or background work share the machine with it. With ``rounds`` > 1 the
    whole sequence runs again, in reverse order every other round, and each runner's timed runs are
    pooled: on a shared machine whose speed drifts over minutes, every runner then samples the same
    stretches of time instead of only its own."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    progress = progress or NoProgress()
    started = time.perf_counter()
    limits = limit_threads(setup.threads)
    fix_malloc_threshold()
    load_before = load_average()
    progress.start(rounds * len(names) * (3 + warmup + repeat) + 1)
    progress.step("reference outputs")
    from autofusion.ir.interpreter import run_graph

    reference = run_graph(setup.graph, setup.feeds, setup.registry)
    by_name: dict[str, list[Measured]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="autofusion-bench-") as tmp:
        job = Path(tmp) / "job.pkl"
        if isolate:
            write_job(job, setup, reference, repeat, warmup, rtol, atol)
        for round_ in range(rounds):
            for name in (names if round_ % 2 == 0 else list(reversed(names))):
                time.sleep(pause)  # the previous runner's thread pools stop spinning before this one starts
                if isolate:
                    progress.step(f"{name} (in its own process)")
                    by_name[name].append(measure_in_worker(job, name, per_kernel=round_ == 0))
                else:  # kernel-by-kernel times come from the first round (pooled_rounds keeps its)
                    by_name[name].append(measure(name, setup, reference, repeat, warmup, rtol, atol, factories,
                                                 progress.step, per_kernel=round_ == 0))
    measured = [pooled_rounds(by_name[name]) for name in names]
    results = _with_outside_opaque([m.result for m in measured if m.result is not None],
                                   {m.name: m.op_times for m in measured if m.op_times is not None},
                                   {m.name: m.step_times for m in measured if m.step_times is not None})
    return BenchResult(tuple(results), {m.name: m.skipped for m in measured if m.skipped is not None},
                       {m.name: m.failed for m in measured if m.failed is not None}, repeat, warmup, setup.threads,
                       rtol, atol, tuple(limits), load_before, load_average(), time.perf_counter() - started,
                       rounds)


STDERR_LINES = 8  # of a crashed worker's output kept in its failure


def write_job(path: Path, setup: BenchSetup, reference: Outputs, repeat: int, warmup: int, rtol: float,
              atol: float) -> None:
    job = {"graph": setup.graph, "plan": setup.plan, "feeds": setup.feeds, "threads": setup.threads,
           "reference": dict(reference), "repeat": repeat, "warmup": warmup, "rtol": rtol, "atol": atol}
    with open(path, "wb") as f:
        pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)


def measure_in_worker(job: Path, name: str, per_kernel: bool = True) -> Measured:
    """Run the worker for runner ``name`` on the job file; a crashed worker is a failed runner."""
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    out = job.with_name(f"{name}.result.pkl")
    r = subprocess.run([sys.executable, "-m", "autofusion.bench.worker", str(job), name, str(out),
                        *([] if per_kernel else ["--no-per-kernel"])],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0 or not out.exists():
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-STDERR_LINES:])
        return Measured(name, failed=f"worker process exited with status {r.returncode}: {tail}")
    with open(out, "rb") as f:
        measured: Measured = pickle.load(f)
    return measured


def pooled_rounds(rounds: Sequence[Measured]) -> Measured:
    """One runner's rounds as one measurement: every timed run pooled (median over all), the worst
    error; the first round's memory, kernels and per-kernel times (only the first round times
    kernels one by one). A round that failed or was skipped makes the runner failed or skipped."""
    for m in rounds:
        if m.failed is not None or m.skipped is not None:
            return m
    first = rounds[0]
    if len(rounds) == 1 or first.result is None:
        return first
    results = [m.result for m in rounds if m.result is not None]
    times = tuple(t for r in results for t in r.times_ms)
    worst = next((r for r in results if not r.outputs_ok), max(results, key=lambda r: r.max_abs_error))
    pooled = replace(first.result, median_ms=statistics.median(times), times_ms=times,
                     max_abs_error=worst.max_abs_error, outputs_ok=worst.outputs_ok, check=worst.check,
                     extra={**first.result.extra, "round_medians_ms": [r.median_ms for r in results]})
    return replace(first, result=pooled)


def _first_run(runner: Runner, device: str) -> tuple[Outputs, MemoryProbe, dict[str, Any]]:
    box: dict[str, Outputs] = {}

    def once() -> None:
        box["out"] = runner.call()

    extra: dict[str, Any] = {}
    if runner.memory == "device":
        probe = MemoryProbe(*peak_device_bytes(once, device))
    elif runner.memory == "rss":
        probe = peak_rss_delta(once)
    elif runner.memory == "tracemalloc":
        once()  # untraced: one-time caches (imports, lookup tables) are not activations
        probe = peak_traced(once)
    else:
        probe = MemoryProbe(runner.planned_peak, runner.planned_method)
        measured = peak_traced(once)  # what the Python-side buffers of this runner actually held
        extra = {"measured_peak_bytes": measured.peak_bytes, "measured_peak_method": measured.method}
    return box["out"], probe, {**extra, **(runner.reported or {})}


def _result(r: Runner, outputs: Outputs, probe: MemoryProbe, extra: dict[str, Any], times: list[float],
            reference: Outputs, rtol: float, atol: float) -> RunnerResult:
    with np.errstate(divide="ignore", invalid="ignore"):  # zero tolerances divide by zero in the check
        report = compare_outputs(reference, outputs, rtol, atol)
    errors = [d.max_abs for d in report.diffs]
    times_ms = tuple(t * 1e3 for t in times)
    return RunnerResult(r.name, statistics.median(times_ms) if times_ms else float("nan"), times_ms,
                        probe.peak_bytes, probe.method, r.kernels, r.kernels_method, r.setup_seconds,
                        max(errors, default=0.0), report.ok, report.summary(), extra=dict(extra))


def _with_outside_opaque(results: list[RunnerResult], op_times: Mapping[str, OpTimes],
                         step_times: Mapping[str, StepTimes] | None = None) -> list[RunnerResult]:
    """Unfused: its non-opaque kernels, measured. Fused: its groups clocked in a profiling build
    (kernels around a core less that core); without one, its median minus its plan's opaque cores."""

    out = []
    for r in results:
        t = op_times.get(r.name)
        if r.name in ("unfused", "fused") and t is None:
            r = replace(r, outside_opaque_method="unavailable: the op-by-op runner offers no per-kernel hook")
        elif r.name == "unfused" and t is not None:
            r = replace(r, outside_opaque_ms=t.other_calls * 1e3, outside_opaque_method=UNFUSED_METHOD,
                        extra={**r.extra, "opaque_core_ms": t.opaque_core * 1e3,
                               "outside_opaque_best_ms": t.other_calls_best * 1e3,
                               "opaque_core_best_ms": t.opaque_core_best * 1e3})
        elif r.name == "fused" and t is not None:
            extra = {**r.extra, "opaque_core_ms": t.opaque_core * 1e3, "opaque_core_best_ms": t.opaque_core_best * 1e3,
                     "outside_opaque_estimate_ms": r.median_ms - t.opaque_core * 1e3}
            steps = (step_times or {}).get("fused")
            if steps is None:
                r = replace(r, outside_opaque_ms=r.median_ms - t.opaque_core * 1e3, outside_opaque_method=FUSED_METHOD,
                            extra={**extra, "outside_opaque_best_ms":
                                   min(r.times_ms, default=math.nan) - t.opaque_core_best * 1e3})
            else:
                r = replace(r, outside_opaque_ms=(steps.other + max(0.0, steps.opaque - t.opaque_core)) * 1e3,
                            outside_opaque_method=FUSED_STEP_METHOD,
                            extra={**extra, "outside_opaque_best_ms":
                                   (steps.other_best + max(0.0, steps.opaque_best - t.opaque_core_best)) * 1e3,
                                   "kernels_without_core_ms": steps.other * 1e3,
                                   "kernels_with_core_ms": steps.opaque * 1e3})
        out.append(r)
    return out
