"""The words of the ``.fuse`` language that editors highlight and complete, read from their sources.

Keywords come from ``grammar/fuse.lark`` at run time, op names from the op registry, guard
functions, built-in classes and templates from :mod:`autofusion.dsl`; each has a fallback so that
highlighting keeps working when a source cannot be read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from autofusion.ops.registry import OpClass

# Statement starters: a statement begins at a line whose first word is one of these.
DECLARATION_KEYWORDS = ("import", "class", "pattern", "rewrite", "fuse", "nofuse")
WORD_OPERATORS = ("and", "or", "not", "in")
CONSTANTS = ("true", "false")
_FALLBACK_KEYWORDS = (
    *DECLARATION_KEYWORDS, "branch", "loop", "into", "producer", "consumer", "where", "priority",
    "template", "as", *WORD_OPERATORS, *CONSTANTS,
)
_FALLBACK_GUARD_FUNCTIONS = {
    "rank": "number of dimensions", "shape": "the shape as a list", "dim": "one dimension",
    "numel": "number of elements", "size_bytes": "size in bytes", "dtype": "element type name",
    "is_float": "element type is a floating-point type", "const": "the tensor is a constant",
    "attr": "an attribute of a captured node", "len": "length of a list or shape",
    "min": "smallest of its arguments", "max": "largest of its arguments", "abs": "absolute value",
}
DOC_COMMENT_PREFIXES = ("##", "///")
COMMENT_PREFIXES = ("#", "//")


@dataclass(frozen=True)
class GuardFunction:
    """A function of the guard language: its name, a signature line and what it computes."""

    name: str
    signature: str
    doc: str


def keywords_from_grammar(grammar_text: str) -> tuple[str, ...]:
    """The reserved words of a lark grammar: quoted lowercase literals and words inside terminals."""
    grammar_text = re.sub(r"(?m)(^|\s)//.*$", "", grammar_text)  # comments quote example rules
    quoted = re.findall(r'"([a-z][a-z_]*)"', grammar_text)
    in_regex = re.findall(r"([a-z][a-z_]+)\\b", grammar_text)  # e.g. ARROW_TEMPLATE: /->\s*template\b/
    return tuple(dict.fromkeys([*quoted, *in_regex]))


@functools.cache
def keywords() -> tuple[str, ...]:
    """Every keyword of the language, sorted (read from the grammar file, fallback list otherwise)."""
    try:
        from autofusion.resources import data_dir

        text = (data_dir("grammar") / "fuse.lark").read_text(encoding="utf-8")
        found = keywords_from_grammar(text)
    except (OSError, UnicodeDecodeError):
        found = ()
    return tuple(sorted(set(found) | set(_FALLBACK_KEYWORDS)))


def other_keywords() -> tuple[str, ...]:
    """Keywords that are neither statement starters, word operators nor constants."""
    special = {*DECLARATION_KEYWORDS, *WORD_OPERATORS, *CONSTANTS}
    return tuple(k for k in keywords() if k not in special)


@functools.cache
def guard_functions() -> Mapping[str, GuardFunction]:
    """The guard language's functions by name, with signatures when the checker describes them."""
    try:
        from autofusion.dsl.guards import FUNCTIONS
    except ImportError:
        return {n: GuardFunction(n, f"{n}(...)", d) for n, d in _FALLBACK_GUARD_FUNCTIONS.items()}
    out = {}
    for name, fn in FUNCTIONS.items():
        params = [str(getattr(p, "value", p)) for p in getattr(fn, "params", ())]
        if getattr(fn, "variadic", False) and params:
            params[-1] += ", ..."
        result = getattr(fn, "result", "")
        signature = f"{name}({', '.join(params)}) -> {getattr(result, 'value', result)}"
        out[name] = GuardFunction(name, signature, str(getattr(fn, "doc", "")))
    return out


def builtin_classes() -> tuple[str, ...]:
    """Class names every rule file may use: one per :class:`OpClass`, and ``any``."""
    try:
        from autofusion.dsl.resolve import BUILTIN_CLASSES

        return tuple(BUILTIN_CLASSES)
    except ImportError:
        return (*(c.value for c in OpClass), "any")


def templates() -> Mapping[str, str]:
    """Kernel template names a fusion rule may name, with a one-line description each."""
    from autofusion.kinds import default_kinds

    return {kind.name: kind.summary for kind in default_kinds() if kind.name != "view"}


_DEFINITION = re.compile(r"^[ \t]*(class|pattern)[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


def defined_names(text: str) -> dict[str, str]:
    """Names defined by ``class`` and ``pattern`` statements of ``text``, mapped to that keyword."""
    return {m.group(2): m.group(1) for m in _DEFINITION.finditer(text)}


__all__ = [
    "COMMENT_PREFIXES",
    "CONSTANTS",
    "DECLARATION_KEYWORDS",
    "DOC_COMMENT_PREFIXES",
    "GuardFunction",
    "WORD_OPERATORS",
    "builtin_classes",
    "defined_names",
    "guard_functions",
    "keywords",
    "keywords_from_grammar",
    "other_keywords",
    "templates",
]
