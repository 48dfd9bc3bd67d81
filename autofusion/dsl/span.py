"""Source positions: every node of the rule IR and every diagnostic carries a :class:`Span`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Span:
    """A range in a rule file; lines and columns count from 1, ``end_col`` is exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @classmethod
    def point(cls, file: str, line: int = 1, col: int = 1) -> Span:
        """A one-character span (used where only a position is known)."""
        return cls(file, line, col, line, col + 1)

    def to(self, other: Span) -> Span:
        """The span from the start of ``self`` to the end of ``other``."""
        return Span(self.file, self.line, self.col, other.end_line, other.end_col)


NO_SPAN = Span("<builtin>", 0, 0, 0, 0)
