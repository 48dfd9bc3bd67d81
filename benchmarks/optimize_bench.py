"""The optimisation benchmark: how fast ``optimize()`` is, how good its choices are, and what it saves.

    python benchmarks/optimize_bench.py                      # everything; writes benchmarks/results/optimize.json
    python benchmarks/optimize_bench.py --cases bert-base    # one timing case
    python benchmarks/optimize_bench.py --no-quality --no-kernels

* speed: wall time of ``optimize()`` (split into rules / saturate / extract) on bert-base, bert-large
  and the synthetic 20,000-op graph, each in its own process so its peak RSS (ru_maxrss) is its own;
* quality: for every region of bert-base and of random graphs, the modelled cost greedy, dp and
  beam find against the exact strategy (gap in percent);
* kernels: our plan's kernel count on a real BERT-base export against the graph onnxruntime makes
  of the same file at ORT_ENABLE_ALL (view-only ops count zero in both), and the bytes of
  intermediates materialised before and after fusion.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

GIB = 1 << 30
TIMING_CASES: dict[str, dict[str, Any]] = {
    "bert-base": {"target_s": 2.0},
    "bert-large": {"target_s": 4.0},
    "synthetic20000": {"target_s": 60.0, "target_rss_bytes": 2 * GIB},
}
QUALITY_TARGET_PERCENT = 2.0
INTERMEDIATE_TARGET = 0.5  # at least half of the intermediate bytes gone
RANDOM_SEEDS = tuple(range(8))
REAL_BERT_SEQ = 128


def build_case(name: str) -> Any:
    from autofusion import models

    if name.startswith("synthetic"):
        from autofusion.models.synthetic import synthetic_graph

        return synthetic_graph(int(name.removeprefix("synthetic")))
    return models.build(name)


# -- speed: one case per process ----------------------------------------------------------------


def time_case(name: str, repeat: int) -> dict[str, Any]:
    """Build ``name`` and optimise it ``repeat`` times in this process (called in a child)."""
    from autofusion.api import optimize
    from autofusion.bench.environment import peak_rss_kib, status_kib

    t0 = time.perf_counter()
    graph = build_case(name)
    build_s = time.perf_counter() - t0
    rss_before = (status_kib("VmRSS") or 0) * 1024
    runs = []
    plan = None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        plan = optimize(graph)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        st = plan.stats
        # cpu_s: CPU seconds of this process; on a shared machine it stays near the idle-machine wall time
        runs.append({"total_s": total, "cpu_s": cpu, "rules_s": st["seconds_rules"], "saturate_s": st["seconds_saturate"],
                     "extract_s": st["seconds_extract"], "saturation_stop": st["saturation"]["stop"]})
    assert plan is not None
    return {"case": name, "nodes": len(graph.nodes), "build_s": build_s, "runs": runs,
            "median_total_s": statistics.median(r["total_s"] for r in runs),
            # the first run compiles the rule library into egglog (later runs in a process reuse it)
            "first_total_s": runs[0]["total_s"],
            "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "kernels_before": int(plan.stats["kernels_source"]), "kernels_after": plan.kernels,
            "rss_before_optimize_bytes": rss_before, "peak_rss_bytes": (peak_rss_kib() or 0) * 1024}


def run_child(args: list[str], timeout: float) -> dict[str, Any]:
    """Run this script with ``args`` in a fresh process; its last stdout line is a JSON object."""
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                       timeout=timeout)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()[-5:]
        return {"error": f"exit {r.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def speed(cases: list[str], repeat: int) -> dict[str, Any]:
    out = {}
    for name in cases:
        reps = 1 if name.startswith("synthetic") else repeat
        result = run_child(["--child-time", name, "--repeat", str(reps)], timeout=1800)
        target = TIMING_CASES.get(name, {})
        if "error" not in result:
            result["target_s"] = target.get("target_s")
            result["met_time"] = result["target_s"] is None or result["median_total_s"] <= result["target_s"]
            if "target_rss_bytes" in target:
                result["target_rss_bytes"] = target["target_rss_bytes"]
                result["met_rss"] = result["peak_rss_bytes"] <= target["target_rss_bytes"]
        out[name] = result
        print(f"speed {name}: {json.dumps(result)[:300]}", file=sys.stderr)
    return out


# -- quality: strategies against the exact one ---------------------------------------------------


def quality(random_seeds: tuple[int, ...] = RANDOM_SEEDS, random_ops: int = 32) -> dict[str, Any]:
    from autofusion import models
    from autofusion.bench.quality import STRATEGIES, region_costs, summarise
    from autofusion.bench.random_graphs import random_graph

    graphs = [("bert-base", models.build("bert-base"))]
    graphs += [(f"random{s}", random_graph(s, ops=random_ops)) for s in random_seeds]
    out: dict[str, Any] = {"target_percent": QUALITY_TARGET_PERCENT, "graphs": {}}
    pooled: list[Any] = []
    for name, graph in graphs:
        t0 = time.perf_counter()
        regions = region_costs(graph)
        pooled.extend(regions)
        out["graphs"][name] = {
            "nodes": len(graph.nodes), "seconds": time.perf_counter() - t0,
            "regions": sum(r.copies for r in regions), "distinct_regions": len(regions),
            "regions_without_exact": sum(r.copies for r in regions if not r.exact_solved),
            "largest_region": max((r.nodes for r in regions), default=0),
            "gaps": {s: asdict(summarise(regions, s)) for s in STRATEGIES if s != "exact"},
            "notes": sorted({n for r in regions for ns in r.notes.values() for n in ns}),
        }
        print(f"quality {name}: {json.dumps(out['graphs'][name]['gaps'])[:300]}", file=sys.stderr)
    out["all"] = {s: asdict(summarise(pooled, s)) for s in STRATEGIES if s != "exact"}
    out["met"] = all(v["max_percent"] <= QUALITY_TARGET_PERCENT for v in out["all"].values())
    return out


# -- kernels and intermediates on a real BERT-base export ---------------------------------------


def export_real_bert(path: str) -> dict[str, Any]:
    """HuggingFace BertModel(BertConfig()) with random weights, exported by the TorchScript exporter."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig()
    config._attn_implementation = "eager"  # the classic MatMul/Softmax/MatMul attention the exporter traces
    model = BertModel(config).eval()

    class Outputs(torch.nn.Module):  # plain tensors out, inputs by keyword (transformers 5 signature)
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    ids = torch.randint(0, config.vocab_size, (1, REAL_BERT_SEQ))
    ones = torch.ones(1, REAL_BERT_SEQ, dtype=torch.int64)
    zeros = torch.zeros(1, REAL_BERT_SEQ, dtype=torch.int64)
    import transformers

    torch.onnx.export(Outputs(), (ids, ones, zeros), path, opset_version=17, dynamo=False,
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state", "pooler_output"])
    return {"source": f"transformers {transformers.__version__} BertModel(BertConfig()) with random weights, "
                      f"torch {torch.__version__} torch.onnx.export (TorchScript exporter, opset 17, seq "
                      f"{REAL_BERT_SEQ})"}


def export_builtin_bert(path: str) -> dict[str, Any]:
    from autofusion import models
    from autofusion.decide import unfused_plan
    from autofusion.export import save_onnx

    save_onnx(unfused_plan(models.build("bert-base")), path)
    return {"source": "built-in bert-base (seq 128) written with autofusion.export (torch/transformers unavailable)"}


def count_kernels(path: str) -> dict[str, Any]:
    """Our plan of the ONNX file against onnxruntime's ORT_ENABLE_ALL graph of it (called in a child)."""
    from collections import Counter

    import onnx
    import onnxruntime as ort

    from autofusion.api import optimize
    from autofusion.bench.runners import ONNX_VIEW_OPS
    from autofusion.decide.summary import plan_summary
    from autofusion.frontends.onnx_import import load_onnx

    graph = load_onnx(path)
    plan = optimize(graph)
    summary = plan_summary(plan, graph)
    optimized = str(Path(path).with_suffix(".ort.onnx"))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = optimized
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "ort.weights")
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    nodes = onnx.load(optimized, load_external_data=False).graph.node
    ort_ops = Counter(n.op_type for n in nodes)
    ort_kernels = sum(c for op, c in ort_ops.items() if op not in ONNX_VIEW_OPS)
    before, after = summary["intermediate_bytes_before"], summary["intermediate_bytes_after"]
    return {
        "onnx_nodes": len(graph.nodes),
        "ours_kernels_unfused": summary["kernels_before"],
        "ours_kernels": summary["kernels_after"],
        "ort_all_nodes": len(nodes),
        "ort_all_kernels": ort_kernels,
        "ort_all_ops": dict(ort_ops.most_common()),
        "intermediate_bytes_before": before,
        "intermediate_bytes_after": after,
        "intermediate_reduction": 1 - after / before if before else 0.0,
        "met_kernels": summary["kernels_after"] < ort_kernels,
        "met_intermediates": before > 0 and 1 - after / before >= INTERMEDIATE_TARGET,
    }


def kernels(real: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="autofusion-bert-") as tmp:
        path = str(Path(tmp) / "bert_base.onnx")
        made = run_child(["--child-export", path], timeout=1200) if real else {"error": "real export not asked for"}
        if "error" in made:
            reason = made["error"]
            made = run_child(["--child-export-builtin", path], timeout=1200)
            made["real_export_failed"] = reason
        if "error" in made:
            return made
        counted = run_child(["--child-kernels", path], timeout=1800)
        return {**made, **counted}


# -- driver ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "optimize.json"))
    p.add_argument("--cases", default=",".join(TIMING_CASES), help="timing cases (comma-separated)")
    p.add_argument("--repeat", type=int, default=3, help="optimize() runs per timing case (synthetic: 1)")
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--no-quality", action="store_true")
    p.add_argument("--no-kernels", action="store_true")
    p.add_argument("--builtin-bert", action="store_true", help="skip the torch/transformers export")
    p.add_argument("--fresh", action="store_true", help="start a new result file instead of updating it")
    p.add_argument("--child-time", metavar="CASE", help=argparse.SUPPRESS)
    p.add_argument("--child-export", metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--child-export-builtin", metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--child-kernels", metavar="PATH", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    child = {"child_time": lambda v: time_case(v, args.repeat), "child_export": export_real_bert,
             "child_export_builtin": export_builtin_bert, "child_kernels": count_kernels}
    for key, fn in child.items():
        value = getattr(args, key)
        if value:
            print(json.dumps(fn(value)))
            return 0
    from autofusion.bench.environment import load_average, machine_info

    out = Path(args.out)
    # sections not run this time are kept from the file; each records the load it ran under
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() and not args.fresh else {}
    for stale in ("load_average_before", "load_average_after"):  # whole-file loads of older versions
        result.pop(stale, None)
    result["machine"] = machine_info()
    sections = {"speed": lambda: speed([c.strip() for c in args.cases.split(",") if c.strip()], args.repeat),
                "quality": quality, "kernels": lambda: kernels(real=not args.builtin_bert)}
    for key, run in sections.items():
        if getattr(args, f"no_{key}"):
            continue
        before = load_average()
        section = run()
        if key == "speed":  # merge timing cases: one case can be rerun alone
            section = {**result.get("speed", {}), **section}
        result[key] = section
        result[f"{key}_load_average"] = {"before": before, "after": load_average()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
