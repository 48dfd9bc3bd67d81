"""Timing compiled plans with the C backend, net of the Python cost of calling them.

A plan is compiled with :class:`CompiledModel` (and run once through it, which checks the feeds),
then timed by calling its SuperKernel entry point ``af_run`` in batches with buffers allocated
once, so Python costs a single ctypes call per run. A plan's time is the median (or minimum) over
the batches, less the cost of a call around a one-element kernel. The launch cost of a kernel is
the time one more one-element kernel adds to a plan.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder
from autofusion.runtime import CompileCache, CompiledModel, default_threads

MIN_SECONDS = 1e-8  # floor of a net time: below what subtracting the call overhead resolves
BATCH_SECONDS = 2e-4  # runs timed together, so that the timer's own cost does not count


STATISTICS = ("median", "min")


@dataclass(frozen=True)
class TimingOptions:
    """How to time each plan: repeats until ``target_seconds`` of runs, within the bounds, summed up
    by ``statistic``: the median, or the minimum, which on a machine busy with other work is the
    steadier estimate of what the kernel itself costs (other processes only ever add time)."""

    target_seconds: float = 0.05
    min_repeats: int = 5
    max_repeats: int = 400
    threads: int | None = None
    statistic: str = "median"

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ValueError(f"timing statistic {self.statistic!r} is not one of {', '.join(STATISTICS)}")


def plan_of(graph: Graph, partition: Sequence[Sequence[str]]) -> Plan:
    """A plan running each part of ``partition`` as one kernel (templates chosen from the ops)."""
    return Plan(graph, build_groups(graph, [list(p) for p in partition]), ZERO_COST, ZERO_COST, strategy="calibration")


class NativeRunner:
    """Calls a compiled plan's ``af_run`` (the SuperKernel's C entry point) with buffers allocated
    once, so a timed call costs the kernels and one ctypes call, not the Python checks of
    :meth:`CompiledModel.run`. The model is run once first and must have succeeded."""

    def __init__(self, model: CompiledModel, feeds: Mapping[str, np.ndarray], threads: int) -> None:
        graph = model.plan.graph
        model.run(feeds)  # checks the feeds and the library once, the public way
        inputs = [np.ascontiguousarray(feeds[name], dtype=graph.types[name].dtype.numpy) for name in graph.inputs]
        constants = [np.ascontiguousarray(a) for _, a in model.source.constants]
        outputs = [np.empty(graph.types[o].shape, graph.types[o].dtype.numpy) for o in graph.outputs]
        buffers = model.source.buffers
        workspace = np.empty(max(64, buffers.workspace_bytes if buffers else 0) + 64, np.uint8)
        lib = ctypes.CDLL(str(model.library_path))
        lib.af_create.restype = ctypes.c_void_p
        lib.af_create.argtypes = [ctypes.c_void_p]
        lib.af_destroy.argtypes = [ctypes.c_void_p]
        lib.af_run.restype = ctypes.c_int
        lib.af_run.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
        pointers = (_pointers(inputs), _pointers(outputs), _pointers(constants))
        self._keep = (inputs, constants, outputs, workspace, pointers)  # alive as long as the context
        self._ctx = lib.af_create(ctypes.cast(pointers[2], ctypes.c_void_p))
        if not self._ctx:
            raise MemoryError("af_create could not allocate its context")
        self._lib = lib
        aligned = workspace.ctypes.data + (-workspace.ctypes.data) % 64
        self._args = (self._ctx, ctypes.cast(pointers[0], ctypes.c_void_p), ctypes.cast(pointers[1], ctypes.c_void_p),
                      ctypes.c_void_p(aligned), threads)
        if self._lib.af_run(*self._args) != 0:
            raise RuntimeError(f"af_run of {graph.name} failed")

    def batch(self, calls: int) -> float:
        """Seconds of ``calls`` back-to-back runs."""
        run, args = self._lib.af_run, self._args
        start = time.perf_counter()
        for _ in range(calls):
            run(*args)
        return time.perf_counter() - start

    def close(self) -> None:
        if self._ctx:
            self._lib.af_destroy(self._ctx)
            self._ctx = None


def _pointers(arrays: Sequence[np.ndarray]) -> ctypes.Array[ctypes.c_void_p]:
    return (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])


def run_seconds(runner: NativeRunner, options: TimingOptions) -> float:
    """Seconds per run: the median (or minimum) over batches of runs, each batch at least
    ``BATCH_SECONDS`` long, until ``options.target_seconds`` of runs (within the repeat bounds)."""
    runner.batch(1)
    once = max(runner.batch(1), 1e-8)
    calls = max(1, int(BATCH_SECONDS / once))
    batches = int(min(options.max_repeats, max(options.min_repeats, options.target_seconds / (once * calls))))
    samples = [runner.batch(calls) / calls for _ in range(batches)]
    return min(samples) if options.statistic == "min" else statistics.median(samples)


@dataclass(frozen=True)
class CallOverhead:
    """Seconds of one ``af_run`` call around its kernels; ``launch`` is what one more tiny kernel adds."""

    call: float
    launch: float

    def net(self, measured: float) -> float:
        """``measured`` less the call overhead."""
        return max(MIN_SECONDS, measured - self.call)


class Timer:
    """Compiles plans into ``cache`` and times them with ``options``."""

    def __init__(self, cache: CompileCache | None = None, options: TimingOptions | None = None) -> None:
        self.cache = cache or CompileCache()
        self.options = options or TimingOptions()
        self.threads = default_threads(self.options.threads)
        self.overhead = CallOverhead(0.0, 0.0)

    def compile(self, plan: Plan) -> CompiledModel:
        return CompiledModel(plan, threads=self.threads, cache=self.cache)

    def gross(self, plan: Plan, feeds: Mapping[str, np.ndarray]) -> float:
        """Seconds of one ``af_run`` call (by the options' statistic), call overhead included."""
        runner = NativeRunner(self.compile(plan), feeds, self.threads)
        try:
            return run_seconds(runner, self.options)
        finally:
            runner.close()

    def net(self, plan: Plan, feeds: Mapping[str, np.ndarray]) -> float:
        """Seconds of the plan's kernels: the call overhead subtracted."""
        return self.overhead.net(self.gross(plan, feeds))

    def measure_overhead(self) -> CallOverhead:
        """Measure the call overhead (a one-element kernel) and the launch cost (what seven more
        one-element kernels add to a fused chain of eight), and keep them."""
        b = GraphBuilder("overhead_chain")
        t = b.input("x", (1,))
        for _ in range(8):
            t = b.op("Relu", t)
        chain = b.build([t])
        names = [n.name for n in chain.nodes]
        feeds = {"x": np.zeros((1,), np.float32)}
        fused = min(self.gross(plan_of(chain, [names]), feeds) for _ in range(3))
        apart = min(self.gross(plan_of(chain, [[n] for n in names]), feeds) for _ in range(3))
        self.overhead = CallOverhead(fused, max(0.0, (apart - fused) / (len(names) - 1)))
        return self.overhead
