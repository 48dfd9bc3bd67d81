"""Every distinct GEMM/Conv core of the benchmark models, alone, in each runtime (``autofusion bench-cores``).

    python benchmarks/gemm_cores.py                       # benchmarks/results/cores_<case>.json
    python benchmarks/gemm_cores.py --cases bert-base:8   # one case
    AUTOFUSION_ISA=avx2 OPENBLAS_CORETYPE=Haswell python benchmarks/gemm_cores.py --suffix _avx2
    python benchmarks/gemm_cores.py --in-model            # benchmarks/results/in_model_<case>.json

The second form exercises another instruction set's kernels on this CPU (here: AVX2 on an AVX-512
machine) against OpenBLAS forced to the same class; onnxruntime picks its kernels from the CPU and
cannot be forced, so its column is the native one. With ``--in-model`` the cores are timed inside the
whole model instead, our kernels beside onnxruntime's nodes (``bench-cores --in-model``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("bert-base:128", "bert-base:8", "gpt2:128", "resnet18")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="*", default=list(CASES), help="MODEL or MODEL:SEQ (default: all)")
    p.add_argument("--suffix", default="", help="appended to each result file's name")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results", help="where the files go")
    p.add_argument("--in-model", action="store_true", help="time the cores inside the whole model")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more options for autofusion bench-cores")
    args = p.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    status = 0
    for case in args.cases:
        model, _, seq = case.partition(":")
        cmd = [sys.executable, "-m", "autofusion.cli.main", "bench-cores", model, "--json",
               *(["--seq", seq] if seq else []), *(["--in-model"] if args.in_model else []),
               *[a for a in args.extra if a != "--"]]
        print(f"$ {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{case}: exit {r.returncode}\n{r.stderr[-2000:]}", file=sys.stderr)
            status = status or r.returncode
            continue
        data = json.loads(r.stdout)
        data["environment"] = {k: os.environ[k] for k in ("AUTOFUSION_ISA", "OPENBLAS_CORETYPE") if k in os.environ}
        args.out_dir.mkdir(parents=True, exist_ok=True)
        prefix = "in_model" if args.in_model else "cores"
        out = args.out_dir / f"{prefix}_{model}{'_seq' + seq if seq else ''}{args.suffix}.json"
        out.write_text(json.dumps(data, indent=2) + "\n")
        for c in data["cores"] if not args.in_model else []:
            t = c["median_ms"]
            print(f"  {c['core']:<40} x{c['count_in_model']:<3} {c['variant']:<28} ours {t.get('autofusion', 0):.3f} "
                  f"ort {t.get('onnxruntime', 0):.3f} blas {t.get('openblas', 0):.3f} ms", file=sys.stderr)
        print(f"{case}: wrote {out}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
