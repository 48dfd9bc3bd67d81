"""The ``autofusion-rules`` command: check and list ``.fuse`` rule files.

    autofusion-rules check rules/ my.fuse            # text diagnostics with carets
    autofusion-rules check --format json my.fuse      # the same as JSON
    autofusion-rules check --no-verify my.fuse        # skip numerical verification of rewrites
    autofusion-rules check --explain F022             # what a diagnostic code means
    autofusion-rules list                             # the shipped rules with their doc comments
    autofusion-rules list --ops                       # op names by class, from the op registry

Exit status: 0 when no error was found (warnings allowed), 1 when an error was found, 2 for a
usage error (no paths, unknown option or code, a path that does not exist, a directory without
``.fuse`` files).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autofusion-rules", description="Check and list .fuse fusion rule files.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser("check", help="parse, check and verify rule files")
    check.add_argument("paths", nargs="*", metavar="PATH", help=".fuse files or directories (walked for *.fuse)")
    check.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    check.add_argument("--no-verify", action="store_true", help="skip numerical verification of rewrites")
    check.add_argument("--no-source", action="store_true", help="do not print source lines under diagnostics")
    check.add_argument("--explain", metavar="CODE", help="print what a diagnostic code means, then exit")
    lst = sub.add_parser("list", help="print classes, patterns and rules with their doc comments")
    lst.add_argument("paths", nargs="*", metavar="PATH", help=".fuse files or directories (default: the shipped rules)")
    lst.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    lst.add_argument("--ops", action="store_true", help="list the op registry's ops by class instead")
    return parser


def _usage(parser: argparse.ArgumentParser, message: str) -> int:
    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _installed(parser: argparse.ArgumentParser) -> tuple[Any, Any] | int:
    """(op registry, kernel kinds) with every installed plugin's, or the exit status of a broken plugin."""
    from autofusion.plugins import PluginError, kinds_with_plugins, registry_with_plugins

    try:
        return registry_with_plugins(), kinds_with_plugins()
    except PluginError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _missing(paths: Sequence[str]) -> list[str]:
    return [p for p in paths if not Path(p).exists()]


def cmd_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from autofusion.dsl.codes import CODES

    if args.explain:
        code = args.explain.strip().upper()
        if code not in CODES:
            return _usage(parser, f"unknown diagnostic code {args.explain!r} (codes: {', '.join(CODES)})")
        print(CODES[code].explain(), end="")
        return EXIT_OK
    if not args.paths:
        return _usage(parser, "check needs at least one PATH (a .fuse file or a directory)")
    missing = _missing(args.paths)
    if missing:
        return _usage(parser, f"no such file or directory: {', '.join(missing)}")
    from autofusion.dsl.loader import analyze, collect_files
    from autofusion.dsl.reporter import format_text, to_json

    if not collect_files(args.paths):
        return _usage(parser, f"no .fuse files in {', '.join(args.paths)}")
    installed = _installed(parser)
    if isinstance(installed, int):
        return installed
    analysis = analyze(args.paths, verify=not args.no_verify, registry=installed[0], kinds=installed[1])
    if args.format == "json":
        print(to_json(analysis.diagnostics, analysis.program.ruleset.files))
    else:
        sys.stdout.write(format_text(analysis.diagnostics, show_source=not args.no_source))
    return EXIT_ERRORS if analysis.errors else EXIT_OK


def cmd_list(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.ops:
        from autofusion.dsl.listing import format_ops
        from autofusion.ops import default_registry

        sys.stdout.write(format_ops(default_registry()))
        return EXIT_OK
    missing = _missing(args.paths)
    if missing:
        return _usage(parser, f"no such file or directory: {', '.join(missing)}")
    from autofusion.dsl.listing import format_list
    from autofusion.dsl.loader import analyze
    from autofusion.dsl.reporter import format_text
    from autofusion.resources import data_dir

    installed = _installed(parser)
    if isinstance(installed, int):
        return installed
    analysis = analyze(args.paths or [data_dir("rules")], verify=False, registry=installed[0], kinds=installed[1])
    sys.stdout.write(format_list(analysis, as_json=args.format == "json"))
    if analysis.errors:
        sys.stderr.write(format_text(analysis.errors))
        return EXIT_ERRORS
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``autofusion-rules`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage and 0 on --help
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        return _usage(parser, "give a command: check or list")
    try:
        if args.command == "check":
            return cmd_check(args, parser)
        return cmd_list(args, parser)
    except KeyboardInterrupt:
        print("autofusion-rules: interrupted", file=sys.stderr)
        return 130
    except (OSError, UnicodeError) as e:
        print(f"autofusion-rules: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
