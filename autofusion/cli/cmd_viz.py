"""``autofusion viz MODEL --out DIR``: pictures of the graph before and after fusion, and an HTML report."""

from __future__ import annotations

import argparse
from typing import Any

from autofusion.cli.cmd_fuse import add_plan_arguments, make_plan
from autofusion.cli.common import CliError, Output


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "viz", help="draw the graph before/after fusion and write an HTML report",
        description="Write before.dot and after.dot (each fused kernel a coloured cluster labelled with its kernel "
                    "name, template and rules), render them to SVG when Graphviz's `dot` is installed, and write "
                    "report.html: summary, cost per kernel, explain tables and the pictures, in one file.")
    add_plan_arguments(p)
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into (created if missing)")
    p.add_argument("--no-render", action="store_true", help="write the .dot files only, even if `dot` is installed")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autofusion.plugins import registry_with_plugins
    from autofusion.viz import write_viz

    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise CliError(f"--out {args.out}: exists and is not a directory")
    loaded, plan = make_plan(args, symbolic=True)
    try:
        result = write_viz(plan, loaded.graph, out_dir, label=loaded.source, render=not args.no_render,
                           registry=registry_with_plugins())
    except OSError as e:
        raise CliError(f"cannot write to {args.out}: {e.strerror or e}") from None
    out = Output()
    for path in result.files:
        out.line(f"wrote {path}")
    if not result.rendered and not args.no_render:
        out.line(f"note: no SVG pictures ({result.problem}); the .dot files are written, and the report "
                 "shows the rest (install Graphviz for pictures)")
    return 0
