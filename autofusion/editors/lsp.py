"""``autofusion-lsp``: a language server for ``.fuse`` rule files (LSP over stdio, built on pygls).

It publishes the rule checker's diagnostics while you type (without numerical verification, so it
stays fast) and with verification when the file is saved, completes op, class, pattern, guard
function, keyword and template names, and explains ops, classes, patterns and diagnostic codes on
hover. No input may stop it: every handler catches what goes wrong and logs it to the client.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from lsprotocol import types
    from pygls.uris import to_fs_path

    try:
        from pygls.lsp.server import LanguageServer  # pygls 2
    except ImportError:  # pygls 1.x
        from pygls.server import LanguageServer  # type: ignore[no-redef,attr-defined]
except ImportError as missing:  # pragma: no cover - exercised only without the extra installed
    raise ImportError("autofusion-lsp needs pygls: pip install 'autofusion[lsp]'") from missing

from autofusion.dsl import Diagnostic, RuleSet, Severity
from autofusion.editors.document_check import DocumentCheck, check_document
from autofusion.editors.lsp_features import completion_items, hover_markdown
from autofusion.kinds import KindRegistry, default_kinds
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

NAME = "autofusion-lsp"
VERSION = "0.1.0"
SOURCE = "autofusion"
TYPING_PAUSE_S = 0.15  # a check starts once typing pauses this long; older pending checks are dropped
_UNNECESSARY = {"F007", "F009"}  # unused binding, shadowed rule: editors grey these out
_log = logging.getLogger(NAME)


@dataclass
class _DocumentState:
    generation: int = 0  # bumped by every edit; a check whose generation is stale is not published
    ruleset: RuleSet | None = None  # from the last check that got that far
    diagnostics: tuple[Diagnostic, ...] = ()


@dataclass
class ServerState:
    """What the server keeps between messages: the registry, one worker, per-document results."""

    registry: OpRegistry
    kinds: KindRegistry
    worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="fuse-check"))
    documents: dict[str, _DocumentState] = field(default_factory=dict)

    def document(self, uri: str) -> _DocumentState:
        return self.documents.setdefault(uri, _DocumentState())


def create_server(registry: OpRegistry | None = None, kinds: KindRegistry | None = None) -> LanguageServer:
    """A language server with every feature registered (start it with ``.start_io()``); ``registry``
    and ``kinds`` are the ops and kernel kinds rules may name."""
    server = LanguageServer(NAME, VERSION, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
    state = ServerState(registry or default_registry(), kinds or default_kinds())

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    async def did_open(ls: LanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        await _check(ls, state, params.text_document.uri, verify=False, pause=0.0)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    async def did_change(ls: LanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        await _check(ls, state, params.text_document.uri, verify=False, pause=TYPING_PAUSE_S)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    async def did_save(ls: LanguageServer, params: types.DidSaveTextDocumentParams) -> None:
        await _check(ls, state, params.text_document.uri, verify=True, pause=0.0)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: LanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        try:
            state.documents.pop(params.text_document.uri, None)
            _publish(ls, params.text_document.uri, [], None)
        except Exception as e:  # the server outlives any failure of one message
            _report(ls, "didClose", e)

    @server.feature(types.TEXT_DOCUMENT_COMPLETION,
                    types.CompletionOptions(trigger_characters=['"', "(", ">", "|", " "]))
    def completion(ls: LanguageServer, params: types.CompletionParams) -> types.CompletionList:
        try:
            doc, line, column = _position(ls, params.text_document.uri, params.position)
            path = _fs_path(params.text_document.uri)
            items = completion_items(doc.source, line, column, state.registry,
                                     state.document(params.text_document.uri).ruleset,
                                     path.parent if path is not None else None)
            return types.CompletionList(is_incomplete=False, items=items)
        except _NotOpen:
            return types.CompletionList(is_incomplete=False, items=[])
        except Exception as e:
            _report(ls, "completion", e)
            return types.CompletionList(is_incomplete=False, items=[])

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(ls: LanguageServer, params: types.HoverParams) -> types.Hover | None:
        try:
            doc, line, column = _position(ls, params.text_document.uri, params.position)
            known = state.document(params.text_document.uri)
            found = hover_markdown(doc.source, line, column, state.registry, known.ruleset, known.diagnostics)
            if found is None:
                return None
            markdown, (start, end) = found
            codec, lines = doc.position_codec, doc.lines
            hover_range = types.Range(start=codec.position_to_client_units(lines, types.Position(line, start)),
                                      end=codec.position_to_client_units(lines, types.Position(line, end)))
            return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=markdown),
                               range=hover_range)
        except _NotOpen:
            return None
        except Exception as e:
            _report(ls, "hover", e)
            return None

    return server


async def _check(ls: LanguageServer, state: ServerState, uri: str, verify: bool, pause: float) -> None:
    try:
        known = state.document(uri)
        known.generation += 1
        generation = known.generation
        if pause:
            await asyncio.sleep(pause)
            if known.generation != generation:
                return  # more typing came in; its own check follows
        doc = ls.workspace.get_text_document(uri)
        text, version = doc.source, doc.version
        loop = asyncio.get_running_loop()
        result: DocumentCheck = await loop.run_in_executor(
            state.worker, check_document, text, _fs_path(uri), verify, state.registry, state.kinds)
        if known.generation != generation or state.documents.get(uri) is not known:
            return  # edited or closed meanwhile
        if result.ruleset is not None:
            known.ruleset = result.ruleset
        known.diagnostics = result.diagnostics
        current = ls.workspace.get_text_document(uri)
        _publish(ls, uri, [_to_lsp(d, current) for d in result.diagnostics], version)
    except Exception as e:
        _report(ls, "check", e)


def _to_lsp(d: Diagnostic, doc: Any) -> types.Diagnostic:
    """A checker diagnostic as an LSP one (spans count from 1 in code points; LSP from 0 in client units)."""
    lines: list[str] = doc.lines or [""]
    start = _clamp(lines, d.span.line - 1, d.span.col - 1)
    end = max(start, _clamp(lines, d.span.end_line - 1, d.span.end_col - 1))
    codec = doc.position_codec
    message = "\n".join([d.message, *d.notes])
    return types.Diagnostic(
        range=types.Range(start=codec.position_to_client_units(lines, types.Position(*start)),
                          end=codec.position_to_client_units(lines, types.Position(*end))),
        message=message,
        severity=types.DiagnosticSeverity.Error if d.severity is Severity.ERROR else types.DiagnosticSeverity.Warning,
        code=d.code,
        source=SOURCE,
        tags=[types.DiagnosticTag.Unnecessary] if d.code in _UNNECESSARY else None,
    )


def _clamp(lines: list[str], line: int, column: int) -> tuple[int, int]:
    line = min(max(line, 0), len(lines) - 1)
    return line, min(max(column, 0), len(lines[line].rstrip("\r\n")))


class _NotOpen(Exception):
    """A request names a document the client never opened (and that is not on disk either)."""


def _position(ls: LanguageServer, uri: str, position: types.Position) -> tuple[Any, int, int]:
    """The document and the position in code points (the client counts in its own units)."""
    doc = ls.workspace.get_text_document(uri)
    try:
        doc.source  # noqa: B018 - pygls reads a document that was never opened from disk
    except (OSError, UnicodeDecodeError) as e:
        raise _NotOpen(uri) from e
    copy = types.Position(line=position.line, character=position.character)  # pygls may adjust it in place
    if position.line >= len(doc.lines):
        return doc, position.line, position.character
    server_pos = doc.position_codec.position_from_client_units(doc.lines, copy)
    return doc, server_pos.line, server_pos.character


def _fs_path(uri: str) -> Path | None:
    try:
        path = to_fs_path(uri) if uri.startswith("file:") else None
    except Exception:  # a malformed URI is checked as an untitled buffer
        return None
    return Path(path) if path else None


def _publish(ls: LanguageServer, uri: str, diagnostics: list[types.Diagnostic], version: int | None) -> None:
    if hasattr(ls, "text_document_publish_diagnostics"):
        ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=version))
    else:  # pygls 1.x
        ls.publish_diagnostics(uri, diagnostics, version=version)  # type: ignore[attr-defined]


def _report(ls: LanguageServer, where: str, error: BaseException) -> None:
    """Log a failure to stderr and to the client's log; never raise."""
    _log.exception("%s failed", where)
    message = f"{NAME}: {where} failed: {type(error).__name__}: {error}"
    try:
        if hasattr(ls, "window_log_message"):
            ls.window_log_message(types.LogMessageParams(type=types.MessageType.Error, message=message))
        else:  # pygls 1.x
            ls.show_message_log(message, types.MessageType.Error)  # type: ignore[attr-defined]
    except Exception:
        _log.exception("could not send the log message")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server on stdin/stdout until the client sends ``exit``."""
    parser = argparse.ArgumentParser(prog=NAME, description="Language server for autofusion .fuse rule files.")
    parser.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    parser.add_argument("--log-file", help="write the server's log to this file (default: stderr)")
    parser.add_argument("--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"{NAME} {VERSION}")
    args = parser.parse_args(argv)
    try:
        handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler(sys.stderr)
    except OSError as e:
        print(f"{NAME}: cannot open log file {args.log_file}: {e.strerror or e}", file=sys.stderr)
        return 2
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for logger in (_log, logging.getLogger("pygls")):
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    from autofusion.plugins import PluginError, kinds_with_plugins, registry_with_plugins

    try:  # rules may name installed plugins' ops and kernel kinds
        registry, kinds = registry_with_plugins(), kinds_with_plugins()
    except PluginError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    protocol_out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the protocol stream
    create_server(registry, kinds).start_io(sys.stdin.buffer, protocol_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
