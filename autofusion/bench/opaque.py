"""Time spent outside the opaque compute cores (MatMul, Gemm, Conv, ...): what fusion can remove.

The op-by-op runner is timed kernel by kernel. Its time outside opaque cores is the sum of its
non-opaque kernels. The fused SuperKernel is timed step by step in a profiling build (``af_run``
clocks each group): kernels without an opaque core count whole; a kernel around a core (a GEMM
with its epilogue) counts what it takes beyond that core, timed alone on the plan's own graph.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autofusion.codegen.buffers import BufferPlan
from autofusion.decide.plan import Plan
from autofusion.graph.graph import Graph
from autofusion.runtime import UnfusedRunner

MIN_OP_RUNS = 3  # a median of fewer samples does not reject a run where a thread was descheduled
OPAQUE_CORES = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "LSTM"})

UNFUSED_METHOD = ("measured: the op-by-op runner timed per kernel call (output allocation included), the medians "
                  "of its non-opaque kernels summed")
FUSED_METHOD = ("estimate: the fused median minus the opaque cores' time (the compiled MatMul/Gemm/Conv functions "
                "of the plan's graph timed one by one)")
FUSED_STEP_METHOD = ("measured per kernel: a profiling build of the SuperKernel clocks every group; groups without "
                     "an opaque core summed (medians), plus what the groups around a core take beyond the cores "
                     "timed alone")


def planned_buffers(runner: UnfusedRunner) -> BufferPlan:
    """The runtime's buffer plan for the runner's (unfused) plan."""
    from autofusion.codegen.superkernel import kernel_buffers

    return kernel_buffers(runner.plan, runner.source.kernels)


class TimedUnfusedRunner(UnfusedRunner):
    """An UnfusedRunner that records, per kernel, the seconds of each call as the runner makes it
    (output allocation and argument passing included) and of the compiled function alone."""

    def __init__(self, graph: Graph, **kwargs: Any) -> None:
        super().__init__(graph, **kwargs)
        self.call_seconds: dict[str, list[float]] = {}
        self.kernel_seconds: dict[str, list[float]] = {}

    def _call(self, k: Any, fn: Any, derived: list[np.ndarray], env: dict[str, np.ndarray], nt: int) -> None:
        inner = self.kernel_seconds.setdefault(k.group.name, [])

        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            rc = fn(*args)
            inner.append(time.perf_counter() - t0)
            return rc

        t0 = time.perf_counter()
        super()._call(k, timed, derived, env, nt)
        self.call_seconds.setdefault(k.group.name, []).append(time.perf_counter() - t0)


def has_kernel_hook() -> bool:
    """Whether the runtime's op-by-op runner still calls each kernel through ``_call``."""
    return callable(getattr(UnfusedRunner, "_call", None))


@dataclass(frozen=True)
class OpTimes:
    """Per-kernel medians of op-by-op runs, summed: opaque cores (compiled function alone) and the
    other kernels (each call as the runner makes it)."""

    opaque_core: float
    other_calls: float
    kernels_opaque: int
    kernels_other: int
    opaque_core_best: float = 0.0  # the same sums over per-kernel minima: what an idle machine approaches
    other_calls_best: float = 0.0


def time_ops(graph: Graph, feeds: Mapping[str, np.ndarray], repeat: int, threads: int,
             plan: Plan | None = None) -> OpTimes:
    """Run ``graph`` (or ``plan``'s groups) op by op: one untimed run (first-touch page faults,
    thread start-up), then ``repeat`` runs (at least 3); per-kernel medians summed."""
    runner = TimedUnfusedRunner(graph, threads=threads, plan=plan)
    runner.run(feeds)
    runner.call_seconds.clear()
    runner.kernel_seconds.clear()
    for _ in range(max(MIN_OP_RUNS, repeat)):
        runner.run(feeds)
    g = runner.graph
    opaque = other = opaque_best = other_best = 0.0
    n_opaque = n_other = 0
    for group in runner.plan.groups:
        calls, cores = runner.call_seconds.get(group.name), runner.kernel_seconds.get(group.name)
        if not calls or not cores:
            continue
        if any(g.node_by_name[n].op in OPAQUE_CORES for n in group.nodes):
            opaque += statistics.median(cores)
            opaque_best += min(cores)
            n_opaque += 1
        else:
            other += statistics.median(calls)
            other_best += min(calls)
            n_other += 1
    return OpTimes(opaque, other, n_opaque, n_other, opaque_best, other_best)


@dataclass(frozen=True)
class StepTimes:
    """Per-group medians (and minima) of a profiled SuperKernel, summed: groups holding an opaque
    core, and the others."""

    opaque: float
    other: float
    opaque_best: float
    other_best: float


def time_steps(plan: Plan, feeds: Mapping[str, np.ndarray], repeat: int, threads: int) -> StepTimes:
    """Run a profiling build of ``plan``'s SuperKernel: one untimed run, then ``repeat`` (at least
    3); per-group medians and minima summed by kind."""
    from autofusion.runtime import CompiledModel

    model = CompiledModel(plan, threads=threads, profile=True)
    model.run(feeds)
    samples = model.step_samples(feeds, max(MIN_OP_RUNS, repeat))
    g = plan.graph
    opaque = other = opaque_best = other_best = 0.0
    for group in plan.groups:
        times = samples.get(group.name)
        if not times:
            continue
        if any(g.node_by_name[n].op in OPAQUE_CORES for n in group.nodes):
            opaque += statistics.median(times)
            opaque_best += min(times)
        else:
            other += statistics.median(times)
            other_best += min(times)
    return StepTimes(opaque, other, opaque_best, other_best)
