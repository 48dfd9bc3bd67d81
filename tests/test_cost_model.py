"""Cost models: analytic monotonicity and sanity, the learned model and its file, the default choice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.decide.cost import (
    PROFILE_DIR,
    SHIPPED_CALIBRATION,
    AnalyticCostModel,
    CacheLevel,
    CostModel,
    GroupTerms,
    HardwareProfile,
    analytic_seconds,
    evaluations,
)
from autofusion.decide.default_model import calibration_file, default_cost_model
from autofusion.decide.learned import (
    FEATURES,
    Calibration,
    LearnedCostModel,
    fit_learned,
    fit_tree,
    load_calibration,
)
from autofusion.ir import DType, Graph, GraphBuilder

SHIPPED = sorted(p.stem for p in PROFILE_DIR.glob("*.json"))
UNARY = ("Relu", "Exp", "Tanh", "Neg", "Sigmoid", "Abs")


def profiles() -> list[HardwareProfile]:
    return [HardwareProfile.load(n) for n in SHIPPED] + [load_calibration(SHIPPED_CALIBRATION).profile]


def pointwise_chain(ops: list[str], shape: tuple[int, ...], side_inputs: list[bool]) -> Graph:
    b = GraphBuilder("chain")
    t = b.input("x", shape)
    for i, (op, side) in enumerate(zip(ops, side_inputs)):
        t = b.op("Add", t, b.input(f"s{i}", shape)) if side else b.op(op, t)
    return b.build([t])


def test_shipped_profiles_load_and_bandwidth_never_rises_with_the_level() -> None:
    assert {"cpu-2core", "nvidia-h200"} <= set(SHIPPED)
    for p in profiles():
        assert p.peak_flops > 0 and p.launch_seconds >= 0 and p.sync_seconds >= 0
        sizes = [c.bytes for c in p.caches]
        assert sizes == sorted(sizes)
        assert all(a >= b for a, b in zip(p.bandwidths, p.bandwidths[1:])), p.name


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 1 << 34), st.integers(0, 1 << 34), st.floats(0, 1e13), st.floats(0, 1e13))
def test_more_bytes_or_flops_never_cheaper(b1: int, b2: int, f1: float, f2: float) -> None:
    lo_b, hi_b = sorted((b1, b2))
    lo_f, hi_f = sorted((f1, f2))
    for p in profiles():
        small = analytic_seconds(GroupTerms(lo_b, 0, 0, lo_f, lo_f, 1), p).total
        more_bytes = analytic_seconds(GroupTerms(hi_b, 0, 0, lo_f, lo_f, 1), p).total
        more_flops = analytic_seconds(GroupTerms(lo_b, 0, 0, hi_f, hi_f, 1), p).total
        assert more_bytes >= small and more_flops >= small


@pytest.mark.parametrize("name", SHIPPED)
def test_a_bigger_tensor_never_costs_less(name: str) -> None:
    model = AnalyticCostModel(HardwareProfile.load(name))
    previous = 0.0
    for n in [1, 7, 64, 1000, 24_000, 25_000, 500_000, 1 << 22, 1 << 26]:
        g = pointwise_chain(["Exp", "Tanh"], (n,), [False, True])
        seconds = model.group_cost(g, [x.name for x in g.nodes]).seconds
        assert seconds >= previous
        previous = seconds


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(UNARY), min_size=2, max_size=7), st.lists(st.booleans(), min_size=7, max_size=7),
       st.integers(1, 5000), st.data())
def test_fusing_a_pointwise_chain_never_costs_more_bytes(ops: list[str], sides: list[bool], n: int, data) -> None:
    g = pointwise_chain(ops, (n,), sides)
    names = [x.name for x in g.nodes]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(names) - 1))))
    parts = [names[a:b] for a, b in zip([0, *cuts], [*cuts, len(names)])]
    for p in profiles():
        model = AnalyticCostModel(p)
        fused = model.group_cost(g, names)
        apart = [model.group_cost(g, part) for part in parts]
        assert fused.bytes <= sum(c.bytes for c in apart)
        assert fused.flops == sum(c.flops for c in apart)  # no broadcast: nothing recomputed
        single_level = p.replace(caches=())
        plain = AnalyticCostModel(single_level)
        assert plain.group_cost(g, names).seconds <= sum(plain.group_cost(g, part).seconds for part in parts) + 1e-15


def test_terms_name_saved_bytes_and_recomputation() -> None:
    b = GraphBuilder("bcast")
    x = b.input("x", (64, 256))
    s = b.input("s", (64, 1))
    heavy = b.op("Tanh", b.op("Exp", s))
    g = b.build([b.op("Mul", x, heavy)])
    model = AnalyticCostModel()
    names = [n.name for n in g.nodes]
    fused = model.terms(g, names)
    assert fused.recompute_flops > 0  # the per-row chain is evaluated once per column
    assert fused.intermediate_bytes == 2 * 64 * 4  # exp and tanh outputs stay in registers
    alone = [model.terms(g, [n]) for n in names]
    assert sum(t.recompute_flops for t in alone) == 0 and sum(t.intermediate_bytes for t in alone) == 0
    parts = model.seconds(g, names)
    assert parts.total == pytest.approx(model.group_cost(g, names).seconds)
    assert parts.launch == model.profile.launch_seconds and parts.sync == model.profile.sync_seconds


def test_a_reduction_read_by_every_element_is_computed_once_per_row() -> None:
    # x - mean(x * 2): the mean is read at every element of the row, but a reduction's statistics
    # are computed once per row (codegen/loopnest.py), so its prologue is not evaluated per reader
    b = GraphBuilder("centred")
    x = b.input("x", (64, 256))
    doubled = b.op("Mul", x, b.const(np.float32(2.0)))
    mean = b.op("ReduceMean", doubled, b.const(np.array([-1], np.int64)), keepdims=1)
    g = b.build([b.op("Sub", x, mean)])
    terms = AnalyticCostModel().terms(g, [n.name for n in g.nodes])
    assert terms.recompute_flops == 0
    assert terms.flops <= 3 * 64 * 256


def test_what_is_computed_from_a_rows_statistic_and_sibling_reductions_are_priced_once() -> None:
    # x - 0.5 * sum(x * 2) and max(x * 2) over the same rows: the scaled sum is a per-row value
    # (computed once a row, not at each element reading it), and the two reductions read x * 2 in
    # one pass
    b = GraphBuilder("siblings")
    x = b.input("x", (64, 256))
    axes = b.const(np.array([-1], np.int64))
    doubled = b.op("Mul", x, b.const(np.float32(2.0)))
    total = b.op("ReduceSum", doubled, axes, keepdims=1)
    other = b.op("ReduceMax", doubled, axes, keepdims=1)
    g = b.build([b.op("Sub", x, b.op("Mul", total, b.const(np.float32(0.5)))), other])
    model = AnalyticCostModel()
    demand = evaluations(g, [n.name for n in g.nodes], model.work(g))
    scaled = next(n.name for n in g.nodes if n.op == "Mul" and g.types[n.outputs[0]].shape == (64, 1))
    assert demand[scaled] == 64  # once a row
    assert demand[g.producers[doubled].name] == 64 * 256  # one pass for both sums


def test_a_convolution_under_a_pooling_op_is_priced_in_its_kernel() -> None:
    """Conv -> Relu -> MaxPool as one kernel (codegen/conv.py computes the convolution's rows and pools
    them): the convolution and the activation are computed once, though nothing reads them but an
    opaque op. Their demand was 0, so ResNet-18's stem kernel was priced at its pooling alone (0.04 ms
    predicted, 0.97 ms measured; Xeon, 2 threads)."""
    b = GraphBuilder("stem")
    x = b.input("x", (1, 3, 32, 32))
    conv = b.op("Conv", x, b.const(np.ones((16, 3, 7, 7), np.float32)), pads=(3, 3, 3, 3), strides=(2, 2))
    g = b.build([b.op("MaxPool", b.op("Relu", conv), kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))])
    model = AnalyticCostModel()
    names = [n.name for n in g.nodes]
    demand = evaluations(g, names, model.work(g))
    assert demand[names[0]] == demand[names[1]] == 16 * 16 * 16  # each of their outputs once
    conv_alone = model.terms(g, names[:1])
    fused = model.terms(g, names)
    assert fused.matmul_flops >= conv_alone.matmul_flops > 0
    assert fused.flops >= conv_alone.flops + 16 * 16 * 16  # the Relu's too


def test_views_cost_nothing() -> None:
    b = GraphBuilder("view")
    x = b.input("x", (4, 8))
    g = b.build([b.op("Reshape", x, b.const(np.array([32], np.int64)))])
    cost = AnalyticCostModel().group_cost(g, [g.nodes[0].name])
    assert (cost.seconds, cost.bytes, cost.launches) == (0.0, 0, 0)


def test_profile_json_round_trip_and_errors(tmp_path: Path) -> None:
    p = HardwareProfile("mine", 1e12, (CacheLevel("L1", 1024, 1e12),), 1e11, 1e-6, 2e-6, "a test profile")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(p.to_json()))
    assert HardwareProfile.load(path) == p
    with pytest.raises(ValueError, match="not found"):
        HardwareProfile.load("no-such-machine")
    path.write_text('{"name": "x"}')
    with pytest.raises(ValueError, match="malformed"):
        HardwareProfile.load(path)


def test_regression_tree_finds_a_step() -> None:
    x = np.array([[float(i), float(i % 3)] for i in range(40)])
    y = np.where(x[:, 0] > 19.5, 2.0, -1.0)
    tree = fit_tree(x, y, depth=2, min_leaf=3)
    assert tree.feature[0] == 0 and 19 <= tree.threshold[0] <= 20
    assert [tree.predict_one(row) for row in x] == pytest.approx(y.tolist())


def _synthetic_fit(seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(80, len(FEATURES)))
    target = 0.5 * x[:, 0] - 0.3 * x[:, 3] + np.where(x[:, 8] > 0.2, 0.7, -0.2)
    return x, target, fit_learned(x, target, rounds=60)


def test_learned_fit_explains_its_training_data() -> None:
    x, target, params = _synthetic_fit()
    predicted = np.array([params.correction(row) for row in x])
    assert np.corrcoef(predicted, target)[0, 1] > 0.95
    assert params.clip == (pytest.approx(target.min()), pytest.approx(target.max()))
    assert params.correction([1e6] * len(FEATURES)) <= params.clip[1]  # far outside: clipped


def test_learned_model_round_trips_through_its_file(tmp_path: Path) -> None:
    _, _, params = _synthetic_fit(1)
    profile = HardwareProfile.load("cpu-2core")
    cal = Calibration(profile, params, "learned", {"learned": {"kendall_tau": 0.9}}, {"cpu": "test"})
    path = cal.save(tmp_path / "cal.json")
    loaded = load_calibration(path)
    assert loaded.learned == params and loaded.profile == profile and loaded.default == "learned"
    assert "pickle" not in path.read_text() and json.loads(path.read_text())["format"] == "autofusion-calibration"
    g = pointwise_chain(["Exp", "Relu", "Tanh"], (3000,), [False, True, False])
    names = [n.name for n in g.nodes]
    before = cal.cost_model().group_cost(g, names)
    after = loaded.cost_model().group_cost(g, names)
    assert before == after and after.model == "learned:cpu-2core"
    assert isinstance(loaded.cost_model(), CostModel) and isinstance(loaded.cost_model(), LearnedCostModel)
    assert loaded.cost_model("analytic").group_cost(g, names).model == "analytic:cpu-2core"
    with pytest.raises(ValueError, match="unknown cost model kind"):
        loaded.cost_model("psychic")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="other"), "not an autofusion-calibration"),
    (lambda d: d.update(version=99), "version"),
    (lambda d: d["learned"].update(features=["a"]), "features"),
    (lambda d: d["learned"]["trees"][0].update(left=[5, 9, 9]), "tree"),
    (lambda d: d.update(default_model="magic"), "default_model"),
    (lambda d: d.pop("profile"), "malformed"),
])
def test_malformed_calibration_files_are_named_errors(tmp_path: Path, mutate, message: str) -> None:
    _, _, params = _synthetic_fit(2)
    data = Calibration(HardwareProfile.load("cpu-2core"), params).to_json()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        load_calibration(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_calibration(path)


def test_shipped_calibration_loads_by_name_and_names_its_model(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AUTOFUSION_CALIBRATION", raising=False)
    monkeypatch.setenv("AUTOFUSION_CACHE", str(tmp_path))  # no user calibration there
    assert calibration_file() is None and default_cost_model().name == "analytic:cpu-2core"
    monkeypatch.setenv("AUTOFUSION_CALIBRATION", str(SHIPPED_CALIBRATION))
    assert calibration_file() == SHIPPED_CALIBRATION
    shipped = load_calibration(SHIPPED_CALIBRATION)
    model = default_cost_model()
    assert model.name == f"{shipped.default}:{shipped.profile.name}"
    assert getattr(model, "source", "") == str(SHIPPED_CALIBRATION)
    # the shipped standalone profile holds the calibrated constants
    assert HardwareProfile.load("cpu-2core") == shipped.profile


def test_user_and_environment_calibrations_take_precedence(monkeypatch, tmp_path: Path) -> None:
    _, _, params = _synthetic_fit(3)
    monkeypatch.delenv("AUTOFUSION_CALIBRATION", raising=False)
    monkeypatch.setenv("AUTOFUSION_CACHE", str(tmp_path))
    user = Calibration(HardwareProfile.load("nvidia-h200"), params, "analytic").save(tmp_path / "calibration.json")
    assert calibration_file() == user
    assert default_cost_model().name == "analytic:nvidia-h200"
    other = Calibration(HardwareProfile.load("cpu-2core").replace(name="elsewhere"), params).save(tmp_path / "o.json")
    monkeypatch.setenv("AUTOFUSION_CALIBRATION", str(other))
    assert default_cost_model().name == "learned:elsewhere"
    monkeypatch.setenv("AUTOFUSION_CALIBRATION", "none")
    assert calibration_file() is None and default_cost_model().name == "analytic:cpu-2core"
    monkeypatch.setenv("AUTOFUSION_CALIBRATION", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="not a file"):
        default_cost_model()


def test_a_broken_user_calibration_falls_back_with_a_warning(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AUTOFUSION_CALIBRATION", raising=False)
    monkeypatch.setenv("AUTOFUSION_CACHE", str(tmp_path))
    (tmp_path / "calibration.json").write_text("[]")
    with pytest.warns(RuntimeWarning, match="uncalibrated"):
        model = default_cost_model()
    assert model.name == "analytic:cpu-2core"


def test_optimize_uses_the_default_model_and_the_plan_names_it(monkeypatch, tmp_path: Path) -> None:
    from autofusion.api import optimize

    monkeypatch.setenv("AUTOFUSION_CALIBRATION", str(SHIPPED_CALIBRATION))
    monkeypatch.setenv("AUTOFUSION_CACHE", str(tmp_path))
    b = GraphBuilder("small")
    x = b.input("x", (32, 64), DType.FLOAT32)
    g = b.build([b.op("Tanh", b.op("Exp", b.op("Relu", x)))])
    plan = optimize(g)
    expected = default_cost_model().name
    assert plan.stats["cost_model"] == expected
    assert plan.stats["cost_model_source"] == str(SHIPPED_CALIBRATION)
    assert {grp.cost.model for grp in plan.groups} == {expected}
    assert plan.cost_after.seconds <= plan.cost_before.seconds * (1 + 1e-9)


def test_learned_correction_only_inside_the_fitted_structure() -> None:
    _, _, params = _synthetic_fit(4)
    profile = HardwareProfile.load("cpu-2core")
    model = LearnedCostModel(params, profile)
    g = pointwise_chain(["Exp", "Relu"], (512,), [False, False])
    names = [n.name for n in g.nodes]
    x = model.features(g, names)
    assert len(x) == len(FEATURES)
    wide = type(params)(**{**params.__dict__, "lower": tuple(-1e9 for _ in FEATURES),
                           "upper": tuple(1e9 for _ in FEATURES)})
    narrow = type(params)(**{**params.__dict__, "upper": tuple(-1e9 for _ in FEATURES)})
    assert wide.in_domain(x) and not narrow.in_domain(x)
    analytic = AnalyticCostModel(profile).group_cost(g, names).seconds
    assert LearnedCostModel(narrow, profile).group_cost(g, names).seconds == pytest.approx(analytic)
    assert LearnedCostModel(wide, profile).group_cost(g, names).seconds == pytest.approx(
        analytic * np.exp(wide.correction(x)))


def test_a_core_streams_its_weight_at_the_measured_stream_speed(tmp_path: Path) -> None:
    b = GraphBuilder("gemv")
    x = b.input("x", (1, 512))
    w = b.const(np.ones((512, 2048), np.float32))
    y = b.op("MatMul", x, w)
    g = b.build([b.op("Add", y, b.const(np.ones(2048, np.float32)))])
    core, bias = g.nodes[0].name, g.nodes[1].name
    slow = HardwareProfile("slow", 1e13, (CacheLevel("L1", 1 << 15, 1e11), CacheLevel("L2", 1 << 25, 1e10)),
                           5e9, 0.0, 0.0)
    streaming = slow.replace(stream_bandwidths=(2e11, 4e10))
    terms = AnalyticCostModel(slow).terms(g, [core])
    assert terms.streamed_const == terms.const_traffic == 512 * 2048 * 4  # the weight, read by the core
    assert AnalyticCostModel(slow).terms(g, [bias]).streamed_const == 0  # a bias added by a loop nest
    weight_seconds = 512 * 2048 * 4 / 4e10  # 4 MiB of weights: in L2, streamed at 40 GB/s, not 10
    other = (terms.traffic - terms.const_traffic) / 1e10
    assert analytic_seconds(terms, streaming).memory == pytest.approx(weight_seconds + other)
    assert analytic_seconds(terms, slow).memory == pytest.approx(terms.traffic / 1e10)
    # beyond the caches, weights come at the fitted DRAM speed either way
    assert streaming.stream_bandwidth_for(1 << 30) == streaming.bandwidth_for(1 << 30) == 5e9
    path = tmp_path / "streaming.json"
    path.write_text(json.dumps(streaming.to_json()))
    assert HardwareProfile.load(path) == streaming
    assert "stream_bandwidths" not in slow.to_json()
    with pytest.raises(ValueError, match="2 cache levels"):
        slow.replace(stream_bandwidths=(1e11,))
    path.write_text(json.dumps({**streaming.to_json(), "stream_bandwidths": [1e11]}))
    with pytest.raises(ValueError, match="malformed"):
        HardwareProfile.load(path)


def test_a_model_measured_on_another_cpu_says_to_calibrate(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from autofusion.cli.main import main
    from autofusion.codegen import cores
    from autofusion.decide.summary import cost_model_text

    stats = {"cost_model": "analytic:cpu-2core", "cost_model_source": "shipped profile cpu-2core",
             "cost_model_fitted_on": "AMD EPYC"}
    assert "measured on AMD EPYC, not this CPU (Intel Xeon)" in cost_model_text(stats, "Intel Xeon")
    assert cost_model_text(stats, "AMD EPYC") == "analytic:cpu-2core, shipped profile cpu-2core"
    assert "calibrate" not in cost_model_text({**stats, "cost_model_fitted_on": ""}, "Intel Xeon")
    assert HardwareProfile.load("cpu-2core").fitted_on == "AMD EPYC"  # the shipped constants say where from
    assert load_calibration(SHIPPED_CALIBRATION).profile.fitted_on == "AMD EPYC"
    monkeypatch.setenv("AUTOFUSION_CALIBRATION", "none")
    monkeypatch.setattr(cores, "cpu_model", lambda: "Some Other CPU")
    assert main(["fuse", "bert-tiny"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "measured on AMD EPYC, not this CPU (Some Other CPU): `autofusion calibrate` fits them here" in text
    monkeypatch.setattr(cores, "cpu_model", lambda: "AMD EPYC")
    assert main(["fuse", "bert-tiny"]) == 0
    assert "autofusion calibrate" not in capsys.readouterr().out
