"""Completion and hover for ``.fuse`` documents, as plain functions of the text and a position.

Positions here are 0-based lines and code-point columns; :mod:`autofusion.editors.lsp` converts
from and to the client's units. Names come from the op registry, the checker's last RuleSet of
the document (classes and patterns of its imports too) and the document's own text (so that a
name is offered while the document does not check).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lsprotocol import types

from autofusion.dsl import CODES, Diagnostic, RuleSet
from autofusion.editors import vocabulary as vocab
from autofusion.ops.registry import OpDef, OpRegistry

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CODE = re.compile(r"F[0-9]{3}")
_IMPORT_STRING = re.compile(r'^\s*import\s+"([^"]*)$')
_TEMPLATE_STRING = re.compile(r'template\s+"([^"]*)$')
_AFTER_TEMPLATE = re.compile(r"template\s+[A-Za-z_]*$")


def word_at(line: str, column: int) -> tuple[str, int, int] | None:
    """The name (or diagnostic code) under ``column`` of ``line``: (word, start, end), or None."""
    for m in _WORD.finditer(line):
        if m.start() <= column <= m.end() and m.end() > m.start():
            return m.group(), m.start(), m.end()
    return None


def _in_comment_or_string(before: str) -> tuple[bool, bool]:
    in_string = False
    for i, ch in enumerate(before):
        if ch == '"':
            in_string = not in_string
        elif not in_string and (ch == "#" or before.startswith("//", i)):
            return True, False
    return False, in_string


# ---- completion ----------------------------------------------------------------------------------

def completion_items(text: str, line: int, column: int, registry: OpRegistry, ruleset: RuleSet | None,
                     document_dir: Path | None) -> list[types.CompletionItem]:
    """What may be written at (``line``, ``column``) of ``text``."""
    lines = text.split("\n")
    if not 0 <= line < len(lines):
        return []
    before = lines[line][: max(0, column)]
    m = _IMPORT_STRING.match(before)
    if m:
        return _import_items(document_dir)
    in_comment, in_string = _in_comment_or_string(before)
    if in_comment:
        return []
    if in_string:
        return _template_items(quoted=False) if _TEMPLATE_STRING.search(before) else []
    if _AFTER_TEMPLATE.search(before):
        return _template_items(quoted=True)
    return [*_keyword_items(), *_op_items(registry), *_class_items(registry, ruleset, text),
            *_pattern_items(ruleset, text), *_guard_items()]


def _item(label: str, kind: types.CompletionItemKind, detail: str, doc: str = "", sort_group: int = 5,
          insert: str | None = None) -> types.CompletionItem:
    documentation = types.MarkupContent(kind=types.MarkupKind.Markdown, value=doc) if doc else None
    return types.CompletionItem(label=label, kind=kind, detail=detail, documentation=documentation,
                                sort_text=f"{sort_group}{label}", insert_text=insert)


def _keyword_items() -> list[types.CompletionItem]:
    return [_item(k, types.CompletionItemKind.Keyword, "keyword", sort_group=6) for k in vocab.keywords()]


def _op_items(registry: OpRegistry) -> list[types.CompletionItem]:
    return [_item(op.name, types.CompletionItemKind.Function, f"{op.op_class} op ({', '.join(op.inputs)})",
                  op_markdown(op), sort_group=2) for op in registry]


def _class_items(registry: OpRegistry, ruleset: RuleSet | None, text: str) -> list[types.CompletionItem]:
    names = dict.fromkeys(vocab.builtin_classes())
    if ruleset is not None:
        names.update(dict.fromkeys(ruleset.classes))
    names.update(dict.fromkeys(n for n, kind in vocab.defined_names(text).items() if kind == "class"))
    return [_item(n, types.CompletionItemKind.Class, "op class", class_markdown(n, registry, ruleset) or "",
                  sort_group=1) for n in names]


def _pattern_items(ruleset: RuleSet | None, text: str) -> list[types.CompletionItem]:
    names = dict.fromkeys(ruleset.patterns if ruleset is not None else ())
    names.update(dict.fromkeys(n for n, kind in vocab.defined_names(text).items() if kind == "pattern"))
    return [_item(n, types.CompletionItemKind.Method, "pattern", pattern_markdown(n, ruleset) or "", sort_group=1)
            for n in names]


def _guard_items() -> list[types.CompletionItem]:
    return [_item(f.name, types.CompletionItemKind.Function, f.signature, f"guard function: {f.doc}", sort_group=3)
            for f in vocab.guard_functions().values()]


def _template_items(quoted: bool) -> list[types.CompletionItem]:
    return [_item(name, types.CompletionItemKind.Value, "kernel template", desc, sort_group=0,
                  insert=f'"{name}"' if quoted else None) for name, desc in vocab.templates().items()]


def _import_items(document_dir: Path | None) -> list[types.CompletionItem]:
    from autofusion.editors.document_check import library_dir

    seen: dict[str, str] = {}
    for base, where in ((document_dir, "next to this file"), (library_dir(), "rule library")):
        if base is None or not base.is_dir():
            continue
        try:
            for p in sorted(base.glob("*.fuse")):
                seen.setdefault(p.name, where)
        except OSError:
            continue
    return [_item(n, types.CompletionItemKind.File, where, sort_group=0) for n, where in seen.items()]


# ---- hover ---------------------------------------------------------------------------------------

def hover_markdown(text: str, line: int, column: int, registry: OpRegistry, ruleset: RuleSet | None,
                   diagnostics: Sequence[Diagnostic] = ()) -> tuple[str, tuple[int, int]] | None:
    """Markdown for the word at (``line``, ``column``) and the word's column range, or None."""
    lines = text.split("\n")
    if not 0 <= line < len(lines):
        return None
    found = word_at(lines[line], column)
    parts: list[str] = []
    extent = (column, column)
    if found is not None:
        word, start, end = found
        extent = (start, end)
        described = describe(word, lines[line], end, registry, ruleset, text)
        if described:
            parts.append(described)
    for code in dict.fromkeys(d.code for d in diagnostics if _covers(d, line, column)):
        if found is None or found[0] != code:
            parts.append(code_markdown(code))
    return ("\n\n---\n\n".join(parts), extent) if parts else None


def _covers(d: Diagnostic, line: int, column: int) -> bool:
    start, end = (d.span.line - 1, d.span.col - 1), (d.span.end_line - 1, d.span.end_col - 1)
    return start <= (line, column) <= end


def describe(word: str, line_text: str, end: int, registry: OpRegistry, ruleset: RuleSet | None,
             text: str) -> str | None:
    """What ``word`` is, in markdown: a code, an op, a class, a pattern, a guard function, a template."""
    if _CODE.fullmatch(word) and word in CODES:
        return code_markdown(word)
    op = registry.get(word)
    if op is not None:
        return op_markdown(op)
    for render in (lambda: class_markdown(word, registry, ruleset, text),
                   lambda: pattern_markdown(word, ruleset, text)):
        found = render()
        if found:
            return found
    guard = vocab.guard_functions().get(word)
    if guard is not None and line_text[end:].lstrip().startswith("("):
        return f"**{guard.name}** (guard function)\n\n`{guard.signature}`\n\n{guard.doc}"
    template = vocab.templates().get(word)
    if template is not None and f'"{word}"' in line_text:
        return f'**template "{word}"**\n\n{template}'
    return None


def code_markdown(code: str) -> str:
    """A diagnostic code's explanation, as ``autofusion-rules check --explain`` prints it."""
    entry = CODES.get(code)
    return f"```text\n{entry.explain().strip()}\n```" if entry is not None else f"unknown diagnostic code {code}"


def op_markdown(op: OpDef) -> str:
    """An op's class, inputs, attributes with their defaults, outputs and description."""
    inputs = [_input_text(n) for n in op.inputs] or ["(none)"]
    attrs = [f"`{k} = {_value_text(v)}`" for k, v in op.attrs.items()] or ["(none)"]
    outputs = "as many as the node declares" if op.num_outputs is None else str(op.num_outputs)
    lines = [f"**{op.name}** ({op.op_class} op)", ""]
    if op.doc:
        lines += [op.doc, ""]
    lines += [f"- inputs: {', '.join(inputs)}", f"- attributes: {', '.join(attrs)}", f"- outputs: {outputs}"]
    return "\n".join(lines)


def _input_text(name: str) -> str:
    if name.endswith("?"):
        return f"`{name[:-1]}` (optional)"
    if name.endswith("*"):
        return f"`{name[:-1]}...` (variadic)"
    return f"`{name}`"


def _value_text(value: Any) -> str:
    if value is None:
        return "(required, no default)"
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def class_markdown(name: str, registry: OpRegistry, ruleset: RuleSet | None, text: str = "") -> str | None:
    """A class's members (built-in classes: every op of the registry of that class)."""
    cls = ruleset.classes.get(name) if ruleset is not None else None
    if cls is not None:
        kind = "built-in class" if cls.builtin else "class"
        members = cls.members or tuple(sorted(cls.ops))
        return _join(f"**{name}** ({kind})", cls.doc, "members: " + _names(members))
    if name in vocab.builtin_classes():
        from autofusion.ops.registry import OpClass

        ops = registry.names if name == "any" else registry.of_class(OpClass(name))
        return _join(f"**{name}** (built-in class)", "members: " + _names(ops))
    if vocab.defined_names(text).get(name) == "class":
        return f"**{name}** (class defined in this file; members are shown once the file checks)"
    return None


def pattern_markdown(name: str, ruleset: RuleSet | None, text: str = "") -> str | None:
    """A pattern's parameters and doc comment."""
    pattern = ruleset.patterns.get(name) if ruleset is not None else None
    if pattern is not None:
        params = "" if pattern.params is None else f"({', '.join(pattern.params)})"
        return _join(f"**pattern {name}{params}** ({pattern.kind})", pattern.doc)
    if vocab.defined_names(text).get(name) == "pattern":
        return f"**pattern {name}** (defined in this file)"
    return None


def _names(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "(none)"


def _join(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)


__all__ = ["code_markdown", "completion_items", "describe", "hover_markdown", "op_markdown", "word_at"]
