"""The .fuse parser: constructs, desugaring, spans, doc comments, syntax errors and recovery."""

from __future__ import annotations

import pytest
from lark.exceptions import UnexpectedInput

from autofusion.dsl import analyze_text
from autofusion.dsl.diagnostics import Sink
from autofusion.dsl.ir import Literal, OpTerm, PatternRef, Var
from autofusion.dsl.parser import grammar, parse_text, split_statements
from autofusion.dsl.syntax_errors import BAD_EXAMPLES


def _parse(text: str) -> tuple[list, list]:
    sink = Sink()
    statements = parse_text(text, "t.fuse", sink)
    return statements, sink.sorted()


def _rules(text: str):
    analysis = analyze_text(text, "t.fuse", verify=False)
    assert [d.code for d in analysis.diagnostics if d.is_error] == []
    return analysis.program.ruleset


def test_every_statement_kind_parses() -> None:
    text = '''
import "core.fuse"
class my_act = Relu | Gelu
pattern p(x, w) = my_act(MatMul(x, w)) where const(w)
rewrite r1: Neg(Neg(x)) => x
rewrite r2: Mul(x, 2.0) <=> Add(x, x) priority 3
fuse f1: MatMul -> Add(b) -> Relu -> template "gemm_epilogue" (tile=64, fast=true) where rank(b) == 1 priority 2
fuse f2: branch x { MatMul(x, a), MatMul(x, c) } -> template "horizontal_gemm"
fuse f3: loop (h) { h = Tanh(Add(MatMul(x[t], w), h)) } -> template "lstm_scan"
fuse f4: pointwise into producer opaque
nofuse n1: Softmax as s where numel(s) > 100
'''
    statements, diags = _parse(text)
    assert diags == []
    assert [s.kind for s in statements] == ["import", "class", "pattern", "rewrite", "rewrite", "fuse", "fuse",
                                            "fuse", "fuse", "nofuse"]
    f1 = statements[5].node
    assert f1.template == "gemm_epilogue" and dict(f1.params) == {"tile": 64, "fast": 1} and f1.priority == 2
    assert statements[4].node.bidirectional and statements[4].node.priority == 3


def test_arrow_chain_desugars_to_nested_terms() -> None:
    rules = _rules('fuse a: MatMul(x, w) -> Add(b) -> Relu -> template "gemm_epilogue"\n'
                   'fuse b: Relu(Add(MatMul(x, w), b)) -> template "gemm_epilogue" priority 1\n')
    chain, nested = (f for f in rules.fusions if f.name in "ab")
    chain, nested = sorted((chain, nested), key=lambda f: f.name)
    assert isinstance(chain.pattern, OpTerm) and chain.pattern.op == "Relu"
    add = chain.pattern.args[0]
    assert add.op == "Add" and add.args[0].op == "MatMul" and add.args[1] == Var("b")
    assert chain.pattern == nested.pattern  # equal apart from spans
    clip = _rules('fuse c: Relu -> Clip -> template "pointwise"\n').fusions[0].pattern
    assert clip.op == "Clip" and clip.open and len(clip.args) == 1  # a bare step leaves further inputs open


def test_bare_names_resolve_to_ops_classes_patterns_and_vars() -> None:
    statements, _ = _parse("pattern q(x) = Relu(x)\nfuse f: Tanh(pointwise(x), ...) -> template \"pointwise\"\n")
    rules = _rules("pattern q(x) = Relu(x)\nfuse f: q -> Tanh -> template \"pointwise\"\n"
                   "fuse g: Softmax(x, axis=-1) as s -> template \"reduction\" where attr(s, \"axis\") == -1\n")
    f = next(r for r in rules.fusions if r.name == "f")
    assert f.pattern.op == "Tanh" and f.pattern.args[0] == OpTerm("Relu", (Var("x"),))  # q expanded
    assert isinstance(rules.patterns["q"].body, OpTerm)
    g = next(r for r in rules.fusions if r.name == "g")
    assert g.pattern.capture == "s" and g.pattern.attrs[0].name == "axis" and g.pattern.attrs[0].value == -1


def test_literals_lists_wildcards_outputs_and_step_inputs() -> None:
    rules = _rules('rewrite r: Reshape(Reshape(x, [2, -1]), [-1]) => Reshape(x, [-1])\n'
                   'fuse s: Mul(Split(x, axis=1, ...)[2], _) -> template "pointwise"\n'
                   'fuse l: loop (h) { h = Add(h, x[t]) } -> template "lstm_scan"\n')
    (rw,) = rules.rewrites
    assert rw.lhs.args[1] == Literal((-1,)) and rw.lhs.args[0].args[1] == Literal((2, -1))
    s = next(f for f in rules.fusions if f.name == "s")
    split, wild = s.pattern.args
    assert split.output == 2 and split.open and isinstance(wild, Var) and wild.name.startswith("_")
    loop = next(f for f in rules.fusions if f.name == "l")
    assert loop.kind == "loop" and loop.carried == ("h",) and loop.step_inputs == ("x",)
    assert Var("x", step=True) in loop.body[0].args


def test_doc_comments_attach_to_the_next_statement() -> None:
    statements, _ = _parse("# a plain comment\n## First line.\n/// Second line.\nrewrite r: Neg(Neg(x)) => x\n\n"
                           "## Not attached (blank line after).\n\nrewrite s: Relu(Relu(x)) => Relu(x)\n")
    assert statements[0].doc == "First line.\nSecond line."
    assert statements[1].doc == ""


def test_spans_point_at_the_source() -> None:
    statements, _ = _parse("\n\nrewrite r:\n    Neg(Neg(x))\n    => x\n")
    rw = statements[0].node
    assert (rw.span.line, rw.span.col, rw.span.end_line) == (3, 1, 5)
    assert (rw.lhs.span.line, rw.lhs.span.col) == (4, 5)
    assert (statements[0].name_span.line, statements[0].name_span.col) == (3, 9)


def test_statements_split_at_keywords_only() -> None:
    chunks = split_statements("## doc\nfuse a: Relu\n  -> Tanh\n  -> template \"pointwise\"\nrewrite b: x => x\n")
    assert [c.start_line for c in chunks] == [2, 5]
    assert chunks[0].doc == "doc"


def test_every_syntax_error_of_a_file_is_reported_with_position() -> None:
    text = ("rewrite a Relu(x) => x\n"           # 1: missing ':' at col 11
            "rewrite ok: Neg(Neg(x)) => x\n"
            "fuse b: Relu(x -> template \"pointwise\"\n"  # 3: unclosed '(', found where the string is
            "class c = Relu |\n"                  # 4: dangling '|'
            "fuse d: Relu -> template \"pointwise\" where rank(x) = 1\n")  # 5: '=' instead of '=='
    statements, diags = _parse(text)
    assert [(d.code, d.span.line, d.span.col) for d in diags] == [
        ("F001", 1, 11), ("F001", 3, 28), ("F001", 4, 17), ("F001", 5, 52)]
    assert [s.name for s in statements] == ["ok"]  # the good statement still loads
    assert "':'" in diags[0].message and "')'" in diags[1].message and "==" in diags[3].message


def test_syntax_error_table_examples_fail_and_classify_as_themselves() -> None:
    gr = grammar()
    for label, examples in BAD_EXAMPLES.items():
        for text in examples:
            with pytest.raises(UnexpectedInput) as info:
                gr.parser.parse(text)
            assert gr.classifier.match(info.value) == label, text


def test_unexpected_characters_and_unterminated_strings() -> None:
    _, diags = _parse('fuse a: Relu $ Tanh -> template "pointwise"\nimport "core.fuse\n')
    assert [(d.code, d.span.line, d.span.col) for d in diags] == [("F001", 1, 14), ("F001", 2, 8)]
    assert "'$'" in diags[0].message and "unterminated string" in diags[1].message


def test_text_before_the_first_statement_is_an_error() -> None:
    _, diags = _parse("hello world\nrewrite r: Neg(Neg(x)) => x\n")
    assert [(d.code, d.span.line) for d in diags] == [("F001", 1)]


def test_ir_nodes_compare_and_hash_without_spans() -> None:
    first, _ = _parse("rewrite r: Neg(Neg(x)) => x\n")
    second, _ = _parse("\n\n   rewrite   r :  Neg( Neg(x) )  =>  x\n")
    a, b = first[0].node, second[0].node
    assert a.span != b.span
    assert a == b and hash(a) == hash(b)


def test_pattern_refs_remain_only_in_pattern_bodies() -> None:
    rules = _rules("pattern inner(x) = Relu(x)\npattern outer(y) = Tanh(inner(y))\n"
                   "fuse f: outer(z) -> template \"pointwise\"\n")
    assert isinstance(rules.patterns["outer"].body.args[0], PatternRef)
    (f,) = [r for r in rules.fusions if r.name == "f"]
    assert f.pattern == OpTerm("Tanh", (OpTerm("Relu", (Var("z"),)),))
