"""Every distinct matrix-product core of a model, timed alone in each runtime, side by side.

For each core of the compiled plan (a MatMul/Gemm or Conv shape, with the implementation the plan
uses: tuned or default), three runners time the same single op on the same data, in one process,
round after round with a pause between runners so one runtime's spinning threads do not take the
cores from the next (each block of timed runs follows untimed ones that wake the threads up, and lasts
at least BLOCK_SECONDS):

* ``autofusion``: the op compiled alone with the plan's choice for that core (tiles and threads
  as in the model);
* ``onnxruntime``: the same one-op graph as ONNX (CPU provider, the same thread count);
* ``openblas``: numpy's OpenBLAS sgemm on the core's matrices (for a convolution, the product of
  its im2col matrix with the weights, without the unfolding: a floor, not a runtime).

Each result is a median over all rounds' runs. The model's GEMM floor is its products' FLOPs at
the best rate any runner reached on any core in the run.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autofusion.bench.timing import RUNNER_PAUSE_SECONDS, wake
from autofusion.codegen.cores import CoreChoice, CoreSpec, FixedChooser, Machine
from autofusion.decide import unfused_plan
from autofusion.runtime.tuning import core_graph, core_plan

RUNNERS = ("autofusion", "onnxruntime", "openblas")
BLOCK_SECONDS = 0.05  # a 0.2 ms core timed 10 times after a pause is timed waking up, not running


@dataclass
class CoreResult:
    """One distinct core: how often the model runs it, its choice, each runner's median."""

    spec: CoreSpec
    choice: CoreChoice
    count: int
    label: str
    times_ms: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def gflop(self) -> float:
        return self.spec.flops / 1e9

    def ratio(self, other: str) -> float | None:
        """Our median over ``other``'s (below 1: ours is faster)."""
        ours, theirs = self.times_ms.get("autofusion"), self.times_ms.get(other)
        return None if ours is None or not theirs else ours / theirs

    def to_json(self) -> dict[str, Any]:
        return {"core": self.spec.describe(), "kind": self.spec.kind, "m": self.spec.m, "n": self.spec.n,
                "k": self.spec.k, "calls": self.spec.calls, "count_in_model": self.count, "variant": self.label,
                "gflop": self.gflop, "median_ms": dict(self.times_ms),
                "gflops": {r: self.gflop / (t / 1e3) for r, t in self.times_ms.items() if t > 0},
                "ratio_vs_onnxruntime": self.ratio("onnxruntime"), "ratio_vs_openblas": self.ratio("openblas"),
                "skipped": dict(self.skipped)}


def distinct_cores(kernels: Any) -> list[tuple[CoreSpec, CoreChoice, int]]:
    """(core, choice, how many kernels run it) for the rendered kernels, largest total FLOPs first."""
    counts: dict[tuple[str, CoreChoice], list[Any]] = {}
    for kernel in kernels:
        for spec, choice in kernel.cores:
            entry = counts.setdefault((spec.key(), choice), [spec, 0])
            entry[1] += 1
    out = [(spec, choice, n) for (_, choice), (spec, n) in counts.items()]
    return sorted(out, key=lambda item: -item[0].flops * item[2])


def _ours(spec: CoreSpec, choice: CoreChoice, machine: Machine, threads: int, cache: Any
          ) -> Callable[[], object]:
    from autofusion.runtime import CompiledModel

    plan, feeds = core_plan(spec)
    model = CompiledModel(plan, threads=threads, cache=cache, cores=FixedChooser(choice, machine))
    return lambda: model.run(feeds)


def _onnxruntime(spec: CoreSpec, threads: int) -> Callable[[], object]:
    import onnxruntime as ort

    from autofusion.export import to_onnx

    graph, feeds = core_graph(spec)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(to_onnx(unfused_plan(graph)).SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    return lambda: session.run(None, feeds)


def _openblas(spec: CoreSpec) -> Callable[[], object]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((spec.calls, spec.m, spec.k)).astype(np.float32)
    if spec.calls == 1:
        a2, b2 = a[0], rng.standard_normal((spec.k, spec.n)).astype(np.float32)
        return lambda: a2 @ b2
    b = rng.standard_normal((spec.calls, spec.k, spec.n)).astype(np.float32)
    return lambda: np.matmul(a, b)


def _timed(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def measure_cores(cores: list[tuple[CoreSpec, CoreChoice, int]], machine: Machine, threads: int,
                  runs: int = 10, rounds: int = 5, cache: Any = None,
                  progress: Callable[[int, int, str], None] | None = None,
                  runners: tuple[str, ...] = RUNNERS) -> list[CoreResult]:
    """Time each core in each runner: ``rounds`` rounds of at least ``runs`` runs (more for a core
    shorter than BLOCK_SECONDS / runs), runners in turn, every other round in reverse order."""
    results = []
    for i, (spec, choice, count) in enumerate(cores):
        if progress is not None:
            progress(i, len(cores), spec.describe())
        result = CoreResult(spec, choice, count, choice.label(machine, spec))
        calls: dict[str, Callable[[], object]] = {}
        for name in runners:
            try:
                if name == "autofusion":
                    calls[name] = _ours(spec, choice, machine, threads, cache)
                elif name == "onnxruntime":
                    calls[name] = _onnxruntime(spec, threads)
                else:
                    calls[name] = _openblas(spec)
            except ImportError as e:
                result.skipped[name] = f"not installed ({e.name})"
            except Exception as e:  # noqa: BLE001 - a runtime that cannot take the op is reported, not fatal
                if name == "autofusion":
                    raise
                result.skipped[name] = f"{type(e).__name__}: {str(e)[:200]}"
        samples: dict[str, list[float]] = {name: [] for name in calls}
        block: dict[str, int] = {}
        for name, fn in calls.items():  # warm up; a block of runs lasts at least BLOCK_SECONDS
            block[name] = max(runs, math.ceil(BLOCK_SECONDS / max(min(_timed(fn, 3)), 1e-7)))
        order = list(calls)
        for r in range(rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                time.sleep(RUNNER_PAUSE_SECONDS)
                wake(calls[name])  # threads that slept through the pause wake up untimed
                samples[name] += _timed(calls[name], block[name])
        result.times_ms = {name: statistics.median(s) * 1e3 for name, s in samples.items()}
        results.append(result)
    if progress is not None:
        progress(len(cores), len(cores), "done")
    return results


def gemm_floor(results: list[CoreResult]) -> dict[str, Any]:
    """The model's matrix products at the best rate seen in this run (any runner, any core)."""
    best = max(((r.gflop / (t / 1e3), name, r.spec.describe()) for r in results
                for name, t in r.times_ms.items() if t > 0), default=None)
    total_gflop = sum(r.gflop * r.count for r in results)
    if best is None:
        return {"gflop": total_gflop}
    rate, runner, core = best
    ours = sum(r.times_ms.get("autofusion", 0.0) * r.count for r in results)
    return {"gflop": total_gflop, "best_gflops": rate, "best_by": f"{runner} on {core}",
            "floor_ms": total_gflop / rate * 1e3, "cores_alone_ms": ours}


def report(results: list[CoreResult], meta: Mapping[str, Any]) -> dict[str, Any]:
    ratios = [x for x in (r.ratio("onnxruntime") for r in results) if x is not None]
    return {**meta, "cores": [r.to_json() for r in results], "floor": gemm_floor(results),
            "worst_ratio_vs_onnxruntime": max(ratios) if ratios else None}
