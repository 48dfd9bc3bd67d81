"""``autofusion fuzz``: differential fuzzing of the whole pipeline against the reference interpreter."""

from __future__ import annotations

import argparse
from typing import Any

from autofusion.cli.common import Output, positive_int


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fuzz", help="run random graphs through every strategy and the C backend, compare with the reference",
        description="Generate random valid graphs (seeds SEED .. SEED+N-1), optimise each with a rotating "
                    "strategy, compile and run it, and compare with the reference interpreter. Exit status 1 "
                    "when any case mismatched or failed; replay case S with --cases 1 --seed S (and the same --shapes).")
    p.add_argument("--cases", type=positive_int, default=100, metavar="N", help="number of cases (default 100)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the first case (default 0)")
    p.add_argument("--max-ops", type=positive_int, default=7, metavar="K", help="most generated ops per graph")
    p.add_argument("--cache", metavar="DIR", help="compile cache directory (default: the usual cache)")
    p.add_argument("--shapes", choices=("small", "realistic", "mixed"), default="mixed",
                   help="small: dimensions 1-6 and 1-K ops; realistic: GEMM sizes to ~1,100 across every block "
                        "of the cores, strided/grouped/dilated convolutions with pooling, attention and residual "
                        "layers, 1-2 threads, each core variant forced; mixed (default): odd seeds realistic")
    p.add_argument("--sanitize", action="store_true",
                   help="build every case with AddressSanitizer and UBSan (-O1) and run it under their runtime in "
                        "a child process; a finding is a failure with its seed")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="spread the seeds over a Ray cluster (pip install 'autofusion[cluster]'); without ADDRESS, "
                        "a local Ray started for the run")
    p.add_argument("--triton", action="store_true",
                   help="also run each plan through the Triton backend (interpreted on the CPU; needs torch and triton)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autofusion.fuzz import run_campaign
    from autofusion.fuzz.sanitized import run_sanitized_campaign

    if args.ray is not None:
        from autofusion.fuzz.cluster import run_ray_campaign

        report = run_ray_campaign(args.cases, args.seed, cache=args.cache, max_ops=args.max_ops, shapes=args.shapes,
                                  triton=args.triton, sanitize=args.sanitize, address=args.ray or None)
    else:
        campaign = run_sanitized_campaign if args.sanitize else run_campaign
        report = campaign(args.cases, args.seed, cache=args.cache, max_ops=args.max_ops, triton=args.triton,
                          shapes=args.shapes)
    out = Output()
    if args.json:
        out.json(report.to_json())
    else:
        rechecked = (f" ({len(report.float64_rechecked)} matched only the float64 reference)"
                     if report.float64_rechecked else "")
        out.line(f"cases {report.cases}, ok {report.ok}{rechecked}, refused {report.refused}, "
                 f"mismatches {len(report.mismatches)}, failures {len(report.failures)} "
                 f"({report.cases / report.seconds if report.seconds else 0.0:.2f} cases/s"
                 f"{f' on {report.workers} workers' if report.workers > 1 else ''})")
        if report.triton_steps:
            out.line("triton steps run: " + ", ".join(f"{k} {n}" for k, n in sorted(report.triton_steps.items())))
        for kind, results in (("mismatch", report.mismatches), ("failure", report.failures)):
            for r in results:
                out.line(f"{kind}: seed {r.seed} ({r.strategy}, {r.backend}): {r.detail.splitlines()[0]}")
    return 1 if report.mismatches or report.failures else 0
