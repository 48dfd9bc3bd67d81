"""Training with torch.compile(backend="autofusion") against eager and inductor, side by side.

    python benchmarks/torch_training.py [--models encoder,cnn] [--steps 20] [--rounds 5] [--threads 2] [--json]

For each model (autofusion/bench/torch_models.py: a 2-layer transformer encoder of width 256 on
8 x 64 tokens, a small CNN with batch norm on 16 x 3 x 32 x 32 images):
- agreement: ``--steps`` SGD steps from the same initial weights, eager and autofusion; the largest
  relative difference of a step's loss and of a parameter after the last step;
- step time: one compiled model per runner, timed round-robin: each round runs every runner for
  5 steps (after 3 warm-up steps, compiles included there); the median of the rounds' medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

RUNNERS = ("eager", "inductor", "autofusion")
STEPS_PER_ROUND = 5


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    import torch

    from autofusion.bench.torch_models import small_cnn, transformer_encoder

    torch.manual_seed(0)
    if name == "encoder":
        return transformer_encoder(d=256, heads=4, layers=2), (torch.randn(8, 64, 256), torch.randn(8, 64, 8))
    if name == "cnn":
        return small_cnn(width=32), (torch.randn(16, 3, 32, 32), torch.randn(16, 4))
    raise SystemExit(f"unknown model {name!r}: encoder or cnn")


def agreement(model: Any, data: tuple[Any, ...], steps: int) -> dict[str, float]:
    from autofusion.bench.torch_models import train

    eager, _, eager_model = train(model, data, None, steps)
    ours, _, our_model = train(model, data, "autofusion", steps)
    loss_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(ours, eager))
    param_rel = max(float((p.detach() - q.detach()).abs().max() / q.detach().abs().max().clamp_min(1e-30))
                    for p, q in zip(our_model.parameters(), eager_model.parameters()))
    return {"loss_max_rel_diff": loss_rel, "param_max_rel_diff": param_rel, "first_loss": eager[0],
            "last_loss": eager[-1]}


def stepper(model: Any, data: tuple[Any, ...], backend: str | None) -> Callable[[], None]:
    import copy

    import torch

    model = copy.deepcopy(model)
    fn = torch.compile(model, backend=backend) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        fn(*data).backward()
        opt.step()

    return step


def step_times(model: Any, data: tuple[Any, ...], rounds: int) -> dict[str, dict[str, float]]:
    steps = {r: stepper(model, data, None if r == "eager" else r) for r in RUNNERS}
    for step in steps.values():
        for _ in range(3):  # compiles, first touches
            step()
    medians: dict[str, list[float]] = {r: [] for r in RUNNERS}
    for _ in range(rounds):
        for runner, step in steps.items():
            times = []
            for _ in range(STEPS_PER_ROUND):
                started = time.perf_counter()
                step()
                times.append(time.perf_counter() - started)
            medians[runner].append(statistics.median(times))
    return {r: {"median_ms": statistics.median(v) * 1e3, "round_medians_ms": [t * 1e3 for t in v]}
            for r, v in medians.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="encoder,cnn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch

    from autofusion.bench.environment import STEADY_MMAP_THRESHOLD, fix_malloc_threshold
    from autofusion.codegen.cores import cpu_model

    torch.set_num_threads(args.threads)
    # large buffers stay in the heap, as in a long-running process: no runner's time depends on
    # how far glibc's own threshold has risen (bench/environment.py, steady_allocator)
    fix_malloc_threshold(STEADY_MMAP_THRESHOLD)

    out: dict[str, Any] = {"cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                           "mmap_threshold": STEADY_MMAP_THRESHOLD, "models": {}}
    for name in args.models.split(","):
        model, data = build(name)
        out["models"][name] = {"agreement": agreement(model, data, args.steps),
                               "step": step_times(model, data, args.rounds)}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"training step, SGD, {args.threads} threads, {out['cpu']}, torch {out['torch']}; "
          f"medians of {args.rounds} rounds x {STEPS_PER_ROUND} steps")
    print(f"{'model':10} {'eager ms':>9} {'inductor ms':>12} {'autofusion ms':>14} {'vs eager':>9} "
          f"{'loss rel diff':>14} {'param rel diff':>15}")
    for name, row in out["models"].items():
        t = {r: row["step"][r]["median_ms"] for r in RUNNERS}
        a = row["agreement"]
        print(f"{name:10} {t['eager']:9.2f} {t['inductor']:12.2f} {t['autofusion']:14.2f} "
              f"{t['eager'] / t['autofusion']:8.2f}x {a['loss_max_rel_diff']:14.1e} {a['param_max_rel_diff']:15.1e}")


if __name__ == "__main__":
    main()
