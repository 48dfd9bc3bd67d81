"""``autofusion calibrate``: time generated kernels, fit the cost models, save them for the engine.

``--report`` prints the held-out accuracy of both models, ``--json`` prints it as one JSON object
(per model: ``kendall_tau``, ``median_rel_error``, ``pair_agreement``), and ``--show [FILE]``
prints the report stored in an existing calibration file without measuring anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autofusion.cli.common import CliError, Output, positive_int


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure kernels with the C backend and fit the cost models to them",
        description="Generate and time a spread of kernels (pointwise chains, reductions, GEMM epilogues, "
                    "broadcasts) with the C backend, fit the analytic profile's constants and a learned "
                    "model, score both on held-out kernels, and write the calibration file the engine "
                    "loads by default.")
    p.add_argument("--budget", type=_positive_float, default=150.0, metavar="SECONDS",
                   help="wall-clock time for measuring (default 150)")
    p.add_argument("--kernels", type=positive_int, default=400, metavar="N",
                   help="at most N single kernels to time (default 400)")
    p.add_argument("--regions", type=_non_negative_int, default=60, metavar="N",
                   help="at most N regions whose alternative plans are timed (default 60)")
    p.add_argument("--max-elements", type=positive_int, default=1 << 22, metavar="N",
                   help="largest tensor of a generated kernel, in elements (default 4194304)")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="threads the kernels run on (default: the runtime's, $OMP_NUM_THREADS or 2)")
    p.add_argument("--repeat-seconds", type=_positive_float, default=0.05, metavar="S",
                   help="time spent running each kernel to time it (default 0.05)")
    p.add_argument("--statistic", choices=("median", "min"), default="median",
                   help="how repeated runs of a kernel are summed up (default median; min is steadier on a "
                        "machine busy with other work)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kernel generator (default 0)")
    p.add_argument("--name", default="cpu-2core", help="name of the fitted profile (default cpu-2core)")
    p.add_argument("--prior", default="cpu-2core", metavar="PROFILE",
                   help="profile (name or JSON file) giving cache sizes and starting values (default cpu-2core)")
    p.add_argument("--out", metavar="FILE",
                   help="calibration file to write (default: the user calibration the engine loads, "
                        "$AUTOFUSION_CACHE/calibration.json or ~/.cache/autofusion/calibration.json)")
    p.add_argument("--profile-out", metavar="FILE", help="also write the fitted hardware profile as its own JSON")
    p.add_argument("--cache", metavar="DIR", help="compile cache directory (default the runtime's)")
    p.add_argument("--report", action="store_true", help="print the held-out accuracy of both models")
    p.add_argument("--json", action="store_true", help="print the accuracy report as one JSON object")
    p.add_argument("--models", default=",".join(COMPARED_MODELS), metavar="NAMES",
                   help="built-in models whose kernel counts are planned before and after, to show what the "
                        f"calibration changes (comma-separated; default {','.join(COMPARED_MODELS)}; none: skip)")
    p.add_argument("--model-kernels", default="default", metavar="NAMES",
                   help="built-in models (name or name:seq) whose plans are profiled where they run, their "
                        "kernels fitted with the generated ones, their whole runs predicted (comma-separated; "
                        "default: bert-base:8,resnet18,lstm,gpt2,bert-base; none: skip; timed outside --budget)")
    p.add_argument("--show", nargs="?", const="", metavar="FILE",
                   help="print the report of an existing calibration file (default: the one the engine uses) "
                        "instead of measuring")
    p.set_defaults(func=run)


COMPARED_MODELS = ("bert-base", "gpt2", "resnet18", "lstm")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    from autofusion.decide.cost import HardwareProfile
    from autofusion.decide.default_model import calibration_file, default_cost_model, user_calibration_path
    from autofusion.decide.learned import Calibration, load_calibration

    out = Output()
    if args.show is not None:
        try:
            path = Path(args.show) if args.show else calibration_file()
        except ValueError as e:
            raise CliError(str(e)) from None
        if path is None:
            raise CliError("no calibration file in use ($AUTOFUSION_CALIBRATION turns it off); name one with --show FILE")
        try:
            calibration = load_calibration(path)
        except ValueError as e:
            raise CliError(str(e)) from None
        _print_report(out, calibration, "calibration:", str(path), as_json=args.json, full=True)
        return 0
    try:
        HardwareProfile.load(args.prior)
    except ValueError as e:
        raise CliError(str(e)) from None
    models = _compared_models(args.models)
    try:
        before = default_cost_model()
    except ValueError as e:
        raise CliError(str(e)) from None
    calibration = _calibrate(args)
    target = Path(args.out) if args.out else user_calibration_path()
    previous = target.with_name(target.name + ".previous")
    replaced = target.is_file()
    try:
        if replaced:
            shutil.copy2(target, previous)
        calibration.save(target)
        if args.profile_out:
            import json

            Path(args.profile_out).write_text(json.dumps(calibration.profile.to_json(), indent=2) + "\n")
    except OSError as e:
        raise CliError(f"cannot write the calibration: {e.strerror or e}: {e.filename or target}") from None
    assert isinstance(calibration, Calibration)
    undo = _undo_text(target, previous if replaced else None)
    changes = _kernel_counts(models, before, calibration.cost_model())  # after the save: minutes of timing are kept
    if args.json:
        out.json({**calibration.report, "file": str(target), "profile": calibration.profile.to_json(),
                  "machine": calibration.machine, "cost_model_before": getattr(before, "name", ""),
                  "kernels_per_model": {m: {"before": b, "after": a} for m, b, a in changes}, "undo": undo})
        return 0
    _print_report(out, calibration, "calibration written to", str(target), as_json=False, full=args.report)
    if changes:
        out.table(f"kernels per built-in model, planned with {getattr(before, 'name', 'the old model')} "
                  "and with the new calibration", ("model", "before", "after"), changes)
    if _engine_calibration() == target.resolve():
        out.line("fuse, explain, run and bench now plan with this calibration by default")
    else:
        out.line(f"the engine plans with it when AUTOFUSION_CALIBRATION={target}")
    out.line(undo)
    return 0


def _compared_models(text: str) -> tuple[str, ...]:
    from autofusion.models import builtin_names

    names = tuple(n.strip() for n in text.split(",") if n.strip() and n.strip() != "none")
    unknown = [n for n in names if n not in builtin_names()]
    if unknown:
        raise CliError(f"--models: unknown model {unknown[0]!r} (built-in: {', '.join(builtin_names())})")
    return names


def _kernel_counts(models: Sequence[str], before: Any, after: Any) -> list[tuple[str, int, int]]:
    """(model, kernels planned with ``before``, with ``after``) for built-in models at their default sizes."""
    from autofusion.api import optimize
    from autofusion.models import build

    rows = []
    for name in models:
        graph = build(name)
        rows.append((name, optimize(graph, cost_model=before).kernels, optimize(graph, cost_model=after).kernels))
    return rows


def _undo_text(target: Path, previous: Path | None) -> str:
    if previous is not None:
        return f"to undo: mv {previous} {target}  (the calibration it replaced)"
    return f"to undo: rm {target}  (or set AUTOFUSION_CALIBRATION=none to plan without it)"


def _engine_calibration() -> Path | None:
    """The calibration file the engine loads by default now, resolved."""
    from autofusion.decide.default_model import calibration_file

    try:
        found = calibration_file()
    except ValueError:
        return None
    return found.resolve() if found is not None else None


def _calibrate(args: argparse.Namespace) -> Any:
    from autofusion.calibrate import CalibrationError, CalibrationOptions, TimingOptions, calibrate

    options = CalibrationOptions(budget_seconds=args.budget, kernels=args.kernels, regions=args.regions,
                                 max_elements=args.max_elements, seed=args.seed, name=args.name, prior=args.prior,
                                 timing=TimingOptions(target_seconds=args.repeat_seconds, threads=args.threads,
                                                      statistic=args.statistic),
                                 cache_dir=args.cache, model_cases=_model_cases(args.model_kernels))
    _warn_if_busy(args.statistic)
    try:
        if sys.stderr.isatty():
            return _with_progress_bar(options)
        return calibrate(options)
    except CalibrationError as e:
        raise CliError(str(e)) from None


def _model_cases(text: str) -> tuple[str, ...]:
    from autofusion.calibrate.models import DEFAULT_CASES, parse_case

    if text.strip() == "default":
        return DEFAULT_CASES
    cases = tuple(c.strip() for c in text.split(",") if c.strip() and c.strip() != "none")
    for case in cases:
        try:
            parse_case(case)
        except ValueError as e:
            raise CliError(f"--model-kernels: {e}") from None
    return cases


def _warn_if_busy(statistic: str) -> None:
    """Other processes inflate timings: say so when the load average exceeds half the cores."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return
    cores = os.cpu_count() or 1
    if load > cores / 2:
        hint = "" if statistic == "min" else "; --statistic min is steadier under load"
        print(f"autofusion: warning: load average {load:.1f} on {cores} cores: other processes will make "
              f"timings noisy{hint}", file=sys.stderr)


def _with_progress_bar(options: Any) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autofusion.calibrate import calibrate

    columns = (TextColumn("[bold]calibrating[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn(f"of {options.budget_seconds:.0f}s"), TextColumn("{task.description}"))
    with Progress(*columns, transient=True, console=Console(file=sys.stderr)) as bar:
        task = bar.add_task("", total=options.kernels + options.regions)

        def update(what: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=what[:48])

        return calibrate(options, update)


def _print_report(out: Output, calibration: Any, heading: str, path: str, as_json: bool, full: bool) -> None:
    report = dict(calibration.report)
    if as_json:
        out.json({**report, "file": path, "profile": calibration.profile.to_json(), "machine": calibration.machine})
        return
    learned, analytic = report.get("learned", {}), report.get("analytic", {})
    out.line(f"{heading} {path}")
    out.line(f"default model: {report.get('default_model', calibration.default)}; learned tau "
             f"{learned.get('kendall_tau', float('nan')):.3f} (target {report.get('target_tau', 0.8)}: "
             f"{'met' if report.get('target_met') else 'not met'})")
    if not full:
        return
    rows = [(kind, r.get("kendall_tau", 0.0), r.get("median_rel_error", 0.0), r.get("pair_agreement", 0.0),
             r.get("pairs", 0), r.get("pair_agreement_clear", 0.0), r.get("pairs_clear", 0), r.get("name", kind))
            for kind, r in (("analytic", analytic), ("learned", learned))]
    out.table(f"held-out accuracy ({report.get('heldout_kernels', 0)} kernels, trained on "
              f"{report.get('train_kernels', 0)}; {report.get('regions', 0)} regions; 'clear' pairs differ by 25%+)",
              ("model", "kendall tau", "median rel error", "pair agreement", "pairs", "clear pairs agreement",
               "clear pairs", "name"), rows)
    _print_models(out, report)
    p = calibration.profile
    out.fields("fitted profile", [("peak flop/s", p.peak_flops)]
               + [(f"{c.level} bandwidth (<= {c.bytes:,} B)", c.bandwidth) for c in p.caches]
               + [(f"{c.level} read by a core's stream (memory probe)", bw)
                  for c, bw in zip(p.caches, p.stream_bandwidths)]
               + [("DRAM bandwidth", p.dram_bandwidth), ("matmul flop/s", p.matmul_flops_rate),
                  ("math-routine flop/s", p.math_flops_rate), ("launch seconds", p.launch_seconds),
                  ("sync seconds", p.sync_seconds), ("ops with a measured cost", len(p.op_seconds))])
    if p.op_seconds:
        out.table("measured compute per element", ("op", "ns"),
                  [(op, round(s * 1e9, 3)) for op, s in sorted(p.op_seconds.items(), key=lambda kv: kv[1])])


def _print_models(out: Output, report: dict[str, Any]) -> None:
    """Whole-model runs predicted against measured, and the models' region pairs ordered."""
    kinds = [k for k in ("analytic", "learned") if isinstance(report.get(k), dict) and report[k].get("plans")]
    if not kinds:
        return
    rows = []
    for i, plan in enumerate(report[kinds[0]]["plans"]):
        row: list[Any] = [plan["case"], plan["plan"], plan["kernels"], round(plan["measured"] * 1e3, 3)]
        for kind in kinds:
            p = report[kind]["plans"][i]
            row += [f"{p['predicted'] / p['measured'] - 1:+.1%}", f"{p['predicted_held_out'] / p['measured'] - 1:+.1%}"]
        rows.append(tuple(row))
    head = ("model", "plan", "kernels", "measured ms") + tuple(
        h for kind in kinds for h in (f"{kind} error", f"{kind} error, family held out"))
    out.table("whole runs of the models' plans (profiling build, medians)", head, rows)
    ratio = float(report.get("model_clear_ratio", 1.0))
    out.table(f"pairs of plans of one region of those models (clear: times differ by {round((ratio - 1) * 100)}%+)",
              ("model", "pairs", "agreement", "clear pairs", "clear agreement", "clear agreement, family held out"),
              [(kind, report[kind]["model_pairs"], round(report[kind]["model_pair_agreement"], 3),
                report[kind]["model_pairs_clear"], round(report[kind]["model_pair_agreement_clear"], 3),
                round(report[kind]["model_pair_agreement_clear_held_out"], 3)) for kind in kinds])
    for kind in kinds:
        wrong = report[kind].get("model_pairs_misordered") or []
        if wrong:
            out.table(f"clear pairs {kind} orders wrong, widest measured gap first (fused group against its parts)",
                      ("model", "fused group", "parts", "measured ms fused / parts", "predicted ms fused / parts"),
                      [(w["family"], _short(w["fused_ops"]), w["parts"],
                        " / ".join(f"{v:.3f}" for v in w["measured_ms"]),
                        " / ".join(f"{v:.3f}" for v in w["predicted_ms"])) for w in wrong])


def _short(ops: str, width: int = 60) -> str:
    return ops if len(ops) <= width else ops[: width - 3] + "..."
