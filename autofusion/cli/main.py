"""The ``autofusion`` command: one subcommand per module, each with ``add_parser`` and ``run``.

A subcommand module exposes ``add_parser(subparsers)`` (which calls ``set_defaults(func=run)``)
and ``run(args) -> int``; registering one is one line in :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from autofusion import __version__
from autofusion.cli.common import EXIT_USAGE, run_guarded

SUBCOMMANDS: tuple[str, ...] = (
    "autofusion.cli.cmd_info",
    "autofusion.cli.cmd_run",
    "autofusion.cli.cmd_fuse",
    "autofusion.cli.cmd_explain",
    "autofusion.cli.cmd_compare",
    "autofusion.cli.cmd_viz",
    "autofusion.cli.cmd_plugins",
    "autofusion.cli.cmd_calibrate",
    "autofusion.cli.cmd_bench",
    "autofusion.cli.cmd_bench_cores",
    "autofusion.cli.cmd_fuzz",
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="autofusion",
        description="Declarative, checked, cost-driven operator fusion for deep-learning graphs.")
    parser.add_argument("--version", action="version", version=f"autofusion {__version__}")
    parser.add_argument("--traceback", action="store_true", help="show the Python traceback of internal errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed usage, --help or --version
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return run_guarded(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
