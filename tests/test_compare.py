"""``autofusion compare``: every strategy under every cost model, predicted and measured side by side."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autofusion.api import optimize
from autofusion.bench.compare import PlanRow, scatter_svg
from autofusion.cli.main import main
from autofusion.codegen import render_plan
from autofusion.decide.cost import HardwareProfile
from autofusion.models import build
from autofusion.plugins import cost_model


def compare(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    code = main(["compare", *argv, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_predictions_per_strategy_and_cost_model(capsys: pytest.CaptureFixture[str]) -> None:
    data = compare(capsys, "bert-tiny", "--strategies", "greedy,dp", "--cost-models", "analytic,analytic:nvidia-h200")
    rows = data["rows"]
    assert [(r["strategy"], r["cost_model"]) for r in rows] == [
        ("greedy", "analytic:cpu-2core"), ("dp", "analytic:cpu-2core"),
        ("greedy", "analytic:nvidia-h200"), ("dp", "analytic:nvidia-h200")]
    graph = build("bert-tiny")
    plan = optimize(graph, strategy="greedy", cost_model=cost_model("analytic"))
    first = rows[0]
    assert first["kernels"] == plan.kernels and first["predicted_seconds"] == pytest.approx(plan.cost_after.seconds)
    buffers = render_plan(plan).buffers
    assert buffers is not None and first["predicted_peak_bytes"] == buffers.footprint(2)  # the buffer planner's
    cpu = HardwareProfile.load("cpu-2core")
    assert first["predicted_joules"] == pytest.approx(cpu.joules(plan.cost_after.seconds, plan.cost_after.bytes))
    assert first["measured_seconds"] is None and data["summary"] == {"measured": 0}
    assert "Horowitz" in data["energy_sources"]["analytic:cpu-2core"]  # the constants' source is named
    assert all(r["optimize_seconds"] > 0 for r in rows)


def test_measured_plans_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = compare(capsys, "lstm-tiny", "--strategies", "greedy,beam", "--cost-models", "analytic", "--measure",
                   "--rounds", "1", "--no-tune", "--html", str(tmp_path))
    rows = data["rows"]
    assert data["measured"] and all(r["measured_seconds"] > 0 and r["runtime_peak_bytes"] > 0 for r in rows)
    for r in rows:
        assert r["time_error"] == pytest.approx((r["predicted_seconds"] - r["measured_seconds"]) / r["measured_seconds"])
    assert data["summary"]["measured"] == len(rows)
    best = min(r["measured_seconds"] for r in rows)
    greedy = next(r for r in rows if r["strategy"] == "greedy")
    assert data["summary"]["default_strategy_regret"] == {
        "analytic:cpu-2core": pytest.approx(greedy["measured_seconds"] / best - 1)}
    assert all(r["predicted_seconds_tuned_cores"] is None for r in rows)  # --no-tune: no measured core rate
    page = (tmp_path / "compare.html").read_text()
    assert page.count('<circle class="plan"') == len({r["plan_id"] for r in rows}) and "<table>" in page
    assert main(["compare", "lstm-tiny", "--strategies", "greedy,beam", "--cost-models", "analytic", "--measure",
                 "--rounds", "1", "--no-tune"]) == 0
    assert "the default strategy's plan under analytic:cpu-2core: +" in capsys.readouterr().out


def test_the_text_table(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.codegen import cores

    monkeypatch.setattr(cores, "cpu_model", lambda: "Some Other CPU")
    assert main(["compare", "bert-tiny", "--strategies", "greedy", "--cost-models", "analytic"]) == 0
    out = capsys.readouterr().out
    assert "plans of bert-tiny (2 threads)" in out and re.search(r"greedy\s+analytic:cpu-2core\s+\d+", out)
    assert "energy of analytic:cpu-2core: cpu-2core: 7.5 W" in out
    assert "analytic:cpu-2core: its constants were measured on AMD EPYC, not this CPU (Some Other CPU)" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--strategies", "nope"], "unknown strategy 'nope'"),
    (["--cost-models", "nope"], "unknown cost model 'nope'"),
    (["--strategies", ","], "--strategies names nothing"),
])
def test_bad_options_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code = main(["compare", "bert-tiny", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_energy_is_time_at_package_power_plus_traffic() -> None:
    cpu = HardwareProfile.load("cpu-2core")
    assert cpu.package_watts > 0 and cpu.joules_per_byte > 0 and cpu.energy_source
    assert cpu.joules(2.0, 1e9) == pytest.approx(2.0 * cpu.package_watts + 1e9 * cpu.joules_per_byte)
    assert HardwareProfile.from_json(cpu.to_json()) == cpu


def test_no_measurement_draws_no_plot() -> None:
    row = PlanRow("greedy", "analytic", "", 3, 1e-3, 10, 1e-2, 0.1, 0)
    assert scatter_svg([row]) == "" and row.time_error is None


def one_matmul_onnx(path: Path) -> Path:
    """x @ w + b -> Relu, large enough (2 x 64 x 512 x 512 FLOP) for the tuner to measure its core."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 512])], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_tuned_cores_price_the_plan_again(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.bench.compare import plan_seconds, with_core_rate
    from autofusion.frontends.onnx_import import load_onnx

    monkeypatch.setenv("AUTOFUSION_TUNE", "1")
    monkeypatch.setenv("AUTOFUSION_CACHE", str(tmp_path / "cache"))  # a tuning cache of this test's own
    model = one_matmul_onnx(tmp_path / "dense.onnx")
    data = compare(capsys, str(model), "--strategies", "greedy", "--cost-models", "analytic", "--measure",
                   "--rounds", "1")
    (row,) = data["rows"]
    rate = row["tuned_core_flops_per_second"]
    assert rate is not None and rate > 1e8  # the tuner measured the plan's matrix product here
    plan = optimize(load_onnx(str(model)), strategy="greedy", cost_model=cost_model("analytic"))
    priced = with_core_rate(cost_model("analytic"), rate)
    assert priced is not None and row["predicted_seconds_tuned_cores"] == pytest.approx(plan_seconds(plan, priced))
    assert row["tuned_time_error"] == pytest.approx(
        (row["predicted_seconds_tuned_cores"] - row["measured_seconds"]) / row["measured_seconds"])
    from dataclasses import replace

    from autofusion.decide.cost import SHIPPED_CALIBRATION
    from autofusion.decide.learned import load_calibration

    learned_file = tmp_path / "learned.json"  # the shipped calibration, its learned model the default
    replace(load_calibration(SHIPPED_CALIBRATION), default="learned").save(learned_file)
    monkeypatch.setenv("AUTOFUSION_CALIBRATION", str(learned_file))  # a learned model: repriced too
    learned = compare(capsys, str(model), "--strategies", "greedy", "--cost-models", "default", "--measure",
                      "--rounds", "1")["rows"][0]
    assert learned["cost_model"].startswith("default (learned") and learned["predicted_seconds_tuned_cores"]


def test_the_unfused_plan_is_priced_by_the_same_model(capsys: pytest.CaptureFixture[str]) -> None:
    from autofusion.decide.optimize import graph_kernels

    data = compare(capsys, "bert-tiny", "--strategies", "unfused,greedy", "--cost-models", "analytic")
    unfused, fused = data["rows"]
    graph = build("bert-tiny")
    model = cost_model("analytic")
    assert unfused["strategy"] == "unfused" and unfused["kernels"] == graph_kernels(graph)
    assert unfused["predicted_seconds"] == pytest.approx(sum(model.group_cost(graph, [n.name]).seconds
                                                             for n in graph.nodes))
    assert fused["kernels"] < unfused["kernels"] and unfused["plan_id"] != fused["plan_id"]


def test_round_robin_timing_runs_every_runner_each_round() -> None:
    from autofusion.bench.timing import round_robin_medians

    calls = {"a": 0, "b": 0}

    def runner(key: str):  # type: ignore[no-untyped-def]
        return lambda: calls.__setitem__(key, calls[key] + 1)

    medians = round_robin_medians({"a": runner("a"), "b": runner("b")}, rounds=3, min_seconds=0.0, pause_seconds=0,
                                  wake_seconds=0)
    # each round: one untimed call after the pause, then the timed ones
    assert set(medians) == {"a", "b"} and calls == {"a": 6, "b": 6} and all(v >= 0 for v in medians.values())


def test_round_robin_timing_pauses_before_each_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner's threads may spin after its calls (after numpy's OpenBLAS the next runner ran 4x
    slower for 100 ms here): every runner's block starts after a pause and untimed calls."""
    from autofusion.bench import timing

    events: list[str] = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append(f"sleep {s}"))
    timing.round_robin_medians({"a": lambda: events.append("a"), "b": lambda: events.append("b")}, rounds=2,
                               min_seconds=0.0, pause_seconds=0.25, wake_seconds=0)
    assert events == ["sleep 0.25", "a", "a", "sleep 0.25", "b", "b"] * 2


def test_round_robin_pauses_past_spinning_pools_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's OpenBLAS and onnxruntime's pools spun for 50-100 ms after their last call here: the
    default pause outlasts them."""
    from autofusion.bench import timing

    slept: list[float] = []
    monkeypatch.setattr(timing.time, "sleep", slept.append)
    timing.round_robin_medians({"a": lambda: None}, rounds=2, min_seconds=0.0, wake_seconds=0)
    assert len(slept) == 2 and all(s >= 0.15 for s in slept)


def test_wake_calls_until_its_time_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.bench import timing

    clock = iter(range(100))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))
    calls: list[int] = []
    timing.wake(lambda: calls.append(1), seconds=3.5)  # starts at 0; calls while the clock reads < 3.5
    assert len(calls) == 4
    calls.clear()
    timing.wake(lambda: calls.append(1), seconds=0)  # at least once
    assert len(calls) == 1
