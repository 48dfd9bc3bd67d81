"""Run ``autofusion bench`` on the benchmark models, one process each, saving the JSON results.

    python benchmarks/run_bench.py                          # all cases, 3 rounds x 10 timed runs after 3 warm-up
    python benchmarks/run_bench.py --cases bert-base:8 resnet18 --repeat 5

Each case writes ``benchmarks/results/bench_<model>[_seq<N>].json``: the command's JSON object,
plus the exit status and anything it printed on stderr (a mismatch is kept, not hidden).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("bert-base:128", "bert-base:8", "gpt2:128", "resnet18", "lstm")


def result_path(case: str, out_dir: Path) -> Path:
    model, _, seq = case.partition(":")
    return out_dir / (f"bench_{model}" + (f"_seq{seq}" if seq else "") + ".json")


def run_case(case: str, repeat: int, warmup: int, out_dir: Path, extra: list[str], rounds: int = 1) -> int:
    model, _, seq = case.partition(":")
    cmd = [sys.executable, "-m", "autofusion.cli.main", "bench", model, "--json", "--repeat", str(repeat),
           "--rounds", str(rounds), "--warmup", str(warmup), *(["--seq", seq] if seq else []), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    print(f"$ {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    try:
        data = json.loads(r.stdout)
    except json.JSONDecodeError:
        print(f"{case}: no JSON (exit {r.returncode}):\n{r.stderr[-2000:]}", file=sys.stderr)
        return r.returncode or 1
    data["command"] = " ".join(["autofusion", *cmd[3:]])
    data["exit_status"] = r.returncode
    data["stderr"] = r.stderr.strip().splitlines()[-20:]
    path = result_path(case, out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    medians = {k: round(v["median_ms"], 3) for k, v in data["runners"].items()}
    print(f"{case}: exit {r.returncode}, medians (ms) {medians}, wrote {path}", file=sys.stderr, flush=True)
    return r.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="*", default=list(CASES), help="MODEL or MODEL:SEQ (default: all)")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="see autofusion bench --rounds")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more options for autofusion bench")
    args = p.parse_args(argv)
    extra = [a for a in args.extra if a != "--"]
    worst = 0
    for case in args.cases:
        worst = max(worst, run_case(case, args.repeat, args.warmup, Path(args.out_dir), extra, args.rounds))
    return worst


if __name__ == "__main__":
    sys.exit(main())
