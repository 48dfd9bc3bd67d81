"""The ``--no-tune`` option and the tuner's progress bar, shared by the commands that compile."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from autofusion.runtime.tuning import Progress, tune_by_default


def add_tune_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-tune", dest="tune", action="store_false", default=None,
                        help="use the untuned default core for every matrix product (deterministic) instead of "
                             "the fastest measured on this machine (tuned once per machine and cached)")


def tune_wanted(args: argparse.Namespace) -> bool:
    """--no-tune, else $AUTOFUSION_TUNE, else on."""
    return tune_by_default() if getattr(args, "tune", None) is None else bool(args.tune)


@contextmanager
def tune_progress() -> Iterator[Progress]:
    """A progress callback for the tuner: a rich bar on stderr when it is a terminal, else one line
    when tuning starts (stdout stays the table or the JSON object)."""
    if not sys.stderr.isatty():
        said = [False]

        def plain(done: int, total: int, what: str) -> None:
            if not said[0] and done < total:
                print(f"autofusion: tuning {total} core(s) on this machine (once; cached)", file=sys.stderr)
                said[0] = True

        yield plain
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("tuning {task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(file=sys.stderr, force_terminal=True), transient=True)
    task: list[Any] = []

    def rich_step(done: int, total: int, what: str) -> None:
        if not task:
            task.append(bar.add_task(what, total=total))
        bar.update(task[0], completed=done, description=what)

    with bar:
        yield rich_step
