"""Optimizing a graph with symbolic sizes: guards decided for every binding or left undecided (the rule
then does not apply, and explain says so), a plan priced at a representative binding, valid at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dynamic_models import CNN_AND_LSTM, DYNAMIC, dynamic_feeds, other_feeds

from autofusion import optimize
from autofusion.codegen import CodegenError, render_plan
from autofusion.decide.binding import bind_plan
from autofusion.decide.explain import explain_report
from autofusion.dsl.guards import Bindings, Call, Compare, IntLit, ListLit, Name, verdict
from autofusion.engine.space import UnfusedReason
from autofusion.frontends.onnx_import import load_onnx
from autofusion.graph.dims import bounded, compare, symbol
from autofusion.graph.graph import Graph
from autofusion.graph.types import DType, TensorType
from autofusion.ir import GraphBuilder, run_graph
from autofusion.ir.symbolic import (
    DEFAULT_REPRESENTATIVE_SIZE,
    BindError,
    bind,
    representative_binding,
    symbols_of,
    with_bounds,
)
from autofusion.runtime import CompiledModel, DynamicModel, RunError
from autofusion.runtime.tuning import Tuner

SEQ, BATCH = symbol("seq"), symbol("batch")


def test_size_comparisons_hold_for_every_binding_or_are_left_open() -> None:
    assert compare("==", SEQ, 768) is None and compare("!=", SEQ, SEQ) is False
    assert compare(">=", SEQ, 1) is True and compare("<", SEQ, SEQ + 1) is True
    assert compare("<=", 2 * SEQ, SEQ) is False and compare("==", 2 * SEQ, SEQ * 2) is True
    assert compare("<=", SEQ, 768) is None  # no bound yet
    with bounded({"seq": 512}):
        assert compare("<=", SEQ, 768) is True and compare("==", SEQ, 768) is False
        assert compare("<", 64 * SEQ, 1 << 20) is True
        assert compare("<=", 64 * SEQ + 3, 32771) is True and compare("<", 64 * SEQ + 3, 32771) is None
        assert compare("<=", BATCH * SEQ, 768) is None  # batch has no bound
        assert compare(">", 0.5 * SEQ, 300) is False and compare(">", 0.5 * SEQ, 0.25) is True
    assert compare("<=", SEQ, 32771) is None  # outside bounded(): no bound


def _guard(op: str, fn: str, *args: object, rhs: object) -> Compare:
    call = Call(fn, (Name("x"), *(IntLit(a) for a in args)))  # type: ignore[arg-type]
    right = ListLit(tuple(IntLit(v) for v in rhs)) if isinstance(rhs, list) else IntLit(rhs)  # type: ignore[arg-type]
    return Compare(op, call, right)


def test_a_guard_over_symbolic_sizes_holds_fails_or_is_undecided() -> None:
    env = Bindings(types={"x": TensorType((SEQ, 768), DType.FLOAT32)})
    assert verdict(_guard("==", "dim", -1, rhs=768), env) is True  # a fixed axis decides
    assert verdict(_guard("==", "dim", 0, rhs=768), env) is None
    assert verdict(_guard("!=", "dim", 0, rhs=768), env) is None  # not "true": seq may be 768
    assert verdict(_guard("<=", "numel", rhs=1 << 20), env) is None
    assert verdict(_guard("==", "shape", rhs=[768]), env) is False  # ranks differ for every binding
    assert verdict(_guard("==", "shape", rhs=[768, 768]), env) is None
    with bounded({"seq": 512}):
        assert verdict(_guard("<=", "numel", rhs=1 << 20), env) is True
        assert verdict(_guard("in", "dim", 0, rhs=[768, 1024]), env) is False


RULES = """
fuse small_gemm_relu: MatMul(x, w) -> Relu -> template "gemm_epilogue" where numel(x) <= 4096
"""


def _mlp() -> Graph:
    b = GraphBuilder("mlp")
    x = b.input("x", (SEQ, 16))
    w = b.const(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    return b.build([b.op("Relu", b.op("MatMul", x, w))])


def test_a_fusion_rule_whose_guard_depends_on_the_sizes_does_not_fire_until_a_bound_decides_it(tmp_path: Path) -> None:
    rules = tmp_path / "small.fuse"
    rules.write_text(RULES)
    graph = _mlp()
    plan = optimize(graph, [rules])
    assert plan.kernels == 2 and plan.stats["fusion_undecided"] == {"small_gemm_relu": 1}
    report = explain_report(plan)
    assert report["undecided_guards"] == {"small_gemm_relu": 1}
    assert report["priced_at"] == {"seq": DEFAULT_REPRESENTATIVE_SIZE}
    bounded_plan = optimize(with_bounds(graph, {"seq": 256}), [rules])  # 256 x 16 <= 4096 for every seq
    assert bounded_plan.kernels == 1 and bounded_plan.stats["fusion_undecided"] == {}
    assert optimize(with_bounds(graph, {"seq": 257}), [rules]).kernels == 2
    (w,) = [c.array for c in graph.constants.values()]
    for seq in (1, 5, 256):
        bound = bind_plan(bounded_plan, {"seq": seq})
        assert bound.kernels == 1 and bound.graph.types["x"].shape == (seq, 16)
        x = np.random.default_rng(seq).standard_normal((seq, 16)).astype(np.float32)
        (got,) = CompiledModel(bound).run({"x": x}).values()
        np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


def test_a_nofuse_rule_undecided_keeps_its_ops_apart_and_says_why() -> None:
    graph = load_onnx(DYNAMIC[0], symbolic=True)  # bert: batch has no bound, so numel(scores) has none
    plan = optimize(graph)
    assert plan.stats["fusion_undecided"] == {"huge_softmax": 2}
    apart = [u for u in plan.unfused if u.reason == UnfusedReason.GUARD_UNDECIDED]
    assert len(apart) == 2 and {graph.node_by_name[u.consumer].op for u in apart} == {"Softmax"}
    assert all(u.detail == "huge_softmax" for u in apart)
    decided = optimize(with_bounds(graph, {"batch": 4}))  # 4 x 2 x 64 x 64 scores at most
    assert decided.stats["fusion_undecided"] == {}
    assert not any(u.reason == UnfusedReason.GUARD_UNDECIDED for u in decided.unfused)


def test_the_representative_binding_is_the_hint_the_bound_or_the_default() -> None:
    graph = load_onnx(DYNAMIC[0], symbolic=True)
    assert representative_binding(graph) == {"batch": DEFAULT_REPRESENTATIVE_SIZE, "seq": 64}
    assert representative_binding(graph, {"batch": 2, "seq": 9}) == {"batch": 2, "seq": 9}
    with pytest.raises(BindError, match="exceeds 64"):
        representative_binding(graph, {"seq": 100})
    plan = optimize(graph)
    assert plan.stats["priced_at"] == {"batch": DEFAULT_REPRESENTATIVE_SIZE, "seq": 64}
    assert plan.stats["priced_also_at"] == [{"batch": 1, "seq": 1}]  # short requests count as much
    hinted = optimize(graph, sizes={"batch": 1, "seq": 32})
    assert hinted.stats["priced_at"] == {"batch": 1, "seq": 32} and hinted.stats["priced_also_at"] == []
    for bad, message in (({"heads": 2}, "no size 'heads'"), ({"batch": 0}, "at least 1")):
        with pytest.raises(BindError, match=message):
            with_bounds(graph, bad)
    assert dict(with_bounds(graph, {"seq": 100, "batch": 3}).bounds) == {"batch": 3, "seq": 64}  # the tighter


@pytest.mark.parametrize("path", [DYNAMIC[1], DYNAMIC[2]], ids=[DYNAMIC[1].stem, DYNAMIC[2].stem])
def test_one_symbolic_plan_compiles_and_runs_at_each_binding_as_onnxruntime(path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    graph = load_onnx(path, symbolic=True)
    plan = optimize(graph)
    static = optimize(load_onnx(path, dims={"batch": 2, "seq": 9}))
    assert abs(plan.kernels - static.kernels) <= 10  # the mask arithmetic a static import folds
    session = ort.InferenceSession(str(path))
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 7), (3, 9), (2, 1)):
        bound = bind_plan(plan, {"batch": batch, "seq": seq})
        assert [g.name for g in bound.groups] == [g.name for g in plan.groups if any(
            n in bound.graph.node_by_name for n in g.nodes)]
        feeds = dynamic_feeds(graph, batch, seq, rng)
        got = CompiledModel(bound, tune=False).run(feeds)[bound.graph.outputs[0]]
        (want,) = session.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{path.stem} at {batch} x {seq}")


def _dynamic_model(path: Path, **options: object) -> tuple[Graph, DynamicModel]:
    graph = load_onnx(path, symbolic=True)
    return graph, DynamicModel(optimize(graph), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", DYNAMIC, ids=[p.stem for p in DYNAMIC])
def test_a_transformer_runs_every_size_on_one_library_compiled_once(path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """BERT and GPT-2 with symbolic batch and seq: every kernel takes its sizes at run time (GEMMs
    with their epilogues, attention products, softmax, LayerNorm, the mask arithmetic)."""
    import autofusion.runtime.model as compiled

    ort = pytest.importorskip("onnxruntime")
    graph = load_onnx(path)  # dynamic axes stay symbolic
    model = CompiledModel(optimize(graph))
    library = model.library_path
    monkeypatch.setattr(compiled, "compile_library", lambda *a, **k: pytest.fail("compiled again"))
    session, rng = ort.InferenceSession(str(path)), np.random.default_rng(5)
    for batch, seq in ((1, 1), (1, 7), (1, 8), (3, 9), (1, 64), (3, 64)):
        feeds = dynamic_feeds(graph, batch, seq, rng)
        got = model.run(feeds)[graph.outputs[0]]
        (want,) = session.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{path.stem} at {batch} x {seq}")
    assert model.library_path == library


def _image_of_any_size() -> Graph:
    """A convolution over an image whose side is symbolic: its kernels take fixed image sizes only."""
    b = GraphBuilder("image")
    x = b.input("x", (1, 3, symbol("side"), symbol("side")))
    w = b.const(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32))
    return b.build([b.op("GlobalAveragePool", b.op("Relu", b.op("Conv", x, w, pads=(1, 1, 1, 1))))])


def test_a_plan_with_kernels_of_fixed_sizes_compiles_each_binding_once_and_says_why() -> None:
    graph = _image_of_any_size()
    model = DynamicModel(optimize(graph), keep=2)
    assert model.library_path is None and "Conv with symbolic channels or image sizes" in model.one_library_refused
    assert "takes fixed sizes only so far" in model.one_library_refused
    rng = np.random.default_rng(2)
    for side in (5, 9, 5, 9, 7):
        feeds = {"x": rng.standard_normal((1, 3, side, side)).astype(np.float32)}
        want = run_graph(bind(graph, {"side": side}), feeds)[graph.outputs[0]]
        np.testing.assert_allclose(model.run(feeds)[graph.outputs[0]], want, rtol=1e-5, atol=1e-6)
    assert model.compiles == 3  # sides 5 and 9 came back while loaded
    model.run({"x": np.zeros((1, 3, 5, 5), np.float32)})
    assert model.compiles == 4  # keep=2: side 5 had been dropped for 7
    with pytest.raises(CodegenError, match="symbolic channels or image sizes .* fixed sizes only so far"):
        CompiledModel(model.plan)


def test_feeds_that_contradict_the_graph_are_refused_by_input_and_axis() -> None:
    graph, model = _dynamic_model(DYNAMIC[0])  # bert: ids, mask, types all [batch, seq]; seq <= 64
    good = dynamic_feeds(graph, 2, 5, np.random.default_rng(0))
    ids, mask = graph.inputs[0], graph.inputs[1]
    for change, message in (
        ({ids: good[ids][0]}, f"input '{ids}' has shape \\[5\\]; the model takes \\[batch, seq\\]: 2 dimension"),
        ({mask: good[mask][:, :4]}, f"input '{mask}' axis 1 is 4, but seq is 5 in input '{ids}' axis 1"),
        ({ids: np.zeros((2, 65), np.int64), mask: np.zeros((2, 65), np.int64),
          graph.inputs[2]: np.zeros((2, 65), np.int64)}, "'seq' = 65 exceeds 64"),
        ({ids: np.zeros((0, 5), np.int64), mask: np.zeros((0, 5), np.int64),
          graph.inputs[2]: np.zeros((0, 5), np.int64)}, "'batch' = 0: the graph needs at least 1"),
    ):
        with pytest.raises(RunError, match=message):
            model.run({**good, **change})
    assert model.compiles == 1  # the one library, built up front; no call ran
    with pytest.raises(RunError, match="missing input"):
        model.run({ids: good[ids]})


def test_a_fixed_size_beside_symbolic_ones_is_checked_too() -> None:
    b = GraphBuilder("rows")
    x = b.input("x", (SEQ, 16))
    graph = b.build([b.op("Relu", x)])
    model = DynamicModel(optimize(graph))
    with pytest.raises(RunError, match="input 'x' axis 1 is 15; the model takes \\[seq, 16\\], fixed at 16"):
        model.run({"x": np.zeros((3, 15), np.float32)})
    x3 = np.arange(-24, 24, dtype=np.float32).reshape(3, 16)
    np.testing.assert_array_equal(model.run({"x": x3})[graph.outputs[0]], np.maximum(x3, 0))


@pytest.mark.parametrize("path", [DYNAMIC[0], DYNAMIC[3]], ids=[DYNAMIC[0].stem, DYNAMIC[3].stem])
def test_the_fused_model_exports_with_its_symbolic_sizes_and_runs_at_any_size(path: Path, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from autofusion.export import save_onnx

    graph = load_onnx(path, symbolic=True)
    target = save_onnx(optimize(graph), tmp_path / "fused.onnx")  # checked by the ONNX checker first
    exported = ort.InferenceSession(str(target))
    assert [[d for d in i.shape] for i in exported.get_inputs()] == [["batch", "seq"]] * len(graph.inputs)
    source = ort.InferenceSession(str(path))
    rng = np.random.default_rng(3)
    for batch, seq in ((1, 7), (3, 9), (2, 64)):
        feeds = dynamic_feeds(graph, batch, seq, rng)
        np.testing.assert_allclose(exported.run(None, feeds)[0], source.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_equal_integer_constants_of_different_shapes_stay_apart_in_the_egraph() -> None:
    from autofusion.engine.encode import vec_text

    # a Slice's starts [0] and a scalar 0 were one e-class, and the export wrote a 0-d starts
    assert vec_text(np.array(0)) != vec_text(np.array([0]))


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny", "resnet-tiny-bn"])
def test_a_dynamic_builtin_model_bound_computes_what_the_static_build_does(name: str) -> None:
    from autofusion.models import ModelSizeError, build
    from autofusion.models.inputs import random_inputs

    graph = build(name, dynamic=True)
    cnn = name.startswith("resnet")
    assert symbols_of(graph) == (("batch",) if cnn else ("batch", "seq"))
    assert dict(graph.bounds) == ({} if cnn else {"seq": 64})
    for batch, seq in ((1, 7), (2, 16), (1, 64)):
        static = build(name, seq=None if cnn else seq, batch=batch)
        feeds = random_inputs(static, seed=seq)
        got = run_graph(bind(graph, {"batch": batch} if cnn else {"batch": batch, "seq": seq}), feeds)
        want = run_graph(static, feeds)
        for out in static.outputs:
            np.testing.assert_array_equal(got[out], want[out], err_msg=f"{name} {out} at {batch} x {seq}")
    with pytest.raises(ModelSizeError, match="only the transformers and CNNs"):
        build("lstm-tiny", dynamic=True)
    with pytest.raises(ModelSizeError, match="no fixed seq"):
        build(name, seq=8, dynamic=True)


def test_a_dynamic_resnet_runs_every_batch_on_one_library() -> None:
    """The built-in ResNet with BatchNormalization kept (folded by the rules), a symbolic batch: one
    library, batch 1, 2 and 3 against the reference of each."""
    from autofusion.models import build
    from autofusion.models.inputs import random_inputs

    graph = build("resnet-tiny-bn", dynamic=True)
    model = CompiledModel(optimize(graph), tune=False)
    for batch in (1, 3, 2):
        static = build("resnet-tiny-bn", batch=batch)
        feeds = random_inputs(static, seed=batch)
        want = run_graph(static, feeds)
        got = model.run(feeds)
        for out in static.outputs:
            np.testing.assert_allclose(got[out], want[out], rtol=1e-4, atol=1e-4, err_msg=f"{out} at batch {batch}")


@pytest.mark.parametrize("path", CNN_AND_LSTM, ids=[p.stem for p in CNN_AND_LSTM])
def test_cnns_and_an_lstm_with_dynamic_axes_run_one_plan_at_any_size(path: Path) -> None:
    """The other architectures of the shared models, exported with a dynamic batch (and the LSTM's
    time steps): Conv, BatchNorm folded or not, pooling, Flatten, Gemm and the LSTM op."""
    ort = pytest.importorskip("onnxruntime")
    graph = load_onnx(path)
    assert symbols_of(graph) == (("batch", "seq") if path.stem.startswith("lstm") else ("batch",))
    model, session = DynamicModel(optimize(graph)), ort.InferenceSession(str(path))
    rng = np.random.default_rng(4)
    for batch, seq in ((1, 3), (3, 8)):
        feeds = other_feeds(path, batch, seq, rng)
        want = session.run(None, feeds)[0]
        bound = bind(graph, {s: {"batch": batch, "seq": seq}[s] for s in symbols_of(graph)})
        np.testing.assert_allclose(run_graph(bound, feeds)[bound.outputs[0]], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(model.run(feeds)[graph.outputs[0]], want, rtol=1e-4, atol=1e-5)
    assert model.compiles == 1 and model.library_path is not None  # convolutions take the batch at run time


def _norm_block() -> Graph:
    """Pointwise, softmax, residual LayerNorm (two outputs), a transpose and a reduction over the
    batch: every kind that takes its sizes at run time so far."""
    b = GraphBuilder("norm_block")
    x, r = b.input("x", (BATCH, SEQ, 16)), b.input("r", (BATCH, SEQ, 16))
    y = b.op("Softmax", b.op("Relu", b.op("Add", x, b.const(np.linspace(-1, 1, 16, dtype=np.float32)))), axis=-1)
    ln = b.op("LayerNormalization", b.op("Add", y, r), b.const(np.full(16, 1.5, np.float32)),
              b.const(np.full(16, 0.25, np.float32)), axis=-1)
    scores = b.op("Softmax", b.op("Transpose", ln, perm=[0, 2, 1]), axis=-1)
    mean = b.op("ReduceMean", scores, b.const(np.array([0], np.int64)), keepdims=1)
    return b.build([ln, scores, mean])


def test_one_library_serves_every_binding_without_compiling_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import autofusion.runtime.model as compiled

    graph = _norm_block()
    model = DynamicModel(optimize(graph))
    assert model.one_library_refused == "" and model.library_path is not None and model.compiles == 1
    library = CompiledModel(model.plan)  # the same library, from the compile cache
    calls: list[object] = []
    monkeypatch.setattr(compiled, "compile_library", lambda *a, **k: calls.append(a))
    for batch, seq in ((1, 1), (2, 7), (3, 64), (1, 333), (2, 7)):
        rng = np.random.default_rng(batch * 1000 + seq)
        feeds = {n: rng.standard_normal((batch, seq, 16)).astype(np.float32) for n in ("x", "r")}
        got = model.run(feeds)
        want = run_graph(bind(graph, {"batch": batch, "seq": seq}), feeds)
        for out in graph.outputs:
            assert got[out].shape == want[out].shape
            np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-6, err_msg=f"{out} at {batch} x {seq}")
    assert calls == [] and model.compiles == 1  # no compiler run for any new size
    small, large = library.workspace_bytes({"batch": 1, "seq": 1}), library.workspace_bytes({"batch": 3, "seq": 64})
    assert 0 < small < large and library.peak_bytes == library.workspace_bytes({"batch": 128, "seq": 128})


def test_a_symbolic_library_is_tuned_and_profiled_at_its_representative_sizes() -> None:
    """Cores tuned at the binding the plan was priced at (seq 128) serve every other size too, and a
    profiling build times each group of the call just made."""
    b = GraphBuilder("dense")
    x = b.input("x", (SEQ, 64))
    w = b.const(np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32) / 8)
    graph = b.build([b.op("Relu", b.op("MatMul", x, w))])
    model = CompiledModel(optimize(graph), tune=True, profile=True)
    assert isinstance(model.chooser, Tuner)
    for seq in (1, 5, 128, 300):
        feeds = {"x": np.random.default_rng(seq).standard_normal((seq, 64)).astype(np.float32)}
        got = model.run(feeds)[graph.outputs[0]]
        np.testing.assert_allclose(got, run_graph(bind(graph, {"seq": seq}), feeds)[graph.outputs[0]],
                                   rtol=1e-5, atol=1e-5, err_msg=f"seq {seq}")
        assert set(model.step_seconds()) == {g.name for g in model.plan.groups}
    with pytest.raises(RunError, match="input 'x' axis 1 is 65; the model takes \\[seq, 64\\]"):
        model.run({"x": np.zeros((3, 65), np.float32)})
    with pytest.raises(RunError, match="input 'x': dtype float64, graph expects float32"):
        model.run({"x": np.zeros((5, 64))})  # shapes seen before: the dtype is checked on every call all the same


def test_calls_at_different_sizes_at_once_each_get_their_own_answer() -> None:
    import threading

    graph = _norm_block()
    model = DynamicModel(optimize(graph))
    shapes = [(1, 5), (2, 9), (3, 17), (1, 64)]
    feeds = [{n: np.random.default_rng(i).standard_normal((b, s, 16)).astype(np.float32) for n in ("x", "r")}
             for i, (b, s) in enumerate(shapes)]
    expected = [model.run(f) for f in feeds]
    problems: list[str] = []

    def work(t: int) -> None:
        for j in range(30):
            i = (t + j) % len(feeds)
            try:
                got = model.run(feeds[i])
            except Exception as e:  # a thread's exception would not fail the test by itself
                problems.append(f"thread {t} call {j}: {type(e).__name__}: {e}")
                continue
            if any(not np.array_equal(got[o], expected[i][o]) for o in graph.outputs):
                problems.append(f"thread {t} call {j}: sizes {shapes[i]} differ")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert problems == []



def test_cores_are_chosen_for_a_typical_call_or_the_sizes_given() -> None:
    """Without sizes, a GEMM over run-time rows is chosen (and tuned) at 128 rows, not at the 512 x 128
    the bounds allow, and a convolution at one image; optimize(sizes=...) names the sizes instead."""
    from autofusion.models import build

    b = GraphBuilder("dense")
    x = b.input("x", (BATCH, SEQ, 64))
    w = b.const(np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32))
    graph = with_bounds(b.build([b.op("Relu", b.op("MatMul", x, w))]), {"seq": 512})

    def specs(plan: object) -> list[tuple[int, int]]:
        return [(spec.m, spec.calls) for k in render_plan(plan).kernels for spec, _ in k.cores]  # type: ignore[arg-type]

    assert specs(optimize(graph)) == [(128, 1)]
    assert specs(optimize(graph, sizes={"batch": 2, "seq": 300})) == [(600, 1)]
    cnn = optimize(build("resnet-tiny", dynamic=True))
    assert {spec.calls for k in render_plan(cnn).kernels for spec, _ in k.cores if spec.kind == "conv"} == {1}


def test_the_c_entry_points_place_the_workspace_themselves_or_take_offsets_kept() -> None:
    """af_run_sized places the workspace for each call's sizes; af_run_placed takes the offsets
    af_place_sized gave for them once (what CompiledModel keeps per binding): same results."""
    import ctypes

    from autofusion.codegen.buffers import aligned_empty
    from autofusion.runtime.loader import pointer_array

    graph = _norm_block()
    model = CompiledModel(optimize(graph))
    lib = ctypes.CDLL(str(model.library_path))
    lib.af_workspace_bytes_sized.restype = ctypes.c_int64
    lib.af_workspace_bytes_sized.argtypes = [ctypes.c_void_p]
    lib.af_create.argtypes = [ctypes.c_void_p]
    lib.af_run_sized.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int]
    lib.af_create.restype = ctypes.c_void_p
    consts = [np.ascontiguousarray(a) for _, a in model.source.constants]
    const_ptrs = pointer_array(consts)
    ctx = lib.af_create(ctypes.cast(const_ptrs, ctypes.c_void_p))
    try:
        for batch, seq in ((1, 3), (2, 40)):
            rng = np.random.default_rng(seq)
            feeds = {n: rng.standard_normal((batch, seq, 16)).astype(np.float32) for n in graph.inputs}
            want = model.run(feeds)
            sizes = np.array([{"batch": batch, "seq": seq}[s] for s in model.symbols], np.int64)
            workspace = aligned_empty(max(64, lib.af_workspace_bytes_sized(sizes.ctypes.data)))
            outs = [np.empty_like(want[o]) for o in graph.outputs]
            ins, out_ptrs = pointer_array([feeds[n] for n in graph.inputs]), pointer_array(outs)
            rc = lib.af_run_sized(ctx, sizes.ctypes.data, ctypes.cast(ins, ctypes.c_void_p),
                                  ctypes.cast(out_ptrs, ctypes.c_void_p), workspace.ctypes.data, 2)
            assert rc == 0
            for o, got in zip(graph.outputs, outs):
                np.testing.assert_array_equal(got, want[o])
    finally:
        lib.af_destroy.argtypes = [ctypes.c_void_p]
        lib.af_destroy(ctx)


def test_a_reduction_over_several_axes_of_symbolic_size_runs_them_as_loops_of_that_size() -> None:
    """Sums over N, H and W with N and H symbolic: the trailing axes are not run as one loop (their
    sizes are not known), and each axis's loop takes its symbolic bound."""
    b = GraphBuilder("channel_sums")
    x = b.input("x", (symbol("batch"), 5, symbol("h"), 7))
    graph = b.build([b.op("ReduceSum", b.op("Relu", x), b.const(np.array([0, 2, 3], np.int64)), keepdims=1)])
    model = CompiledModel(optimize(graph))
    rng = np.random.default_rng(3)
    for batch, h in ((3, 6), (2, 9)):
        feeds = {"x": rng.standard_normal((batch, 5, h, 7)).astype(np.float32)}
        want = run_graph(bind(graph, {"batch": batch, "h": h}), feeds)[graph.outputs[0]]
        np.testing.assert_allclose(model.run(feeds)[graph.outputs[0]], want, rtol=1e-5, atol=1e-5)


def test_a_run_on_the_callers_memory_matches_run_and_checks_every_shape() -> None:
    """run_addresses (the torch backend's call, no arrays made) gives run's numbers at each size of
    a symbolic library and of a static one, and refuses shapes the graph contradicts."""
    b = GraphBuilder("rows")
    x = b.input("x", (SEQ, 16))
    symbolic = CompiledModel(optimize(b.build([b.op("Relu", x)])))
    b = GraphBuilder("rows4")
    x = b.input("x", (4, 16))
    static = CompiledModel(optimize(b.build([b.op("Relu", x)])))
    for model, rows in ((symbolic, 3), (symbolic, 5), (static, 4)):
        feed = np.arange(-8 * rows, 8 * rows, dtype=np.float32).reshape(rows, 16)
        (shape,) = model.output_shapes([feed.shape])
        out = np.full(shape, np.nan, np.float32)
        model.run_addresses([feed.shape], [feed.ctypes.data], [out.ctypes.data])
        np.testing.assert_array_equal(out, model.run({"x": feed})[model.plan.graph.outputs[0]])
    with pytest.raises(RunError, match="input 'x' axis 1 is 15; the model takes \\[seq, 16\\]"):
        symbolic.output_shapes([(3, 15)])
    with pytest.raises(RunError, match="input 'x': shape \\(4, 15\\), graph expects \\(4, 16\\)"):
        static.run_addresses([(4, 15)], [0], [0])
    with pytest.raises(RunError, match="2 inputs given, the graph takes 1"):
        static.output_shapes([(4, 16), (4, 16)])
    with pytest.raises(RunError, match="2 output addresses, the graph has 1 outputs"):
        static.run_addresses([(4, 16)], [0], [0, 0])
    with pytest.raises(RunError, match="2 input addresses for 1 shapes"):
        static.run_addresses([(4, 16)], [0, 0], [0])
