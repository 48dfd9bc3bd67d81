"""ONNX out: fused plans as opset-18 models with one model-local function per fused kernel."""

from __future__ import annotations

import importlib
import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autofusion import models
from autofusion.api import optimize
from autofusion.cli.main import main
from autofusion.export import DOMAIN, OPSET, OnnxExportError, save_onnx, to_onnx
from autofusion.export.onnx_out import identifier
from autofusion.frontends.onnx_import import load_onnx
from autofusion.ir import DType, GraphBuilder, run_graph
from autofusion.ops import OpClass, OpDef

DATA = Path(__file__).parent / "data" / "models"
OP_CASES = importlib.import_module("test_ops_cases").CASES  # the op corner-case table of tests/test_ops_cases.py

RULES = """\
class compute = pointwise | reduction | opaque
rewrite gelu_erf: Mul(Mul(x, Add(Erf(Div(x, 1.4142135623730951)), 1.0)), 0.5) => Gelu(x)
fuse qkv: branch x { MatMul(x, wq), MatMul(x, wk), MatMul(x, wv) } -> template "horizontal_gemm" where const(wq) and const(wk) and const(wv)
fuse epilogue: pointwise into producer compute
fuse prologue: pointwise into consumer reduction
"""


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "test.fuse"
    path.write_text(RULES)
    return path


def run_onnx(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def check_structure(model: onnx.ModelProto, plan) -> None:  # type: ignore[no-untyped-def]
    """Functions per fused group, called once each, rules in their doc strings; plain nodes otherwise."""
    onnx.checker.check_model(model, full_check=True)
    fused = [g for g in plan.groups if g.fused]
    assert len(model.functions) == len(fused) > 0
    assert {(o.domain, o.version) for o in model.opset_import} == {("", OPSET), (DOMAIN, 1)}
    calls = Counter(n.op_type for n in model.graph.node if n.domain == DOMAIN)
    assert calls == Counter({f.name: 1 for f in model.functions})
    for function, group in zip(model.functions, fused):
        assert function.domain == DOMAIN
        assert function.name == group.name  # kernel names are already identifiers
        assert list(function.input) == list(group.inputs) and list(function.output) == list(group.outputs)
        for rule in group.rules:
            assert f"{rule.name} ({rule.file}:{rule.line})" in function.doc_string
        body_ops = [n.op_type for n in function.node if n.op_type != "Constant"]
        plan_ops = [plan.graph.node_by_name[n].op for n in group.nodes]
        assert body_ops == plan_ops or "Gelu" in plan_ops  # Gelu is expanded into opset-18 ops
    plain = [n for n in model.graph.node if n.domain == "" and n.op_type != "Constant"]
    singles = [g for g in plan.groups if not g.fused]
    assert len(plain) >= len(singles)
    assert {n.name for n in plain} >= {g.nodes[0] for g in singles}
    used = {i for n in plan.graph.nodes for i in n.inputs}
    assert {t.name for t in model.graph.initializer} == {c for c in plan.graph.constants if c in used}


@pytest.mark.parametrize("name", ["bert-tiny", "resnet-tiny", "lstm-tiny"])
def test_builtin_models_round_trip_through_onnxruntime(name: str, rules: Path) -> None:
    graph = models.build(name)
    plan = optimize(graph, rules)
    model = to_onnx(plan)
    check_structure(model, plan)
    feeds = models.random_inputs(graph)
    expected = run_graph(graph, feeds)
    got = run_onnx(model, feeds)
    assert list(got) == list(graph.outputs)
    for out in graph.outputs:
        np.testing.assert_allclose(got[out], expected[out], rtol=1e-4, atol=1e-5)


def test_imported_onnx_model_matches_recorded_outputs(rules: Path, tmp_path: Path) -> None:
    graph = load_onnx(DATA / "bert_tiny_script.onnx")
    plan = optimize(graph, rules)
    assert any(n.op == "Gelu" for n in plan.graph.nodes)  # the rewrite fired: Gelu (opset 20) is expanded
    assert any(g.kind == "branch" and g.template == "horizontal_gemm" for g in plan.groups)
    path = save_onnx(plan, tmp_path / "fused.onnx")
    model = onnx.load(path)
    check_structure(model, plan)
    recorded = np.load(DATA / "bert_tiny_script.npz")
    feeds = {k.split(":", 1)[1]: v for k, v in recorded.items() if k.startswith("input:")}
    got = run_onnx(model, feeds)
    for out in graph.outputs:
        np.testing.assert_allclose(got[out], recorded[f"output:{out}"], rtol=1e-4, atol=1e-5)
    assert os.listdir(tmp_path) == ["fused.onnx"]  # the temporary file was renamed, not left behind


def test_legacy_attribute_forms_become_opset_18_inputs(rules: Path) -> None:
    """Attribute forms of older opsets (axes, split, starts, min/max, pads) are written as inputs."""
    b = GraphBuilder("legacy")
    x = b.input("x", (2, 6, 4), DType.FLOAT32)
    r = b.op("ReduceMean", x, axes=(2,), keepdims=1)
    s = b.op("Squeeze", r, axes=(2,))
    u = b.op("Unsqueeze", s, axes=(0,))
    parts = b.op_multi("Split", [u], 2, axis=2, split=(2, 4))
    halves = b.op_multi("Split", [x], 2, attrs={"num_outputs": 2}, axis=1)
    sl = b.op("Slice", parts[0], starts=(0,), ends=(1,), axes=(1,))
    c = b.op("Clip", sl, min=-0.1, max=0.2)
    p = b.op("Pad", c, pads=(0, 0, 0, 0, 0, 1), value=0.5)
    d = b.op("Dropout", parts[1], ratio=0.3)
    cast = b.op("Cast", d, to=1, saturate=1)
    g = b.op("Gelu", cast, approximate="tanh")
    e = b.op("Gelu", halves[1])
    graph = b.build([p, g, e, halves[0]])
    plan = optimize(graph, rules)
    model = to_onnx(plan)
    onnx.checker.check_model(model, full_check=True)
    ops = {n.op_type for n in model.graph.node} | {n.op_type for f in model.functions for n in f.node}
    assert "Gelu" not in ops and "Erf" in ops and "Tanh" in ops
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 6, 4)).astype(np.float32)}
    expected = run_graph(graph, feeds)
    got = run_onnx(model, feeds)
    for out in graph.outputs:
        np.testing.assert_allclose(got[out], expected[out], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", range(len(OP_CASES)), ids=[c[0] for c in OP_CASES])
def test_attribute_corners_of_heavy_ops_survive_export(case: int) -> None:
    """The op corner cases checked against onnxruntime elsewhere (LSTM activations and optional inputs,
    Einsum, Pad with omitted inputs, pooling, ...) written out and run by onnxruntime."""
    op, inputs, attrs, n_out = OP_CASES[case]
    b = GraphBuilder(op)
    fed = op != "Range"  # Range needs constant inputs to have a static shape
    names = [(b.input("x", v.shape, DType.of(v)) if i == 0 and fed else b.const(v, f"in{i}")) if v is not None else ""
             for i, v in enumerate(inputs)]
    graph = b.build(b.op_multi(op, names, n_out, attrs=attrs))
    model = to_onnx(optimize(graph, rules=[]))
    onnx.checker.check_model(model, full_check=True)
    feeds = {"x": inputs[0]} if fed else {}
    expected, got = run_graph(graph, feeds), run_onnx(model, feeds)
    for out in graph.outputs:
        np.testing.assert_allclose(got[out], expected[out], rtol=1e-4, atol=1e-5)


def swish_op() -> OpDef:
    return OpDef("Swish", OpClass.POINTWISE, ("X",), lambda ctx: (ctx.type(0),),
                 lambda xs, a: (xs[0] / (1 + np.exp(-xs[0])),))


def test_op_without_onnx_form_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    from autofusion.ops import default_registry

    registry = default_registry().extended([swish_op()])
    b = GraphBuilder("custom", registry)
    y = b.op("Swish", b.input("x", (3,)), name="act")
    plan = optimize(b.build([y]), rules=[], registry=registry)
    with pytest.raises(OnnxExportError, match="'act'.*'Swish' has no ONNX opset-18 form"):
        to_onnx(plan)
    target = tmp_path / "out.onnx"
    target.write_bytes(b"previous")
    with pytest.raises(OnnxExportError):
        save_onnx(plan, target)
    assert target.read_bytes() == b"previous" and os.listdir(tmp_path) == ["out.onnx"]


def test_kernel_names_are_sanitised_into_unique_identifiers(rules: Path) -> None:
    assert identifier("k1 matmul/add", set()) == "k1_matmul_add"
    assert identifier("3x", set()) == "_3x"
    taken: set[str] = set()
    assert [identifier("a-b", taken), identifier("a.b", taken)] == ["a_b", "a_b_2"]
    plan = optimize(models.build("resnet-tiny"), rules)
    fused = [i for i, g in enumerate(plan.groups) if g.fused][:2]
    groups = list(plan.groups)
    for i in fused:  # names from a user's plan: characters ONNX op types cannot have, and a clash
        groups[i] = replace(groups[i], name="conv <&> relu/1")
    model = to_onnx(replace(plan, groups=tuple(groups)))
    onnx.checker.check_model(model, full_check=True)
    names = [f.name for f in model.functions]
    assert names[:2] == ["conv_____relu_1", "conv_____relu_1_2"]


def test_plan_that_is_not_a_partition_is_refused(rules: Path) -> None:
    plan = optimize(models.build("resnet-tiny"), rules)
    with pytest.raises(OnnxExportError, match="nodes in no kernel"):
        to_onnx(replace(plan, groups=plan.groups[1:]))
    with pytest.raises(OnnxExportError, match="is in kernels"):
        to_onnx(replace(plan, groups=plan.groups + plan.groups[:1]))


def test_cli_fuse_writes_onnx(rules: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fused.onnx"
    code = main(["fuse", "resnet-tiny", "--rules", str(rules), "--onnx-out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["onnx_out"] == str(out)
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert model.functions
    code = main(["fuse", "resnet-tiny", "--rules", str(rules), "--onnx-out", str(out)])
    assert code == 0 and f"wrote {out}" in capsys.readouterr().out


@pytest.mark.parametrize("where, message", [("missing/fused.onnx", "does not exist"), (".", "is a directory")])
def test_cli_bad_onnx_out_path_is_one_line(where: str, message: str, rules: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fuse", "resnet-tiny", "--rules", str(rules), "--onnx-out", str(tmp_path / where)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
