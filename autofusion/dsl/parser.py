"""Parsing ``.fuse`` text into statements, reporting every syntax error of a file.

The file is cut into top-level statements (a statement starts at a line whose first word is
``import``, ``class``, ``pattern``, ``rewrite``, ``fuse`` or ``nofuse``) and each is parsed on its own
with the LALR grammar in ``grammar/fuse.lark``; a broken statement costs only itself. Doc comments
are the ``##`` or ``///`` lines right above a statement.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from lark import Lark, Tree
from lark.exceptions import UnexpectedInput, UnexpectedToken

from autofusion.dsl.diagnostics import Sink
from autofusion.dsl.lower import Lowerer, Statement
from autofusion.dsl.span import Span
from autofusion.dsl.syntax_errors import Classifier
from autofusion.resources import data_dir

KEYWORDS = ("import", "class", "pattern", "rewrite", "fuse", "nofuse")
_START = re.compile(r"^\s*(" + "|".join(KEYWORDS) + r")(?![A-Za-z0-9_])")
_DOC = re.compile(r"^\s*(##|///)\s?(.*)$")


@dataclass(frozen=True)
class Grammar:
    parser: Lark
    classifier: Classifier


@functools.cache
def _grammar(path: str) -> Grammar:
    parser = Lark(Path(path).read_text(encoding="utf-8"), parser="lalr", propagate_positions=True,
                  maybe_placeholders=True)
    return Grammar(parser, Classifier(parser))


def grammar() -> Grammar:
    """The parser for ``grammar/fuse.lark`` (built once per process: it is immutable)."""
    return _grammar(str(data_dir("grammar") / "fuse.lark"))


@dataclass(frozen=True)
class Chunk:
    start_line: int  # 1-based line of the statement's first line
    text: str
    doc: str


def split_statements(text: str) -> list[Chunk]:
    """Top-level statements of ``text`` with their doc comments."""
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if _START.match(line)]
    if not starts or any(line.strip() and not _is_comment(line) for line in lines[: starts[0]]):
        starts = [0, *starts]  # text before the first keyword is a (broken) statement of its own
    chunks = []
    for k, begin in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        body = lines[begin:end]
        if not any(line.strip() and not _is_comment(line) for line in body):
            continue
        chunks.append(Chunk(begin + 1, "\n".join(body), _doc_above(lines, begin)))
    return chunks


def _is_comment(line: str) -> bool:
    s = line.lstrip()
    return s.startswith("#") or s.startswith("//")


def _doc_above(lines: list[str], index: int) -> str:
    docs: list[str] = []
    i = index - 1
    while i >= 0:
        m = _DOC.match(lines[i])
        if not m:
            break
        docs.append(m.group(2).rstrip())
        i -= 1
    return "\n".join(reversed(docs)).strip()


def parse_text(text: str, file: str, sink: Sink) -> list[Statement]:
    """Statements of one file; syntax errors (F001) go to ``sink``, one per broken statement."""
    gr = grammar()
    lowerer = Lowerer(file, sink)
    out: list[Statement] = []
    for chunk in split_statements(text):
        padded = "\n" * (chunk.start_line - 1) + chunk.text  # keeps lark's line numbers file-relative
        try:
            tree = gr.parser.parse(padded)
        except UnexpectedInput as err:
            sink.add("F001", gr.classifier.message(err), _error_span(err, chunk, file))
            continue
        for stmt_tree in tree.children:
            if not isinstance(stmt_tree, Tree):
                continue
            try:
                st = lowerer.statement(stmt_tree, chunk.doc)
            except RecursionError:
                sink.add("F001", "this statement is nested too deeply to read", Span.point(file, chunk.start_line))
                continue
            if st is not None:
                out.append(st)
    return out


def _error_span(err: UnexpectedInput, chunk: Chunk, file: str) -> Span:
    if isinstance(err, UnexpectedToken) and err.token.type == "$END":
        return _end_of(chunk, file)
    line = getattr(err, "line", None)
    col = getattr(err, "column", None)
    if not isinstance(line, int) or line < 1 or not isinstance(col, int) or col < 1:
        return _end_of(chunk, file)
    token = getattr(err, "token", None)
    end_col = col + max(1, len(str(token))) if token is not None and getattr(token, "line", None) == line else col + 1
    return Span(file, line, col, line, end_col)


def _end_of(chunk: Chunk, file: str) -> Span:
    lines = chunk.text.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        code = _strip_comment(lines[i]).rstrip()
        if code:
            line = chunk.start_line + i
            return Span(file, line, len(code) + 1, line, len(code) + 2)
    return Span.point(file, chunk.start_line)


def _strip_comment(line: str) -> str:
    out, in_str = [], False
    for i, ch in enumerate(line):
        if ch == '"':
            in_str = not in_str
        if not in_str and (ch == "#" or line.startswith("//", i)):
            break
        out.append(ch)
    return "".join(out)
