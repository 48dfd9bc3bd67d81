"""A calibration run: time random kernels and regions, fit both cost models, score them held out.

1. Measure the call overhead and the launch cost (:mod:`autofusion.calibrate.measure`).
2. Time random kernels (each a whole small graph run as one group) until the kernel share of the
   budget or the kernel count is used up.
3. Time alternative plans of random regions (all fused, each node alone, two halves) in the rest.
4. Hold out a share of the kernels; fit the analytic profile and the learned correction on the
   others; report Kendall tau and median relative error on the held-out kernels, and how often each
   model orders two plans of the same region like the measurement.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autofusion.calibrate.fit import accuracy, fit_profile, pair_agreement
from autofusion.calibrate.measure import Timer, TimingOptions, plan_of
from autofusion.calibrate.opcosts import measure_op_seconds
from autofusion.calibrate.specs import alternatives, random_feeds, random_kernel
from autofusion.codegen.errors import CodegenError
from autofusion.decide.cost import AnalyticCostModel, CostModel, HardwareProfile
from autofusion.decide.learned import Calibration, LearnedCostModel, fit_learned, group_features
from autofusion.graph.graph import FrozenMap
from autofusion.ir import Graph
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry
from autofusion.runtime import CompileCache, CompileError, detect_toolchain

TARGET_TAU = 0.8
KERNEL_SHARE = 0.75  # of the budget, for single kernels; the rest times regions
OP_COST_SHARE = 0.1  # per-op costs are timed only if the call overhead took less of the budget
MIN_KERNELS = 8
CLEAR_RATIO = 1.25  # plans whose measured times differ by this much: a decision that matters
RENDER_ERRORS = (CodegenError, CompileError)  # a group the backend cannot build is skipped

Progress = Callable[[str, int, int], None]  # (what is being timed, done, total)


class CalibrationError(ValueError):
    """The run could not measure enough to fit (budget too small, no working compiler)."""


@dataclass(frozen=True)
class CalibrationOptions:
    """What to measure and how long; ``budget_seconds`` bounds the whole run (fits excluded)."""

    budget_seconds: float = 150.0
    kernels: int = 400
    regions: int = 60
    max_elements: int = 1 << 22
    holdout: float = 0.25
    seed: int = 0
    name: str = "cpu-2core"
    prior: str = "cpu-2core"
    timing: TimingOptions = field(default_factory=TimingOptions)
    op_costs: bool = True  # time one-op kernels for the per-element cost of each pointwise op
    cache_dir: str | None = None


@dataclass(frozen=True)
class KernelSample:
    kind: str
    graph: Graph
    seconds: float


@dataclass(frozen=True)
class RegionSample:
    graph: Graph
    partitions: tuple[tuple[tuple[str, ...], ...], ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class Measurements:
    kernels: tuple[KernelSample, ...]
    regions: tuple[RegionSample, ...]
    launch_seconds: float
    skipped: int
    seconds: float
    threads: int = 1
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute load at the start and at the end
    op_seconds: tuple[tuple[str, float], ...] = ()  # compute seconds per element of pointwise ops


def measure(options: CalibrationOptions, progress: Progress | None = None) -> Measurements:
    """Time kernels and region plans within ``options.budget_seconds``."""
    started = time.monotonic()
    load_at_start = _load()
    deadline = started + options.budget_seconds
    timer = Timer(CompileCache(options.cache_dir), options.timing)
    rng = np.random.default_rng(options.seed)
    total = options.kernels + options.regions
    report = progress or (lambda what, done, total: None)
    report("call overhead", 0, total)
    try:
        overhead = timer.measure_overhead()
    except CompileError as e:
        raise CalibrationError(f"cannot compile calibration kernels: {e}") from None
    op_seconds: dict[str, float] = {}
    if options.op_costs and time.monotonic() < started + options.budget_seconds * OP_COST_SHARE:
        op_seconds = measure_op_seconds(timer, lambda what: report(what, 0, total))
    kernels: list[KernelSample] = []
    skipped = 0
    kernel_deadline = started + options.budget_seconds * KERNEL_SHARE
    while len(kernels) < options.kernels and time.monotonic() < kernel_deadline:
        spec = random_kernel(rng, options.max_elements)
        report(spec.label, len(kernels), total)
        try:
            seconds = timer.net(plan_of(spec.graph, [[n.name for n in spec.graph.nodes]]),
                                random_feeds(spec.graph, rng))
        except RENDER_ERRORS:
            skipped += 1
            continue
        kernels.append(KernelSample(spec.kind, spec.graph, seconds))
    regions: list[RegionSample] = []
    while len(regions) < options.regions and time.monotonic() < deadline:
        spec = random_kernel(rng, options.max_elements)
        report(f"region {spec.label}", len(kernels) + len(regions), total)
        feeds = random_feeds(spec.graph, rng)
        parts = alternatives(spec.graph)
        try:
            times = tuple(timer.net(plan_of(spec.graph, p), feeds) for p in parts)
        except RENDER_ERRORS:
            skipped += 1
            continue
        regions.append(RegionSample(spec.graph, tuple(tuple(tuple(g) for g in p) for p in parts), times))
    report("done", total, total)
    return Measurements(tuple(kernels), tuple(regions), overhead.launch, skipped, time.monotonic() - started,
                        timer.threads, (load_at_start, _load()), tuple(sorted(op_seconds.items())))


def _predict(model: CostModel, graph: Graph, partition: Sequence[Sequence[str]]) -> float:
    return sum(model.group_cost(graph, list(part)).seconds for part in partition)


def fit(data: Measurements, options: CalibrationOptions, registry: OpRegistry | None = None) -> Calibration:
    """Fit both models on the training kernels and score them on the held-out kernels and regions."""
    registry = registry or default_registry()
    if len(data.kernels) < MIN_KERNELS:
        raise CalibrationError(f"measured {len(data.kernels)} kernels, need at least {MIN_KERNELS}: "
                               f"raise --budget or --kernels")
    order = np.random.default_rng(options.seed + 1).permutation(len(data.kernels))
    n_test = min(len(order) - 4, max(2, int(round(len(order) * options.holdout))))
    test = [data.kernels[i] for i in order[:n_test]]
    train = [data.kernels[i] for i in order[n_test:]]
    prior = HardwareProfile.load(options.prior)
    prior = prior.replace(op_seconds=FrozenMap(data.op_seconds)) if data.op_seconds else prior
    work_model = AnalyticCostModel(prior, registry)

    def whole(s: KernelSample) -> list[str]:
        return [n.name for n in s.graph.nodes]

    train_terms = [work_model.terms(s.graph, whole(s)) for s in train]
    description = (f"fitted by `autofusion calibrate` on {len(train)} kernels measured on {_cpu_name()} "
                   f"({os.cpu_count()} cores; kernels on {data.threads} thread(s), {options.timing.statistic} of "
                   f"repeats) on {datetime.date.today().isoformat()}")
    profile = fit_profile(train_terms, [s.seconds for s in train], prior, data.launch_seconds, options.name,
                          description)
    analytic = AnalyticCostModel(profile, registry)
    rows, target = [], []
    for s, terms in zip(train, train_terms):
        work = analytic.work(s.graph)
        rows.append(group_features(s.graph, whole(s), work, terms, profile, registry))
        target.append(np.log(s.seconds / analytic.group_cost(s.graph, whole(s)).seconds))
    learned_params = fit_learned(np.array(rows), np.array(target))
    models: dict[str, CostModel] = {"analytic": analytic, "learned": LearnedCostModel(learned_params, profile, registry)}
    report: dict[str, object] = {"heldout_kernels": len(test), "train_kernels": len(train),
                                 "regions": len(data.regions), "target_tau": TARGET_TAU}
    measured = [s.seconds for s in test]
    for kind, model in models.items():
        acc = accuracy([model.group_cost(s.graph, whole(s)).seconds for s in test], measured)
        predicted = [[_predict(model, r.graph, p) for p in r.partitions] for r in data.regions]
        agree, pairs = pair_agreement(predicted, [r.seconds for r in data.regions])
        clear, clear_pairs = pair_agreement(predicted, [r.seconds for r in data.regions], CLEAR_RATIO)
        report[kind] = {**acc.to_json(), "pair_agreement": agree, "pairs": pairs,
                        "pair_agreement_clear": clear, "pairs_clear": clear_pairs, "name": model.name}
    report["target_met"] = bool(report["learned"]["kendall_tau"] >= TARGET_TAU)  # type: ignore[index]
    default = _choose(report)
    report["default_model"] = default
    machine = {"cpu": _cpu_name(), "cores": os.cpu_count(), "threads": data.threads,
               "statistic": options.timing.statistic, "load_average": data.load_average,
               "machine": platform.machine(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "measure_seconds": round(data.seconds, 1), "kernels_skipped": data.skipped,
               "max_elements": options.max_elements, "seed": options.seed, **_toolchain(),
               "kinds": {k: sum(1 for s in data.kernels if s.kind == k) for k in sorted({s.kind for s in data.kernels})}}
    return Calibration(profile, learned_params, default, report, machine)


def _choose(report: dict[str, object]) -> str:
    """The model the engine uses by default: the learned one unless it orders held-out kernels and
    region plans worse than the analytic one."""
    def score(kind: str) -> float:
        r = report[kind]
        assert isinstance(r, dict)
        return float(r["kendall_tau"]) + (float(r["pair_agreement"]) if r["pairs"] else 0.0)

    return "learned" if score("learned") >= score("analytic") else "analytic"


def calibrate(options: CalibrationOptions | None = None, progress: Progress | None = None,
              registry: OpRegistry | None = None) -> Calibration:
    """Measure with ``options`` and fit: the :class:`Calibration` to save and load."""
    options = options or CalibrationOptions()
    return fit(measure(options, progress), options, registry)


def _toolchain() -> dict[str, str]:
    """The compiler and flags the kernels were built with: a calibration is stale once they change."""
    try:
        tc = detect_toolchain()
    except CompileError:
        return {}
    return {"compiler": tc.version, "cflags": " ".join(tc.cflags)}


def _load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
