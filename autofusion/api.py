"""The embedding API: from an IR graph and rules to a fusion plan.

>>> import numpy as np
>>> from autofusion import optimize
>>> from autofusion.ir import GraphBuilder
>>> b = GraphBuilder("mlp")
>>> x = b.input("x", (8, 16))
>>> w = b.const(np.ones((16, 16), np.float32))
>>> y = b.op("Relu", b.op("Add", b.op("MatMul", x, w), b.const(np.ones(16, np.float32))))
>>> plan = optimize(b.build([y]))
>>> plan.kernels
1
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from autofusion.decide.cost import CostModel, model_profile
from autofusion.decide.default_model import default_cost_model
from autofusion.decide.optimize import decide, graph_kernels
from autofusion.decide.plan import Plan
from autofusion.decide.strategies import Strategy
from autofusion.dsl.ir import RuleSet
from autofusion.engine import Limits, fusion_space, saturate_rewrites
from autofusion.graph.dims import bounded
from autofusion.graph.graph import FrozenMap, Graph
from autofusion.ir.verify import verify
from autofusion.kinds import KindRegistry
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

RulesArg = RuleSet | Sequence[str | Path] | str | Path | None


def load_ruleset(rules: RulesArg, registry: OpRegistry | None = None, kinds: KindRegistry | None = None) -> RuleSet:
    """A RuleSet from a RuleSet, rule file or directory paths, or None for the shipped library."""
    if isinstance(rules, RuleSet):
        return rules
    from autofusion.dsl import load_rules

    if isinstance(rules, (str, Path)):
        rules = [rules]
    return load_rules(rules, registry=registry, kinds=kinds)


def optimize(
    graph: Graph,
    rules: RulesArg = None,
    cost_model: CostModel | None = None,
    strategy: str | Strategy = "greedy",
    size_cap: int = 48,
    limits: Limits | None = None,
    registry: OpRegistry | None = None,
    kinds: KindRegistry | None = None,
    sizes: Mapping[str, int] | None = None,
) -> Plan:
    """Rewrite ``graph`` by equality saturation, then choose fused kernels under ``cost_model``
    (default: the calibrated model when a calibration file exists, see ``default_cost_model``);
    ``kinds`` are the kernel kinds rules may name (default: the built-in ones; with plugins':
    ``autofusion.plugins.kinds_with_plugins()``). A graph with symbolic sizes gets one plan for
    every binding, priced at ``sizes`` when given (the sizes it will mostly run at), else at its
    bounds (128 where a size has none) and at size 1 together."""
    with bounded(graph.bounds):  # a graph with symbolic sizes: later stages take its bounds for granted
        return _optimize(graph, rules, cost_model, strategy, size_cap, limits, registry, kinds, sizes)


def _optimize(graph: Graph, rules: RulesArg, cost_model: CostModel | None, strategy: str | Strategy,
              size_cap: int, limits: Limits | None, registry: OpRegistry | None,
              kinds: KindRegistry | None, sizes: Mapping[str, int] | None) -> Plan:
    registry = registry or default_registry()
    cost_model = cost_model or default_cost_model(registry)
    t0 = time.perf_counter()
    ruleset = load_ruleset(rules, registry, kinds)
    t1 = time.perf_counter()
    rewritten = saturate_rewrites(graph, ruleset, registry, limits)
    verify(rewritten.graph, registry)
    t2 = time.perf_counter()
    space, matches = fusion_space(rewritten.graph, ruleset, registry)
    t3 = time.perf_counter()
    plan = decide(space, cost_model, strategy, size_cap, registry, kinds=kinds, sizes=sizes)
    t4 = time.perf_counter()
    stats = dict(plan.stats)
    stats.update({
        "kernels_source": graph_kernels(graph, registry),
        "cost_model_source": str(getattr(cost_model, "source", "")),
        "cost_model_fitted_on": getattr(model_profile(cost_model), "fitted_on", ""),  # the CPU measured on
        "seconds_rules": t1 - t0,
        "seconds_saturate": (t2 - t1 - rewritten.extract_seconds) + (t3 - t2),
        "seconds_extract": rewritten.extract_seconds + (t4 - t3),
        "saturation": {k: v for k, v in asdict(rewritten.report).items()},
        "fusion_matches": dict(matches.fired),
        "fusion_rejected": dict(matches.rejected),
        "fusion_undecided": dict(matches.undecided),
        "skipped_rules": {**rewritten.report.skipped, **matches.skipped},
        "rewritten_nodes": {k: list(v) for k, v in rewritten.provenance.items()},
    })
    return replace(plan, stats=FrozenMap(stats))
