"""``autofusion explain MODEL``: which rules fused what, and why each unfused pair stayed apart."""

from __future__ import annotations

import argparse
from typing import Any

from autofusion.cli.cmd_fuse import add_plan_arguments, make_plan
from autofusion.cli.common import Output
from autofusion.codegen import cores
from autofusion.decide.explain import explain_report
from autofusion.decide.summary import cost_model_text, priced_text


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
    loaded, plan = make_plan(args, symbolic=True)
    report = explain_report(plan)
    out = Output()
    if args.json:
        out.json(report)
        return 0
    limit = args.limit or None
    out.line(f"cost model: {cost_model_text(report, cores.cpu_model())}")
    if report["priced_at"]:
        out.line(f"symbolic sizes: {priced_text(report)}")
    out.table("rules that fired", ("rule", "kind", "where", "times"),
              [(r["rule"], r["kind"], r["where"], r["times"]) for r in report["rules"]][:limit])
    out.table("fused kernels", ("kernel", "template", "ops", "rules", "template from"),
              [(g["name"], _with_params(g), " ".join(g["ops"]), ", ".join(g["rules"]), g["decided_by"])
               for g in report["kernels"]][:limit])
    out.table("why pairs were not fused", ("reason", "pairs"), sorted(report["reasons"].items(), key=lambda kv: -kv[1]))
    if report["undecided_guards"]:
        out.table("guard-undecided: rules whose guard depends on sizes bound at run time (not applied; "
                  "fusion rules do not fire, nofuse rules keep their ops apart)", ("rule", "matches"),
                  sorted(report["undecided_guards"].items()))
    out.table("unfused pairs", ("producer", "consumer", "reason", "detail"),
              [(u["producer"], u["consumer"], u["reason"], u["detail"]) for u in report["unfused"]][:limit])
    return 0


def _with_params(kernel: dict[str, Any]) -> str:
    params = ", ".join(f"{k}={v}" for k, v in kernel["params"].items())
    return f"{kernel['template']} ({params})" if params else kernel["template"]
