"""The shipped rule library: every file checks clean with verification; the rules say what they should."""

from __future__ import annotations

from pathlib import Path

import pytest

from autofusion.dsl import check_paths, load_rules
from autofusion.dsl.codes import CODES, markdown
from autofusion.dsl.guards import unparse
from autofusion.dsl.ir import OpTerm, ops_used
from autofusion.resources import data_dir

LIBRARY = data_dir("rules")
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("path", sorted(LIBRARY.glob("*.fuse")), ids=lambda p: p.name)
def test_every_shipped_file_passes_check_with_verification(path: Path) -> None:
    diags = check_paths([path], verify=True)
    assert [(d.code, str(d.span), d.message) for d in diags] == []


def test_library_has_the_promised_files() -> None:
    assert {p.name for p in LIBRARY.glob("*.fuse")} >= {"core.fuse", "transformer.fuse", "cnn.fuse", "rnn.fuse"}


@pytest.fixture(scope="module")
def rules():  # type: ignore[no-untyped-def]
    return load_rules()


def test_transformer_rules(rules) -> None:  # type: ignore[no-untyped-def]
    rewrites = {r.name: r for r in rules.rewrites}
    for name in ("gelu_erf", "gelu_erf_dynamo", "gelu_tanh", "layernorm_primitives", "softmax_primitives"):
        assert name in rewrites
    assert rewrites["gelu_tanh"].rhs.attrs[0].value == "tanh"
    assert ops_used(rewrites["layernorm_primitives"].lhs) >= {"ReduceMean", "Sub", "Pow", "Add", "Sqrt", "Div",
                                                               "Mul"}
    assert rewrites["layernorm_primitives"].rhs.op == "LayerNormalization"
    fusions = {f.name: f for f in rules.fusions}
    qkv = fusions["qkv_projection"]
    assert qkv.kind == "branch" and qkv.template == "horizontal_gemm" and len(qkv.members) == 3
    residual = fusions["residual_layernorm"]
    assert residual.shared_output and residual.shared_term.op == "Add"
    attention = fusions["attention_softmax"]
    assert attention.pattern.op == "Softmax" and attention.pattern.args[0].op == "Add"
    # no tile params: the kernel's own blocking measured faster than 64x64 tiles (rules/transformer.fuse)
    assert fusions["dense_act"].template == "gemm_epilogue" and dict(fusions["dense_act"].params) == {}


def test_cnn_and_rnn_rules(rules) -> None:  # type: ignore[no-untyped-def]
    rewrites = {r.name: r for r in rules.rewrites}
    fold = rewrites["fold_bn_into_conv_nobias"]
    assert fold.lhs.op == "BatchNormalization" and fold.rhs.op == "Conv" and "const(w)" in unparse(fold.guard)
    fusions = {f.name: f for f in rules.fusions}
    assert fusions["conv_bn_relu"].pattern.op == "Relu" and fusions["conv_residual_relu"].template == "conv_epilogue"
    lstm = fusions["lstm_over_time"]
    assert lstm.kind == "loop" and lstm.carried == ("h", "c") and lstm.step_inputs == ("x",)
    assert lstm.template == "lstm_scan" and all(isinstance(b, OpTerm) for b in lstm.body)
    assert {"Gemm", "Split", "Sigmoid", "Tanh", "Mul", "Add"} <= set().union(*(ops_used(b) for b in lstm.body))


def test_core_class_rules_are_generic_fallbacks(rules) -> None:  # type: ignore[no-untyped-def]
    kinds = {f.name: f for f in rules.fusions if f.kind == "class"}
    assert {"pointwise_chain", "gemm_epilogue", "reduction_prologue", "reduction_epilogue", "opaque_epilogue"} <= set(kinds)
    assert kinds["reduction_prologue"].host == "consumer" and kinds["gemm_epilogue"].host == "producer"
    assert all(f.priority == -10 for f in kinds.values() if f.span.file.endswith("core.fuse"))
    assert rules.fusions[-1].priority <= rules.fusions[0].priority
    assert rules.ops_of("act") >= {"Relu", "Gelu", "Tanh", "Sigmoid"}
    assert {n.name for n in rules.nofuse} >= {"lstm_op", "huge_softmax", "grouped_conv"}


def test_rule_docs_are_kept(rules) -> None:  # type: ignore[no-untyped-def]
    rewrites = {r.name: r for r in rules.rewrites}
    assert "BERT" in rewrites["gelu_erf"].doc
    assert all(r.doc for r in (*rules.rewrites, *rules.fusions, *rules.nofuse))


def test_diagnostics_doc_is_generated_from_the_code_table() -> None:
    assert (DOCS / "diagnostics.md").read_text(encoding="utf-8") == markdown()
    assert all(f"## {code} " in markdown() for code in CODES)
