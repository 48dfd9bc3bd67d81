"""The Triton backend: kernels rendered per template, run under TRITON_INTERPRET=1 against the reference.

Regenerate the snapshots after an intended change with ``AUTOFUSION_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest

from autofusion.codegen.errors import CodegenError
from autofusion.codegen.triton import py_ident, render_triton_group
from autofusion.decide.plan import FusedGroup
from autofusion.graph.graph import Graph
from autofusion.ir import run_graph
from autofusion.ir.builder import GraphBuilder

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU
torch = pytest.importorskip("torch", reason="the Triton backend needs torch (pip install autofusion[gpu])",
                            exc_type=ImportError)
pytest.importorskip("triton", reason="the Triton backend needs triton (pip install autofusion[gpu])",
                    exc_type=ImportError)

from triton_cases import check, feeds_for, one_group_plan  # noqa: E402

from autofusion.runtime.triton_runner import TritonModel  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "triton"
UPDATE = os.environ.get("AUTOFUSION_UPDATE_GOLDEN") == "1"


def pointwise_graph() -> Graph:
    b = GraphBuilder("pw")
    x = b.input("x", (3, 5, 7))
    y = b.input("y", (5, 1))
    s = b.op("Add", x, y)
    r = b.op("Relu", b.op("Mul", s, b.const(np.float32(1.5))))
    w = b.op("Where", b.op("Greater", x, y), r, b.op("Gelu", s))
    c = b.op("Cast", b.op("Less", s, b.const(np.float32(0.0))), to=1)
    t = b.op("Transpose", w, perm=(2, 0, 1))
    return b.build([b.op("Sub", w, c), t])


def reduction_graphs() -> list[Graph]:
    out = []
    b = GraphBuilder("softmax")
    x = b.input("x", (2, 3, 10))
    out.append(b.build([b.op("Mul", b.op("Softmax", b.op("Add", x, x), axis=-1), b.const(np.float32(2.0)))]))
    b = GraphBuilder("reducesum")
    x = b.input("x", (4, 6, 5))
    r = b.op("ReduceSum", b.op("Exp", x), b.const(np.array([1], dtype=np.int64)), keepdims=1)
    out.append(b.build([b.op("Sqrt", r)]))
    b = GraphBuilder("layernorm")
    x = b.input("x", (6, 20))
    res = b.input("res", (6, 20))
    scale = b.const(np.linspace(0.5, 1.5, 20, dtype=np.float32))
    bias = b.const(np.linspace(-1, 1, 20, dtype=np.float32))
    out.append(b.build([b.op("LayerNormalization", b.op("Add", x, res), scale, bias, axis=-1, epsilon=1e-5)]))
    return out


def gemm_graph() -> Graph:
    b = GraphBuilder("gemm")
    a = b.input("a", (2, 20, 24))
    w = b.const(np.random.default_rng(1).standard_normal((24, 18)).astype(np.float32))
    bias = b.const(np.random.default_rng(2).standard_normal(18).astype(np.float32))
    return b.build([b.op("Relu", b.op("Add", b.op("MatMul", a, w), bias))])


def test_pointwise_matches_reference() -> None:
    check(one_group_plan(pointwise_graph(), "multi_output"), seed=1)


@pytest.mark.parametrize("graph", reduction_graphs(), ids=lambda g: g.name)
def test_reduction_matches_reference(graph: Graph) -> None:
    check(one_group_plan(graph, "reduction"))


def test_gemm_epilogue_matches_reference() -> None:
    model = check(one_group_plan(gemm_graph(), "gemm_epilogue"))
    assert "tl.dot(" in model.kernels[0].source


@pytest.mark.parametrize("name,kinds", [
    ("bert-tiny", {"pointwise", "reduction", "gemm_epilogue", "horizontal_gemm"}),
    ("gpt2-tiny", {"pointwise", "reduction", "gemm_epilogue", "opaque"}),
])
def test_transformer_plans_run_wholly_in_triton(name: str, kinds: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every group of the tiny transformers' fused plans is one Triton kernel (the attention products
    read K^T and the heads through their Transposes, QKV is one launch, the attention scores' kernel
    stores the mask it computes at the mask's own shape), none falls back or splits; the views
    (Reshapes) are tensors reshaped on the device: nothing goes through the host."""
    from autofusion.api import optimize
    from autofusion.models import build, random_inputs

    plan = optimize(build(name))
    model = TritonModel(plan)
    assert not model.fallbacks, model.fallbacks
    assert any(g.template == "view" for g in plan.groups)
    monkeypatch.setattr(model, "run_reference", lambda *args: pytest.fail("a group ran on the host"))
    assert not model.split, dict(model.split)
    assert kinds <= {k.group.template for k in model.kernels}
    feeds = random_inputs(plan.graph)
    got, want = model(feeds), run_graph(plan.graph, feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_convolution_ending_in_its_pooling_op_runs_as_two_kernels() -> None:
    """ResNet's stem (a convolution ending in its max-pool) has no single Triton kernel: it runs as
    the convolution with its epilogue and then the pooling op, on the device, none on the host, and
    matches the reference; with fallback=False the group is refused instead."""
    from autofusion.api import optimize
    from autofusion.models import build, random_inputs

    plan = optimize(build("resnet-tiny"))
    stem = next(g for g in plan.groups if any(plan.graph.node_by_name[n].op == "MaxPool" for n in g.nodes))
    model = TritonModel(plan)
    assert stem.name in model.split
    assert not model.fallbacks, model.fallbacks
    assert [k.group.name for k in model.kernels if k.group.name.startswith(stem.name)] == [
        f"{stem.name}_conv", f"{stem.name}_pool"]
    assert len(model.kernels) == len([g for g in plan.groups if g.template != "view"]) + 1
    feeds = random_inputs(plan.graph)
    got, want = model(feeds), run_graph(plan.graph, feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)
    with pytest.raises(CodegenError, match=stem.name):
        TritonModel(plan, fallback=False)


@pytest.mark.parametrize("name", ["lstm-tiny", "lstm_unrolled_script", "lstm_unrolled_dynamo"])
def test_an_unrolled_lstm_cell_is_one_kernel(name: str) -> None:
    """The LSTM cell unrolled over time (lstm_scan; a built-in and two exports) is one Triton kernel,
    its state in registers across the steps, instead of one kernel per op."""
    from autofusion.api import optimize
    from autofusion.frontends import load_onnx
    from autofusion.models import build, random_inputs

    graph = build(name) if "-" in name else load_onnx(Path(__file__).parent / "data" / "models" / f"{name}.onnx")
    plan = optimize(graph)
    model = TritonModel(plan, fallback=False)
    scan = [k for k in model.kernels if k.group.template == "lstm_scan"]
    assert len(scan) == 1 and "# step 1" in scan[0].source
    feeds = random_inputs(plan.graph)
    got, want = model(feeds), run_graph(plan.graph, feeds)
    for out, ref in want.items():
        np.testing.assert_allclose(got[out], ref, rtol=1e-4, atol=1e-5, err_msg=out)


def test_an_lstm_cell_whose_gate_is_read_outside_runs_per_op() -> None:
    """A gate the rest of the model reads cannot stay in registers: the cell kernel says so."""
    from autofusion.api import optimize
    from autofusion.models import build

    plan = optimize(build("lstm-tiny"))
    scan = next(g for g in plan.groups if g.template == "lstm_scan")
    sigmoid = next(n for n in scan.nodes if plan.graph.node_by_name[n].op == "Sigmoid")
    gate = plan.graph.node_by_name[sigmoid].outputs[0]
    leaky = FusedGroup(scan.name, scan.nodes, scan.inputs, scan.outputs + (gate,), scan.template)
    with pytest.raises(CodegenError, match="read outside the kernel"):
        render_triton_group(plan.graph, leaky)


def test_run_device_keeps_tensors_on_the_device() -> None:
    """run_device takes and returns tensors (no host copy, weights uploaded once at build), checks
    the feeds as the numpy call does, and computes the same numbers."""
    from autofusion.ir.interpreter import InterpreterError

    graph = gemm_graph()
    model = TritonModel(one_group_plan(graph, "gemm_epilogue"), fallback=False)
    feeds = feeds_for(graph)
    out = graph.outputs[0]
    got = model.run_device({k: torch.from_numpy(v) for k, v in feeds.items()})[out]
    assert isinstance(got, torch.Tensor) and got.device.type == model.device
    np.testing.assert_allclose(got.cpu().numpy(), model(feeds)[out], rtol=0, atol=0)
    with pytest.raises(InterpreterError, match="input 'a'"):
        model.run_device({"a": torch.zeros(2, 20, 23)})
    with pytest.raises(InterpreterError, match="missing input 'a'"):
        model.run_device({})


def test_gemm_operands_computed_in_the_group() -> None:
    """Q @ K^T with K^T a Transpose of a [batch, heads, seq, dim] input and a transposed, scaled Gemm
    (transB): the operands are computed in the K loop from what the group reads."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("attn")
    q, kx = b.input("q", (2, 3, 17, 8)), b.input("k", (2, 17, 3, 8))
    kt = b.op("Transpose", kx, perm=(0, 2, 3, 1))  # [2, 3, 8, 17]
    g = b.build([b.op("Mul", b.op("MatMul", q, kt), b.const(np.float32(0.125)))])
    check(one_group_plan(g, "gemm_epilogue"))
    b = GraphBuilder("gemm_t")
    x = b.input("x", (19, 33))
    w = b.const(rng.standard_normal((21, 33)).astype(np.float32))
    c = b.const(rng.standard_normal(21).astype(np.float32))
    g = b.build([b.op("Gemm", b.op("Neg", x), w, c, transB=1, alpha=0.5, beta=2.0)])
    check(one_group_plan(g, "gemm_epilogue"))


def test_opaque_product_and_horizontal_products() -> None:
    """An opaque Gemm alone; three products of one input with different widths and epilogues in one
    launch (horizontal_gemm), against the reference."""
    rng = np.random.default_rng(4)
    b = GraphBuilder("opaque_gemm")
    x = b.input("x", (5, 40))
    g = b.build([b.op("Gemm", x, b.const(rng.standard_normal((40, 70)).astype(np.float32)),
                      b.const(rng.standard_normal(70).astype(np.float32)))])
    check(one_group_plan(g, "opaque"))
    b = GraphBuilder("qkv")
    x = b.input("x", (2, 9, 24))
    outs = []
    for width, act in ((24, "Relu"), (40, "Tanh"), (7, "Sigmoid")):
        y = b.op("Add", b.op("MatMul", x, b.const(rng.standard_normal((24, width)).astype(np.float32))),
                 b.const(rng.standard_normal(width).astype(np.float32)))
        outs.append(b.op(act, y))
    model = check(one_group_plan(b.build(outs), "horizontal_gemm"))
    assert model.kernels[0].source.count("tl.dot(") == 3


def test_split_and_slice_in_a_pointwise_group() -> None:
    """Split's parts and a Slice with a negative step, computed as index mappings of the input."""
    b = GraphBuilder("split_slice")
    x = b.input("x", (4, 30))
    p0, p1, p2 = b.op_multi("Split", [x, b.const(np.array([10, 10, 10], np.int64))], 3, axis=1)
    s = b.op("Slice", x, b.const(np.array([0, 29], np.int64)), b.const(np.array([4, 9], np.int64)),
             b.const(np.array([0, 1], np.int64)), b.const(np.array([1, -2], np.int64)))
    check(one_group_plan(b.build([b.op("Add", b.op("Exp", p0), p1), s, p2]), "multi_output"))


def test_unsupported_template_is_a_clear_error() -> None:
    plan = one_group_plan(gemm_graph(), "lstm_scan")
    with pytest.raises(CodegenError, match="lstm_scan"):
        TritonModel(plan, fallback=False)
    model = TritonModel(plan)  # one kernel per op instead
    assert "g0" in model.split and not model.fallbacks
    feeds = feeds_for(plan.graph)
    # atol: an output near 0.014 is a sum of terms up to ~5, so float32 summation order moves it by
    # ~4e-7 (2.6e-5 relative: seen on a Zen 3, where torch's CPU kernels sum in another order)
    np.testing.assert_allclose(model(feeds)[plan.graph.outputs[0]], run_graph(plan.graph, feeds)[plan.graph.outputs[0]],
                               rtol=1e-5, atol=2e-6)


def test_rendering_is_deterministic() -> None:
    plan = one_group_plan(reduction_graphs()[2], "reduction")
    first = render_triton_group(plan.graph, plan.groups[0]).source
    assert render_triton_group(plan.graph, plan.groups[0]).source == first


def test_hostile_names_are_safe() -> None:
    evil = 'x"); import os; os.system("echo pwned") #\n'
    b = GraphBuilder("evil")
    x = b.input(evil, (9,))
    g = b.build([b.op("Exp", x, name="n\nimport sys")])
    plan = one_group_plan(g, "pointwise", name="g\n# )(")
    source = render_triton_group(g, plan.groups[0]).source
    assert "import os" not in source.replace("# group", "")
    ast.parse(source)
    assert py_ident("class", "") != "class" and py_ident("def", "").isidentifier()
    check(plan)


@pytest.mark.parametrize("case", ["pointwise", "softmax", "layernorm", "gemm"])
def test_golden_snapshots(case: str) -> None:
    graphs = {"pointwise": (pointwise_graph(), "multi_output"), "softmax": (reduction_graphs()[0], "reduction"),
              "layernorm": (reduction_graphs()[2], "reduction"), "gemm": (gemm_graph(), "gemm_epilogue")}
    graph, template = graphs[case]
    plan = one_group_plan(graph, template)
    source = render_triton_group(graph, plan.groups[0]).source
    path = GOLDEN / f"{case}.py"
    if UPDATE or not path.exists():
        path.write_text(source)
    assert source == path.read_text(), f"{path} changed; rerun with AUTOFUSION_UPDATE_GOLDEN=1 if intended"


def test_calls_from_eight_threads_are_correct(problems_from_threads) -> None:
    graph = gemm_graph()
    model = TritonModel(one_group_plan(graph, "gemm_epilogue"), fallback=False)
    feeds = [feeds_for(graph, seed) for seed in range(4)]
    assert problems_from_threads(model, feeds, threads=8, calls=12) == []


def test_its_kernel_folder_goes_with_the_model(tmp_path: Path) -> None:
    import gc

    model = TritonModel(one_group_plan(pointwise_graph(), "multi_output"))
    folder = model._dir
    assert any(folder.glob("*.py"))
    del model
    gc.collect()
    assert not folder.exists()  # nothing is left in the temporary folder
    kept = TritonModel(one_group_plan(pointwise_graph(), "multi_output"), directory=tmp_path)
    del kept
    gc.collect()
    assert any(tmp_path.glob("*.py"))  # a folder the caller gave stays the caller's


def test_an_epilogue_output_of_a_broadcast_shape_is_stored_once_per_element() -> None:
    """Scores [2, 3, 80, 72] with a mask computed in the group at [1, 1, 80, 72] and a bias row at
    [2, 1, 1, 72], both group outputs: two tiles of 64 rows and of 64 columns and six batch
    programs, so the programs and lanes that must not store the broadcast outputs exist."""
    b = GraphBuilder("g")
    a, w = b.input("a", (2, 3, 80, 16)), b.input("w", (2, 3, 16, 72))
    m, r = b.input("m", (1, 1, 80, 72)), b.input("r", (2, 1, 1, 72))
    mask = b.op("Greater", m, b.const(np.float32(0.0)))
    bias = b.op("Mul", r, b.const(np.float32(2.0)))
    scores = b.op("Where", mask, b.op("Add", b.op("MatMul", a, w), bias), b.const(np.float32(-1e4)))
    graph = b.build([scores, b.op("Cast", mask, to=1), bias])
    model = check(one_group_plan(graph, "gemm_epilogue"))
    assert not model.split and len(model.kernels) == 1


def long_row_graphs() -> list[Graph]:
    """Reductions over rows too long for one block, each with a prologue and an epilogue."""
    out = reduction_graphs()
    for op, shift in (("ReduceMax", -2.0), ("ReduceMin", 2.0), ("ReduceMean", 0.0)):
        b = GraphBuilder(op.lower())
        x = b.input("x", (3, 7, 40))
        # every value below zero for the maximum, above it for the minimum: the identity must be infinite
        t = b.op("Add", b.op("Tanh", x), b.const(np.float32(shift)))
        r = b.op(op, t, b.const(np.array([0, 2], dtype=np.int64)), keepdims=0)
        out.append(b.build([b.op("Mul", r, b.const(np.float32(3.0)))]))
    b = GraphBuilder("logsoftmax_two_outputs")
    x = b.input("x", (5, 45))
    s = b.op("LogSoftmax", b.op("Mul", x, b.const(np.float32(0.5))), axis=-1)
    out.append(b.build([b.op("Exp", s), s]))
    b = GraphBuilder("layernorm_stats")
    x = b.input("x", (2, 3, 33))
    ln = b.op_multi("LayerNormalization", [x, b.const(np.linspace(0.5, 1.5, 33, dtype=np.float32))], 3, axis=-1,
                    epsilon=1e-5)
    out.append(b.build(ln))
    b = GraphBuilder("global_pool")
    x = b.input("x", (2, 3, 9, 7))
    out.append(b.build([b.op("Relu", b.op("GlobalAveragePool", b.op("Sigmoid", x)))]))
    return out


@pytest.mark.parametrize("graph", long_row_graphs(), ids=lambda g: g.name)
def test_rows_longer_than_a_block_loop_over_blocks(graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reduction kind over rows several blocks long, the last block partial (blocks of 4 here;
    rows over 16K elements in a model): the same results as in one block."""
    from autofusion.codegen.triton import configs
    from autofusion.codegen.triton import reduce as red

    monkeypatch.setattr(red, "MAX_BLOCK", 4)
    monkeypatch.setattr(configs, "LOOP_BLOCKS", (4,))
    model = check(one_group_plan(graph, "reduction"))
    assert "for j0 in range(0, " in model.kernels[0].source


def test_a_softmax_row_of_20000_elements() -> None:
    b = GraphBuilder("long_softmax")
    x = b.input("x", (3, 20000))
    model = check(one_group_plan(b.build([b.op("Softmax", b.op("Add", x, x), axis=-1)]), "reduction"))
    assert "BLOCK=4096, num_warps" in model.kernels[0].source  # rows walked in blocks of 4096 by default


def test_gather_ids_off_the_table_are_clamped_as_in_c() -> None:
    """Token ids past either end of the table read its first or last row (negative ones count from
    the end first), as the C backend does: on a GPU an unclamped id is an illegal address."""
    from autofusion.runtime import CompiledModel

    b = GraphBuilder("gather_off")
    table = b.const(np.arange(40, dtype=np.float32).reshape(10, 4))
    ids = b.input("ids", (1, 5), dtype="int64")
    graph = b.build([b.op("Relu", b.op("Gather", table, ids, axis=0))])
    feeds = {"ids": np.array([[-1, 3, 12, -15, 1 << 40]], dtype=np.int64)}
    got = TritonModel(one_group_plan(graph, "pointwise"), fallback=False)(feeds)[graph.outputs[0]]
    np.testing.assert_array_equal(got, np.arange(40, dtype=np.float32).reshape(10, 4)[[[9, 3, 9, 0, 9]]])
    np.testing.assert_array_equal(got, CompiledModel(one_group_plan(graph, "pointwise")).run(feeds)[graph.outputs[0]])


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_in_a_pointwise_kernel(batch_dims: int) -> None:
    """GatherND (what torch.export writes for advanced indexing) computed in the kernel, its tuples
    read from the indices tensor, negative indices from the end, with a pointwise epilogue."""
    b = GraphBuilder("gather_nd")
    data = b.input("data", (3, 5, 4, 6))
    tuples = [[[1, -1], [0, 3]], [[2, 0], [-2, 3]], [[0, 2], [1, 1]]] if batch_dims else [[[2, 4], [-1, 0]], [[0, -3], [1, 2]]]
    ind = b.const(np.array(tuples, dtype=np.int64))
    g = b.build([b.op("Relu", b.op("GatherND", data, ind, batch_dims=batch_dims))])
    model = check(one_group_plan(g, "pointwise"))
    assert "tl.load(" in model.kernels[0].source and len(model.kernels) == 1


def test_shared_exports_run_wholly_in_triton() -> None:
    """The torch.export models' GatherND (bert and gpt2) and the TorchScript export's LSTM op run on
    the device, nothing on the host."""
    from autofusion.api import optimize
    from autofusion.frontends import load_onnx
    from autofusion.models import random_inputs

    for name in ("bert_tiny_dynamo", "gpt2_tiny_dynamo", "lstm_op_script"):
        path = Path(__file__).parent / "data" / "models" / f"{name}.onnx"
        plan = optimize(load_onnx(path))
        model = TritonModel(plan)
        assert not model.fallbacks, model.fallbacks
        feeds = random_inputs(plan.graph)  # token ids within the vocabulary
        got, want = model(feeds), run_graph(plan.graph, feeds)
        for out, ref in want.items():
            np.testing.assert_allclose(got[out], ref, rtol=1e-4, atol=1e-5, err_msg=f"{name}: {out}")


def lstm_graph(direction: str, bias: bool, states: bool, outputs: tuple[bool, bool, bool],
               seq: int = 5, batch: int = 3, size: int = 7, hidden: int = 6, **attrs: object) -> Graph:
    rng = np.random.default_rng(3)
    dirs = 2 if direction == "bidirectional" else 1
    b = GraphBuilder(f"lstm_{direction}")
    x = b.input("x", (seq, batch, size))
    w = b.const((rng.standard_normal((dirs, 4 * hidden, size)) * 0.5).astype(np.float32))
    r = b.const((rng.standard_normal((dirs, 4 * hidden, hidden)) * 0.5).astype(np.float32))
    inputs = [x, w, r, b.const(rng.standard_normal((dirs, 8 * hidden)).astype(np.float32)) if bias else "", ""]
    if states:
        inputs += [b.input("h0", (dirs, batch, hidden)), b.input("c0", (dirs, batch, hidden))]
    ys = b.op_multi("LSTM", inputs, 3, hidden_size=hidden, direction=direction, **attrs)
    return b.build([y for y, keep in zip(ys, outputs) if keep])


@pytest.mark.parametrize("direction,bias,states,outputs", [
    ("forward", True, True, (True, True, True)),
    ("forward", False, False, (True, False, False)),
    ("reverse", True, False, (False, True, True)),
    ("bidirectional", True, True, (True, True, True)),
    ("bidirectional", False, True, (False, False, True)),
])
def test_the_lstm_op_is_one_recurrent_kernel(direction: str, bias: bool, states: bool,
                                             outputs: tuple[bool, bool, bool]) -> None:
    model = check(one_group_plan(lstm_graph(direction, bias, states, outputs), "opaque"))
    assert "for s in range(5):" in model.kernels[0].source


def test_a_clipped_lstm_is_one_recurrent_kernel() -> None:
    """The op's clip bounds the gates' pre-activations, in the kernel (seq 5, values that reach it)."""
    g = lstm_graph("bidirectional", True, True, (True, True, True), clip=0.7)
    model = check(one_group_plan(g, "opaque"))
    assert "tl.minimum(tl.maximum(zi, -0.7), 0.7)" in model.kernels[0].source


def test_an_lstm_the_kernel_does_not_render_says_why() -> None:
    from autofusion.codegen.errors import CodegenError

    g = lstm_graph("forward", True, False, (True, True, True), activations=["HardSigmoid", "Tanh", "Tanh"])
    with pytest.raises(CodegenError, match="does not render activations"):
        TritonModel(one_group_plan(g, "opaque"), fallback=False)
    model = TritonModel(one_group_plan(g, "opaque"))  # the reference way, and says so
    assert any("activations" in why for why in model.fallbacks.values())
    feeds = feeds_for(g)
    for name, ref in run_graph(g, feeds).items():
        np.testing.assert_allclose(model(feeds)[name], ref, rtol=1e-4, atol=1e-5)


def test_a_pooled_group_with_ops_after_the_pool_splits_at_the_pool() -> None:
    """Conv -> Relu -> MaxPool -> Mul, the Relu an output too: the first kernel stores the Relu (an
    output, and what the pool reads), the second pools it and multiplies."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("pooled")
    x = b.input("x", (2, 3, 11, 9))
    r = b.op("Relu", b.op("Conv", x, b.const(rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
                          b.const(rng.standard_normal(8).astype(np.float32)), pads=(1, 1, 1, 1)))
    pooled = b.op("MaxPool", r, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    g = b.build([b.op("Mul", pooled, b.const(np.float32(0.5))), r])
    plan = one_group_plan(g, "conv_epilogue")
    model = TritonModel(plan)
    assert [k.group.template for k in model.kernels] == ["conv_epilogue", "opaque"]
    feeds = feeds_for(g)
    for name, ref in run_graph(g, feeds).items():
        np.testing.assert_allclose(model(feeds)[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


def test_an_op_without_a_triton_kernel_runs_as_torchs_op_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pow and Concat have no Triton kernel: in a fused group split per op, and alone, they run as
    torch's own ops on the device (``on_torch`` says which and why), never through the host; an op
    torch has no conversion for (the LSTM with other activations above) still does."""
    from autofusion.api import optimize

    rng = np.random.default_rng(8)
    b = GraphBuilder("no_triton_kernel")
    x, e, z = b.input("x", (3, 5)), b.input("e", (3, 5)), b.input("z", (3, 2))
    y = b.op("Concat", b.op("Relu", b.op("Add", b.op("Pow", b.op("Abs", x), e), x)), z, axis=1)
    g = b.build([y])
    plan = optimize(g)
    model = TritonModel(plan)
    ops = {g.node_by_name[n].op for name in model.on_torch for s in model.steps if s.group.name == name
           for n in s.group.nodes}
    assert ops == {"Pow", "Concat"} and not model.fallbacks
    assert all("not supported by the Triton backend" in why for why in model.on_torch.values())
    monkeypatch.setattr(model, "run_reference", lambda *args: pytest.fail("a group ran on the host"))
    feeds = {"x": rng.standard_normal((3, 5)).astype(np.float32), "e": rng.integers(1, 3, (3, 5)).astype(np.float32),
             "z": rng.standard_normal((3, 2)).astype(np.float32)}
    np.testing.assert_allclose(model(feeds)[y], run_graph(g, feeds)[y], rtol=1e-5, atol=1e-6)


def test_sibling_reductions_over_the_same_rows_are_one_kernel() -> None:
    """A LayerNorm gradient's two means over each row (one group, as the kinds take them) are one
    Triton kernel, not one per op, and match the reference."""
    from gradient_graphs import layernorm_gradient

    from autofusion.api import optimize

    b = GraphBuilder("ln_grad")
    dy, x = b.input("dy", (4, 8, 96)), b.input("x", (4, 8, 96))
    mean, rstd, w = b.input("mean", (4, 8, 1)), b.input("rstd", (4, 8, 1)), b.input("w", (96,))
    dx, _, _ = layernorm_gradient(b, dy, x, mean, rstd, w)
    plan = optimize(b.build([dx]))
    both = [g for g in plan.groups if sum(plan.graph.node_by_name[n].op == "ReduceMean" for n in g.nodes) == 2]
    assert both, [g.nodes for g in plan.groups]
    model = TritonModel(plan)
    assert not model.split, dict(model.split)
    rng = np.random.default_rng(2)
    feeds = {n: rng.standard_normal(plan.graph.types[n].shape).astype(np.float32) for n in plan.graph.inputs}
    got, want = model(feeds), run_graph(plan.graph, feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)
