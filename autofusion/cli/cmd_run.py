"""``autofusion run MODEL``: execute a model on given or random inputs and summarise its outputs."""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.cli.common import CliError, Output, add_model_arguments, json_number, load_model
from autofusion.cli.tuning_args import add_tune_argument, tune_progress, tune_wanted
from autofusion.ir import Graph

BACKENDS = ("reference", "c", "c-unfused", "triton")
HEAD = 5  # values shown per output


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run", help="run a model and summarise its outputs",
        description="Run a model with the chosen backend on inputs from an .npz file (keys input:NAME) "
                    "or on seeded random inputs, and print each output's shape, dtype, statistics and "
                    "first values, and the wall time.")
    add_model_arguments(p)
    p.add_argument("--backend", choices=BACKENDS, default="reference",
                   help="reference (numpy interpreter), c (fused plan as one compiled SuperKernel), c-unfused "
                        "(every op its own compiled kernel) or triton (the fused plan's Triton kernels on the CUDA "
                        "device, or under Triton's interpreter on the CPU when there is none: slow, for checking); "
                        "default reference")
    p.add_argument("--inputs", metavar="FILE.npz", help="inputs as an .npz with keys input:NAME")
    p.add_argument("--save", metavar="FILE.npz", help="write the outputs (output:NAME) and inputs (input:NAME)")
    p.add_argument("--seed", type=int, default=0, help="seed of built-in weights and random inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--profile", action="store_true",
                   help="with --backend c: build the SuperKernel with a clock around every kernel, run it "
                        "5 more times and list the kernels by their median time and the core each ran")
    add_tune_argument(p)
    p.set_defaults(func=run)


def read_npz_inputs(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz, by key; CliError when it cannot be read as one."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic[:4] != b"PK\x03\x04" and magic != b"\x93NUMPY":
            raise CliError(f"inputs file {path} is not an .npz archive (expected one written by numpy.savez "
                           "with keys input:NAME)")
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise CliError(f"inputs file {path} holds one array, not an .npz archive with keys input:NAME")
        with data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise CliError(f"inputs file not found: {path}") from None
    except IsADirectoryError:
        raise CliError(f"inputs file {path} is a directory") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CliError(f"cannot read inputs file {path}: {e} (expected an .npz written by numpy.savez)") from None
    return arrays


def given_inputs(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k.removeprefix("input:"): v for k, v in arrays.items() if k.startswith("input:")}


def checked_inputs(path: str, arrays: Mapping[str, np.ndarray], graph: Graph) -> dict[str, np.ndarray]:
    """The feeds of ``graph`` among ``arrays`` (keys ``input:NAME``), checked against its inputs."""
    given = given_inputs(arrays)
    missing = [n for n in graph.inputs if n not in given]
    if missing:
        raise CliError(f"inputs file {path} lacks {', '.join('input:' + n for n in missing)} "
                       f"(it has: {', '.join(sorted(arrays)) or 'no arrays'})")
    unknown = sorted(set(given) - set(graph.inputs))
    if unknown:
        raise CliError(f"inputs file {path} has {', '.join('input:' + n for n in unknown)}, which the model does "
                       f"not take (its inputs: {', '.join(graph.inputs)})")
    for n in graph.inputs:
        want, got = graph.types[n], given[n]
        if tuple(got.shape) != want.shape or got.dtype != want.dtype.numpy:
            raise CliError(f"inputs file {path}: input:{n} is {got.dtype}{list(got.shape)}, the model takes "
                           f"{want.dtype}{list(want.shape)}")
    return {n: given[n] for n in graph.inputs}


def summarise(name: str, value: np.ndarray) -> dict[str, Any]:
    """Shape, dtype, statistics over finite values, count of non-finite ones, first values."""
    flat = np.asarray(value).reshape(-1)
    as_float = flat.astype(np.float64)
    finite = as_float[np.isfinite(as_float)]
    stats = {k: json_number(float(f(finite))) if finite.size else None
             for k, f in (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max))}
    head = [v.item() for v in flat[:HEAD]]
    return {"name": name, "shape": list(value.shape), "dtype": str(value.dtype), **stats,
            "nonfinite": int(as_float.size - finite.size),
            "head": [json_number(v) if isinstance(v, float) else v for v in head]}


def save_npz(path: str, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> str:
    """Write ``input:NAME`` and ``output:NAME`` arrays; returns the path numpy wrote."""
    target = path if path.endswith(".npz") else path + ".npz"  # numpy.savez appends it otherwise
    arrays = {**{f"input:{k}": v for k, v in feeds.items()}, **{f"output:{k}": v for k, v in outputs.items()}}
    try:
        np.savez(target, **arrays)  # type: ignore[arg-type]
    except OSError as e:
        raise CliError(f"cannot write {target}: {e.strerror or e}") from None
    return target


def run(args: argparse.Namespace) -> int:
    from autofusion.ir import run_graph
    from autofusion.models import random_inputs

    out = Output()
    if args.save and Path(args.save).is_dir():
        raise CliError(f"--save {args.save} is a directory; give a file name")
    arrays = read_npz_inputs(args.inputs) if args.inputs else None
    # a model exported with dynamic axes runs at whatever sizes the inputs file holds
    loaded = load_model(args, seed=args.seed, feeds=given_inputs(arrays) if arrays is not None else None)
    graph = loaded.graph
    feeds = checked_inputs(args.inputs, arrays, graph) if arrays is not None else random_inputs(graph, seed=args.seed)
    if args.profile and args.backend != "c":
        raise CliError("--profile times the kernels of the fused SuperKernel: use it with --backend c")
    start = time.perf_counter()
    profile: list[dict[str, Any]] | None = None
    triton: dict[str, Any] | None = None
    if args.backend == "reference":
        outputs = run_graph(graph, feeds)
    elif args.backend == "triton":
        outputs, start, triton = _run_triton(graph, feeds, tune=None if args.tune is None else False)
    else:
        outputs, start, profile = _run_compiled(args, graph, feeds)
    wall = time.perf_counter() - start
    saved = save_npz(args.save, feeds, outputs) if args.save else None
    summaries = [summarise(name, outputs[name]) for name in graph.outputs]
    if args.json:
        data = {"model": loaded.source, "backend": args.backend, "wall_s": wall,
                "inputs": args.inputs or f"random (seed {args.seed})", "saved": saved, "outputs": summaries}
        if profile is not None:
            data["kernels"] = profile
        if triton is not None:
            data["triton"] = triton
        out.json(data)
        return 0
    rows = [(s["name"], "x".join(map(str, s["shape"])) or "scalar", s["dtype"], _num(s["mean"]), _num(s["std"]),
             _num(s["min"]), _num(s["max"]), " ".join(_num(v) for v in s["head"]))
            for s in summaries]
    out.table(f"{loaded.source}: outputs ({args.backend} backend)",
              ("output", "shape", "dtype", "mean", "std", "min", "max", "first values"), rows)
    for s in summaries:
        if s["nonfinite"]:
            out.line(f"warning: {s['name']} has {s['nonfinite']} non-finite values")
    out.line(f"inputs: {args.inputs or f'random (seed {args.seed})'}")
    out.line(f"wall time: {wall * 1000:.1f} ms")
    if triton is not None:
        out.line(f"triton on {triton['device']}: {triton['kernels']} kernels, {triton['launches']}; "
                 f"launch configurations {triton['tuned']}")
        for group, why in triton["split"].items():
            out.line(f"  {group}: one kernel per op ({why})")
        for group, why in triton["torch"].items():
            out.line(f"  {group}: torch's op on the device ({why})")
        for group, why in triton["host"].items():
            out.line(f"  {group}: on the host with the reference ops ({why})")
    if profile is not None:
        total = sum(k["ms"] for k in profile) or 1.0
        top = profile[:PROFILE_ROWS]
        out.table(f"kernels by time (medians of {PROFILE_RUNS} runs after the first; {len(top)} of {len(profile)}, "
                  f"{total:.1f} ms in all)",
                  ("kernel", "template", "nodes", "ms", "predicted ms", "share", "core"),
                  [(k["kernel"], k["template"], str(k["nodes"]), f"{k['ms']:.3f}", f"{k['predicted_ms']:.3f}",
                    f"{100 * k['ms'] / total:.1f}%", ", ".join(k["cores"]) or "-") for k in top])
        predicted = sum(k["predicted_ms"] for k in profile)
        out.line(f"predicted by {profile[0]['cost_model'] if profile else 'the cost model'}: {predicted:.1f} ms "
                 f"for these kernels ({predicted / total - 1:+.0%})")
    if saved:
        out.line(f"saved: {saved}")
    return 0


PROFILE_ROWS = 15
PROFILE_RUNS = 5


def _run_compiled(args: argparse.Namespace, graph: Graph, feeds: Mapping[str, np.ndarray]
                  ) -> tuple[dict, float, list[dict[str, Any]] | None]:
    """Outputs of the fused plan compiled as one SuperKernel (``c``) or of every op compiled on its
    own (``c-unfused``); the start time excludes optimisation and compilation; with ``--profile``,
    the kernels by time, slowest first."""
    from autofusion.runtime import CompiledModel, CompileError, UnfusedRunner

    try:
        if args.backend == "c":
            from autofusion.api import optimize

            plan = optimize(graph)
            with tune_progress() as progress:
                model: Any = CompiledModel(plan, profile=args.profile, tune=tune_wanted(args), progress=progress)
        else:
            model = UnfusedRunner(graph, tune=tune_wanted(args))
        start = time.perf_counter()
        outputs = dict(model.run(feeds))
    except CompileError as e:
        raise CliError(str(e)) from None
    if not args.profile:
        return outputs, start, None
    samples = model.step_samples(feeds, PROFILE_RUNS)  # after the first run: its page faults are not the kernels'
    groups = {g.name: g for g in model.plan.groups}
    cores = {k.group.name: sorted({c.label(model.machine, s) for s, c in k.cores}) for k in model.source.kernels}
    rows = [{"kernel": name, "template": groups[name].template, "nodes": len(groups[name].nodes),
             "ms": statistics.median(times) * 1e3, "predicted_ms": groups[name].cost.seconds * 1e3,
             "cost_model": groups[name].cost.model, "cores": cores.get(name, [])} for name, times in samples.items()]
    return outputs, start, sorted(rows, key=lambda r: -r["ms"])


def _run_triton(graph: Graph, feeds: Mapping[str, np.ndarray], tune: bool | None) -> tuple[dict, float, dict[str, Any]]:
    """Outputs of the fused plan's Triton kernels, on the CUDA device or, without one (or with
    $TRITON_INTERPRET set), under Triton's interpreter on the CPU; the start time follows a first call
    (which compiles the kernels and, on a device unless ``tune`` is False, tunes their launch
    configurations), as the C backends' follows their compile."""
    try:
        import torch
    except ImportError:
        raise CliError("--backend triton needs torch and triton: pip install 'autofusion[gpu]'") from None
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or not torch.cuda.is_available()
    if interpreted:
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported
    try:
        import triton  # noqa: F401
    except ImportError:
        raise CliError("--backend triton needs triton: pip install 'autofusion[gpu]'") from None
    from autofusion.api import optimize
    from autofusion.runtime.triton_runner import TritonModel

    device = "cpu" if interpreted else "cuda"
    try:
        model = TritonModel(optimize(graph), device=device, tune=tune)
        model(feeds)
    except Exception as e:  # a kernel Triton cannot compile on this device: its own message, no traceback
        if not type(e).__module__.startswith("triton"):
            raise
        raise CliError(f"Triton could not compile a kernel: {type(e).__name__}: {str(e).strip()[:500]}") from None
    start = time.perf_counter()
    outputs = model(feeds)
    host = dict(model.fallbacks)
    return outputs, start, {"device": "cpu (Triton's interpreter)" if interpreted else torch.cuda.get_device_name(),
                            "kernels": len(model.kernels), "split": dict(model.split), "torch": dict(model.on_torch),
                            "host": host, "tuned": model.tuning, "configurations": dict(model.variants),
                            "launches": model.launches, "workspace_bytes": model.workspace_bytes}


def _num(v: Any) -> str:
    if v is None:
        return "nan"
    if isinstance(v, float):
        return f"{v:.5g}"
    return str(v)
