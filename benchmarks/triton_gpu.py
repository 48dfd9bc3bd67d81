"""Time the Triton SuperKernel on a GPU against torch eager and torch.compile on the same device.

    python benchmarks/triton_gpu.py                 # a CUDA device: bert-base seq 128 and 8, gpt2, resnet18
    python benchmarks/triton_gpu.py --device cpu --cases bert-tiny:8 --rounds 1 --min-seconds 0
                                                    # a dry run under Triton's interpreter (times mean nothing)

Per case (batch 1): the built-in graph, ``optimize()`` with the shipped rules; three runners on the
device, each checked against the reference interpreter first: ``triton`` (``TritonModel.run_device``:
tensors stay on the device, weights uploaded once), ``torch_eager`` (the IR graph converted to a
``torch.fx.GraphModule``, one torch call per op) and ``torch_compile`` (that module under inductor).
Every call ends with ``torch.cuda.synchronize()``; medians of round-robin rounds
(``round_robin_medians``). Writes ``benchmarks/results/triton_gpu.json``, with the groups that ran
as one kernel per op and any op on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = ("bert-base:128", "bert-base:8", "gpt2:128", "resnet18")


def case_graph(case: str) -> Any:
    from autofusion.models import build

    model, _, seq = case.partition(":")
    return build(model, **({"seq": int(seq)} if seq else {}))


def runners(graph: Any, device: str) -> tuple[dict[str, Callable[[], object]], dict[str, Any]]:
    """The three runners of ``graph`` on ``device``, each checked against the reference, and what the
    Triton model reports of itself."""
    import numpy as np
    import torch

    from autofusion.api import optimize
    from autofusion.ir import run_graph
    from autofusion.models import random_inputs
    from autofusion.runtime.torch_ops import to_torch_module
    from autofusion.runtime.triton_runner import TritonModel

    feeds = random_inputs(graph)
    want = run_graph(graph, feeds)
    model = TritonModel(optimize(graph), device=device)
    dev_feeds = {k: torch.from_numpy(v).to(device) for k, v in feeds.items()}
    module = to_torch_module(graph).to(device)
    args = tuple(dev_feeds[n] for n in graph.inputs)
    compiled = torch.compile(module)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def triton() -> object:
        out = model.run_device(dev_feeds)
        sync()
        return out

    def on_device(fn: Any) -> Callable[[], object]:
        def call() -> object:
            with torch.inference_mode():
                out = fn(*args)
            sync()
            return out
        return call

    calls = {"triton": triton, "torch_eager": on_device(module), "torch_compile": on_device(compiled)}
    got = {k: v.cpu().numpy() for k, v in model.run_device(dev_feeds).items()}
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-3, atol=1e-4, err_msg=f"triton: {name}")
    for name in ("torch_eager", "torch_compile"):
        calls[name]()  # compiles inductor's kernels: setup, not timed
    info = {"kernels": len(model.kernels), "groups": len(model.plan.groups), "split": dict(model.split),
            "host": {k: v for k, v in model.fallbacks.items() if v != "view"}}
    return calls, info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), help="MODEL or MODEL:SEQ (default: all)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-seconds", type=float, default=0.5, help="time per runner per round")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "triton_gpu.json"))
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch

    from autofusion.bench.timing import round_robin_medians

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here; --device cpu runs a dry run under Triton's interpreter", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (Triton's interpreter)"
    results: dict[str, Any] = {"device": device_name, "torch": torch.__version__, "cases": {}}
    for case in args.cases:
        calls, info = runners(case_graph(case), args.device)
        medians = round_robin_medians(calls, args.rounds, args.min_seconds)
        ms = {k: v * 1e3 for k, v in medians.items()}
        results["cases"][case] = {"median_ms": ms, "speedup_vs_eager": ms["torch_eager"] / ms["triton"],
                                  "speedup_vs_compile": ms["torch_compile"] / ms["triton"], **info}
        print(f"{case}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items())
              + f"; triton {ms['torch_eager'] / ms['triton']:.2f}x eager, {ms['torch_compile'] / ms['triton']:.2f}x"
              " torch.compile", file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
