"""``autofusion bench MODEL``: the fused model side by side with the unfused one, the reference
interpreter, onnxruntime and torch, in one run, on the same inputs and the same thread count."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from autofusion.cli.cmd_fuse import add_plan_arguments, make_plan
from autofusion.cli.common import CliError, Output, error, human_bytes, positive_int
from autofusion.cli.tuning_args import add_tune_argument, tune_progress, tune_wanted

EXIT_MISMATCH = 1  # outputs that differ from the reference are a bug somewhere: never a quiet success


def add_parser(subparsers: Any) -> None:
    from autofusion.bench.device_runners import DEVICE_RUNNER_NAMES
    from autofusion.bench.runners import RUNNER_NAMES

    p = subparsers.add_parser(
        "bench", help="time the fused model against the unfused one, onnxruntime and torch",
        description="Run the model with every runtime side by side (reference interpreter, op-by-op kernels, the "
                    "fused SuperKernel, onnxruntime without and with graph optimisation, torch eager and "
                    "torch.compile) on the same random inputs; report median latency, peak memory and kernels, "
                    "and check every runtime's outputs against the reference.")
    add_plan_arguments(p)
    p.add_argument("--repeat", type=positive_int, default=10, metavar="N", help="timed runs per runner (default 10)")
    p.add_argument("--rounds", type=positive_int, default=1, metavar="N",
                   help="run the whole sequence of runners N times, every other time in reverse order, and "
                        "pool each runner's timed runs (default 1): on a machine whose speed drifts, every "
                        "runner then samples the same stretches of time")
    p.add_argument("--warmup", type=_non_negative, default=2, metavar="N",
                   help="untimed runs per runner before timing (default 2)")
    p.add_argument("--threads", type=positive_int, default=2, metavar="N",
                   help="threads for every runtime (default 2)")
    p.add_argument("--runners", default=None, metavar="LIST",
                   help=f"comma-separated runners to include (default all of the device's: {','.join(RUNNER_NAMES)} "
                        "on the cpu)")
    p.add_argument("--skip", default="", metavar="LIST", help="comma-separated runners to leave out")
    p.add_argument("--rtol", type=float, default=None, metavar="X", help="relative tolerance of the output check")
    p.add_argument("--atol", type=float, default=None, metavar="X", help="absolute tolerance of the output check")
    p.add_argument("--pause", type=float, default=None, metavar="S",
                   help="seconds of rest before each runner is timed, so thread pools of the previous one go "
                        "idle (default 0.5)")
    p.add_argument("--in-process", action="store_true",
                   help="measure every runner in this process instead of one fresh process each (faster to "
                        "start; the runtimes' thread pools then share the machine)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the random inputs (default 0)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default): the runtimes above on this machine's cores; cuda: on the GPU, the plan's "
                        f"Triton SuperKernel beside torch and onnxruntime's CUDA provider ({', '.join(DEVICE_RUNNER_NAMES)})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_tune_argument(p)
    p.set_defaults(func=run)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def selected_runners(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """(runners to run, runners left out with why); unknown names are usage errors."""
    from autofusion.bench.device_runners import DEVICE_RUNNER_NAMES
    from autofusion.bench.runners import RUNNER_NAMES

    known = DEVICE_RUNNER_NAMES if args.device == "cuda" else RUNNER_NAMES

    def names(text: str, option: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        unknown = [s for s in items if s not in known]
        if unknown:
            raise CliError(f"{option}: unknown runner {', '.join(unknown)} on --device {args.device} "
                           f"(runners: {', '.join(known)})")
        return items

    wanted = names(args.runners if args.runners is not None else ",".join(known), "--runners")
    skip = set(names(args.skip, "--skip"))
    chosen = [n for n in known if n in wanted and n not in skip]
    left_out = {n: "left out by --skip" if n in skip else "not in --runners" for n in known if n not in chosen}
    if not chosen:
        raise CliError("no runner left to run (check --runners and --skip)")
    return chosen, left_out


def run(args: argparse.Namespace) -> int:
    from autofusion.bench import ATOL, RTOL, BenchSetup, run_bench, to_json
    from autofusion.bench.environment import limit_threads, machine_info
    from autofusion.bench.harness import PAUSE_SECONDS
    from autofusion.decide.summary import plan_summary
    from autofusion.models import random_inputs
    from autofusion.plugins import registry_with_plugins

    for option in ("rtol", "atol", "pause"):
        value = getattr(args, option)
        if value is not None and not value >= 0:
            raise CliError(f"--{option} must be a non-negative number, got {value}")
    names, left_out = selected_runners(args)
    if args.device == "cuda":
        _check_cuda()
    limit_threads(args.threads)  # before any runtime starts its thread pool
    loaded, plan = make_plan(args)
    # on the GPU the Triton runner tunes its kernels in its first run (AUTOFUSION_TUNE=0 with --no-tune)
    tuning = pretune(plan, args) if args.device == "cpu" else _triton_tuning(args)
    registry = registry_with_plugins()
    feeds = random_inputs(loaded.graph, seed=args.seed)
    setup = BenchSetup(loaded.graph, plan, feeds, args.threads, registry, device=args.device)
    with _progress() as progress:
        result = run_bench(setup, names, args.repeat, args.warmup, progress,
                           RTOL if args.rtol is None else args.rtol, ATOL if args.atol is None else args.atol,
                           PAUSE_SECONDS if args.pause is None else args.pause, isolate=not args.in_process,
                           rounds=args.rounds)
    summary = plan_summary(plan, loaded.graph, registry)
    meta = {
        "model": loaded.source,
        "graph": loaded.graph.name,
        "inputs": {n: list(loaded.graph.types[n].shape) for n in loaded.graph.inputs},
        "strategy": plan.strategy,
        "isolation": "in-process" if args.in_process else "one process per runner",
        "device": _device_name(args.device),
        "plan": {k: summary[k] for k in ("kernels_before", "kernels_after", "intermediate_bytes_before",
                                         "intermediate_bytes_after", "seconds")},
        "machine": machine_info(),
        "tuning": tuning,
    }
    data = to_json(result, meta)
    data["skipped"] = {**data["skipped"], **left_out}
    out = Output()
    if args.json:
        out.json(data)
    else:
        _print_tables(out, loaded.source, data)
    return _verdict(data)


def _triton_tuning(args: argparse.Namespace) -> dict[str, Any]:
    import os

    if not tune_wanted(args):
        os.environ["AUTOFUSION_TUNE"] = "0"  # the runners' worker processes inherit it
        return {"tuned": False}
    return {"tuned": True, "where": "the triton runner's first run (launch configurations, cached per device)"}


def _check_cuda() -> None:
    try:
        import torch
    except ImportError:
        raise CliError("--device cuda needs torch and triton: pip install 'autofusion[gpu]'") from None
    if not torch.cuda.is_available():
        raise CliError("--device cuda: no CUDA device here (torch.cuda.is_available() is False); "
                       "without --device the runtimes run on the CPU")


def _device_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    return f"cuda: {torch.cuda.get_device_name()}"


def pretune(plan: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Tune the plan's cores once, here, before any runner is timed (the runners' processes then
    find them in the cache); with --no-tune, every process takes the untuned default."""
    import os

    from autofusion.runtime import CompiledModel
    from autofusion.runtime.tuning import Tuner

    if not tune_wanted(args):
        os.environ["AUTOFUSION_TUNE"] = "0"  # the runners' worker processes inherit it
        return {"tuned": False}
    t0 = time.perf_counter()
    with tune_progress() as progress:
        model = CompiledModel(plan, threads=args.threads, tune=True, progress=progress)
    assert isinstance(model.chooser, Tuner)
    return {"tuned": True, "seconds": round(time.perf_counter() - t0, 3),
            "cores_measured": model.chooser.tuned,
            "cores": sorted({f"{s.describe()}: {c.label(model.machine, s)}" for k in model.source.kernels
                             for s, c in k.cores})}


def _verdict(data: dict[str, Any]) -> int:
    """Failures and output mismatches are reported on stderr and make the exit status 1."""
    status = 0
    for name, message in data["failed"].items():
        error(f"runner {name} failed: {message}")
        status = EXIT_MISMATCH
    for name in data["mismatches"]:
        error(f"OUTPUT MISMATCH: {name} differs from the reference: {data['runners'][name]['check']}")
        status = EXIT_MISMATCH
    return status


def _print_tables(out: Output, source: str, data: dict[str, Any]) -> None:
    from autofusion.bench.report import short_method

    runners = data["runners"]
    fused = runners.get("fused")
    sizes = ", ".join(f"{n} {shape}" for n, shape in data["inputs"].items())
    rows = []
    for name, r in runners.items():
        speed = data["ratios"].get("fused_speedup", {}).get(name)
        rows.append((name, f"{r['median_ms']:.3f}" if r["median_ms"] is not None else "n/a",
                     f"{r['min_ms']:.3f}" if r["min_ms"] is not None else "n/a",
                     "1.00x" if name == "fused" else ("" if speed is None else f"{speed:.2f}x"),
                     "n/a" if r["peak_bytes"] is None else human_bytes(r["peak_bytes"]),
                     short_method(r["peak_method"]), "n/a" if r["kernels"] is None else r["kernels"],
                     f"{r['max_abs_error']:.2e}" if r["max_abs_error"] is not None else "n/a",
                     "ok" if r["outputs_ok"] else "MISMATCH"))
    rounds = data.get("rounds", 1)
    runs = f"{data['repeat']} runs" if rounds == 1 else f"{rounds} rounds x {data['repeat']} runs"
    out.table(f"{source} ({sizes}): median of {runs} after {data['warmup']} warm-up, "
              f"{data['threads']} threads",
              ("runner", "median ms", "min ms", "fused is", "peak memory", "measured by", "kernels", "max |err|",
               "outputs"),
              rows)
    out.line("'fused is' = that runner's median / the fused median (above 1: fused is faster); min ms: the "
             "fastest timed run.")
    for name in ("unfused", "fused"):
        r = runners.get(name)
        if r is not None and r.get("outside_opaque_ms") is not None:
            out.line(f"{name}: {r['outside_opaque_ms']:.3f} ms outside MatMul/Gemm/Conv cores ({r['outside_opaque_method']})")
    ratio = data["ratios"].get("outside_opaque_unfused_over_fused")
    if ratio is not None:
        out.line(f"time outside opaque cores: unfused / fused = {ratio:.2f}x")
    for name in ("unfused", "fused"):
        r = runners.get(name)
        if r is not None and r.get("footprint_bytes") is not None:
            out.line(f"{name}: {human_bytes(r['footprint_bytes'])} with each thread's blocks (im2col, tiles) of the "
                     f"kernel with the largest, {human_bytes(r['thread_block_bytes'])} per thread")
    if fused is not None:
        out.line(f"fused max |error| against the reference: {data['max_abs_error']:.3g}")
    for name, reason in data["skipped"].items():
        out.line(f"skipped {name}: {reason}")
    tuning = data.get("tuning") or {}
    if tuning.get("tuned"):
        out.line(f"cores tuned on this machine ({tuning['cores_measured']} measured now, "
                 f"{tuning['seconds']:.1f} s with compiling): " + "; ".join(tuning["cores"]))
    elif tuning:
        out.line("cores: untuned defaults (--no-tune)")
    out.line(f"load average before/after: {data['load_average_before']} / {data['load_average_after']}")


class _progress:
    """A rich progress bar on stderr when it is a terminal; nothing otherwise."""

    def __enter__(self) -> Any:
        from autofusion.bench import NoProgress

        if not sys.stderr.isatty():
            self._bar = None
            return NoProgress()
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        # on stderr, so that stdout stays the table or the JSON object
        self._bar = Progress(TextColumn("{task.description:<28}"), BarColumn(), TimeElapsedColumn(),
                             console=Console(file=sys.stderr, force_terminal=True), transient=True)
        self._bar.__enter__()
        bar = self._bar

        class _Rich:
            task = None

            def start(self, total: int) -> None:
                self.task = bar.add_task("benchmark", total=total)

            def step(self, description: str) -> None:
                if self.task is not None:
                    bar.update(self.task, advance=1, description=description)

        return _Rich()

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)  # type: ignore[arg-type]
