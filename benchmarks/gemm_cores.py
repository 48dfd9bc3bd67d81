"""One MatMul (activations x constant weights) in each runtime: how fast the opaque core itself is.

    python benchmarks/gemm_cores.py      # writes benchmarks/results/gemm_cores.json

The shapes are BERT-base's at seq 128 and seq 8 (QKV/FFN-in and FFN-out); 2 threads everywhere.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

SHAPES = ((128, 768, 3072), (8, 768, 3072), (8, 3072, 768))
RUNS = 40


def median_and_min(fn: Any, runs: int = RUNS) -> tuple[float, float]:
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def measure(m: int, k: int, n: int) -> dict[str, Any]:
    import numpy as np

    from autofusion.decide import unfused_plan
    from autofusion.export import to_onnx
    from autofusion.ir import GraphBuilder
    from autofusion.runtime import CompiledModel

    rng = np.random.default_rng(0)
    b = GraphBuilder("matmul")
    x = b.input("x", (m, k))
    w = b.const((rng.standard_normal((k, n)) * 0.02).astype(np.float32))
    g = b.build([b.op("MatMul", x, w)])
    feeds = {"x": rng.standard_normal((m, k)).astype(np.float32)}
    weights, xs = np.array(g.constants[w].array), feeds["x"]
    runners = {"autofusion": lambda: model.run(feeds), "numpy (OpenBLAS)": lambda: xs @ weights}
    model = CompiledModel(unfused_plan(g), threads=2)
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
        session = ort.InferenceSession(to_onnx(unfused_plan(g)).SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        runners["onnxruntime"] = lambda: session.run(None, feeds)
    except ImportError:
        pass
    try:
        import torch

        torch.set_num_threads(2)
        tx, tw = torch.from_numpy(xs), torch.from_numpy(weights)
        runners["torch"] = lambda: torch.matmul(tx, tw)
    except ImportError:
        pass
    gflop = 2 * m * k * n / 1e9
    out = {}
    for name, fn in runners.items():
        time.sleep(0.3)
        med, best = median_and_min(fn)
        out[name] = {"median_ms": med, "min_ms": best, "gflops_at_min": gflop / (best / 1e3)}
    return out


def main() -> int:
    from autofusion.bench.environment import limit_threads, load_average, machine_info

    limit_threads(2)
    result: dict[str, Any] = {"machine": machine_info(), "load_average_before": load_average(), "shapes": {}}
    for m, k, n in SHAPES:
        result["shapes"][f"{m}x{k} @ {k}x{n}"] = measure(m, k, n)
    result["load_average_after"] = load_average()
    out = ROOT / "benchmarks" / "results" / "gemm_cores.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for shape, rows in result["shapes"].items():
        print(shape, {k: round(v["min_ms"], 3) for k, v in rows.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
