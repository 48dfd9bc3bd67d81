"""A campaign's cases in a child process, one JSON line per event on standard output.

``python -m autofusion.fuzz.worker --seed S --cases N [--shapes ...] [--max-ops K] [--cache DIR]
[--triton]`` prints ``{"start": seed}`` before each case and ``{"result": {...}}`` after it, so
that a parent learns which case was running when the process died (a sanitizer's finding ends
the process: fuzz/sanitized.py runs its campaigns through this).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from autofusion.fuzz.cases import SHAPES, case_for
from autofusion.fuzz.differential import run_case


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m autofusion.fuzz.worker")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--cases", type=int, required=True)
    p.add_argument("--shapes", choices=SHAPES, default="small")
    p.add_argument("--max-ops", type=int, default=7)
    p.add_argument("--cache")
    p.add_argument("--triton", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from autofusion.api import load_ruleset

    args = parse_args(argv)
    rules = load_ruleset(None)
    for seed in range(args.seed, args.seed + args.cases):
        print(json.dumps({"start": seed}), flush=True)
        result = run_case(case_for(seed, args.shapes, args.max_ops), args.cache, rules, args.triton)
        print(json.dumps({"result": asdict(result)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
