"""``autofusion bench-cores MODEL``: every distinct matrix-product core of the model, timed alone in
autofusion, onnxruntime and OpenBLAS side by side, with the ratios and the model's GEMM floor; with
``--in-model``, timed inside the whole model run by autofusion and by onnxruntime."""

from __future__ import annotations

import argparse
from typing import Any

from autofusion.cli.cmd_fuse import add_plan_arguments, make_plan
from autofusion.cli.common import CliError, Output, positive_int
from autofusion.cli.tuning_args import add_tune_argument, tune_progress, tune_wanted


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench-cores", help="time each distinct GEMM/Conv core against onnxruntime and OpenBLAS",
        description="Compile the fused model (tuning its cores unless --no-tune), then time every distinct "
                    "matrix-product core alone: our kernel with the variant the plan uses, onnxruntime on the same "
                    "single op, and numpy's OpenBLAS on the same matrices, in one process, round by round.")
    add_plan_arguments(p)
    p.add_argument("--threads", type=positive_int, default=2, metavar="N", help="threads for every runtime (default 2)")
    p.add_argument("--repeat", type=positive_int, default=10, metavar="N", help="timed runs per round (default 10)")
    p.add_argument("--rounds", type=positive_int, default=5, metavar="N", help="rounds of every runner (default 5)")
    p.add_argument("--top", type=positive_int, default=None, metavar="N",
                   help="only the N cores with the most FLOPs in the model")
    p.add_argument("--in-model", action="store_true",
                   help="time the cores inside the whole model instead: our profiling build's kernels beside "
                        "onnxruntime's profiled nodes (with its graph optimisations), per distinct core")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the random inputs (--in-model)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_tune_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autofusion.bench.cores import distinct_cores, measure_cores, report
    from autofusion.bench.environment import limit_threads, load_average, machine_info
    from autofusion.runtime import CompiledModel

    limit_threads(args.threads)
    loaded, plan = make_plan(args)
    if args.in_model:
        return _run_in_model(args, loaded, plan)
    with tune_progress() as progress:
        model = CompiledModel(plan, threads=args.threads, tune=tune_wanted(args), progress=progress)
    cores = distinct_cores(model.source.kernels)[: args.top]
    if not cores:
        raise CliError(f"{loaded.source} has no MatMul, Gemm or Conv core to time")
    before = load_average()
    results = measure_cores(cores, model.machine, args.threads, args.repeat, args.rounds, model.cache)
    meta = {"model": loaded.source, "threads": args.threads, "repeat": args.repeat, "rounds": args.rounds,
            "tuned": tune_wanted(args), "isa": model.machine.isa, "machine": machine_info(),
            "load_average_before": before, "load_average_after": load_average()}
    data = report(results, meta)
    out = Output()
    if args.json:
        out.json(data)
        return 0
    _print(out, data)
    return 0


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _x(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}x"


def _print(out: Output, data: dict[str, Any]) -> None:
    rows = []
    for c in data["cores"]:
        t = c["median_ms"]
        rows.append((c["core"], c["count_in_model"], c["variant"], _ms(t.get("autofusion")), _ms(t.get("onnxruntime")),
                     _ms(t.get("openblas")), _x(c["ratio_vs_onnxruntime"]), _x(c["ratio_vs_openblas"]),
                     f"{c['gflops'].get('autofusion', 0):.0f}"))
    m = data["machine"]
    out.table(f"{data['model']}: cores alone, medians of {data['rounds']} rounds x {data['repeat']} runs, "
              f"{data['threads']} threads, {m['cpu']} ({data['isa']})",
              ("core", "in model", "variant", "ours ms", "ort ms", "openblas ms", "ours/ort", "ours/blas", "GFLOP/s"),
              rows)
    out.line("ours/ort below 1: our core is faster than onnxruntime's for the same op.")
    floor = data["floor"]
    if "floor_ms" in floor:
        out.line(f"GEMM floor: {floor['gflop']:.2f} GFLOP at {floor['best_gflops']:.0f} GFLOP/s "
                 f"(best rate of the run: {floor['best_by']}) = {floor['floor_ms']:.2f} ms; our cores alone "
                 f"x their count: {floor['cores_alone_ms']:.2f} ms")
    for c in data["cores"]:
        for name, why in c["skipped"].items():
            out.line(f"skipped {name} for {c['core']}: {why}")
    out.line(f"load average before/after: {data['load_average_before']} / {data['load_average_after']}")


def _run_in_model(args: argparse.Namespace, loaded: Any, plan: Any) -> int:
    from autofusion.bench.environment import load_average, machine_info
    from autofusion.bench.in_model import OnnxRuntimeFailed, measure_in_model
    from autofusion.bench.runners import BenchSetup
    from autofusion.models import random_inputs

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise CliError("--in-model compares with onnxruntime: pip install onnxruntime") from None
    setup = BenchSetup(loaded.graph, plan, random_inputs(loaded.graph, seed=args.seed), args.threads)
    before = load_average()
    try:
        with tune_progress() as progress:
            result = measure_in_model(plan, setup.onnx_bytes, setup.feeds, args.threads, args.repeat, args.rounds,
                                      tune=tune_wanted(args), progress=progress)
    except OnnxRuntimeFailed as e:
        raise CliError(f"{loaded.source}: {e}") from None
    data = {"model": loaded.source, "threads": args.threads, "repeat": args.repeat, "rounds": args.rounds,
            "tuned": tune_wanted(args), "machine": machine_info(), "load_average_before": before,
            "load_average_after": load_average(), **result.to_json()}
    out = Output()
    if args.json:
        out.json(data)
        return 0
    rows = []
    cores = data["cores"][: args.top]
    for c in cores:
        t = c["ms_per_instance"]
        count = str(c["instances"]) if c["instances"] == c["onnxruntime_nodes"] else \
            f"{c['instances']} / {c['onnxruntime_nodes']}"
        rows.append((c["core"], count, ", ".join(c["variants"]), _ms(t["autofusion"]), _ms(t["onnxruntime"]),
                     _x(c["ratio_vs_onnxruntime"]), f"{c['gflops'].get('autofusion', 0):.0f}",
                     f"{c['gflops'].get('onnxruntime', 0):.0f}"))
    m = data["machine"]
    out.table(f"{data['model']}: cores inside the whole model, medians of {data['rounds']} rounds x {data['repeat']} "
              f"runs, {data['threads']} threads, {m['cpu']}",
              ("core", "in model", "variant", "ours ms", "ort ms", "ours/ort", "ours GFLOP/s", "ort GFLOP/s"), rows)
    out.line("ms per instance: our kernel holding the core (its epilogue included; a kernel of several cores "
             "shared by FLOPs) against onnxruntime's node (its fused activation or sum included).")
    tot, rest = data["totals_ms"], data["outside_cores_ms"]
    out.line(f"all kernels: ours {tot['autofusion']:.2f} ms, onnxruntime's nodes {tot['onnxruntime']:.2f} ms; "
             f"outside the cores: ours {rest['autofusion']:.2f} ms, onnxruntime {rest['onnxruntime']:.2f} ms")
    run = data["whole_run_ms"]
    over = tot["onnxruntime"] / run["onnxruntime"] if run["onnxruntime"] > 0 else 0.0
    out.line(f"whole runs while profiled (wall clock): ours {run['autofusion']:.2f} ms, onnxruntime "
             f"{run['onnxruntime']:.2f} ms" + (f"; onnxruntime's nodes sum to {over:.2f}x its run, so its times "
                                               "above may be overstated (ours/ort flattered)" if over > 1.02 else ""))
    for node, ms in data["unmatched_onnxruntime_nodes_ms"].items():
        out.line(f"onnxruntime node {node} ({ms:.3f} ms) computes a product the plan has no core for")
    out.line(f"load average before/after: {data['load_average_before']} / {data['load_average_after']}")
    return 0
