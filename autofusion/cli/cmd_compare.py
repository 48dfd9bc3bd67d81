"""``autofusion compare MODEL``: every strategy under every cost model before fusing, with each
plan's kernels, predicted time, peak memory and energy, and with ``--measure`` the measured time of
each distinct plan beside its prediction."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autofusion.cli.common import CliError, Output, add_model_arguments, load_model, positive_int
from autofusion.cli.tuning_args import add_tune_argument, tune_progress, tune_wanted

STRATEGIES = ("unfused", "greedy", "dp", "beam", "exact")
UNFUSED = "unfused"  # not a strategy: every node its own kernel, priced by the same model
COST_MODELS = ("default", "analytic")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare", help="compare the plans of every strategy and cost model: predicted and measured",
        description="Plan MODEL with each strategy under each cost model and list, per plan, its kernels, "
                    "predicted latency, predicted peak memory (the buffer planner's, exact) and predicted energy "
                    "(an estimate from the hardware profile's constants), and the time the planning took. "
                    "--measure compiles each distinct plan and times it, round by round, beside its prediction.")
    add_model_arguments(p)
    p.add_argument("--rules", action="append", default=[], metavar="PATH",
                   help="a .fuse file or directory of them (repeatable; default: the shipped library)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), metavar="NAMES",
                   help="comma-separated strategies, built-in or a plugin's, and unfused (every op its own kernel) "
                        f"(default {','.join(STRATEGIES)})")
    p.add_argument("--cost-models", default=",".join(COST_MODELS), metavar="NAMES",
                   help="comma-separated cost models: default (the calibration the engine uses, else analytic), "
                        "analytic, analytic:PROFILE or a plugin's (default default,analytic)")
    p.add_argument("--size-cap", type=int, default=48, metavar="N", help="most ops in one kernel (default 48)")
    p.add_argument("--threads", type=positive_int, default=2, metavar="N", help="threads the plans run on (default 2)")
    p.add_argument("--measure", action="store_true", help="compile and time each distinct plan")
    p.add_argument("--rounds", type=positive_int, default=5, metavar="N",
                   help="rounds of timing, every plan once per round (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--html", metavar="DIR", help="also write DIR/compare.html: the table and, measured, a plot")
    add_tune_argument(p)
    p.set_defaults(func=run)


def _names(text: str, what: str) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise CliError(f"--{what} names nothing")
    return names


def _cost_models(names: list[str], registry: Any) -> dict[str, Any]:
    """Cost models by label; two names for one model (default = analytic when uncalibrated) count once."""
    from autofusion import plugins
    from autofusion.decide.default_model import default_cost_model

    models: dict[str, Any] = {}
    seen: set[tuple[str, str]] = set()
    for name in names:
        try:
            model = default_cost_model(registry) if name == "default" else plugins.cost_model(name, registry)
        except (ValueError, plugins.PluginError) as e:
            raise CliError(str(e)) from None
        identity = (str(getattr(model, "name", name)), repr(getattr(model, "profile", None)))  # same constants
        if identity not in seen:
            seen.add(identity)
            models[identity[0] if name != "default" else f"default ({identity[0]})"] = model
    return models


def run(args: argparse.Namespace) -> int:
    from autofusion import plugins
    from autofusion.api import optimize
    from autofusion.bench.compare import compare_plans, html_page, summary
    from autofusion.codegen import cores, render_plan
    from autofusion.decide.cost import model_profile
    from autofusion.dsl import RuleError

    try:
        registry, kinds = plugins.registry_with_plugins(), plugins.kinds_with_plugins()
        rules = plugins.rule_paths(args.rules or None)
        strategies = _names(args.strategies, "strategies")
        for s in strategies:
            if s != UNFUSED:
                plugins.strategy(s)
    except plugins.PluginError as e:
        raise CliError(str(e)) from None
    cost_models = _cost_models(_names(args.cost_models, "cost-models"), registry)
    loaded = load_model(args, registry=registry)

    def plan(graph: Any, strategy: str, model: Any) -> Any:
        if strategy == UNFUSED:
            return _unfused(graph, model, registry)
        try:
            return optimize(graph, rules, cost_model=model, strategy=strategy, size_cap=args.size_cap,
                            registry=registry, kinds=kinds)
        except RuleError as e:
            raise CliError(f"rule files have errors (run `autofusion-rules check`): {e}") from None

    rows, plans = compare_plans(loaded.graph, strategies, cost_models, plan, args.threads,
                                lambda p: render_plan(p).buffers.footprint(args.threads))  # type: ignore[union-attr]
    if args.measure:
        rows = _measured(args, loaded.graph, rows, plans, cost_models)
    data = {"model": loaded.source, "threads": args.threads, "measured": bool(args.measure),
            "rows": [r.to_json() for r in rows], "summary": summary(rows),
            "energy_sources": {name: _energy_source(m) for name, m in cost_models.items()},
            "fitted_on": {name: getattr(model_profile(m), "fitted_on", "") for name, m in cost_models.items()},
            "this_cpu": cores.cpu_model()}
    if args.html:
        folder = Path(args.html)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "compare.html").write_text(html_page(f"{loaded.source}: plans compared", rows))
        except OSError as e:
            raise CliError(f"cannot write {folder / 'compare.html'}: {e.strerror or e}") from None
        data["html"] = str(folder / "compare.html")
    out = Output()
    if args.json:
        out.json(data)
        return 0
    _print(out, data)
    return 0


def _unfused(graph: Any, model: Any, registry: Any) -> Any:
    """The unfused plan of ``graph`` with its cost under ``model`` (a kernel per op)."""
    from dataclasses import replace

    from autofusion.decide.baseline import unfused_plan
    from autofusion.decide.plan import ZERO_COST

    plan = unfused_plan(graph, registry)
    total = ZERO_COST
    for group in plan.groups:
        total = total + model.group_cost(graph, list(group.nodes))
    return replace(plan, cost_before=total, cost_after=total, registry=registry)


def _energy_source(model: Any) -> str:
    from autofusion.bench.compare import profile_of

    profile = profile_of(model)
    return f"{profile.name}: {profile.package_watts:g} W, {profile.joules_per_byte:g} J/byte ({profile.energy_source})"


def _measured(args: argparse.Namespace, graph: Any, rows: Any, plans: dict[int, Any], cost_models: Any) -> Any:
    """Rows with measured times, and each plan priced again with its cores at their tuned rate; each
    plan's first run is checked against the reference interpreter."""
    from dataclasses import replace

    import numpy as np

    from autofusion.bench.compare import measure_plans, plan_seconds, with_core_rate
    from autofusion.bench.environment import limit_threads
    from autofusion.ir import run_graph
    from autofusion.models import random_inputs
    from autofusion.runtime import CompiledModel

    limit_threads(args.threads)
    feeds = random_inputs(graph, seed=0)
    want = run_graph(graph, feeds, plans[0].registry)
    runners, allocated, rates = {}, {}, {}
    for pid, p in plans.items():
        with tune_progress() as progress:
            model = CompiledModel(p, threads=args.threads, tune=tune_wanted(args), progress=progress)
        got = model.run(feeds)
        for name, ref in want.items():
            if not np.allclose(got[name], ref, rtol=1e-3, atol=1e-3):
                raise CliError(f"plan {pid} computes {name} unlike the reference interpreter "
                               f"(max error {float(np.max(np.abs(got[name] - ref))):.3g})")
        runners[pid] = (lambda m: (lambda: m.run(feeds)))(model)
        blocks = model.source.buffers.thread_bytes if model.source.buffers is not None else 0
        allocated[pid] = model.workspaces.nbytes + args.threads * blocks
        rates[pid] = _tuned_core_rate(model, args.threads)
    rows = measure_plans(rows, runners, allocated, args.rounds)
    out = []
    for r in rows:
        rate = rates.get(r.plan_id)
        priced = with_core_rate(cost_models[r.cost_model], rate) if rate else None
        out.append(r if priced is None else replace(r, predicted_seconds_tuned_cores=plan_seconds(plans[r.plan_id], priced),
                                                    tuned_core_flops_per_second=rate))
    return out


def _tuned_core_rate(model: Any, threads: int) -> float | None:
    """FLOP/s of the plan's matrix products alone, as the tuner measured them on this machine."""
    store = getattr(model.chooser, "store", None)
    if store is None:
        return None
    flops, seconds = 0, 0.0
    for kernel in model.source.kernels:
        for spec, _ in kernel.cores:
            measured = store.seconds(spec, threads)
            if measured is not None:
                flops, seconds = flops + spec.flops, seconds + measured
    return flops / seconds if seconds > 0 else None


def _print(out: Output, data: dict[str, Any]) -> None:
    from autofusion.decide.summary import calibrate_hint

    measured = data["measured"]
    head = ["strategy", "cost model", "kernels", "pred ms", "pred peak MiB", "pred J", "optimize s", "plan"]
    tuned = any(r["predicted_seconds_tuned_cores"] is not None for r in data["rows"])
    if measured:
        head += ["measured ms", "error"] + (["pred ms, tuned cores", "error"] if tuned else []) + ["runtime peak MiB"]
    rows = []
    for r in data["rows"]:
        row = [r["strategy"], r["cost_model"], r["kernels"], round(r["predicted_seconds"] * 1e3, 3),
               round(r["predicted_peak_bytes"] / 2**20, 2), round(r["predicted_joules"], 4),
               round(r["optimize_seconds"], 2), r["plan_id"]]
        if measured:
            err = r["time_error"]
            row += [round(r["measured_seconds"] * 1e3, 3), "" if err is None else f"{err:+.1%}"]
            if tuned:
                t, terr = r["predicted_seconds_tuned_cores"], r["tuned_time_error"]
                row += ["" if t is None else round(t * 1e3, 3), "" if terr is None else f"{terr:+.1%}"]
            row.append(round((r["runtime_peak_bytes"] or 0) / 2**20, 2))
        rows.append(row)
    out.table(f"plans of {data['model']} ({data['threads']} threads)", head, rows)
    for name, source in data["energy_sources"].items():
        out.line(f"energy of {name}: {source}")
    s = data["summary"]
    if s.get("measured"):
        out.line(f"predicted time vs measured: median error {s['median_abs_time_error']:.1%}, "
                 f"worst {s['max_abs_time_error']:.1%}")
    for model, regret in s.get("default_strategy_regret", {}).items():
        out.line(f"the default strategy's plan under {model}: {regret:+.1%} against the fastest plan measured "
                 f"({s['best_measured_seconds'] * 1e3:.3f} ms)")
    if "median_abs_tuned_time_error" in s:
        out.line(f"with the cores at their tuned rate: median error {s['median_abs_tuned_time_error']:.1%}, "
                 f"worst {s['max_abs_tuned_time_error']:.1%}")
    for name, cpu in data["fitted_on"].items():
        hint = calibrate_hint(cpu, data["this_cpu"])
        if hint:
            out.line(f"{name}: {hint}")
    if data.get("html"):
        out.line(f"wrote {data['html']}")
