"""``autofusion explain MODEL``: which rules fused what, and why each unfused pair stayed apart."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from autofusion.cli.cmd_fuse import add_plan_arguments, make_plan
from autofusion.cli.common import Output


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "explain", help="show which rules fired where and why pairs were not fused",
        description="Explain a fusion plan: rewrites applied, each fused kernel with the rules (file:line) that "
                    "allowed it, and every producer/consumer pair left in separate kernels with the reason.")
    add_plan_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--limit", type=int, default=40, metavar="N", help="rows per table (default 40; 0 = all)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded, plan = make_plan(args)
    report = explain_report(plan)
    out = Output()
    if args.json:
        out.json(report)
        return 0
    limit = args.limit or None
    out.table("rules that fired", ("rule", "kind", "where", "times"),
              [(r["rule"], r["kind"], r["where"], r["times"]) for r in report["rules"]][:limit])
    out.table("fused kernels", ("kernel", "template", "ops", "rules"),
              [(g["name"], g["template"], " ".join(g["ops"]), ", ".join(g["rules"])) for g in report["kernels"]][:limit])
    out.table("why pairs were not fused", ("reason", "pairs"), sorted(report["reasons"].items(), key=lambda kv: -kv[1]))
    out.table("unfused pairs", ("producer", "consumer", "reason", "detail"),
              [(u["producer"], u["consumer"], u["reason"], u["detail"]) for u in report["unfused"]][:limit])
    return 0


def explain_report(plan: Any) -> dict[str, Any]:
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
                "rules": [str(r) for r in g.rules]} for g in plan.groups if g.fused]
    unfused = [{"producer": u.producer, "consumer": u.consumer, "reason": str(u.reason), "detail": u.detail,
                "ops": [graph.node_by_name[u.producer].op, graph.node_by_name[u.consumer].op]} for u in plan.unfused]
    reasons = Counter(u["reason"] for u in unfused)
    return {"rules": rules, "kernels": kernels, "unfused": unfused, "reasons": dict(reasons),
            "rewritten_nodes": dict(stats.get("rewritten_nodes", {})),
            "skipped_rules": dict(stats.get("skipped_rules", {}))}
