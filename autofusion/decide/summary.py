"""Numbers that describe a plan against its unfused graph: kernels, materialised bytes, cost."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autofusion.decide.plan import FusedGroup, Plan
from autofusion.graph.graph import Graph
from autofusion.ir.symbolic import at_binding
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry


def intermediate_bytes_unfused(graph: Graph, registry: OpRegistry | None = None) -> int:
    """Bytes written to memory for intermediates when every op is its own kernel (views alias)."""
    registry = registry or default_registry()
    outputs = set(graph.outputs)
    return sum(graph.types[o].nbytes for n in graph.nodes if not registry[n.op].view
               for o in n.outputs if o and o not in outputs)


def intermediate_bytes_fused(graph: Graph, groups: Iterable[FusedGroup]) -> int:
    """Bytes of intermediates the plan's kernels write (graph outputs and view groups excluded)."""
    outputs = set(graph.outputs)
    return sum(graph.types[o].nbytes for g in groups if g.template != "view" for o in g.outputs if o not in outputs)


def cost_model_text(stats: Any, this_cpu: str = "") -> str:
    """Which cost model planned, and where its constants came from (a calibration file, a profile);
    with ``this_cpu``, a hint to calibrate where they were measured on another CPU."""
    name, source = str(stats.get("cost_model", "")), str(stats.get("cost_model_source", ""))
    fitted = str(stats.get("cost_model_fitted_on", ""))
    if source.endswith(".json"):
        text = f"{name}, calibration {source} (AUTOFUSION_CALIBRATION=none plans with the analytic model)"
    else:
        text = f"{name}, {source}" if source else name
    hint = calibrate_hint(fitted, this_cpu)
    return f"{text}; {hint}" if hint else text


def calibrate_hint(fitted_on: str, this_cpu: str) -> str:
    """Where a cost model's constants were measured on another CPU than ``this_cpu``: that, and how
    to fit them here; else ""."""
    if not (fitted_on and this_cpu and fitted_on != this_cpu):
        return ""
    return (f"its constants were measured on {fitted_on}, not this CPU ({this_cpu}): `autofusion calibrate` "
            f"fits them here in 2-3 minutes")


def plan_summary(plan: Plan, source: Graph, registry: OpRegistry | None = None) -> dict[str, Any]:
    """The fuse report's numbers (``source`` is the graph before rewrites)."""
    stats = plan.stats
    seconds = {
        "import": float(stats.get("seconds_import", 0.0)),
        "saturate": float(stats.get("seconds_saturate", 0.0)),
        "extract": float(stats.get("seconds_extract", 0.0)),
    }
    seconds["total"] = sum(seconds.values()) + float(stats.get("seconds_rules", 0.0))
    priced_at = dict(stats.get("priced_at", {}))
    graph = plan.graph
    if priced_at:  # symbolic sizes: bytes at the binding the plan was priced at, like its times
        source, graph = at_binding(source, priced_at), at_binding(graph, priced_at)
    return {
        "graph": source.name,
        "strategy": plan.strategy,
        "cost_model": stats.get("cost_model", ""),
        "cost_model_source": stats.get("cost_model_source", ""),
        "cost_model_fitted_on": stats.get("cost_model_fitted_on", ""),
        "kernels_before": int(stats.get("kernels_source", 0)),
        "kernels_after": plan.kernels,
        "intermediate_bytes_before": intermediate_bytes_unfused(source, registry),
        "intermediate_bytes_after": intermediate_bytes_fused(graph, plan.groups),
        "cost_before": plan.cost_before.seconds,
        "cost_after": plan.cost_after.seconds,
        "cost_breakdown_before": {"bytes": plan.cost_before.bytes, "flops": plan.cost_before.flops,
                                  "launches": plan.cost_before.launches},
        "cost_breakdown_after": {"bytes": plan.cost_after.bytes, "flops": plan.cost_after.flops,
                                 "launches": plan.cost_after.launches},
        "seconds": seconds,
        "rewrites_fired": dict(stats.get("saturation", {}).get("fired", {})),
        "saturation_stop": stats.get("saturation", {}).get("stop", ""),
        "skipped_rules": dict(stats.get("skipped_rules", {})),
        "notes": list(stats.get("notes", [])),
        "priced_at": priced_at,
        "priced_also_at": list(stats.get("priced_also_at", [])),
    }


def priced_text(report: dict[str, Any]) -> str:
    """How a plan over symbolic sizes was priced, for a person (``report``: a summary or explain report)."""
    def sizes(b: dict[str, int]) -> str:
        return ", ".join(f"{k}={v}" for k, v in b.items())

    also = "".join(f" and at {sizes(b)}" for b in report.get("priced_also_at", []))
    return (f"one plan for every binding; bytes at {sizes(report['priced_at'])}, times the mean of those at "
            f"{sizes(report['priced_at'])}{also}, each relative to the whole model there" if also else
            f"one plan for every binding; bytes and times at {sizes(report['priced_at'])}")
