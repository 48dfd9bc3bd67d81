"""Kernels of real models, timed where they run.

Each built-in model is planned three ways (every op its own kernel, the engine's plan, kernels of at
most three ops), built with per-step profiling and run; each group's step is timed. These kernels
show what generated ones cannot: weights streamed from memory between layers, an LSTM's loop over
time, convolutions, and the tuned cores the runtime really uses. Their times feed the fit, and
the plans give whole-model predictions to check and pairs of alternative plans of one region (a
group of one plan against the groups another plan splits it into).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autofusion.bench.timing import RUNNER_PAUSE_SECONDS
from autofusion.decide.baseline import unfused_plan
from autofusion.decide.cost import CostModel
from autofusion.decide.plan import Plan
from autofusion.graph.graph import Graph
from autofusion.runtime import CompileCache, CompiledModel

# the benchmark models: their kernels put each cache level, DRAM and the cores' rates where they are
# in real runs (without the two at seq 128, a calibration priced them 13-24 % slow on a Xeon)
DEFAULT_CASES = ("bert-base:8", "resnet18", "lstm", "gpt2", "bert-base")
SMALL_CAP = 3  # the third plan: kernels of at most this many ops
WARM_RUNS = 3
VIEW = "view"  # a group that aliases a buffer: its step runs no kernel, only the clock


@dataclass(frozen=True)
class PlanSample:
    """One plan of one model, profiled: each group's nodes and the median seconds of its step."""

    case: str  # "bert-base:8": a built-in model and its sequence length
    family: str  # the model's family (held out together: bert-base at two lengths is one model)
    label: str  # unfused | engine | small
    graph: Graph
    groups: tuple[tuple[str, ...], ...]
    step_seconds: tuple[float, ...]
    run_seconds: float  # median of whole runs of the profiling build

    def kernels(self) -> list[tuple[tuple[str, ...], float]]:
        """(nodes, seconds) of each group that ran a kernel."""
        return [(nodes, s) for nodes, s in zip(self.groups, self.step_seconds) if s > 0]


@dataclass(frozen=True)
class RegionPair:
    """Two plans of one region (a group of one plan; the groups of another inside it), measured."""

    family: str
    graph: Graph
    fused: tuple[str, ...]
    split: tuple[tuple[str, ...], ...]
    seconds: tuple[float, float]  # (fused, split)


def parse_case(text: str) -> tuple[str, int | None]:
    """``name`` or ``name:seq`` -> (name, seq); ValueError for a name that is not built in."""
    from autofusion.models import builtin_names

    name, _, seq = text.strip().partition(":")
    if name not in builtin_names():
        raise ValueError(f"unknown model {name!r} (built-in: {', '.join(builtin_names())})")
    if seq and not (seq.isdigit() and int(seq) > 0):
        raise ValueError(f"{text!r}: the sequence length after ':' must be a positive integer")
    return name, int(seq) if seq else None


def model_plans(graph: Graph, model: CostModel) -> dict[str, Plan]:
    """The three plans of ``graph`` timed: unfused, the engine's under ``model``, and small kernels."""
    from autofusion.api import optimize

    engine = optimize(graph, cost_model=model)
    return {"unfused": unfused_plan(engine.graph), "engine": engine,
            "small": optimize(graph, cost_model=model, size_cap=SMALL_CAP)}


def measure_case(case: str, model: CostModel, runs: int, threads: int, cache: CompileCache,
                 report: Callable[[str], None] | None = None) -> list[PlanSample]:
    """Profile the three plans of built-in model ``case``: ``runs`` rounds, each plan once a round,
    so that the machine's drift touches every plan alike (the pairs compare plans with each other)."""
    from autofusion.models import build, random_inputs, spec

    name, seq = parse_case(case)
    graph = build(name, seq=seq)
    feeds = random_inputs(graph, seed=0)
    plans = model_plans(graph, model)
    compiled = {}
    for label, plan in plans.items():
        if report:
            report(f"{case}: {label} plan")
        compiled[label] = CompiledModel(plan, threads=threads, cache=cache, profile=True)
        for _ in range(WARM_RUNS):
            compiled[label].run(feeds)
    time.sleep(RUNNER_PAUSE_SECONDS)  # a core library's spinning threads (the tuner's) settle first
    steps: dict[str, dict[str, list[float]]] = {label: {} for label in plans}
    wall: dict[str, list[float]] = {label: [] for label in plans}
    order = list(compiled)
    for r in range(runs):
        for label in order[r % len(order):] + order[:r % len(order)]:  # each plan follows each in turn
            built = compiled[label]
            start = time.perf_counter()
            built.run(feeds)
            wall[label].append(time.perf_counter() - start)
            for group, seconds in built.step_seconds().items():
                steps[label].setdefault(group, []).append(seconds)
    family = spec(name).family
    return [PlanSample(case, family, label, plan.graph, tuple(g.nodes for g in plan.groups),
                       tuple(0.0 if g.template == VIEW else float(np.median(steps[label].get(g.name, [0.0])))
                             for g in plan.groups),
                       float(np.median(wall[label])))
            for label, plan in plans.items()]


def region_pairs(samples: Sequence[PlanSample]) -> list[RegionPair]:
    """Every group of one plan that another plan of the same model splits into groups inside it,
    once (a group two plans share, split alike by a third, is one pair: the first plan's timing)."""
    pairs: dict[tuple[str, tuple[str, ...], tuple[tuple[str, ...], ...]], RegionPair] = {}
    by_case: dict[str, list[PlanSample]] = {}
    for s in samples:
        by_case.setdefault(s.case, []).append(s)
    for case, plans in by_case.items():
        for a in plans:
            for b in plans:
                if a is not b:
                    for pair in _pairs_of(a, b):
                        pairs.setdefault((case, pair.fused, pair.split), pair)
    return list(pairs.values())


def _pairs_of(coarse: PlanSample, fine: PlanSample) -> list[RegionPair]:
    if coarse.graph.nodes != fine.graph.nodes:
        return []  # rewritten differently: node names say nothing across the two
    owner = {n: i for i, nodes in enumerate(fine.groups) for n in nodes}
    out = []
    for nodes, seconds in zip(coarse.groups, coarse.step_seconds):
        parts = sorted({owner[n] for n in nodes if n in owner})
        if len(nodes) < 2 or len(parts) < 2 or seconds <= 0:
            continue
        if sum(len(fine.groups[i]) for i in parts) != len(nodes):
            continue  # the finer plan's groups reach outside this region
        split = tuple(fine.groups[i] for i in parts)
        out.append(RegionPair(coarse.family, coarse.graph, nodes, split,
                              (seconds, sum(fine.step_seconds[i] for i in parts))))
    return out
