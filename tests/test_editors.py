"""Editor tooling for .fuse files: the Pygments lexer, the TextMate grammar, buffer checking and the
language server (run as a real subprocess speaking LSP over stdio)."""

from __future__ import annotations

import json
import plistlib
import queue
import re
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pygments.token import Comment, Error, Keyword, Name, Number, Operator, Punctuation, String, Whitespace

from autofusion.dsl import CODES
from autofusion.editors import vocabulary as vocab
from autofusion.editors.document_check import check_document, import_lines
from autofusion.editors.pygments_lexer import FuseLexer
from autofusion.editors.textmate import build_grammar, render
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "rules").glob("*.fuse"))
TUTORIAL = ROOT / "docs" / "rules-tutorial.md"
TM_FILE = ROOT / "editors" / "textmate" / "fuse.tmLanguage.json"

SAMPLE = '''import "core.fuse"
## A doc comment.
# a comment
class myact = Relu | Gelu   // trailing comment
pattern dense(x, w, b) = Add(MatMul(x, w), b) where const(w)
rewrite neg2: Neg(Neg(x)) => x
rewrite both: Mul(x, 1.0) <=> x
fuse f: myact(dense(x, w, b)) -> template "gemm_epilogue" (tile_m=64) where rank(x) >= 2 and not is_float(x) priority -10
nofuse big: Softmax(x, ...) where numel(x) > 1.5e6 or dtype(x) in ["float16"]
fuse g: pointwise into producer Conv -> template "conv_epilogue" where true
'''


def _tokens(text: str, lexer: FuseLexer | None = None) -> list[tuple[Any, str]]:
    return list((lexer or FuseLexer()).get_tokens(text))


def _kinds(text: str) -> dict[str, set[Any]]:
    out: dict[str, set[Any]] = {}
    for tok, value in _tokens(text):
        out.setdefault(value, set()).add(tok)
    return out


def _tutorial_blocks() -> list[str]:
    if not TUTORIAL.is_file():
        return []
    return re.findall(r"^```fuse\b[^\n]*\n(.*?)^```", TUTORIAL.read_text(encoding="utf-8"), re.M | re.S)


# ---- Pygments lexer ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_lexer_has_no_error_tokens_on_shipped_rules(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    tokens = _tokens(text)
    assert [v for t, v in tokens if t is Error] == []
    assert "".join(v for _, v in tokens) == text if text.endswith("\n") else text + "\n"
    assert any(t is Name.Builtin for t, _ in tokens)  # every rule file names ops


def test_shipped_rules_exist() -> None:
    assert RULE_FILES, "rules/*.fuse is the lexer's main test input"


def test_lexer_has_no_error_tokens_on_tutorial_blocks() -> None:
    blocks = _tutorial_blocks()
    if not blocks:
        pytest.skip("docs/rules-tutorial.md has no ```fuse blocks yet")
    for block in blocks:
        assert [v for t, v in _tokens(block) if t is Error] == [], block


def test_lexer_classifies_tokens() -> None:
    k = _kinds(SAMPLE)
    for word in ("import", "class", "pattern", "rewrite", "fuse", "nofuse"):
        assert k[word] == {Keyword.Declaration}, word
    for word in ("where", "template", "priority", "into", "producer"):
        assert k[word] == {Keyword}, word
    for word in ("and", "not", "or", "in"):
        assert k[word] == {Operator.Word}, word
    assert k["true"] == {Keyword.Constant}
    for op in ("Relu", "Gelu", "Add", "MatMul", "Neg", "Mul", "Softmax", "Conv"):
        assert k[op] == {Name.Builtin}, op
    assert k["myact"] == {Name.Class}  # defined here: at its definition and where it is used
    assert k["pointwise"] == {Name.Class}  # built-in class
    assert k["dense"] == {Name.Function}  # pattern, defined and used
    assert k["neg2"] == k["f"] == k["big"] == {Name.Function}
    for fn in ("const", "rank", "is_float", "numel", "dtype"):
        assert k[fn] == {Name.Function.Magic}, fn
    assert k["## A doc comment."] == {Comment.Special}
    assert k["# a comment"] == {Comment.Single}
    assert k["// trailing comment"] == {Comment.Single}
    assert k['"gemm_epilogue"'] == {String.Double}
    assert k["1.0"] == {Number.Float} and k["1.5e6"] == {Number.Float}
    assert k["64"] == {Number.Integer} and k["10"] == {Number.Integer}
    assert k["->"] == k["=>"] == k["<=>"] == {Operator}
    assert k["..."] == {Punctuation}
    assert k["x"] == {Name}


def test_lexer_guard_function_names_need_a_call() -> None:
    k = _kinds("rewrite r: Add(rank, x) => Add(x, rank) where rank(x) == 1\n")
    assert k["rank"] == {Name, Name.Function.Magic}


def test_lexer_reports_bad_characters_as_errors() -> None:
    tokens = _tokens('fuse f: Relu @ -> template "pointw\n')
    assert [v for t, v in tokens if t is Error] == ["@", '"pointw']


def test_lexer_follows_the_given_registry() -> None:
    small = OpRegistry([default_registry()["Relu"]])
    k = _kinds_with(FuseLexer(registry=small), "fuse f: Relu -> Tanh -> template \"pointwise\"\n")
    assert k["Relu"] == {Name.Builtin} and k["Tanh"] == {Name}


def _kinds_with(lexer: FuseLexer, text: str) -> dict[str, set[Any]]:
    out: dict[str, set[Any]] = {}
    for tok, value in lexer.get_tokens(text):
        out.setdefault(value, set()).add(tok)
    return out


def test_keywords_come_from_the_grammar() -> None:
    grammar = '// "ignored" in a comment\nstmt: "unroll" NAME "by" INT\nT.2: /->\\s*kernel\\b/\n'
    assert vocab.keywords_from_grammar(grammar) == ("unroll", "by", "kernel")
    expected = {"import", "class", "pattern", "rewrite", "fuse", "nofuse", "branch", "loop", "into", "producer",
                "consumer", "where", "priority", "template", "and", "or", "not", "in", "true", "false"}
    assert expected <= set(vocab.keywords())
    assert set(vocab.guard_functions()) == {"rank", "shape", "dim", "numel", "size_bytes", "dtype", "is_float",
                                            "const", "attr", "len", "min", "max", "abs"}


def test_pyproject_declares_the_editor_entry_points() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["pygments.lexers"]["fuse"] == "autofusion.editors.pygments_lexer:FuseLexer"
    assert project["scripts"]["autofusion-lsp"] == "autofusion.editors.lsp:main"
    assert any(dep.startswith("pygls") for dep in project["optional-dependencies"]["lsp"])
    assert FuseLexer.aliases == ["fuse"] and FuseLexer.filenames == ["*.fuse"]
    assert FuseLexer.analyse_text('fuse f: Relu -> template "pointwise"\n') > 0
    assert FuseLexer.analyse_text("def fuse(x):\n    return x\n") == 0


# ---- TextMate grammar ------------------------------------------------------------------------------

def _tm_rules(grammar: dict[str, Any]) -> list[dict[str, Any]]:
    """The grammar's top-level rules in order, includes resolved."""
    out = []
    for ref in grammar["patterns"]:
        out.extend(grammar["repository"][ref["include"].lstrip("#")]["patterns"])
    return out


def _tm_scopes(grammar: dict[str, Any], line: str) -> list[str | None]:
    """The scope of each character of ``line``: earliest match wins, ties go to the first rule."""
    rules = _tm_rules(grammar)
    scopes: list[str | None] = [None] * len(line)
    pos = 0
    while pos < len(line):
        best = None
        for rule in rules:
            m = re.compile(rule.get("match") or rule["begin"]).search(line, pos)
            if m and (best is None or m.start() < best[1].start()):
                best = (rule, m)
        if best is None:
            break
        rule, m = best
        end = m.end()
        if "begin" in rule:
            closing = re.compile(rule["end"]).search(line, m.end())
            end = closing.end() if closing else len(line)
        for i in range(m.start(), end):
            scopes[i] = rule.get("name")
        for group, cap in rule.get("captures", {}).items():
            for i in range(m.start(int(group)), m.end(int(group))):
                scopes[i] = cap["name"]
        pos = max(end, pos + 1)
    return scopes


def test_textmate_file_is_valid_json_and_up_to_date() -> None:
    shipped = json.loads(TM_FILE.read_text(encoding="utf-8"))
    assert shipped["scopeName"] == "source.fuse" and shipped["fileTypes"] == ["fuse"]
    assert TM_FILE.read_text(encoding="utf-8") == render(), (
        "regenerate: python -m autofusion.editors.textmate editors/textmate/fuse.tmLanguage.json")


def test_textmate_regexes_compile_and_scopes_exist() -> None:
    grammar = json.loads(TM_FILE.read_text(encoding="utf-8"))
    names = set()
    for rule in _tm_rules(grammar):
        for key in ("match", "begin", "end"):
            if key in rule:
                re.compile(rule[key])
        names.add(rule.get("name"))
        names.update(c["name"] for c in rule.get("captures", {}).values())
    for scope in ("keyword.declaration.fuse", "keyword.other.fuse", "keyword.operator.word.fuse",
                  "constant.language.boolean.fuse", "support.function.op.fuse", "support.class.builtin.fuse",
                  "support.function.guard.fuse", "entity.name.function.fuse", "entity.name.type.class.fuse",
                  "comment.line.documentation.fuse", "comment.line.number-sign.fuse",
                  "comment.line.double-slash.fuse", "string.quoted.double.fuse", "constant.numeric.float.fuse",
                  "constant.numeric.integer.fuse", "keyword.operator.arrow.fuse", "keyword.operator.rewrite.fuse"):
        assert scope in names, scope


def test_textmate_converts_to_a_property_list_for_sublime() -> None:
    grammar = json.loads(TM_FILE.read_text(encoding="utf-8"))
    assert plistlib.loads(plistlib.dumps(grammar)) == grammar  # the README's one-line conversion


def test_textmate_classifies_a_sample_line() -> None:
    line = 'fuse f: act(MatMul(x, w)) -> template "reduction" where rank(x) >= 2 and not true # done'
    scopes = _tm_scopes(build_grammar(), line)

    def scope_of(word: str, nth: int = 0) -> str | None:
        starts = [m.start() for m in re.finditer(re.escape(word), line)]
        return scopes[starts[nth]]

    assert scope_of("fuse") == "keyword.declaration.fuse"
    assert scope_of("f:") == "entity.name.function.fuse"
    assert scope_of("MatMul") == "support.function.op.fuse"
    assert scope_of("->") == "keyword.operator.arrow.fuse"
    assert scope_of("template") == "keyword.other.fuse"
    assert scope_of('"reduction"') == "string.quoted.double.fuse"  # a class name inside a string stays a string
    assert scope_of("where") == "keyword.other.fuse"
    assert scope_of("rank") == "support.function.guard.fuse"
    assert scope_of("and") == scope_of("not") == "keyword.operator.word.fuse"
    assert scope_of("true") == "constant.language.boolean.fuse"
    assert scope_of("2") == "constant.numeric.integer.fuse"
    assert scope_of("# done") == "comment.line.number-sign.fuse"
    assert scope_of("x") is None


_PYGMENTS_TO_SCOPE = {
    Keyword.Declaration: ("keyword.declaration",), Keyword: ("keyword.other",),
    Operator.Word: ("keyword.operator.word",), Keyword.Constant: ("constant.language.boolean",),
    Name.Builtin: ("support.function.op",), Name.Function.Magic: ("support.function.guard",),
    Comment.Special: ("comment.line.documentation",), Comment.Single: ("comment.line.number-sign",
                                                                       "comment.line.double-slash"),
    String.Double: ("string.quoted.double",), Number.Float: ("constant.numeric.float",),
    Number.Integer: ("constant.numeric.integer",), Operator: ("keyword.operator",),
    Punctuation: ("punctuation", "keyword.operator.rest"), Name: (None,),
    # uses of defined classes and patterns are only known to the lexer, which reads the whole file
    Name.Class: ("support.class.builtin", "entity.name.type.class", None),
    Name.Function: ("entity.name.function", None),
}


@pytest.mark.parametrize("text", [SAMPLE, *(p.read_text(encoding="utf-8") for p in RULE_FILES),
                                  "\n".join(_tutorial_blocks())],
                         ids=["sample", *(p.name for p in RULE_FILES), "tutorial"])
def test_textmate_agrees_with_the_lexer(text: str) -> None:
    grammar = build_grammar()
    lines = text.split("\n")
    line_scopes = [_tm_scopes(grammar, line) for line in lines]
    line_no, col = 0, 0
    for tok, value in _tokens(text):
        if tok not in (Whitespace,) and value.strip():
            scope = line_scopes[line_no][col]
            allowed = _PYGMENTS_TO_SCOPE[tok]
            assert any((scope is None) if a is None else (scope or "").startswith(a) for a in allowed), (
                f"line {line_no + 1}: {value!r} is {tok} for Pygments but {scope} for TextMate")
        for ch in value:
            line_no, col = (line_no + 1, 0) if ch == "\n" else (line_no, col + 1)


# ---- checking unsaved buffers ------------------------------------------------------------------------

def test_buffer_imports_resolve_next_to_the_document(tmp_path: Path) -> None:
    (tmp_path / "proj" / "sub").mkdir(parents=True)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "up.fuse").write_text("class upact = Relu | Tanh\n")
    (tmp_path / "proj" / "sub" / "deep.fuse").write_text("class deepact = Sigmoid\n")
    (tmp_path / "proj" / "local.fuse").write_text('import "sub/deep.fuse"\npattern mine(x) = Elu(x)\n')
    (tmp_path / "proj" / "broken.fuse").write_text('fuse b1: Relux -> template "pointwise"\n'
                                                   'fuse b2: Tanhx -> template "pointwise"\n')
    text = ('import "core.fuse"\nimport "local.fuse"\nimport "../lib/up.fuse"\nimport "broken.fuse"\n'
            'fuse a1: upact -> deepact -> template "pointwise"\n'
            'fuse a2: mine(x) -> act -> template "pointwise"\n'
            'fuse a3: Relu -> Gelux -> template "pointwise"\n')
    doc = tmp_path / "proj" / "doc.fuse"  # never written: the buffer is checked, not the disk
    result = check_document(text, doc)
    found = [(d.code, d.span.line, d.span.col, d.span.end_col) for d in result.diagnostics]
    assert found == [("F002", 4, 8, 21), ("F002", 7, 18, 23)]
    assert "broken.fuse" in result.diagnostics[0].message and "1 more" in result.diagnostics[0].message
    assert all(d.span.file == "doc.fuse" for d in result.diagnostics)
    assert result.ruleset is not None
    assert {"upact", "deepact", "act"} <= set(result.ruleset.classes) and "mine" in result.ruleset.patterns
    assert not doc.exists() and sorted(p.name for p in (tmp_path / "proj").iterdir()) == [
        "broken.fuse", "local.fuse", "sub"]


def test_untitled_buffer_messages_name_the_document_not_a_temporary_copy() -> None:
    text = 'fuse x: Relu -> template "pointwise"\nfuse x: Tanh -> template "pointwise"\n'
    result = check_document(text, None)
    dup = [d for d in result.diagnostics if d.code == "F008"]
    assert dup and dup[0].span.line == 2 and "untitled.fuse:1:6" in dup[0].message
    assert all("autofusion-check-" not in d.message for d in result.diagnostics)


def test_verification_runs_only_when_asked() -> None:
    text = "rewrite swap: Sub(a, b) => Sub(b, a)\n"
    assert [d.code for d in check_document(text, None, verify=False).diagnostics] == []
    assert [d.code for d in check_document(text, None, verify=True).diagnostics] == ["F022"]


def test_checker_failure_becomes_a_diagnostic() -> None:
    broken_registry: Any = object()  # the checker cannot use it: that must not raise out of check_document
    result = check_document("fuse f: Relu -> template \"pointwise\"\n", None, registry=broken_registry)
    assert [d.code for d in result.diagnostics] == ["F024"] and result.ruleset is None


def test_import_lines_spans() -> None:
    [imp] = import_lines('# x\n  import "a b.fuse"  # c\n', "d.fuse")
    assert (imp.name, imp.span.line, imp.span.col, imp.span.end_col) == ("a b.fuse", 2, 10, 20)


# ---- the language server, over stdio -----------------------------------------------------------------

WAIT_S = 30.0  # generous for a loaded 2-core machine; a healthy server answers in well under a second


class LspClient:
    """A minimal LSP client: Content-Length framed JSON-RPC over the server's stdin/stdout."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "autofusion.editors.lsp", "--stdio"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[bytes] = []
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()  # type: ignore[arg-type]

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            headers = {}
            while True:
                line = out.readline()
                if not line:
                    return
                if line in (b"\r\n", b"\n"):
                    break
                key, _, value = line.decode("ascii").partition(":")
                headers[key.strip().lower()] = value.strip()
            self.messages.put(json.loads(out.read(int(headers["content-length"]))))

    def send(self, payload: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **payload}).encode("utf-8")
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.send({"method": method, "params": params})

    def request(self, method: str, params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.send({"id": self.next_id, "method": method, "params": params})
        return self.wait(lambda m: m.get("id") == self.next_id and "method" not in m)

    def wait(self, accept: Any) -> dict[str, Any]:
        while True:
            try:
                message = self.messages.get(timeout=WAIT_S)
            except queue.Empty:
                raise AssertionError(f"no answer from the server; stderr: {b''.join(self.stderr)[-2000:]!r}") from None
            if accept(message):
                return message
            if message.get("method") in ("window/workDoneProgress/create", "client/registerCapability"):
                self.send({"id": message["id"], "result": None})

    def diagnostics(self, uri: str, version: int | None = None) -> list[dict[str, Any]]:
        message = self.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                            and m["params"]["uri"] == uri
                            and (version is None or m["params"].get("version") == version))
        return message["params"]["diagnostics"]


@pytest.fixture(scope="module")
def lsp() -> Any:
    client = LspClient()
    reply = client.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    caps = reply["result"]["capabilities"]
    assert caps["hoverProvider"] and "completionProvider" in caps and caps["textDocumentSync"]
    client.notify("initialized", {})
    yield client
    if client.proc.poll() is None:
        client.proc.kill()
        client.proc.wait(timeout=WAIT_S)


BROKEN = '''import "core.fuse"
rewrite r: Add(x) => x
fuse f: MatMul -> Relux -> template "gemm_epilogue"
rewrite double_neg Neg(Neg(x)) => x
fuse g: act(x) -> template "pointwise" where ndim(x) == 2
'''


def _open(lsp: LspClient, uri: str, text: str, version: int = 1) -> list[dict[str, Any]]:
    lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "fuse", "version": version,
                                                          "text": text}})
    return lsp.diagnostics(uri, version)


def _range(d: dict[str, Any]) -> tuple[int, int, int, int]:
    r = d["range"]
    return r["start"]["line"], r["start"]["character"], r["end"]["line"], r["end"]["character"]


def test_lsp_publishes_diagnostics_on_open_change_and_save(lsp: LspClient, tmp_path: Path) -> None:
    uri = (tmp_path / "broken.fuse").as_uri()
    diags = _open(lsp, uri, BROKEN)
    assert [(d["code"], _range(d)) for d in diags] == [
        ("F003", (1, 11, 1, 17)), ("F002", (2, 18, 2, 23)), ("F001", (3, 19, 3, 22)), ("F016", (4, 45, 4, 52))]
    assert {d["source"] for d in diags} == {"autofusion"} and {d["severity"] for d in diags} == {1}
    assert "Relu" in diags[1]["message"]
    # fix the unknown op in place (an incremental edit), then add a wrong rewrite
    lsp.notify("textDocument/didChange", {
        "textDocument": {"uri": uri, "version": 2},
        "contentChanges": [{"range": {"start": {"line": 2, "character": 18}, "end": {"line": 2, "character": 23}},
                            "text": "Relu"},
                           {"range": {"start": {"line": 5, "character": 0}, "end": {"line": 5, "character": 0}},
                            "text": "rewrite swap: Sub(a, b) => Sub(b, a)\n"}]})
    assert [d["code"] for d in lsp.diagnostics(uri, 2)] == ["F003", "F001", "F016"]
    lsp.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    saved = lsp.diagnostics(uri, 2)
    assert [d["code"] for d in saved] == ["F003", "F001", "F016", "F022"]  # numerical verification on save
    assert _range(saved[-1])[0] == 5
    lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert lsp.diagnostics(uri) == []


def test_lsp_ranges_count_utf16_units(lsp: LspClient, tmp_path: Path) -> None:
    uri = (tmp_path / "wide.fuse").as_uri()
    diags = _open(lsp, uri, 'fuse f: Relu(x, name="😀😀") -> Tanhx -> template "pointwise"\n')
    assert [(d["code"], _range(d)) for d in diags if d["code"] == "F002"] == [("F002", (0, 32, 0, 37))]  # code points: 30..35


def test_lsp_resolves_imports_next_to_the_document(lsp: LspClient, tmp_path: Path) -> None:
    (tmp_path / "mine.fuse").write_text("## Mine.\nclass mine = Relu | Elu\n")
    uri = (tmp_path / "user.fuse").as_uri()
    diags = _open(lsp, uri, 'import "mine.fuse"\nfuse u: MatMul -> mine -> template "gemm_epilogue"\n')
    assert diags == []
    hover = lsp.request("textDocument/hover", {"textDocument": {"uri": uri},
                                               "position": {"line": 1, "character": 20}})["result"]
    assert "Mine." in hover["contents"]["value"] and "`Elu`" in hover["contents"]["value"]


def _labels(lsp: LspClient, uri: str, line: int, character: int) -> dict[str, dict[str, Any]]:
    reply = lsp.request("textDocument/completion", {"textDocument": {"uri": uri},
                                                    "position": {"line": line, "character": character}})
    result = reply["result"]
    items = result["items"] if isinstance(result, dict) else result
    return {item["label"]: item for item in items}


def test_lsp_completion(lsp: LspClient, tmp_path: Path) -> None:
    uri = (tmp_path / "complete.fuse").as_uri()
    text = ('import "core.fuse"\nclass mycls = Relu | Tanh\npattern pat(x) = Relu(x)\n'
            'fuse c: Ma\nfuse d: Relu -> template "po\nfuse e: Relu -> template \n')
    _open(lsp, uri, text)
    labels = _labels(lsp, uri, 3, 10)
    for name in ("MatMul", "Gemm", "Relu", "LayerNormalization"):
        assert labels[name]["kind"] == 3, name  # Function
    for name in ("pointwise", "reduction", "mycls", "act"):  # built-in, this file's, and core.fuse's class
        assert labels[name]["kind"] == 7, name  # Class
    assert labels["pat"]["kind"] == 2  # Method: a pattern
    assert labels["rank"]["detail"].startswith("rank(") and labels["where"]["kind"] == 14
    in_string = _labels(lsp, uri, 4, 29)
    assert set(in_string) == set(vocab.templates()) and in_string["pointwise"].get("insertText") is None
    after_keyword = _labels(lsp, uri, 5, 25)
    assert after_keyword["reduction"]["insertText"] == '"reduction"'
    imports = _labels(lsp, uri, 0, 10)
    assert "core.fuse" in imports and "complete.fuse" not in imports  # the library; the buffer is not on disk


def test_lsp_hover(lsp: LspClient, tmp_path: Path) -> None:
    uri = (tmp_path / "hover.fuse").as_uri()
    text = 'fuse h: LeakyRelu -> template "pointwise"   # F003 happens elsewhere\nrewrite r: Add(x) => x\n'
    _open(lsp, uri, text)

    def hover(line: int, character: int) -> str | None:
        result = lsp.request("textDocument/hover", {"textDocument": {"uri": uri},
                                                    "position": {"line": line, "character": character}})["result"]
        return None if result is None else result["contents"]["value"]

    op = hover(0, 10)
    assert op is not None and "pointwise op" in op and "`alpha = 0.01`" in op and "`X`" in op
    code = hover(0, 48)
    assert code is not None and "wrong-arity" in code and CODES["F003"].why in code
    over_error = hover(1, 12)  # on Add, inside the F003 diagnostic's range
    assert over_error is not None and "**Add**" in over_error and "wrong-arity" in over_error
    assert hover(0, 2) is None  # a keyword


def test_lsp_survives_bad_input(lsp: LspClient, tmp_path: Path) -> None:
    uri = (tmp_path / "garbage.fuse").as_uri()
    garbage = "fuse (((((" + "(" * 5000 + "\x00\ud800 ->->-> \"\n" + "\u2028 rewrite : => <=> ]]]\n" * 50
    diags = _open(lsp, uri, garbage)
    assert diags and all(d["code"].startswith("F") for d in diags)
    assert lsp.request("textDocument/completion", {"textDocument": {"uri": uri},
                                                   "position": {"line": 9999, "character": 9999}})["result"] is not None
    assert lsp.request("textDocument/hover", {"textDocument": {"uri": uri},
                                              "position": {"line": 0, "character": 9999}})["result"] is None
    reply = lsp.request("textDocument/hover", {"textDocument": {"uri": "file:///no/such/open/doc.fuse"},
                                               "position": {"line": 0, "character": 0}})
    assert reply["result"] is None
    untitled = "untitled:Untitled-1"
    assert [d["code"] for d in _open(lsp, untitled, "fuse u: Reluu -> template \"pointwise\"\n")] == ["F002"]
    # still answering
    assert _labels(lsp, untitled, 0, 9)["Relu"]["kind"] == 3
    assert lsp.proc.poll() is None


def test_lsp_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autofusion.editors.lsp import main

    assert main(["--log-file", str(tmp_path / "no" / "such" / "dir" / "log.txt")]) == 2
    assert "cannot open log file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as version:
        main(["--version"])
    assert version.value.code == 0 and "autofusion-lsp" in capsys.readouterr().out


def test_lsp_shutdown_and_exit(lsp: LspClient) -> None:
    assert lsp.request("shutdown", None).get("error") is None
    lsp.notify("exit", {})
    assert lsp.proc.wait(timeout=WAIT_S) == 0
