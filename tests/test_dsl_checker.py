"""The rule checker: a corpus of bad files, a table of bad inputs, guards, imports, the RuleSet API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autofusion.dsl import RuleError, analyze_text, check_paths, load_rules
from autofusion.dsl import guards as g
from autofusion.dsl.diagnostics import Sink
from autofusion.dsl.guard_analysis import Truth, TypeChecker, truth
from autofusion.dsl.guards import Ty
from autofusion.dsl.ir import OpTerm, PatternRef, walk
from autofusion.dsl.parser import parse_text

CORPUS = Path(__file__).resolve().parent / "data" / "fuse"
_EXPECT = re.compile(r"^# expect: (F\d{3}) (\d+):(\d+)$", re.M)


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.fuse")), ids=lambda p: p.name)
def test_corpus_file_reports_exactly_its_expected_diagnostics(path: Path) -> None:
    expected = sorted((c, int(line), int(col)) for c, line, col in _EXPECT.findall(path.read_text()))
    assert expected, f"{path.name} declares no expectations"
    diags = [d for d in check_paths([path]) if Path(d.span.file).resolve() == path.resolve()]
    assert sorted((d.code, d.span.line, d.span.col) for d in diags) == expected


def _codes(text: str, verify: bool = False) -> set[str]:
    return {d.code for d in analyze_text(text, "table.fuse", verify=verify).diagnostics}


BAD_INPUTS: list[tuple[str, set[str]]] = [
    ("rewrite r Relu(x) => x", {"F001"}),
    ("fuse f: Reluu -> template \"pointwise\"", {"F002"}),
    ("fuse f: frobnicate(x) -> template \"pointwise\"", {"F002"}),
    ("class c = Relu | Nope", {"F002"}),
    ("fuse f: Relu into producer nothing", {"F002"}),
    ("rewrite r: Where(x, y) => x", {"F003"}),
    ("rewrite r: Relu(x, y) => x", {"F003"}),
    ("fuse f: Relu(x, ...) -> Tanh(y) -> template \"pointwise\"", {"F003"}),
    ("fuse f: reduction(x, y, z, w, v) -> template \"reduction\"", {"F003"}),
    ("pattern p(a, b) = Add(a, b)\nfuse f: p(x) -> template \"pointwise\"", {"F003"}),
    ("fuse f: Relu(x, alpha=0.1) -> template \"pointwise\"", {"F004"}),
    ("fuse f: reduction(x, ..., nonsense=1) -> template \"reduction\"", {"F004"}),
    ("fuse f: Gelu(x, approximate=2) -> template \"pointwise\"", {"F005"}),
    ("fuse f: Softmax(x, axis=\"last\") -> template \"reduction\"", {"F005"}),
    ("rewrite r: Relu(x) => Mul(x, y)", {"F006"}),
    ("rewrite r: Mul(x, y) <=> Relu(x)", {"F006"}),
    ("rewrite r: Relu(x) => Softmax(x, axis=a)", {"F006"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(q) == 1", {"F006"}),
    ("fuse f: Softmax(x) as s -> template \"reduction\"", {"F007"}),
    ("rewrite r: LeakyRelu(x, alpha=a) => Relu(x)", {"F007"}),
    ("pattern p(x, unused) = Relu(x)", {"F007"}),
    ("rewrite dup: Neg(Neg(x)) => x\nfuse dup: Relu -> template \"pointwise\"", {"F008"}),
    ("class Gelu = Relu", {"F008"}),
    ("pattern any = Relu(x)", {"F008"}),
    ("fuse a: Relu(x) -> template \"pointwise\"\nfuse b: Relu(y) -> template \"pointwise\"", {"F009"}),
    ("fuse a: act_c(x) -> template \"pointwise\"\nfuse b: Tanh(y) -> template \"pointwise\"\n"
     "class act_c = Relu | Tanh", {"F009"}),
    ("fuse a: pointwise into producer opaque\nfuse b: Relu into producer MatMul", {"F009"}),
    ("nofuse a: Softmax\nnofuse b: Softmax(x, axis=-1)", {"F009"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where 1 > 2", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(x) < 0", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where numel(x) * 4 < 0", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(x) >= 3 and rank(x) <= 2", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(x) == 2 and rank(x) != 2", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where dtype(x) == \"float32\" and dtype(x) == \"int64\"", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where dtype(x) in [\"float64\"] and dtype(x) != \"float64\"", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where const(x) and not const(x)", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where (rank(x) < 0 or 1 > 2) and rank(x) == 1", {"F010"}),
    ("pattern p(x) = Relu(x) where rank(x) > 5\nfuse f: p(y) -> template \"pointwise\" where rank(y) < 2", {"F010"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(x) >= 0", {"F011"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where 2 > 1 and rank(x) == 1", {"F011"}),
    ("fuse f: Relu -> template \"relu_kernel\"", {"F012"}),
    ("fuse f: Relu -> Tanh", {"F012"}),
    ("import \"nowhere.fuse\"", {"F013"}),
    ("rewrite r: Exp(x) => Mul(Exp(Div(x, 2.0)), Exp(Div(x, 2.0)))", {"F015"}),
    ("rewrite r: Relu(x) => Relu(Relu(x))", {"F015"}),
    ("rewrite c: Add(x, y) => Add(y, x)\nrewrite a: Add(a, Add(b, c)) => Add(Add(a, b), c)", {"F015"}),
    ("rewrite r: Mul(x, 2.0) <=> Add(x, x)", {"F015"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where size(x) > 2", {"F016"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(x) == \"two\"", {"F017"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(x)", {"F017"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where const(x) + 1 > 0", {"F017"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(x, x) == 1", {"F017"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(2) == 1", {"F017"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where x == 1", {"F017"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where dim(x, \"a\") == 1", {"F017"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where shape(x)[\"a\"] == 1", {"F017"}),
    ("fuse f: Relu(x) -> template \"pointwise\" where rank(x) in 3", {"F017"}),
    ("fuse f: LeakyRelu(x, alpha=a) -> template \"pointwise\" where rank(a) == 1", {"F017"}),
    ("rewrite r: x => Relu(x)", {"F018"}),
    ("rewrite r: 1.0 => Relu(x)", {"F018", "F006"}),
    ("rewrite r: Relu(x) => pointwise(x)", {"F018"}),
    ("rewrite r: Relu(x) => Add(x, _)", {"F018"}),
    ("rewrite r: Relu(x) => Relu(x, ...)", set()),  # Relu has one input: '...' leaves nothing open
    ("rewrite r: Relu(x) => Clip(x, ...)", {"F018"}),
    ("rewrite r: Relu(x) => Neg(x) as n", {"F018"}),
    ("rewrite r: Relu(x) <=> pointwise(x)", {"F018"}),
    ("rewrite r: Clip(x, lo, hi) => Clip(x, min=lo)", {"F018"}),
    ("pattern p(x) = Relu(p(x))", {"F019"}),
    ("pattern a(x) = Relu(b(x))\npattern b(x) = Tanh(a(x))", {"F019"}),
    ("class a = b | Relu\nclass b = a", {"F019"}),
    ("pattern br = branch x { Relu(x), Tanh(x) }\nfuse f: Neg(br) -> template \"pointwise\"", {"F019"}),
    ("pattern p(x) = Relu(x) where rank(x) == 1\nfuse f: p(2.0) -> template \"pointwise\"", {"F019"}),
    ("fuse f: branch x { Relu(x) } -> template \"multi_output\"", {"F020"}),
    ("fuse f: branch x { Relu(x), Tanh(y) } -> template \"multi_output\"", {"F020"}),
    ("fuse f: branch x { Relu(x), x } -> template \"multi_output\"", {"F020"}),
    ("fuse f: branch x = Neg(x) { Relu(x), Tanh(x) } -> template \"multi_output\"", {"F020"}),
    ("fuse f: loop (h) { c = Tanh(h) } -> template \"lstm_scan\"", {"F021"}),
    ("fuse f: loop (h, h) { h = Tanh(h) } -> template \"lstm_scan\"", {"F021"}),
    ("fuse f: loop (h) { h = Tanh(h), h = Relu(h) } -> template \"lstm_scan\"", {"F021"}),
    ("fuse f: loop (h) { h = Tanh(x[t]) } -> template \"lstm_scan\"", {"F021"}),
    ("fuse f: loop (h) { h = Tanh(h[t]) } -> template \"lstm_scan\"", {"F021"}),
    ("rewrite r: Relu(x[t]) => x", {"F021"}),
    ("fuse f: Relu(x)[t] -> template \"pointwise\"", {"F021"}),
    ("fuse f: Relu(x)[1] -> template \"pointwise\"", {"F025"}),
    ("fuse f: Relu(x[1]) -> template \"pointwise\"", {"F025"}),
]


@pytest.mark.parametrize(("text", "codes"), BAD_INPUTS, ids=[t[:40] for t, _ in BAD_INPUTS])
def test_bad_input_table(text: str, codes: set[str]) -> None:
    assert _codes(text) == codes


def test_good_inputs_have_no_diagnostics() -> None:
    text = '''
class my_act = Relu | Tanh
pattern proj(x, w) = MatMul(x, w) where const(w)
rewrite gelu: Mul(Mul(x, 0.5), Add(Erf(Div(x, 1.4142135623730951)), 1.0)) => Gelu(x)
rewrite leaky: LeakyRelu(x, alpha=a) => Max(x, Mul(x, a)) where a >= 0 and a <= 1
fuse mm: my_act(proj(x, w)) -> template "gemm_epilogue" where rank(x) >= 2 and dim(x, -1) % 4 == 0
fuse qkv: branch x { proj(x, a), proj(x, b) } -> template "horizontal_gemm"
fuse soft: Softmax(x, axis=ax) as s -> template "reduction" where ax == -1 and attr(s, "axis") == ax
nofuse big: Softmax(x) where numel(x) > 1000000 or size_bytes(x) >= 4000000
'''
    assert analyze_text(text, "good.fuse").diagnostics == []


# ---- guards --------------------------------------------------------------------------------------


def _guard(text: str) -> g.Guard:
    sink = Sink()
    (st,) = parse_text(f'fuse f: Relu(x) -> template "pointwise" where {text}', "g.fuse", sink)
    assert sink.items == []
    return st.node.guard


@pytest.mark.parametrize(("text", "expected"), [
    ("1 > 2", Truth.FALSE),
    ("2 > 1", Truth.TRUE),
    ("rank(x) < 0", Truth.FALSE),
    ("rank(x) >= 0", Truth.TRUE),
    ("numel(x) * 4 + 1 < 1", Truth.FALSE),
    ("dim(x, -1) % 4 > 3", Truth.FALSE),
    ("dim(x, -1) % 4 == 0", Truth.UNKNOWN),
    ("shape(x)[0] > 2 and dim(x, 0) < 3", Truth.FALSE),
    ("len(shape(x)) == 3 and rank(x) == 2", Truth.FALSE),
    ("rank(x) > 1 and rank(x) < 3", Truth.UNKNOWN),
    ("rank(x) > 1.5 and rank(x) < 2", Truth.FALSE),
    ("rank(x) == 2.5", Truth.FALSE),
    ("dtype(x) == \"float99\"", Truth.FALSE),
    ("dtype(x) in [\"float32\", \"float16\"] and dtype(x) == \"int8\"", Truth.FALSE),
    ("not (rank(x) < 0)", Truth.TRUE),
    ("rank(x) < 0 or rank(x) == 1", Truth.UNKNOWN),
    ("rank(x) < 0 or 1 > 2", Truth.FALSE),
    ("max(1, 2) == 2", Truth.TRUE),
])
def test_guard_truth(text: str, expected: Truth) -> None:
    assert truth(_guard(text)) is expected


def test_guard_types() -> None:
    kinds = {"x": Ty.TENSOR, "n": Ty.NODE, "a": Ty.ANY}
    ok = _guard('rank(x) + dim(x, -1) * 2 > a and attr(n, "axis") == -1 and dtype(n) in ["float32"]')
    sink = Sink()
    assert TypeChecker(kinds, sink, "rule").check_condition(ok) and sink.items == []
    for bad in ("rank(x) + 1", "x > 1", "attr(x, \"axis\") == 1", "dtype(x) < 3", "const(x) and 3"):
        sink = Sink()
        TypeChecker(kinds, sink, "rule").check_condition(_guard(bad))
        assert {d.code for d in sink.items} == {"F017"}, bad


def test_guard_evaluation() -> None:
    from autofusion.ir import DType, TensorType

    env = g.Bindings(types={"x": TensorType((2, 8), DType.FLOAT32), "n": TensorType((2, 8), DType.FLOAT32)},
                     consts=frozenset({"x"}), attrs={"n": {"axis": -1}}, values={"a": 3})
    assert _guard('rank(x) == 2 and shape(x)[-1] == 8 and dim(x, 0) * a == 6').evaluate(env) is True
    assert _guard('const(x) and attr(n, "axis") == -1 and size_bytes(x) == 64').evaluate(env) is True
    assert _guard('dtype(x) in ["float16"] or numel(x) % 5 == 1').evaluate(env) is True
    assert not g.holds(_guard("dim(x, 7) == 1"), env)  # out of range: false, not an exception
    assert not g.holds(_guard("rank(y) == 1"), env)


# ---- imports -------------------------------------------------------------------------------------


def test_imports_resolve_relative_then_library_and_load_once(tmp_path: Path) -> None:
    (tmp_path / "shared.fuse").write_text("class my_cls = Relu | Tanh\n")
    (tmp_path / "a.fuse").write_text('import "shared.fuse"\nfuse fa: my_cls(x) -> template "pointwise"\n')
    (tmp_path / "b.fuse").write_text('import "shared.fuse"\nimport "core.fuse"\n'
                                     'fuse fb: Gemm -> act -> template "gemm_epilogue"\n')
    analysis = check_paths([tmp_path / "a.fuse", tmp_path / "b.fuse"], verify=False)
    assert analysis == []  # shared.fuse is loaded once: no duplicate class
    rules = load_rules([tmp_path / "a.fuse", tmp_path / "b.fuse"])
    assert "my_cls" in rules.classes and "act" in rules.classes  # act comes from the shipped core.fuse
    names = [Path(f).name for f in rules.files]
    assert names == ["shared.fuse", "a.fuse", "core.fuse", "b.fuse"]  # a file after what it imports


def test_import_cycle_is_reported_once_and_loading_continues(tmp_path: Path) -> None:
    (tmp_path / "a.fuse").write_text('import "b.fuse"\nfuse fa: Relu -> template "pointwise"\n')
    (tmp_path / "b.fuse").write_text('\nimport "a.fuse"\nfuse fb: Tanh -> template "pointwise"\n')
    diags = check_paths([tmp_path / "a.fuse"], verify=False)
    assert [(d.code, Path(d.span.file).name, d.span.line, d.span.col) for d in diags] == [("F014", "b.fuse", 2, 8)]
    assert "a.fuse -> " in diags[0].message


def test_directories_are_walked_for_fuse_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.fuse").write_text("rewrite r: Add(x) => x\n")
    (tmp_path / "notes.txt").write_text("rewrite r: Add(x) => x\n")
    diags = check_paths([tmp_path], verify=False)
    assert [(d.code, Path(d.span.file).name) for d in diags] == [("F003", "x.fuse")]


def test_unreadable_input_is_a_diagnostic(tmp_path: Path) -> None:
    path = tmp_path / "latin1.fuse"
    path.write_bytes(b"rewrite r: Neg(Neg(x)) => x # caf\xe9\n")
    assert [d.code for d in check_paths([path])] == ["F001"]
    with pytest.raises(FileNotFoundError):
        check_paths([tmp_path / "missing.fuse"])


# ---- the RuleSet ---------------------------------------------------------------------------------


def test_load_rules_raises_with_every_diagnostic(tmp_path: Path) -> None:
    path = tmp_path / "bad.fuse"
    path.write_text("rewrite r: Add(x) => x\nfuse f: Reluu -> template \"pointwise\"\n")
    with pytest.raises(RuleError) as info:
        load_rules([path])
    assert [d.code for d in info.value.diagnostics] == ["F003", "F002"]
    assert "F003" in str(info.value)


def test_ruleset_is_expanded_ordered_and_hashable() -> None:
    text = '''
pattern lin(x, w) = MatMul(x, w) where const(w)
fuse low: Relu -> template "pointwise" priority -1
fuse high: Tanh(lin(a, b)) -> template "gemm_epilogue" where rank(a) == 2 priority 7
fuse mid: Sigmoid -> template "pointwise"
'''
    rules = analyze_text(text, "r.fuse", verify=False).program.ruleset
    assert [f.name for f in rules.fusions] == ["high", "mid", "low"]
    high = rules.fusions[0]
    assert not any(isinstance(t, PatternRef) for t in walk(high.pattern))
    assert g.unparse(high.guard) == "(rank(a) == 2 and const(b))"  # the pattern's guard joins the rule's
    assert rules.ops_of("pointwise") >= {"Relu", "Add"} and rules.ops_of("MatMul") == frozenset({"MatMul"})
    assert rules.ops_of("any") >= rules.ops_of("opaque")
    assert hash(rules) == hash(analyze_text(text, "r.fuse", verify=False).program.ruleset)
    assert high.span.line == 4 and high.span.file == "r.fuse"


def test_pattern_private_names_are_renamed_per_use() -> None:
    rules = analyze_text('pattern sq(x) = Mul(x, t) where const(t)\n'
                         'fuse f: Add(sq(a), sq(b)) -> template "pointwise"\n', "r.fuse", verify=False).program.ruleset
    (f,) = rules.fusions
    left, right = f.pattern.args
    assert isinstance(left, OpTerm) and left.args[0].name == "a" and right.args[0].name == "b"
    assert left.args[1].name != right.args[1].name  # each use has its own private t
    assert {n.name for n in g.names_in(f.guard)} == {left.args[1].name, right.args[1].name}


def test_internal_errors_become_diagnostics(monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.dsl import program

    def boom(*args: object) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(program, "_compile", boom)
    diags = analyze_text("rewrite r: Neg(Neg(x)) => x\n", "r.fuse", verify=False).diagnostics
    assert [(d.code, d.span.line) for d in diags] == [("F024", 1)]
    assert "simulated bug" in diags[0].message
