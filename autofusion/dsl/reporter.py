"""Formatting diagnostics: ``file:line:col: CODE message`` with the source line and a caret, or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autofusion.dsl.diagnostics import Diagnostic, Severity

SourceReader = Callable[[str], "list[str] | None"]


def read_lines(file: str) -> list[str] | None:
    """The lines of ``file``, or None when it cannot be read (the caret is then left out)."""
    try:
        return Path(file).read_text(encoding="utf-8", errors="replace").split("\n")
    except OSError:
        return None


def format_text(diags: Sequence[Diagnostic], source: SourceReader = read_lines, show_source: bool = True) -> str:
    """Every diagnostic as text, then a summary line."""
    cache: dict[str, list[str] | None] = {}
    out: list[str] = []
    for d in diags:
        tag = " (warning)" if d.severity is Severity.WARNING else ""
        out.append(f"{d.span.file}:{d.span.line}:{d.span.col}: {d.code} {d.message}{tag}")
        if show_source:
            if d.span.file not in cache:
                cache[d.span.file] = source(d.span.file)
            out.extend(_excerpt(d, cache[d.span.file]))
        out.extend(f"      = {note}" for note in d.notes)
    out.append(summary(diags))
    return "\n".join(out) + "\n"


def _excerpt(d: Diagnostic, lines: list[str] | None) -> list[str]:
    span = d.span
    if lines is None or not 1 <= span.line <= len(lines):
        return []
    text = lines[span.line - 1].replace("\t", " ")
    width = max(1, (span.end_col if span.end_line == span.line else len(text) + 1) - span.col)
    width = min(width, max(1, len(text) - span.col + 1))
    gutter = f"{span.line:>5} | "
    return [gutter + text, " " * (len(gutter) - 2) + "| " + " " * (span.col - 1) + "^" * width]


def summary(diags: Sequence[Diagnostic]) -> str:
    errors = sum(d.is_error for d in diags)
    warnings = len(diags) - errors
    if not diags:
        return "no problems found"
    return f"{errors} error(s), {warnings} warning(s)"


def to_json(diags: Sequence[Diagnostic], files: Sequence[str] = ()) -> str:
    """Diagnostics as a JSON document: ``{"diagnostics": [...], "errors": n, "warnings": n, "files": [...]}``."""
    def one(d: Diagnostic) -> dict[str, Any]:
        return {
            "file": d.span.file, "line": d.span.line, "col": d.span.col,
            "end_line": d.span.end_line, "end_col": d.span.end_col,
            "code": d.code, "severity": str(d.severity), "message": d.message,
            "notes": list(d.notes), "data": _plain(dict(d.data)),
        }

    errors = sum(d.is_error for d in diags)
    doc = {"diagnostics": [one(d) for d in diags], "errors": errors, "warnings": len(diags) - errors,
           "files": list(files)}
    return json.dumps(doc, indent=2, allow_nan=False, default=str)


def _plain(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
