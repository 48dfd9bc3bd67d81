"""What every subcommand shares: model arguments and loading, error reporting, output formatting."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from autofusion.ir import Graph, InterpreterError, TensorType, VerifyError
from autofusion.ops.registry import OpRegistry, ShapeError, UnknownOpError

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug: the message asks for a report
EXIT_USAGE = 2  # bad usage or bad input: the message says what to fix


class CliError(Exception):
    """An expected problem with the user's input; printed as ``autofusion: error: ...``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def expected_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input, not a bug: reported in one line, exit status 2."""
    from autofusion.codegen.cores import UnknownIsaError
    from autofusion.frontends.onnx_import import OnnxImportError
    from autofusion.fuzz.cluster import RayUnavailable
    from autofusion.kinds import KindError
    from autofusion.models import ModelSizeError, UnknownModelError, WeightError
    from autofusion.plugins import PluginError
    from autofusion.runtime.sanitize import SanitizerUnavailable
    from autofusion.runtime.toolchain import CompileError

    return (CliError, OnnxImportError, UnknownModelError, ModelSizeError, WeightError, ShapeError, VerifyError,
            UnknownOpError, InterpreterError, FileNotFoundError, IsADirectoryError, PermissionError, CompileError,
            UnknownIsaError, SanitizerUnavailable, RayUnavailable, KindError, PluginError)


def error(message: str, stream: TextIO | None = None) -> None:
    print(f"autofusion: error: {message}", file=stream or sys.stderr)


def run_guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand; expected errors become one line on stderr and exit status 2."""
    try:
        return func(args)
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except BrokenPipeError:  # the reader (`| head`) has all it wants: stop quietly, as a shell command does
        with contextlib.suppress(OSError, ValueError):  # stdout may be no file (captured, replaced)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # flushing at exit must not fail again
        return 141
    except expected_errors() as e:
        error(_message(e))
        return e.code if isinstance(e, CliError) else EXIT_USAGE
    except Exception as e:
        if getattr(args, "traceback", False):
            raise
        error(f"internal error: {type(e).__name__}: {e} (rerun with --traceback and please report it)")
        return EXIT_INTERNAL


def _message(e: BaseException) -> str:
    if isinstance(e, (FileNotFoundError, IsADirectoryError, PermissionError)) and e.filename:
        return f"{e.strerror or e}: {e.filename}"
    return str(e)


# -- models -----------------------------------------------------------------------------------


def add_model_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """MODEL (built-in name or .onnx path) and the options that size it."""
    parser.add_argument("model", metavar="MODEL", nargs=None if required else "?",
                        help="a built-in model name (see `autofusion info --list`) or the path of an .onnx file")
    parser.add_argument("--seq", type=positive_int, metavar="N",
                        help="sequence length of a built-in transformer, time steps of a built-in LSTM")
    parser.add_argument("--batch", type=positive_int, metavar="N", help="batch size of a built-in model")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                        help="bind a symbolic dimension of an .onnx model (repeatable)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    """``["batch=1", "seq=128"]`` as ``{"batch": 1, "seq": 128}``."""
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CliError(f"--dim expects NAME=N, got {item!r}")
        try:
            dims[name.strip()] = positive_int(value.strip())
        except argparse.ArgumentTypeError as e:
            raise CliError(f"--dim {item}: {e}") from None
    return dims


@dataclass(frozen=True)
class LoadedModel:
    """A graph and where it came from: a built-in name or an ONNX file."""

    graph: Graph
    source: str
    builtin: bool


def is_onnx_path(model: str) -> bool:
    from autofusion.models import builtin_names

    return model.endswith(".onnx") or (model not in builtin_names() and Path(model).exists())


def load_model(args: argparse.Namespace, seed: int = 0, registry: OpRegistry | None = None,
               feeds: Mapping[str, Any] | None = None, symbolic: bool = False) -> LoadedModel:
    """The graph MODEL names: imported from an .onnx file (with the ops of ``registry``, default the
    built-in ones; symbolic dimensions bound by ``--dim``, then read off ``feeds``, the arrays a run
    will pass, and with ``symbolic`` the rest kept symbolic) or built (weights from ``seed``)."""
    from autofusion import models

    model: str = args.model
    dynamic = getattr(args, "dynamic", False)
    if dynamic and not symbolic:
        raise CliError("--dynamic plans one model for every size; this command runs or measures at fixed sizes "
                       "(give --seq and --batch)")
    if dynamic and is_onnx_path(model):
        raise CliError("--dynamic is for built-in models: an .onnx file keeps its dynamic axes unless --dim binds them")
    if is_onnx_path(model):
        if args.seq is not None or args.batch is not None:
            raise CliError("--seq and --batch size built-in models; bind the symbolic dimensions of an "
                           ".onnx file with --dim NAME=N")
        from autofusion.frontends.onnx_import import load_onnx
        from autofusion.frontends.onnx_proto import UnboundDimensionError

        try:
            graph = load_onnx(model, dims=parse_dims(args.dim), registry=registry, feeds=feeds, symbolic=symbolic)
        except UnboundDimensionError as e:
            flags = " ".join(f"--dim {name}=N" for name in e.names)
            raise CliError(f"{model} has dynamic axes ({', '.join(e.names)}); this command runs or measures at fixed "
                           f"sizes: give them ({flags}, or --inputs FILE for run); fuse, explain, viz and info take "
                           "the model as it is") from None
        return LoadedModel(graph, model, builtin=False)
    if model not in models.builtin_names() and ("/" in model or "\\" in model or "." in model):
        raise CliError(f"no such file: {model} (and no built-in model of that name; built-in models: "
                       f"{', '.join(models.builtin_names())})")
    if args.dim:
        raise CliError("--dim binds dimensions of .onnx files; size a built-in model with --seq and --batch")
    return LoadedModel(models.build(model, seq=args.seq, batch=args.batch, seed=seed, dynamic=dynamic), model,
                       builtin=True)


# -- output -----------------------------------------------------------------------------------


def type_text(t: TensorType) -> str:
    return f"{t.dtype}[{', '.join(map(str, t.shape))}]"


def tensor_json(name: str, t: TensorType) -> dict[str, Any]:
    return {"name": name, "shape": [d if isinstance(d, int) else str(d) for d in t.shape], "dtype": str(t.dtype)}


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def json_number(x: float) -> float | None:
    """JSON has no NaN or infinity: those become null."""
    return x if math.isfinite(x) else None


class Output:
    """Writes tables to ``stream``: with rich when it is a terminal, as aligned plain text otherwise."""

    def __init__(self, stream: TextIO | None = None, rich: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.rich = self.stream.isatty() if rich is None else rich

    def line(self, text: str = "") -> None:
        print(text, file=self.stream)

    def json(self, obj: Any) -> None:
        print(json.dumps(obj, indent=2, allow_nan=False), file=self.stream)

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A titled table; numeric cells are right-aligned."""
        cells = [[_cell(v) for v in row] for row in rows]
        numeric = [all(isinstance(r[i], (int, float)) for r in rows) and bool(rows) for i in range(len(columns))]
        if self.rich:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=title, title_justify="left")
            for name, num in zip(columns, numeric):
                table.add_column(name, justify="right" if num else "left")
            for row in cells:
                table.add_row(*row)
            Console(file=self.stream, force_terminal=True).print(table)
            return
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

        def fmt(row: Sequence[str]) -> str:
            return "  " + "  ".join(v.rjust(w) if num else v.ljust(w)
                                    for v, w, num in zip(row, widths, numeric)).rstrip()

        self.line(title)
        self.line(fmt(list(columns)))
        for row in cells:
            self.line(fmt(row))
        self.line()

    def fields(self, title: str, pairs: Sequence[tuple[str, Any]]) -> None:
        """A titled two-column table of names and values."""
        self.table(title, ("field", "value"), [(k, _cell(v)) for k, v in pairs])


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
