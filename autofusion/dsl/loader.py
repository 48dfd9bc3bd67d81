"""Loading rule files: walking directories, resolving imports, and the public entry points.

``import "x.fuse"`` is looked up next to the importing file, then in the shipped rule library
(``autofusion.resources.data_dir("rules")``). Every file is loaded once however often it is
imported; files come in load order (a file after the files it imports).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autofusion.dsl.diagnostics import Diagnostic, RuleError, Sink
from autofusion.dsl.ir import RuleSet
from autofusion.dsl.lower import Statement
from autofusion.dsl.parser import parse_text
from autofusion.dsl.program import Program, compile_program
from autofusion.dsl.span import Span
from autofusion.kinds import KindRegistry
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry
from autofusion.resources import data_dir

PathLike = str | Path


def collect_files(paths: Sequence[PathLike]) -> list[Path]:
    """The ``.fuse`` files named by ``paths``; directories are walked. Missing paths raise."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.fuse") if q.is_file()))
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return out


def display_name(path: Path) -> str:
    """How diagnostics name a file: relative to the working directory when it is below it."""
    try:
        resolved = path.resolve()
        rel = os.path.relpath(resolved)
        return rel if not rel.startswith("..") else str(resolved)
    except (OSError, ValueError):
        return str(path)


class _Loader:
    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.loaded: dict[Path, list[Statement]] = {}
        self.order: list[Path] = []
        self.names: dict[Path, str] = {}

    def load(self, path: Path, stack: tuple[Path, ...] = (), text: str | None = None) -> None:
        key = path.resolve()
        if key in self.loaded:
            return
        name = display_name(path) if text is None else str(path)
        self.names[key] = name
        self.loaded[key] = []
        if text is None:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                self.sink.add("F001", f"the file is not UTF-8 text ({e.reason} at byte {e.start})", Span.point(name))
                text = ""
            except OSError as e:
                self.sink.add("F013", f"cannot read {name}: {e.strerror or e}", Span.point(name))
                text = ""
        try:
            statements = parse_text(text, name, self.sink)
        except RecursionError:
            self.sink.add("F001", "the file is nested too deeply to parse", Span.point(name))
            statements = []
        except Exception as e:  # a parser bug must not end in a traceback; it becomes a diagnostic
            self.sink.add("F024", f"internal error while parsing: {type(e).__name__}: {e}", Span.point(name))
            statements = []
        self.loaded[key] = statements
        for st in statements:
            if st.kind == "import":
                self.follow(path, st, (*stack, key))
        self.order.append(key)

    def follow(self, importer: Path, st: Statement, stack: tuple[Path, ...]) -> None:
        target = self.find(importer, st.node)
        if target is None:
            self.sink.add("F013", f"import {st.node!r}: no such file next to {self.names[importer.resolve()]} "
                          "or in the rule library", st.name_span)
            return
        key = target.resolve()
        if key in stack:
            cycle = " -> ".join(self.names.get(p, str(p)) for p in (*stack[stack.index(key):], key))
            self.sink.add("F014", f"import cycle: {cycle}", st.name_span)
            return
        self.load(target, stack)

    @staticmethod
    def find(importer: Path, name: str) -> Path | None:
        if not name:
            return None
        for base in (importer.parent, _library()):
            if base is None:
                continue
            candidate = base / name
            if candidate.is_file():
                return candidate
        return None


def _library() -> Path | None:
    try:
        return data_dir("rules")
    except FileNotFoundError:
        return None


@dataclass
class Analysis:
    """Everything a check produces: the program (RuleSet and compiled rules) and the diagnostics."""

    program: Program
    diagnostics: list[Diagnostic]

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]


def analyze(paths: Sequence[PathLike], verify: bool = True, registry: OpRegistry | None = None,
            kinds: KindRegistry | None = None) -> Analysis:
    """Load, check and (with ``verify``) numerically verify the rule files ``paths`` as one program;
    ``kinds`` are the kernel kinds its rules may name (default: the built-in ones)."""
    sink = Sink()
    loader = _Loader(sink)
    for f in collect_files(paths):
        loader.load(f)
    return _finish(loader, sink, verify, registry, kinds)


def analyze_text(text: str, name: str = "<input>.fuse", verify: bool = True,
                 registry: OpRegistry | None = None, kinds: KindRegistry | None = None) -> Analysis:
    """Like :func:`analyze` for rule text that is not in a file; imports resolve next to ``name``."""
    sink = Sink()
    loader = _Loader(sink)
    loader.load(Path(name), text=text)
    return _finish(loader, sink, verify, registry, kinds)


def _finish(loader: _Loader, sink: Sink, verify: bool, registry: OpRegistry | None,
            kinds: KindRegistry | None) -> Analysis:
    registry = registry or default_registry()
    statements = [st for key in loader.order for st in loader.loaded[key]]
    files = [loader.names[k] for k in loader.order]
    program = compile_program(statements, files, registry, sink, kinds)
    if verify:
        from autofusion.dsl.numeric_check import verify_program

        verify_program(program, registry, sink)
    return Analysis(program, sink.sorted())


def check_paths(paths: Sequence[PathLike], verify: bool = True, registry: OpRegistry | None = None,
                kinds: KindRegistry | None = None) -> list[Diagnostic]:
    """Every diagnostic for the rule files (directories walked for ``*.fuse``), sorted by position.

    >>> from autofusion.dsl import check_paths
    >>> check_paths([]) == []
    True
    """
    return analyze(paths, verify, registry, kinds).diagnostics


def load_rules(paths: Sequence[PathLike] | None = None, registry: OpRegistry | None = None,
               kinds: KindRegistry | None = None) -> RuleSet:
    """The RuleSet of ``paths`` (None: the shipped library); raises RuleError if there are errors.

    Loading does not run numerical verification (``autofusion-rules check`` does).

    >>> from autofusion.dsl import load_rules
    >>> rules = load_rules()
    >>> "gelu_erf" in {r.name for r in rules.rewrites}
    True
    """
    if paths is None:
        paths = [data_dir("rules")]
    analysis = analyze(paths, verify=False, registry=registry, kinds=kinds)
    if analysis.errors:
        raise RuleError(analysis.diagnostics)
    return analysis.program.ruleset

