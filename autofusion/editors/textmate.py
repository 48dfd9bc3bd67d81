"""The TextMate grammar of ``.fuse`` files (``editors/textmate/fuse.tmLanguage.json``), built from the
same vocabulary as the Pygments lexer.

Regenerate the shipped file after the grammar, the op registry or the guard functions change::

    python -m autofusion.editors.textmate editors/textmate/fuse.tmLanguage.json

Scopes (Pygments token in brackets): ``keyword.declaration.fuse`` [Keyword.Declaration],
``keyword.other.fuse`` [Keyword], ``keyword.operator.word.fuse`` [Operator.Word],
``constant.language.boolean.fuse`` [Keyword.Constant], ``support.function.op.fuse`` [Name.Builtin],
``support.class.builtin.fuse`` and ``entity.name.type.class.fuse`` [Name.Class],
``entity.name.function.fuse`` [Name.Function], ``support.function.guard.fuse`` [Name.Function.Magic],
``comment.line.documentation.fuse`` [Comment.Special], ``comment.line.*.fuse`` [Comment.Single],
``string.quoted.double.fuse`` [String.Double], ``constant.numeric.*.fuse`` [Number],
``keyword.operator.*.fuse`` [Operator].
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from autofusion.editors import vocabulary as vocab
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

SCOPE = "source.fuse"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


def _alternation(names: Iterable[str]) -> str:
    # longest first: an alternation must not stop at a prefix (Min before MinPool)
    return "|".join(sorted(names, key=lambda n: (-len(n), n)))


def _word_rule(names: Iterable[str], scope: str, lookahead: str = "") -> dict[str, str]:
    return {"match": rf"\b(?:{_alternation(names)})\b{lookahead}", "name": scope}


def build_grammar(registry: OpRegistry | None = None) -> dict[str, Any]:
    """The TextMate grammar as a JSON-ready dict."""
    registry = registry or default_registry()
    declarations = [k for k in vocab.keywords() if k in vocab.DECLARATION_KEYWORDS]
    return {
        "$schema": "https://raw.githubusercontent.com/martinring/tmlanguage/master/tmlanguage.json",
        "name": "Fuse",
        "scopeName": SCOPE,
        "fileTypes": ["fuse"],
        "patterns": [{"include": f"#{part}"} for part in
                     ("comments", "strings", "definitions", "keywords", "names", "numbers", "operators")],
        "repository": {
            "comments": {"patterns": [
                {"match": r"(?:##|///).*$", "name": "comment.line.documentation.fuse"},
                {"match": r"#.*$", "name": "comment.line.number-sign.fuse"},
                {"match": r"//.*$", "name": "comment.line.double-slash.fuse"},
            ]},
            "strings": {"patterns": [
                {"begin": '"', "end": '"|$', "name": "string.quoted.double.fuse",
                 "patterns": [{"match": r"\\.", "name": "constant.character.escape.fuse"}]},
            ]},
            "definitions": {"patterns": [
                {"match": rf"\b(class)\s+({_NAME})",
                 "captures": {"1": {"name": "keyword.declaration.fuse"}, "2": {"name": "entity.name.type.class.fuse"}}},
                {"match": rf"\b(pattern|rewrite|fuse|nofuse)\s+({_NAME})",
                 "captures": {"1": {"name": "keyword.declaration.fuse"}, "2": {"name": "entity.name.function.fuse"}}},
            ]},
            "keywords": {"patterns": [
                _word_rule(vocab.WORD_OPERATORS, "keyword.operator.word.fuse"),
                _word_rule(vocab.CONSTANTS, "constant.language.boolean.fuse"),
                _word_rule(declarations, "keyword.declaration.fuse"),
                _word_rule(vocab.other_keywords(), "keyword.other.fuse"),
            ]},
            "names": {"patterns": [
                _word_rule(vocab.guard_functions(), "support.function.guard.fuse", r"(?=\s*\()"),
                _word_rule(registry.names, "support.function.op.fuse"),
                _word_rule(vocab.builtin_classes(), "support.class.builtin.fuse"),
            ]},
            "numbers": {"patterns": [
                {"match": r"(?:\b[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\b[0-9]+[eE][+-]?[0-9]+|\.[0-9]+(?:[eE][+-]?[0-9]+)?)",
                 "name": "constant.numeric.float.fuse"},
                {"match": r"\b[0-9]+\b", "name": "constant.numeric.integer.fuse"},
            ]},
            "operators": {"patterns": [
                {"match": r"<=>|=>", "name": "keyword.operator.rewrite.fuse"},
                {"match": r"->", "name": "keyword.operator.arrow.fuse"},
                {"match": r"==|!=|<=|>=|<|>", "name": "keyword.operator.comparison.fuse"},
                {"match": r"\.\.\.", "name": "keyword.operator.rest.fuse"},
                {"match": r"[-+*/%]", "name": "keyword.operator.arithmetic.fuse"},
                {"match": r"[=|:]", "name": "keyword.operator.assignment.fuse"},
                {"match": r"[()\[\]{},]", "name": "punctuation.separator.fuse"},
            ]},
        },
    }


def render(registry: OpRegistry | None = None) -> str:
    """The grammar file's text (stable key order, two-space indent, final newline)."""
    return json.dumps(build_grammar(registry), indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the grammar to the path given as the only argument, or to stdout."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = render()
    if not args:
        sys.stdout.write(text)
        return 0
    if len(args) > 1:
        print("usage: python -m autofusion.editors.textmate [OUTPUT.json]", file=sys.stderr)
        return 2
    try:
        with open(args[0], "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as e:
        print(f"cannot write {args[0]}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
