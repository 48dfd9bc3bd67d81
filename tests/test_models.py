"""Built-in models: they build, verify and run; their structure and numbers match the real exports."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from autofusion import models
from autofusion.ir import DType, Graph, GraphBuilder, TensorType, run_graph, verify
from autofusion.models import (
    ModelSizeError,
    UnknownModelError,
    WeightError,
    build,
    graph_stats,
    op_histogram,
    parameter_count,
    random_inputs,
)
from autofusion.models.inputs import index_bound, padding_mask

DATA = Path(__file__).parent / "data" / "models"
EXPORTS = json.loads((DATA / "models.json").read_text())

# tiny model -> (export it mirrors, build options giving the export's sizes)
MIRRORS = {
    "bert-tiny": ("bert_tiny_script", {}),
    "gpt2-tiny": ("gpt2_tiny_script", {}),
    "resnet-tiny": ("resnet_tiny_script", {}),
    "resnet-tiny-bn": ("resnet_tiny_bn_script", {}),
    "lstm-tiny": ("lstm_unrolled_script", {"batch": 2}),
}
TINY_OUTPUTS = {
    "bert-tiny": {"last_hidden_state": (2, 16, 64), "pooler_output": (2, 64)},
    "gpt2-tiny": {"last_hidden_state": (2, 16, 64)},
    "resnet-tiny": {"logits": (2, 10)},
    "resnet-tiny-bn": {"logits": (2, 10)},
    "lstm-tiny": {"y": (2, 8)},
}
# exporter ops that constant folding removes or that only compute the mask's shape arithmetic
FOLDED = {"Constant", "Identity", "Shape", "ConstantOfShape", "Concat", "Equal", "GreaterOrEqual", "LessOrEqual",
          "Flatten", "And", "Expand"}
# ops whose count the built-in model must match exactly (the exporters' extra Add/Mul/Cast/Reshape/Gather
# nodes are shape arithmetic that folds away)
COMPUTE_OPS = {"MatMul", "Gemm", "LayerNormalization", "Softmax", "Erf", "Tanh", "Pow", "Split", "Transpose",
               "Sigmoid", "Conv", "BatchNormalization", "Relu", "MaxPool", "GlobalAveragePool"}


@pytest.fixture(scope="module")
def tiny() -> dict[str, Graph]:
    return {name: build(name, batch=2) for name in TINY_OUTPUTS}


def test_registry_names_describe_and_unknown_names() -> None:
    names = models.builtin_names()
    for required in ("bert-base", "bert-large", "gpt2", "resnet18", "lstm", "bert-tiny", "gpt2-tiny", "resnet-tiny",
                     "lstm-tiny"):
        assert required in names
    assert "hidden=768" in models.describe("bert-base") and "seq 128" in models.describe("bert-base")
    with pytest.raises(UnknownModelError) as err:
        build("bert-huge")
    assert "bert-huge" in str(err.value) and "bert-base" in str(err.value) and "lstm-tiny" in str(err.value)
    with pytest.raises(UnknownModelError):
        models.describe("nope")


@pytest.mark.parametrize("name", sorted(TINY_OUTPUTS))
def test_tiny_model_verifies_and_runs_to_finite_outputs(tiny: dict[str, Graph], name: str) -> None:
    graph = verify(tiny[name])
    outputs = run_graph(graph, random_inputs(graph, seed=1))
    assert {k: v.shape for k, v in outputs.items()} == TINY_OUTPUTS[name]
    for value in outputs.values():
        assert value.dtype == np.float32 and np.isfinite(value).all() and value.std() > 1e-3


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_op_histogram_matches_the_real_export(tiny: dict[str, Graph], name: str) -> None:
    export = EXPORTS[MIRRORS[name][0]]["ops"]
    ours = op_histogram(tiny[name])
    assert set(export) - FOLDED <= set(ours)
    assert set(ours) - set(export) == set()
    for op in COMPUTE_OPS & set(export):
        assert ours[op] == export[op], op
    assert tiny[name].inputs == tuple(EXPORTS[MIRRORS[name][0]]["inputs"])
    assert tiny[name].outputs == tuple(EXPORTS[MIRRORS[name][0]]["outputs"])


_WEIGHT_OPS = {"MatMul", "Add", "LayerNormalization", "Gather", "Gemm", "Conv", "BatchNormalization"}


def _export_weight_nodes(path: Path) -> list[tuple[str, list[np.ndarray]]]:
    """(op, weights) of every export node that reads initializers, BatchNorm merged into its Conv."""
    model = onnx.load(str(path))
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    alias = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity" and n.input[0] in init}
    out: list[tuple[str, list[np.ndarray]]] = []
    conv_of: dict[str, int] = {}
    for n in model.graph.node:
        weights = [init[alias.get(i, i)] for i in n.input if alias.get(i, i) in init]
        if n.op_type == "BatchNormalization" and n.input[0] in conv_of:
            out[conv_of[n.input[0]]][1].extend(weights)
        elif n.op_type in _WEIGHT_OPS and weights:
            if n.op_type == "Conv":
                conv_of[n.output[0]] = len(out)
            out.append((n.op_type, weights))
    return out


def _our_weight_nodes(graph: Graph) -> list[tuple[str, list[str]]]:
    """(op, state-dict names) in node order; ExportBuilder's other constants are named ``/scope/...``."""
    out: list[tuple[str, list[str]]] = []
    conv_of: dict[str, int] = {}
    for n in graph.nodes:
        names = [i for i in n.inputs if i in graph.constants and not i.startswith("/")]
        if n.op == "BatchNormalization" and n.inputs[0] in conv_of:
            out[conv_of[n.inputs[0]]][1].extend(names)
        elif n.op in _WEIGHT_OPS and names:
            if n.op == "Conv":
                conv_of[n.outputs[0]] = len(out)
            out.append((n.op, names))
    return out


def _export_weights(graph: Graph, path: Path) -> dict[str, np.ndarray]:
    """Our weight names -> the export's arrays, pairing weight-reading nodes in order by op and shapes."""
    theirs = _export_weight_nodes(path)
    used = [False] * len(theirs)
    weights: dict[str, np.ndarray] = {}
    for op, names in _our_weight_nodes(graph):
        shapes = [graph.constants[n].array.shape for n in names]
        j = next(j for j, (top, arrs) in enumerate(theirs)
                 if not used[j] and top == op and [a.shape for a in arrs] == shapes)
        used[j] = True
        for name, array in zip(names, theirs[j][1]):
            assert name not in weights or np.array_equal(weights[name], array), f"{name} is shared inconsistently"
            weights[name] = array
    assert all(used), "export nodes left without a counterpart"
    return weights


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_tiny_model_computes_what_the_real_export_computes(tiny: dict[str, Graph], name: str) -> None:
    """With the export's weights loaded, the built-in graph reproduces onnxruntime's outputs."""
    export, options = MIRRORS[name]
    graph = build(name, weights=_export_weights(build(name, **options), DATA / f"{export}.onnx"), **options)
    data = np.load(DATA / f"{export}.npz")
    feeds = {k.removeprefix("input:"): data[k] for k in data.files if k.startswith("input:")}
    for out_name, value in run_graph(graph, feeds).items():
        np.testing.assert_allclose(value, data[f"output:{out_name}"], rtol=1e-4, atol=1e-5)


def test_folded_and_batchnorm_resnets_compute_the_same_function(tiny: dict[str, Graph]) -> None:
    feeds = random_inputs(tiny["resnet-tiny"], seed=3)
    folded = run_graph(tiny["resnet-tiny"], feeds)["logits"]
    unfolded = run_graph(tiny["resnet-tiny-bn"], feeds)["logits"]
    np.testing.assert_allclose(folded, unfolded, rtol=1e-4, atol=1e-5)


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    a, b, c = build("gpt2-tiny", seed=7), build("gpt2-tiny", seed=7), build("gpt2-tiny", seed=8)
    assert a == b and hash(a) == hash(b)
    assert a.nodes == c.nodes and a.constants != c.constants
    w = "h.0.attn.c_attn.weight"
    assert np.array_equal(a.constants[w].array, b.constants[w].array)
    assert not np.array_equal(a.constants[w].array, c.constants[w].array)
    assert abs(float(a.constants[w].array.std()) - 0.02) < 0.002
    assert np.all(a.constants["h.0.ln_1.weight"].array == 1) and np.all(a.constants["h.0.ln_1.bias"].array == 0)


def test_full_size_parameter_counts() -> None:
    bert = verify(build("bert-base"))
    assert parameter_count(bert) == 109_482_240  # BertModel with pooler, as transformers counts it
    # per layer: Q, K, V, attention output, two FFN projections and the two attention products
    assert op_histogram(bert)["MatMul"] == 12 * 8 and op_histogram(bert)["LayerNormalization"] == 25
    assert bert.types["last_hidden_state"] == TensorType((1, 128, 768), DType.FLOAT32)
    assert bert.types["input_ids"] == TensorType((1, 128), DType.INT64)
    del bert
    assert parameter_count(build("resnet18")) == 11_689_512 - 4800  # torchvision's count, BatchNorm folded
    assert parameter_count(build("resnet18-bn")) == 11_689_512 + 2 * 4800  # plus running mean and var
    assert build("resnet18").types["logits"].shape == (1, 1000)


def test_sizes_follow_seq_and_batch_and_bad_sizes_are_refused() -> None:
    g = build("gpt2-tiny", seq=5, batch=3)
    assert g.types["input_ids"].shape == (3, 5) and g.types["last_hidden_state"].shape == (3, 5, 64)
    assert build("lstm-tiny", seq=3).types["x"].shape == (1, 3, 32)
    assert op_histogram(build("lstm-tiny", seq=3))["Split"] == 3
    with pytest.raises(ModelSizeError, match="64 positions"):
        build("bert-tiny", seq=65)
    with pytest.raises(ModelSizeError, match="no sequence length"):
        build("resnet-tiny", seq=4)
    with pytest.raises(ModelSizeError, match="batch"):
        build("lstm-tiny", batch=0)


def test_given_weights_must_fit() -> None:
    with pytest.raises(WeightError, match="does not have: nonsense"):
        build("lstm-tiny", weights={"nonsense": np.zeros(3, np.float32)})
    with pytest.raises(WeightError, match="head.bias"):
        build("lstm-tiny", weights={"head.bias": np.zeros(3, np.float32)})
    g = build("lstm-tiny", weights={"head.bias": np.full(8, 100.0, np.float32)})
    assert run_graph(g, random_inputs(g))["y"].min() > 90


def test_random_inputs_are_valid_for_builtin_and_imported_models(tiny: dict[str, Graph]) -> None:
    from autofusion.frontends import load_onnx

    for graph, vocab in ((tiny["bert-tiny"], 1000), (tiny["gpt2-tiny"], 1000),
                         (load_onnx(DATA / "bert_tiny_script.onnx"), 1000)):
        feeds = random_inputs(graph, seed=5)
        assert index_bound(graph, "input_ids") == vocab
        ids = feeds["input_ids"]
        assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < vocab and len(np.unique(ids)) > 5
        mask = feeds["attention_mask"]
        assert mask.dtype == np.int64 and mask[:, 0].all() and not mask[:, -1].any()
        assert all(np.all(np.diff(row) <= 0) for row in mask)  # ones, then padding zeros
    types = random_inputs(tiny["bert-tiny"], seed=5)["token_type_ids"]
    assert set(np.unique(types)) <= {0, 1}
    a, b = random_inputs(tiny["lstm-tiny"], seed=5), random_inputs(tiny["lstm-tiny"], seed=5)
    assert np.array_equal(a["x"], b["x"]) and a["x"].dtype == np.float32
    assert not np.array_equal(a["x"], random_inputs(tiny["lstm-tiny"], seed=6)["x"])


def test_padding_mask_mixes_lengths() -> None:
    mask = padding_mask((4, 16), np.dtype(np.int64))
    assert mask.sum(axis=1).tolist() == [14, 12, 10, 8]
    assert padding_mask((1, 1), np.dtype(np.int64)).tolist() == [[1]]


def test_graph_stats_counts_parameters_constants_and_activations() -> None:
    b = GraphBuilder("small")
    x = b.input("x", (2, 4), DType.FLOAT32)
    w = b.const(np.ones((4, 3), np.float32), "w")
    shape = b.const(np.array([3, 2], np.int64), "shape")
    y = b.op("Reshape", b.op("Relu", b.op("MatMul", x, w)), shape)
    stats = graph_stats(b.build([y]))
    assert stats.nodes == 3
    assert dict(stats.op_histogram) == {"MatMul": 1, "Relu": 1, "Reshape": 1}
    assert dict(stats.op_classes) == {"opaque": 1, "pointwise": 1, "reorganize": 1}
    assert (stats.parameter_count, stats.parameter_bytes) == (12, 48)
    assert (stats.other_constant_count, stats.other_constant_bytes) == (1, 16)
    assert stats.activation_bytes == 4 * (8 + 6 + 6 + 6)
    assert stats.inputs == (("x", TensorType((2, 4), DType.FLOAT32)),)
    assert Counter(dict(stats.op_histogram)) == Counter(n.op for n in b.build([y]).nodes)


def test_exported_gelu_forms_equal_gelu() -> None:
    """The Div/Erf and Pow/Tanh node chains compute GELU and its tanh approximation over a wide range."""
    from autofusion.models.bert import gelu_erf
    from autofusion.models.export_builder import ExportBuilder
    from autofusion.models.gpt2 import gelu_tanh
    from autofusion.ops import default_registry

    e = ExportBuilder("gelu")
    x = e.input("x", (4096,), DType.FLOAT32)
    graph = e.build([gelu_erf(e, "/erf", x), gelu_tanh(e, "/tanh", x)])
    xs = np.random.default_rng(0).normal(0.0, 3.0, 4096).astype(np.float32)
    erf_form, tanh_form = run_graph(graph, {"x": xs}).values()
    gelu = default_registry()["Gelu"].reference
    np.testing.assert_allclose(erf_form, gelu([xs], {"approximate": "none"})[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tanh_form, gelu([xs], {"approximate": "tanh"})[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(erf_form, tanh_form, rtol=1e-5, atol=1e-6)
