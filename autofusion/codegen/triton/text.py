"""User text in generated Python: names become safe identifiers, comments stay on one line."""

from __future__ import annotations

import keyword

from autofusion.codegen.names import c_comment_text, c_ident

_RESERVED = frozenset({"tl", "triton", "torch", "mask", "offs", "pid", "row", "acc", "BLOCK", "launch", "kernel"})


def py_ident(text: str, prefix: str = "t_") -> str:
    """A Python identifier for ``text`` (the C backend's safe identifier, then Python's keywords avoided).

    >>> py_ident("x")
    't_x'
    >>> py_ident('x"); import os #').startswith("t_x_import_os_")
    True
    """
    ident = c_ident(text, prefix)
    if keyword.iskeyword(ident) or ident in _RESERVED:
        ident = "x" + ident
    return ident


def py_comment(text: str) -> str:
    """``text`` as one line of a ``#`` comment: printable ASCII, no newline can end it early."""
    return "# " + c_comment_text(text, limit=400)
