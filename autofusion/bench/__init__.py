"""Benchmarks: autofusion's runtimes side by side with onnxruntime and torch, and the optimiser's speed.

>>> # from autofusion.bench import BenchSetup, run_bench
>>> # result = run_bench(BenchSetup(graph, optimize(graph), random_inputs(graph), threads=2), RUNNER_NAMES)
"""

from autofusion.bench.harness import ATOL, RTOL, BenchResult, NoProgress, RunnerResult, run_bench
from autofusion.bench.report import ratios, to_json
from autofusion.bench.runners import RUNNER_NAMES, BenchSetup, Runner, RunnerSkipped, prepare

__all__ = [
    "ATOL",
    "RTOL",
    "RUNNER_NAMES",
    "BenchResult",
    "BenchSetup",
    "NoProgress",
    "Runner",
    "RunnerResult",
    "RunnerSkipped",
    "prepare",
    "ratios",
    "run_bench",
    "to_json",
]
