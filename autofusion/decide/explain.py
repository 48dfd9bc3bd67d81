"""What ``autofusion explain`` shows, as data: the rules that fired, each fused kernel with its
provenance, and why pairs stayed apart (also the viz report's explain section)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from autofusion.decide.plan import Plan


def explain_report(plan: Plan) -> dict[str, Any]:
    """The explain table as data: rules fired, fused kernels with provenance, unfused reasons."""
    stats = plan.stats
    where: dict[str, str] = {}
    kinds: dict[str, str] = {}
    uses: Counter[str] = Counter()
    for g in plan.groups:
        for r in g.rules:
            uses[r.name] += 1
            where[r.name] = f"{r.file}:{r.line}"
            kinds[r.name] = g.kind
    rules = [{"rule": name, "kind": kinds[name], "where": where[name], "times": n} for name, n in uses.most_common()]
    for name, n in stats.get("saturation", {}).get("fired", {}).items():
        rules.append({"rule": name, "kind": "rewrite", "where": "", "times": n})
    graph = plan.graph
    kernels = [{"name": g.name, "template": g.template, "kind": g.kind,
                "ops": [graph.node_by_name[n].op for n in g.nodes], "nodes": list(g.nodes),
                "rules": [str(r) for r in g.rules], "params": dict(g.params),
                "decided_by": str(g.decided_by) if g.decided_by else "the op mix"} for g in plan.groups if g.fused]
    unfused = [{"producer": u.producer, "consumer": u.consumer, "reason": str(u.reason), "detail": u.detail,
                "ops": [graph.node_by_name[u.producer].op, graph.node_by_name[u.consumer].op]} for u in plan.unfused]
    reasons = Counter(u["reason"] for u in unfused)
    return {"cost_model": stats.get("cost_model", ""), "cost_model_source": stats.get("cost_model_source", ""),
            "cost_model_fitted_on": stats.get("cost_model_fitted_on", ""),
            "rules": rules, "kernels": kernels, "unfused": unfused, "reasons": dict(reasons),
            "rewritten_nodes": dict(stats.get("rewritten_nodes", {})),
            "undecided_guards": {**stats.get("saturation", {}).get("undecided", {}), **stats.get("fusion_undecided", {})},
            "priced_at": dict(stats.get("priced_at", {})),
            "priced_also_at": list(stats.get("priced_also_at", [])),
            "skipped_rules": dict(stats.get("skipped_rules", {}))}
