"""Diagnostics as data: a stable code, a severity, a one-line message and a source span.

The checker only appends diagnostics; :mod:`autofusion.dsl.reporter` formats them and the CLI's
exit status counts the errors. What each code means is in :mod:`autofusion.dsl.codes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autofusion.dsl.codes import CODES, Severity
from autofusion.dsl.span import Span

__all__ = ["Diagnostic", "RuleError", "Severity", "Sink", "did_you_mean"]


@dataclass(frozen=True)
class Diagnostic:
    """One finding. ``notes`` are extra lines (a counterexample, a hint); ``data`` is for tools."""

    code: str
    severity: Severity
    message: str
    span: Span
    notes: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.span.file, self.span.line, self.span.col, self.code)


class RuleError(Exception):
    """Loading rules found errors; ``diagnostics`` holds every finding (errors and warnings)."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        errors = [d for d in self.diagnostics if d.is_error]
        first = errors[0] if errors else None
        summary = f"{len(errors)} error(s) in rule files"
        if first is not None:
            summary += f"; first: {first.span}: {first.code} {first.message}"
        super().__init__(summary)


class Sink:
    """Collects diagnostics; checks append, nothing stops at the first problem."""

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []

    def add(self, code: str, message: str, span: Span, notes: Iterable[str] = (),
            data: Mapping[str, Any] | None = None) -> None:
        self.items.append(Diagnostic(code, CODES[code].severity, message, span, tuple(notes), dict(data or {})))

    def extend(self, diags: Iterable[Diagnostic]) -> None:
        self.items.extend(diags)

    def has_errors(self) -> bool:
        return any(d.is_error for d in self.items)

    def sorted(self) -> list[Diagnostic]:
        """Unique diagnostics in file and position order."""
        seen: set[tuple[Any, ...]] = set()
        out = []
        for d in sorted(self.items, key=Diagnostic.sort_key):
            key = (d.code, d.span, d.message)
            if key not in seen:
                seen.add(key)
                out.append(d)
        return out


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the closest candidate, or an empty string."""
    import difflib

    best = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if not best:
        lower = {c.lower(): c for c in candidates}
        if name.lower() in lower:
            best = [lower[name.lower()]]
    return f" (did you mean {best[0]!r}?)" if best else ""
