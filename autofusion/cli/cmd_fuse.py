"""``autofusion fuse MODEL``: rewrite, explore and choose fused kernels; print the plan's summary."""

from __future__ import annotations

import argparse
import time
from typing import Any

from autofusion.cli.common import CliError, Output, add_model_arguments, human_bytes, load_model
from autofusion.decide.strategies import BUILTIN_STRATEGIES


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fuse", help="choose fused kernels for a model and summarise the plan",
        description="Rewrite the model by equality saturation with the rules, choose fused kernels under the "
                    "cost model, and print kernels, materialised bytes, modelled cost and timings before/after.")
    add_plan_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--groups", action="store_true", help="also list every fused group")
    p.add_argument("--emit", metavar="DIR", help="write the generated C sources of the SuperKernel into DIR")
    p.add_argument("--onnx-out", metavar="FILE",
                   help="write the fused model as ONNX, each fused kernel a model-local function")
    p.set_defaults(func=run)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--rules", action="append", default=[], metavar="PATH",
                   help="a .fuse file or directory of them (repeatable; default: the shipped library)")
    p.add_argument("--strategy", default="greedy", metavar="NAME",
                   help=f"decision strategy: {', '.join(BUILTIN_STRATEGIES)} or a plugin's (default greedy)")
    p.add_argument("--profile", default=None, metavar="NAME|FILE",
                   help="hardware profile of the analytic cost model (default cpu-2core)")
    p.add_argument("--size-cap", type=int, default=48, metavar="N", help="most ops in one kernel (default 48)")
    p.add_argument("--dynamic", action="store_true",
                   help="a built-in transformer (batch and seq) or CNN (batch) with its sizes symbolic: one "
                        "plan for every size")


def make_plan(args: argparse.Namespace, symbolic: bool = False) -> tuple[Any, Any]:
    """(loaded model, plan) for the plan arguments; bad rules or options become CliError. With
    ``symbolic``, sizes an .onnx file leaves unbound stay symbolic (one plan for every binding)."""
    from autofusion.api import optimize
    from autofusion.decide.cost import AnalyticCostModel, HardwareProfile
    from autofusion.dsl import RuleError
    from autofusion.plugins import PluginError, kinds_with_plugins, registry_with_plugins, rule_paths, strategy

    try:  # installed plugins: ops, kernel kinds, rule directories (with the shipped library), strategies
        registry = registry_with_plugins()
        kinds = kinds_with_plugins()
        rules = rule_paths(args.rules or None)
        strategy(args.strategy)
    except PluginError as e:
        raise CliError(str(e)) from None
    t0 = time.perf_counter()
    loaded = load_model(args, registry=registry, symbolic=symbolic)
    t_import = time.perf_counter() - t0
    try:
        model = AnalyticCostModel(HardwareProfile.load(args.profile), registry) if args.profile else None
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        plan = optimize(loaded.graph, rules, cost_model=model, strategy=args.strategy,
                        size_cap=args.size_cap, registry=registry, kinds=kinds)
    except RuleError as e:
        lines = [f"{d.span}: {d.code} {d.message}" for d in e.diagnostics if d.is_error]
        raise CliError("rule files have errors (run `autofusion-rules check`):\n  " + "\n  ".join(lines[:20])) from None
    except ValueError as e:
        if "strategy" in str(e):
            raise CliError(str(e)) from None
        raise
    from dataclasses import replace

    from autofusion.graph.graph import FrozenMap

    stats = dict(plan.stats)
    stats["seconds_import"] = t_import
    return loaded, replace(plan, stats=FrozenMap(stats))


def run(args: argparse.Namespace) -> int:
    from autofusion.codegen import cores
    from autofusion.decide.summary import cost_model_text, plan_summary, priced_text
    from autofusion.plugins import registry_with_plugins

    loaded, plan = make_plan(args, symbolic=True)
    summary = plan_summary(plan, loaded.graph, registry_with_plugins())  # plugin ops count too
    if args.onnx_out:
        summary["onnx_out"] = write_onnx(plan, args.onnx_out)
    if args.emit:
        summary["emitted"] = emit_sources(plan, args.emit)
    out = Output()
    if args.json:
        if args.groups:
            summary["plan"] = plan.to_json()
        out.json(summary)
        return 0
    s = summary
    out.fields(f"fusion plan for {loaded.source} ({s['strategy']}, {s['cost_model']})", [
        ("cost model", cost_model_text(s, cores.cpu_model())),
        *([("symbolic sizes", priced_text(s))] if s["priced_at"] else []),
        ("kernels", f"{s['kernels_before']} -> {s['kernels_after']}"),
        ("intermediates materialised", f"{human_bytes(s['intermediate_bytes_before'])} -> "
                                       f"{human_bytes(s['intermediate_bytes_after'])}"),
        ("modelled time", f"{s['cost_before'] * 1e3:.3f} ms -> {s['cost_after'] * 1e3:.3f} ms"),
        ("bytes moved (model)", f"{human_bytes(s['cost_breakdown_before']['bytes'])} -> "
                                f"{human_bytes(s['cost_breakdown_after']['bytes'])}"),
        ("rewrites fired", ", ".join(f"{k} x{v}" for k, v in s["rewrites_fired"].items()) or "none"),
        ("saturation stopped", s["saturation_stop"]),
        ("time (s)", "import {import:.3f}, saturate {saturate:.3f}, extract {extract:.3f}, total {total:.3f}"
                     .format(**s["seconds"])),
    ])
    for name, why in s["skipped_rules"].items():
        out.line(f"note: rule {name} not used: {why}")
    for note in s["notes"]:
        out.line(f"note: {note}")
    if args.emit:
        out.line(f"wrote {len(summary['emitted'])} C source files to {args.emit}")
    if args.onnx_out:
        out.line(f"wrote {args.onnx_out} ({sum(g.fused for g in plan.groups)} fused kernels as ONNX functions)")
    if args.groups:
        out.table("fused groups", ("kernel", "template", "ops", "rules"), [
            (g.name, g.template, " ".join(plan.graph.node_by_name[n].op for n in g.nodes),
             ", ".join(str(r) for r in g.rules))
            for g in plan.groups if g.fused])
    return 0


def write_onnx(plan: Any, path: str) -> str:
    """Save the plan as ONNX at ``path`` (atomically); export problems become CliError."""
    from pathlib import Path

    from autofusion.export import OnnxExportError, save_onnx

    target = Path(path)
    if target.is_dir():
        raise CliError(f"--onnx-out {path}: is a directory")
    if not target.parent.is_dir():
        raise CliError(f"--onnx-out {path}: directory {target.parent} does not exist")
    try:
        save_onnx(plan, target)
    except OnnxExportError as e:
        raise CliError(f"cannot write ONNX: {e}") from None
    return str(target)


def emit_sources(plan: Any, directory: str) -> list[str]:
    """Write the SuperKernel's C sources (and its header) into ``directory``; returns the paths."""
    import os
    from pathlib import Path

    from autofusion.codegen import CodegenError, render_plan
    from autofusion.ir.symbolic import is_symbolic, symbols_of

    if is_symbolic(plan.graph):
        flags = " ".join(f"--dim {s}=N" for s in symbols_of(plan.graph))
        raise CliError(f"--emit writes the kernels of one binding and {plan.graph.name!r} has symbolic sizes "
                       f"({', '.join(symbols_of(plan.graph))}): give them with {flags}")
    try:
        source = render_plan(plan)
    except CodegenError as e:
        raise CliError(str(e)) from None
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise CliError(f"--emit {directory} is not a directory")
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in [("af_runtime.h", source.header), *source.units]:
        path = target / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # never leave a half-written file
        written.append(str(path))
    return written
