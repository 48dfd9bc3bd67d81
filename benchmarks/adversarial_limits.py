"""Saturation bounds under adversarial rule sets: the table of docs/reliability.md ("Adversarial rules").

    python benchmarks/adversarial_limits.py

Each row optimises the 8-op chain of ``tests/test_adversarial_rules.py`` under one rule file and one
set of limits, then compiles the plan and compares it with the reference interpreter.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_adversarial_rules import EXPLODE, GUARDS, LOOP, _assert_correct, _chain  # noqa: E402

from autofusion.api import optimize  # noqa: E402
from autofusion.engine import Limits  # noqa: E402

ROWS = [
    ("associativity + distributivity, enodes <= 3000", EXPLODE, Limits(iterations=50, enodes=3000, seconds=120)),
    ("associativity + distributivity, seconds <= 0.2", EXPLODE, Limits(iterations=50, enodes=10**8, seconds=0.2)),
    ("associativity + distributivity, default Limits", EXPLODE, Limits()),
    ("endless growth, iterations <= 6", LOOP, Limits(iterations=6, enodes=10**8, seconds=120)),
    ("endless growth, default Limits", LOOP, Limits()),
    ("guards that raise (3 rules), default Limits", GUARDS, Limits()),
]


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="autofusion-adversarial-"))
    print("| rule set, limits | stop | iterations | e-nodes | saturation s | optimize s | plan |")
    print("|---|---|---:|---:|---:|---:|---|")
    for i, (name, text, limits) in enumerate(ROWS):
        path = tmp / f"rules{i}.fuse"
        path.write_text(text)
        graph = _chain(8)
        start = time.perf_counter()
        plan = optimize(graph, [path], limits=limits)
        seconds = time.perf_counter() - start
        sat = plan.stats["saturation"]
        _assert_correct(plan, graph)  # raises when the compiled plan disagrees with the reference
        rejected = sum(sat["rejected"].values())
        print(f"| {name} | {sat['stop']} | {sat['iterations']} | {sat['enodes']} | {sat['seconds']:.2f} | "
              f"{seconds:.1f} | {plan.kernels} kernels, correct; {rejected} matches rejected |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
