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
import math
import os
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autofusion.calibrate.caches import ReadSample, contended, measured_levels, probe_reads
from autofusion.calibrate.fit import accuracy, fit_profile, pair_agreement
from autofusion.calibrate.measure import Timer, TimingOptions, plan_of
from autofusion.calibrate.models import DEFAULT_CASES, PlanSample, RegionPair, measure_case, region_pairs
from autofusion.calibrate.opcosts import measure_op_seconds
from autofusion.calibrate.specs import alternatives, random_feeds, random_kernel
from autofusion.codegen.cores import cache_levels, cpu_model
from autofusion.codegen.errors import CodegenError
from autofusion.decide.cost import AnalyticCostModel, CacheLevel, CostModel, HardwareProfile
from autofusion.decide.learned import Calibration, LearnedCostModel, LearnedParams, fit_learned, group_features
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
MODEL_CLEAR_RATIO = 1.10  # the same for the pairs of plans of one region of a real model
MISORDERED_LISTED = 20  # clear pairs a model orders wrong, kept in the report
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
    model_cases: tuple[str, ...] = DEFAULT_CASES  # built-in models whose kernels are timed where they run
    model_runs: int = 15  # profiled runs of each of their plans
    read_probe: bool = True  # time reads of growing buffers for the cache levels' real sizes and speeds


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
    plans: tuple[PlanSample, ...] = ()  # real models' plans, each group's step timed
    model_seconds: float = 0.0  # what timing them took (outside the budget)
    read_samples: tuple[ReadSample, ...] = ()  # the memory probe's (caches.py), empty where not run


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
    read_samples = _probe(options, timer.threads, lambda what: report(what, 0, total))
    plans, model_seconds = _measure_models(options, timer, read_samples, lambda what: report(what, 0, total))
    deadline += model_seconds  # the models' time is outside the budget of the generated kernels
    started += model_seconds
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
                        timer.threads, (load_at_start, _load()), tuple(sorted(op_seconds.items())), plans,
                        model_seconds, read_samples)


def _probe(options: CalibrationOptions, threads: int, report: Callable[[str], None]) -> tuple[ReadSample, ...]:
    """The memory probe's samples; none where it is off or does not build (the reported sizes stay)."""
    if not options.read_probe:
        return ()
    report("memory probe")
    try:
        for _ in range(2):  # once more where other work slowed it
            samples = probe_reads(threads, last_level=cache_levels()[-1][1])
            if not contended(samples):
                return samples
    except CompileError:
        return ()
    warnings.warn("the memory probe's reads were slowed by other work on this machine; the cache sizes "
                  "Linux reports are used, and weights are priced like other traffic", RuntimeWarning, stacklevel=2)
    return ()


def _measure_models(options: CalibrationOptions, timer: Timer, read_samples: Sequence[ReadSample],
                    report: Callable[[str], None]) -> tuple[tuple[PlanSample, ...], float]:
    """Profile the plans of ``options.model_cases``, planned with the prior profile on this machine."""
    started = time.monotonic()
    planner = AnalyticCostModel(machine_prior(HardwareProfile.load(options.prior), read_samples, timer.threads))
    plans: list[PlanSample] = []
    for case in options.model_cases:
        try:
            plans.extend(measure_case(case, planner, options.model_runs, timer.threads, timer.cache, report))
        except ValueError as e:
            raise CalibrationError(f"model kernels: {e}") from None
    return tuple(plans), time.monotonic() - started


def machine_prior(prior: HardwareProfile, read_samples: Sequence[ReadSample] = (),
                  threads: int = 1) -> HardwareProfile:
    """``prior`` with this machine's cache levels: with the memory probe's ``read_samples`` (taken
    on ``threads`` threads), the sizes and read speeds it measured (caches.py); else the sizes
    Linux reports, each starting from the bandwidth of the prior's level at the same place (its
    last one beyond)."""
    levels = cache_levels()
    if not prior.caches:
        return prior
    if len(read_samples) >= 2:
        caches, dram = measured_levels(levels, read_samples, threads)
        return prior.replace(caches=caches, dram_bandwidth=dram,
                             stream_bandwidths=tuple(c.bandwidth for c in caches))
    caches = tuple(CacheLevel(name, size, prior.caches[min(i, len(prior.caches) - 1)].bandwidth)
                   for i, (name, size) in enumerate(levels))
    same_levels = len(caches) == len(prior.caches)  # else the prior's measured stream speeds fit no level
    return prior.replace(caches=caches, stream_bandwidths=prior.stream_bandwidths if same_levels else ())


def _predict(model: CostModel, graph: Graph, partition: Sequence[Sequence[str]]) -> float:
    return sum(model.group_cost(graph, list(part)).seconds for part in partition)


Timed = tuple[Graph, Sequence[str], float]  # a kernel: its graph, its nodes, measured seconds


def fit(data: Measurements, options: CalibrationOptions, registry: OpRegistry | None = None) -> Calibration:
    """Fit both models on the training kernels (generated and, all of them, the models' kernels) and
    score them on the held-out kernels and regions, and on the models' whole plans and region pairs,
    with each model family also held out of a refit."""
    registry = registry or default_registry()
    if len(data.kernels) < MIN_KERNELS:
        raise CalibrationError(f"measured {len(data.kernels)} kernels, need at least {MIN_KERNELS}: "
                               f"raise --budget or --kernels")
    order = np.random.default_rng(options.seed + 1).permutation(len(data.kernels))
    n_test = min(len(order) - 4, max(2, int(round(len(order) * options.holdout))))
    test = [data.kernels[i] for i in order[:n_test]]
    train: list[Timed] = [(s.graph, _whole(s.graph), s.seconds) for s in (data.kernels[i] for i in order[n_test:])]
    from_models: list[tuple[str, Timed]] = [(p.family, (p.graph, nodes, seconds))
                                            for p in data.plans for nodes, seconds in p.kernels()]
    prior = machine_prior(HardwareProfile.load(options.prior), data.read_samples, data.threads).replace(
        fitted_on=cpu_model())
    prior = prior.replace(op_seconds=FrozenMap(data.op_seconds)) if data.op_seconds else prior
    description = (f"fitted by `autofusion calibrate` on {len(train)} generated kernels and {len(from_models)} "
                   f"kernels of {len(options.model_cases)} models measured on {cpu_model()} "
                   f"({os.cpu_count()} cores; kernels on {data.threads} thread(s), {options.timing.statistic} of "
                   f"repeats) on {datetime.date.today().isoformat()}")

    def fitted(without: str | None = None) -> dict[str, CostModel]:
        kernels = train + [k for family, k in from_models if family != without]
        profile = _fit_profile(kernels, prior, data.launch_seconds, options.name, description, registry)
        analytic = AnalyticCostModel(profile, registry)
        learned = LearnedCostModel(_fit_learned(kernels, analytic, registry), profile, registry)
        return {"analytic": analytic, "learned": learned}

    models = fitted()
    report: dict[str, object] = {"heldout_kernels": len(test), "train_kernels": len(train),
                                 "model_kernels": len(from_models), "model_cases": list(options.model_cases),
                                 "model_clear_ratio": MODEL_CLEAR_RATIO,
                                 "regions": len(data.regions), "target_tau": TARGET_TAU}
    measured = [s.seconds for s in test]
    for kind, model in models.items():
        acc = accuracy([model.group_cost(s.graph, _whole(s.graph)).seconds for s in test], measured)
        predicted = [[_predict(model, r.graph, p) for p in r.partitions] for r in data.regions]
        agree, pairs = pair_agreement(predicted, [r.seconds for r in data.regions])
        clear, clear_pairs = pair_agreement(predicted, [r.seconds for r in data.regions], CLEAR_RATIO)
        report[kind] = {**acc.to_json(), "pair_agreement": agree, "pairs": pairs,
                        "pair_agreement_clear": clear, "pairs_clear": clear_pairs, "name": model.name}
    if data.plans:
        held_out = {family: fitted(without=family) for family in sorted({p.family for p in data.plans})}
        for kind, model in models.items():
            entry = report[kind]
            assert isinstance(entry, dict)
            entry.update(model_scores(data.plans, model, {f: m[kind] for f, m in held_out.items()}))
    report["target_met"] = bool(report["learned"]["kendall_tau"] >= TARGET_TAU)  # type: ignore[index]
    default = _choose(report)
    report["default_model"] = default
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": data.threads,
               "statistic": options.timing.statistic, "load_average": data.load_average,
               "machine": platform.machine(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "measure_seconds": round(data.seconds, 1), "model_seconds": round(data.model_seconds, 1),
               "kernels_skipped": data.skipped,
               "read_probe": [[s.bytes, s.bandwidth] for s in data.read_samples],
               "max_elements": options.max_elements, "seed": options.seed,
               **_toolchain(),
               "kinds": {k: sum(1 for s in data.kernels if s.kind == k) for k in sorted({s.kind for s in data.kernels})}}
    profile = models["analytic"].profile  # type: ignore[attr-defined]
    learned_params = models["learned"].params  # type: ignore[attr-defined]
    return Calibration(profile, learned_params, default, report, machine)


def _whole(graph: Graph) -> list[str]:
    return [n.name for n in graph.nodes]


def _fit_profile(kernels: Sequence[Timed], prior: HardwareProfile, launch: float, name: str, description: str,
                 registry: OpRegistry) -> HardwareProfile:
    work_model = AnalyticCostModel(prior, registry)
    terms = [work_model.terms(graph, nodes) for graph, nodes, _ in kernels]
    return fit_profile(terms, [seconds for _, _, seconds in kernels], prior, launch, name, description)


def _fit_learned(kernels: Sequence[Timed], analytic: AnalyticCostModel, registry: OpRegistry) -> LearnedParams:
    rows, target = [], []
    for graph, nodes, seconds in kernels:
        terms = analytic.terms(graph, nodes)
        rows.append(group_features(graph, nodes, analytic.work(graph), terms, analytic.profile, registry))
        target.append(np.log(seconds / analytic.group_cost(graph, nodes).seconds))
    return fit_learned(np.array(rows), np.array(target))


def model_scores(plans: Sequence[PlanSample], model: CostModel,
                 held_out: dict[str, CostModel]) -> dict[str, object]:
    """How ``model`` (fitted on every model's kernels) and ``held_out[family]`` (fitted without that
    family's) predict each plan's whole run, and order the pairs of plans of one region whose
    measured times differ by ``MODEL_CLEAR_RATIO`` or more."""
    rows = []
    for p in plans:
        other = held_out[p.family]
        rows.append({"case": p.case, "plan": p.label, "kernels": len(p.kernels()), "measured": p.run_seconds,
                     "predicted": _predict(model, p.graph, p.groups),
                     "predicted_held_out": _predict(other, p.graph, p.groups)})
    pairs = region_pairs(plans)
    measured = [r.seconds for r in pairs]

    def predicted(pick: Callable[[str], CostModel]) -> list[tuple[float, float]]:
        return [(_predict(pick(r.family), r.graph, [r.fused]), _predict(pick(r.family), r.graph, r.split))
                for r in pairs]

    own = predicted(lambda family: model)
    everything, n_all = pair_agreement(own, measured)
    clear, n_clear = pair_agreement(own, measured, MODEL_CLEAR_RATIO)
    clear_held, _ = pair_agreement(predicted(held_out.__getitem__), measured, MODEL_CLEAR_RATIO)
    return {"plans": rows, "model_pairs": n_all, "model_pair_agreement": everything,
            "model_pairs_clear": n_clear, "model_pair_agreement_clear": clear,
            "model_pair_agreement_clear_held_out": clear_held,
            "model_pairs_misordered": misordered_pairs(pairs, own)}


def misordered_pairs(pairs: Sequence[RegionPair], predicted: Sequence[tuple[float, float]],
                     limit: int = MISORDERED_LISTED) -> list[dict[str, object]]:
    """The clear pairs the prediction orders unlike the measurement, the widest measured gap first:
    where a cost model goes wrong, for whoever improves it (or the code the kernels are made of)."""
    wrong: list[tuple[float, dict[str, object]]] = []
    for r, (fused, split) in zip(pairs, predicted):
        slow, fast = max(r.seconds), min(r.seconds)
        if slow < MODEL_CLEAR_RATIO * fast or (fused < split) == (r.seconds[0] < r.seconds[1]):
            continue
        ops = " -> ".join(r.graph.node_by_name[n].op for n in r.fused)
        ratio = slow / fast if fast > 0 else None  # (a side below the clock's resolution: no ratio)
        wrong.append((ratio or math.inf, {"family": r.family, "fused_ops": ops, "parts": len(r.split),
                                          "measured_ms": [r.seconds[0] * 1e3, r.seconds[1] * 1e3],
                                          "predicted_ms": [fused * 1e3, split * 1e3], "measured_ratio": ratio}))
    return [w for _, w in sorted(wrong, key=lambda item: -item[0])][:limit]


def _choose(report: dict[str, object]) -> str:
    """The model the engine uses by default: the learned one unless it orders held-out kernels and
    plans worse than the analytic one (region plans generated and, where models were timed, the
    pairs of their plans and their whole runs, both with the model's family held out of the fit)."""
    def score(kind: str) -> float:
        r = report[kind]
        assert isinstance(r, dict)
        total = float(r["kendall_tau"]) + (float(r["pair_agreement"]) if r["pairs"] else 0.0)
        if r.get("plans"):
            errors = [abs(p["predicted_held_out"] / p["measured"] - 1) for p in r["plans"]]
            total += float(r["model_pair_agreement_clear_held_out"]) - float(np.median(errors))
        return total

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
