"""A Pygments lexer for ``.fuse`` rule files (``pygmentize -l fuse rules/core.fuse``).

Token kinds: statement keywords are ``Keyword.Declaration``, the other keywords ``Keyword``,
``and/or/not/in`` ``Operator.Word``, ``true/false`` ``Keyword.Constant``; op names of the registry
``Name.Builtin``; built-in and defined classes ``Name.Class``; defined patterns and rule names
``Name.Function``; guard functions ``Name.Function.Magic``; ``##``/``///`` doc comments
``Comment.Special``; ``#`` and ``//`` comments ``Comment.Single``; arrows ``Operator``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pygments.lexer import RegexLexer, bygroups, words
from pygments.token import (
    Comment,
    Error,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    String,
    Whitespace,
    _TokenType,
)

from autofusion.editors import vocabulary as vocab

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_FLOAT = r"(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"


def _keyword_rules() -> list[tuple[Any, ...]]:
    decl = [k for k in vocab.keywords() if k in vocab.DECLARATION_KEYWORDS]
    return [
        (words(vocab.WORD_OPERATORS, suffix=r"\b"), Operator.Word),
        (words(vocab.CONSTANTS, suffix=r"\b"), Keyword.Constant),
        (words(decl, suffix=r"\b"), Keyword.Declaration),
        (words(vocab.other_keywords(), suffix=r"\b"), Keyword),
    ]


class FuseLexer(RegexLexer):
    """Lexer for the ``.fuse`` rule language of autofusion.

    Options: ``registry`` (an :class:`~autofusion.ops.registry.OpRegistry`; default: the built-in
    ops) decides which names are highlighted as op names.
    """

    name = "Fuse"
    aliases = ["fuse"]
    filenames = ["*.fuse"]
    mimetypes = ["text/x-fuse"]
    url = "https://github.com/autofusion/autofusion"

    tokens = {
        "root": [
            (r"[ \t\r\f]+", Whitespace),
            (r"\n", Whitespace),
            (r"(##|///)[^\n]*", Comment.Special),
            (r"(#|//)[^\n]*", Comment.Single),
            (r'"(?:[^"\\\n]|\\.)*"', String.Double),
            (r'"[^\n]*', Error),  # an unterminated string
            (r"<=>|=>|->", Operator),
            (r"==|!=|<=|>=|<|>", Operator),
            (r"\.\.\.", Punctuation),
            (r"[-+*/%]", Operator),
            (r"[=|:]", Operator),
            (r"[()\[\]{},]", Punctuation),
            (_FLOAT, Number.Float),
            (r"[0-9]+", Number.Integer),
            (r"(class)(\s+)(" + _NAME + ")", bygroups(Keyword.Declaration, Whitespace, Name.Class)),
            (r"(pattern|rewrite|fuse|nofuse)(\s+)(" + _NAME + ")",
             bygroups(Keyword.Declaration, Whitespace, Name.Function)),
            *_keyword_rules(),
            (words(tuple(vocab.guard_functions()), suffix=r"(?=\s*\()"), Name.Function.Magic),
            (_NAME, Name),
        ],
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._registry = options.get("registry")

    def _op_names(self) -> frozenset[str]:
        registry = self._registry
        if registry is None:
            from autofusion.ops.catalog import default_registry

            registry = default_registry()
        return frozenset(registry.names)

    def get_tokens_unprocessed(self, text: str, stack: Any = ("root",)) -> Iterator[tuple[int, _TokenType, str]]:
        """Tokens of ``text``; plain names become ops, classes or patterns by what they stand for."""
        ops = self._op_names()
        classes = set(vocab.builtin_classes())
        patterns: set[str] = set()
        for name, kind in vocab.defined_names(text).items():
            (classes if kind == "class" else patterns).add(name)
        for index, token, value in super().get_tokens_unprocessed(text, stack):
            if token is Name:
                if value in ops:
                    token = Name.Builtin
                elif value in classes:
                    token = Name.Class
                elif value in patterns:
                    token = Name.Function
            yield index, token, value

    @staticmethod
    def analyse_text(text: str) -> float:
        """Rule files start statements with ``rewrite NAME:`` or ``fuse NAME:`` lines."""
        if re.search(r"^(rewrite|fuse|nofuse)\s+" + _NAME + r"\s*:", text, re.MULTILINE):
            return 0.3
        return 0.0


__all__ = ["FuseLexer"]
