"""Checking the text of an open editor buffer, which need not be saved, with its imports resolved.

The checker reads files, so the buffer is written into a temporary directory that mirrors the
document's directory: every ``.fuse`` file and folder next to the document is linked in (and, for
``import "../x.fuse"``, the folders above it), so imports resolve exactly as they would on disk
while the document's own text is the buffer's. Nothing is written next to the user's files.

Diagnostics come back with spans in the document; errors inside imported files are reported on
the ``import`` line that brings them in.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from autofusion.dsl import Diagnostic, RuleSet, Severity, Span, analyze
from autofusion.kinds import KindRegistry
from autofusion.ops.registry import OpRegistry

UNTITLED = "untitled.fuse"
_MAX_UP_LEVELS = 8  # import "../../x.fuse" needs two levels of mirrored parent folders
_MAX_LINKS_PER_DIR = 2000  # a document in a huge folder still checks quickly
_IMPORT = re.compile(r'^[ \t]*import[ \t]+"([^"\n]*)"', re.MULTILINE)


@dataclass(frozen=True)
class ImportLine:
    """One ``import "name"`` of the document: the name and the span of its string (1-based)."""

    name: str
    span: Span


@dataclass(frozen=True)
class DocumentCheck:
    """The checker's findings for one buffer, and the rules it defines (None if the check failed)."""

    diagnostics: tuple[Diagnostic, ...]
    ruleset: RuleSet | None


def import_lines(text: str, file: str = UNTITLED) -> list[ImportLine]:
    """The ``import`` statements of ``text`` in order."""
    out = []
    for m in _IMPORT.finditer(text):
        line = text.count("\n", 0, m.start(1)) + 1
        col = m.start(1) - (text.rfind("\n", 0, m.start(1)) + 1)  # 1-based column of the opening quote
        out.append(ImportLine(m.group(1), Span(file, line, col, line, col + len(m.group(1)) + 2)))
    return out


def check_document(text: str, path: Path | None, verify: bool = False,
                   registry: OpRegistry | None = None, kinds: KindRegistry | None = None) -> DocumentCheck:
    """Check ``text`` as if it were the content of ``path`` (None: an untitled buffer).

    ``verify`` adds numerical verification of rewrites (slower; meant for saves). Never raises for
    any text: a failure of the checker becomes an F024 diagnostic.
    """
    file = path.name if path is not None else UNTITLED
    with tempfile.TemporaryDirectory(prefix="autofusion-check-") as tmp:
        try:
            copy = _mirror(Path(tmp), text, path)
        except OSError as e:
            return DocumentCheck((_internal(file, f"cannot prepare the check: {e.strerror or e}"),), None)
        try:
            analysis = analyze([copy], verify=verify, registry=registry, kinds=kinds)
        except Exception as e:  # a checker bug must not stop the editor; report it on the document
            return DocumentCheck((_internal(file, f"the checker failed: {type(e).__name__}: {e}"),), None)
        diagnostics = _map_to_document(analysis.diagnostics, copy, text, file)
        return DocumentCheck(tuple(diagnostics), analysis.program.ruleset)


def _internal(file: str, message: str) -> Diagnostic:
    return Diagnostic("F024", Severity.ERROR, message, Span.point(file))


def _mirror(root: Path, text: str, path: Path | None) -> Path:
    """Write ``text`` under ``root`` in a copy of ``path``'s surroundings; returns the copy's path."""
    if path is None:
        copy = root / UNTITLED
        _write(copy, text)
        return copy
    real_dir = path.parent
    ups = min(_levels_up(text), _MAX_UP_LEVELS, len(real_dir.parents))
    chain = [real_dir, *list(real_dir.parents)[:ups]]  # chain[i] is i folders above the document
    mirrors = [root / "top"]
    for i in range(ups - 1, -1, -1):
        mirrors.insert(0, mirrors[0] / (chain[i].name or "root"))
    for i, (real, mirror) in enumerate(zip(chain, mirrors)):
        mirror.mkdir(parents=True, exist_ok=True)
        skip = path.name if i == 0 else chain[i - 1].name
        _link_entries(real, mirror, skip)
    copy = mirrors[0] / path.name
    _write(copy, text)
    return copy


def _write(path: Path, text: str) -> None:
    # a buffer may hold lone surrogates that UTF-8 cannot encode; they become '?' for the check
    path.write_text(text, encoding="utf-8", errors="replace")


def _levels_up(text: str) -> int:
    levels = 0
    for imp in import_lines(text):
        parts = Path(os.path.normpath(imp.name)).parts if imp.name else ()
        levels = max(levels, next((k for k, p in enumerate(parts) if p != ".."), len(parts)))
    return levels


def _link_entries(real: Path, mirror: Path, skip: str) -> None:
    try:
        entries = sorted(os.scandir(real), key=lambda e: e.name)[:_MAX_LINKS_PER_DIR]
    except OSError:
        return  # a folder that does not exist (a new file) or cannot be read has nothing to import
    for entry in entries:
        if entry.name == skip or entry.name.startswith("."):
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if not is_dir and not entry.name.endswith(".fuse"):
            continue
        target = mirror / entry.name
        try:
            os.symlink(entry.path, target, target_is_directory=is_dir)
        except OSError:
            if not is_dir:  # no symlinks (some Windows setups): a copy of the rule file will do
                shutil.copyfile(entry.path, target)


def _same_file(span_file: str, path: Path) -> bool:
    candidate = Path(span_file)
    if not candidate.is_absolute():
        candidate = Path.cwd() / candidate  # the checker names files relative to the working directory
    try:
        return candidate.resolve() == path.resolve()
    except OSError:
        return False


def _map_to_document(diagnostics: list[Diagnostic], copy: Path, text: str, file: str) -> list[Diagnostic]:
    imports = import_lines(text, file)
    copy_names = sorted(_spellings(copy), key=len, reverse=True)
    out: list[Diagnostic] = []
    reported_files: set[str] = set()
    for d in diagnostics:
        if _same_file(d.span.file, copy):
            message, notes = d.message, d.notes
            for name in copy_names:  # messages that cite another place in the document name the temporary copy
                message = message.replace(name, file)
                notes = tuple(n.replace(name, file) for n in notes)
            out.append(replace(d, message=message, notes=notes, span=replace(d.span, file=file)))
        elif d.is_error and d.span.file not in reported_files:
            reported_files.add(d.span.file)  # one diagnostic per broken imported file
            count = sum(1 for e in diagnostics if e.is_error and e.span.file == d.span.file)
            where = _import_bringing(d.span.file, imports, copy, file)
            shown = Path(d.span.file).name
            more = f" (and {count - 1} more)" if count > 1 else ""
            out.append(Diagnostic(d.code, d.severity,
                                  f"imported file {shown} has errors{more}: line {d.span.line}: {d.message}",
                                  where, d.notes, d.data))
    return sorted(out, key=Diagnostic.sort_key)


def _spellings(path: Path) -> set[str]:
    names = {str(path), str(path.resolve())}
    try:
        names.add(os.path.relpath(path.resolve()))
    except ValueError:  # another drive than the working directory's
        pass
    return names


def _import_bringing(span_file: str, imports: list[ImportLine], copy: Path, file: str) -> Span:
    """The import of the document that loads ``span_file`` directly, else the first import."""
    for imp in imports:
        for base in (copy.parent, library_dir()):
            if base is None:
                continue
            candidate = base / imp.name
            if imp.name and candidate.is_file() and _same_file(span_file, candidate):
                return imp.span
    if imports:
        return imports[0].span
    return Span.point(file)


def library_dir() -> Path | None:
    """The shipped rule library (where imports not found next to a file are looked up)."""
    from autofusion.resources import data_dir

    try:
        return data_dir("rules")
    except FileNotFoundError:
        return None


__all__ = ["UNTITLED", "DocumentCheck", "ImportLine", "check_document", "import_lines", "library_dir"]
