"""Fuzzing: random text and mutated shipped rule files give diagnostics, never an exception.

No internal error (F024) may appear either: each one would be a checker bug.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.dsl import Diagnostic, analyze_text
from autofusion.resources import data_dir

SHIPPED = {p.name: p.read_text(encoding="utf-8") for p in sorted(data_dir("rules").glob("*.fuse"))}
TOKENS = [
    "import", "class", "pattern", "rewrite", "fuse", "nofuse", "branch", "loop", "into", "producer", "consumer",
    "where", "priority", "and", "or", "not", "in", "as", "template", "->", "-> template", "=>", "<=>", "=", "==",
    "<", ">=", "(", ")", "[", "]", "{", "}", ",", ":", "|", "...", "_", "x", "y", "h", "w", "t", "x[t]", "[1]",
    "Relu", "Add", "MatMul", "Split", "Softmax", "Conv", "LSTM", "Reluu", "pointwise", "act", "any", "rank(x)",
    "dim(x, -1)", "const(w)", "attr(n, \"axis\")", "numel", "0", "1", "-1", "2.5", "1e-5", '"pointwise"',
    '"core.fuse"', '"x', "#", "##", "\n", "\n", " ", "axis=-1", "alpha=a", "$", "\t",
]

_settings = settings(max_examples=60, deadline=2000, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check(text: str, verify: bool = False) -> list[Diagnostic]:
    diags = analyze_text(text, "fuzz.fuse", verify=verify).diagnostics
    assert all(isinstance(d, Diagnostic) for d in diags)
    assert not [d for d in diags if d.code == "F024"], [d.message for d in diags if d.code == "F024"]
    for d in diags:
        assert d.span.line >= 1 and d.span.col >= 1
    return diags


@_settings
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    _check(text)


@_settings
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_random_token_soup(tokens: list[str]) -> None:
    _check(" ".join(tokens))


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    text = SHIPPED[draw(st.sampled_from(sorted(SHIPPED)))]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "duplicate", "swap", "truncate"]))
        i = draw(st.integers(0, len(text)))
        if kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 12)):]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif kind == "truncate":
            text = text[:i]
        else:
            lines = text.split("\n")
            a, b = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            if kind == "duplicate":
                lines.insert(a, lines[b])
            else:
                lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
    return text


@_settings
@given(_mutated())
def test_mutated_shipped_files(text: str) -> None:
    _check(text)


@settings(max_examples=12, deadline=10000, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_shipped_files_with_verification(text: str) -> None:
    _check(text, verify=True)


def test_deep_nesting_is_a_diagnostic_not_a_crash() -> None:
    deep = "rewrite r: " + "Neg(" * 2000 + "x" + ")" * 2000 + " => x\nrewrite ok: Neg(Neg(y)) => y\n"
    analysis = analyze_text(deep, "deep.fuse", verify=False)
    assert [(d.code, d.span.line) for d in analysis.diagnostics] == [("F001", 1)]
    assert [r.name for r in analysis.program.ruleset.rewrites] == ["ok"]  # the rest of the file still loads


def test_shipped_files_are_the_fuzz_seeds() -> None:
    assert set(SHIPPED) >= {"core.fuse", "transformer.fuse", "cnn.fuse", "rnn.fuse"}
    assert all(Path(data_dir("rules") / name).is_file() for name in SHIPPED)


def _registry():  # type: ignore[no-untyped-def]
    from autofusion.ops import default_registry

    return default_registry()


@st.composite
def _random_rewrite(draw: st.DrawFn) -> str:
    """A rewrite over random registry ops with fitting arities: mostly wrong, never a crash."""
    registry = _registry()
    ops = sorted(d.name for d in registry if d.min_inputs >= 1 and d.min_inputs <= 3)

    def term(depth: int, leaves: list[str], built: bool) -> str:
        if depth == 0 or draw(st.integers(0, 3)) == 0:
            return draw(st.sampled_from(leaves))
        opdef = registry[draw(st.sampled_from(ops))]
        n = draw(st.integers(opdef.min_inputs, min(opdef.max_inputs or 3, 3)))
        args = [term(depth - 1, leaves, built) for _ in range(n)]
        if opdef.attrs and draw(st.booleans()):
            name = draw(st.sampled_from(sorted(opdef.attrs)))
            default = opdef.attrs[name]
            literal = repr(default) if isinstance(default, (int, float)) else None
            choices = [literal] if built else ["a", "_", literal or "a"]
            if choices[0] is not None:
                args.append(f"{name}={draw(st.sampled_from(choices))}")
        return f"{opdef.name}({', '.join(args)})"

    lhs = term(3, ["x", "y", "0.5", "[2, -1]"], built=False)
    bound = [v for v in ("x", "y") if re.search(rf"\b{v}\b", lhs)]
    rhs = term(2, bound + ["2.0"], built=True)
    guard = draw(st.sampled_from(["", " where const(y)", " where rank(x) == 2"]))
    return f"rewrite fuzz: {lhs} => {rhs}{guard}\n"


@settings(max_examples=40, deadline=10000, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_random_rewrite())
def test_random_rewrites_over_registry_ops_verify_without_crashing(text: str) -> None:
    _check(text, verify=True)
