"""One library for every size against the SuperKernel specialised for each size, side by side.

    python benchmarks/dynamic_sizes.py                          # bert-base, gpt2, resnet18
    python benchmarks/dynamic_sizes.py --models bert-base --sizes seq=8 seq=128 --rounds 7
    python benchmarks/dynamic_sizes.py --json benchmarks/results/dynamic_sizes.json

For each built-in model, the plan over symbolic sizes (``models.build(name, dynamic=True)``) is
compiled once; for each size, the static build is optimized and compiled on its own. Rounds
alternate the two on the same feeds (medians of each round's runs, then the median over rounds):
the ratio is one library's time over the specialised one's. The compiler invocations the one
library needed after its first compile are counted too (zero is the point of it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autofusion import models, optimize  # noqa: E402
from autofusion.codegen.cores import cpu_model  # noqa: E402
from autofusion.models.inputs import random_inputs  # noqa: E402
from autofusion.runtime import CompiledModel  # noqa: E402
from autofusion.runtime import model as compiled  # noqa: E402

DEFAULT_SIZES = {"bert-base": ["seq=8", "seq=128"], "gpt2": ["seq=8", "seq=128"], "resnet18": ["batch=1", "batch=2"]}


def _median_ms(model: CompiledModel, feeds: dict[str, np.ndarray], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        model.run(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _sizes(texts: list[str]) -> dict[str, int]:
    sizes = {"batch": 1}
    for text in texts:
        name, _, value = text.partition("=")
        sizes[name] = int(value)
    return sizes


def bench_model(name: str, sizes: list[str], rounds: int, runs: int, tune: bool,
                priced_at: dict[str, int] | None = None) -> dict[str, Any]:
    calls = {"n": 0}
    real = compiled.compile_library

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return real(*args, **kwargs)

    compiled.compile_library = counted  # type: ignore[assignment]
    try:
        one = CompiledModel(optimize(models.build(name, dynamic=True), sizes=priced_at), tune=tune)
        after_first = calls["n"]
        results = []
        for text in sizes:
            binding = _sizes(text.split(","))
            static_graph = models.build(name, seq=binding.get("seq"), batch=binding["batch"])
            static = CompiledModel(optimize(static_graph), tune=tune)
            feeds = random_inputs(static_graph, seed=1)
            before = calls["n"]
            np.testing.assert_allclose(one.run(feeds)[static_graph.outputs[0]],
                                       static.run(feeds)[static_graph.outputs[0]], rtol=1e-3, atol=1e-3)
            new_compiles = calls["n"] - before
            pairs = [(_median_ms(one, feeds, runs), _median_ms(static, feeds, runs)) for _ in range(rounds)]
            one_ms = statistics.median(p[0] for p in pairs)
            static_ms = statistics.median(p[1] for p in pairs)
            ratio = statistics.median(p[0] / p[1] for p in pairs)
            results.append({"sizes": binding, "one_library_ms": one_ms, "specialised_ms": static_ms,
                            "ratio": ratio, "compiles_for_this_size": new_compiles,
                            "rounds": [{"one_library_ms": a, "specialised_ms": b} for a, b in pairs]})
            print(f"{name} {binding}: one library {one_ms:.2f} ms, specialised {static_ms:.2f} ms, "
                  f"ratio {ratio:.3f} (median of {rounds} round ratios), compiles {new_compiles}", flush=True)
    finally:
        compiled.compile_library = real  # type: ignore[assignment]
    return {"model": name, "one_library": str(one.library_path), "first_compiles": after_first,
            "priced_at": one.plan.stats.get("priced_at"), "sizes": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", default=list(DEFAULT_SIZES))
    p.add_argument("--sizes", nargs="*", help="NAME=N[,NAME=N] per binding (default per model)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--runs", type=int, default=10, help="runs per round and model")
    p.add_argument("--no-tune", action="store_true", help="the untuned default cores for both")
    p.add_argument("--priced-at", help="NAME=N[,NAME=N]: the sizes the one library is optimized and tuned for "
                   "(optimize(sizes=...); default: each size's bound, 128 where it has none, and 1)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    import platform

    out = {"cpu": cpu_model(), "machine": platform.machine(), "models": []}
    for name in args.models:
        sizes = args.sizes or DEFAULT_SIZES.get(name, ["seq=128"])
        priced_at = _sizes(args.priced_at.split(",")) if args.priced_at else None
        out["models"].append(bench_model(name, sizes, args.rounds, args.runs, not args.no_tune, priced_at))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
