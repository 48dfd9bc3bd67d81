"""The benchmark harness and ``autofusion bench``: runners, output checks, JSON keys, ratios, skips.

Runs on tiny models with one timed run; no assertion depends on how long anything took.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from autofusion import models
from autofusion.bench import RUNNER_NAMES, BenchSetup, Runner, RunnerSkipped, prepare, run_bench, to_json
from autofusion.bench.environment import limit_threads, peak_rss_delta, peak_traced
from autofusion.bench.opaque import OPAQUE_CORES, time_ops
from autofusion.bench.quality import RegionCosts, region_costs, summarise
from autofusion.bench.random_graphs import random_graph
from autofusion.cli.main import main
from autofusion.decide import unfused_plan
from autofusion.ir.interpreter import run_graph
from autofusion.ops.catalog import default_registry

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_ORT = importlib.util.find_spec("onnxruntime") is not None
ROOT = Path(__file__).resolve().parent.parent
FAST = ["--repeat", "1", "--warmup", "0", "--pause", "0"]


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[int, dict, str]]:
    """One bench run per tiny model, shared by the tests below: bert-tiny with a process per runner
    (the default), resnet-tiny in-process. torch.compile is left out: it is tested on its own on a
    small graph, its compile alone would take most of the test budget."""
    out = {}
    for model, isolation in (("bert-tiny", []), ("resnet-tiny", ["--in-process"])):
        with pytest.MonkeyPatch.context() as mp:
            captured: list[str] = []
            mp.setattr(sys, "stdout", _Sink(captured))
            code = main(["bench", model, *FAST, "--json", "--skip", "torch_compile", *isolation])
        out[model] = (code, json.loads("".join(captured)), "")
    return out


class _Sink:
    def __init__(self, into: list[str]) -> None:
        self.into = into

    def write(self, text: str) -> int:
        self.into.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


MODELS = ("bert-tiny", "resnet-tiny")


@pytest.mark.parametrize("model", MODELS)
def test_every_runner_ran_or_says_why(runs: dict, model: str) -> None:
    code, data, _ = runs[model]
    assert code == 0
    ran = set(data["runners"])
    assert {"reference", "unfused", "fused"} <= ran
    assert ran | set(data["skipped"]) | set(data["failed"]) == set(RUNNER_NAMES)
    assert not data["failed"]
    assert data["skipped"]["torch_compile"] == "left out by --skip"
    for name in ("ort_disable", "ort_all"):
        assert (name in ran) == HAS_ORT
        if not HAS_ORT:
            assert "onnxruntime is not installed" in data["skipped"][name]
    assert ("torch_eager" in ran) == HAS_TORCH
    if not HAS_TORCH:
        assert "torch is not installed" in data["skipped"]["torch_eager"]


@pytest.mark.parametrize("model", MODELS)
def test_runner_entries_have_the_documented_keys_and_checked_outputs(runs: dict, model: str) -> None:
    _, data, _ = runs[model]
    for name, r in data["runners"].items():
        assert {"median_ms", "peak_bytes", "kernels"} <= set(r), name
        assert r["median_ms"] > 0 and len(r["times_ms"]) == 1
        assert r["outputs_ok"], (name, r["check"])
        assert r["max_abs_error"] < 1e-3
        assert r["peak_method"].split(":")[0] in ("planned", "rss", "tracemalloc")
    assert data["outputs_ok"] and data["mismatches"] == []
    assert data["max_abs_error"] == data["runners"]["fused"]["max_abs_error"]
    assert data["runners"]["reference"]["max_abs_error"] == 0.0
    for name in ("unfused", "fused"):
        r = data["runners"][name]
        assert isinstance(r["outside_opaque_ms"], float), r["outside_opaque_method"]
        assert r["opaque_core_ms"] > 0 and 0 < r["opaque_core_best_ms"] <= r["opaque_core_ms"]
    fused = data["runners"]["fused"]
    assert fused["outside_opaque_method"].startswith("measured per kernel")
    assert fused["kernels_without_core_ms"] > 0 and fused["kernels_with_core_ms"] > 0
    assert fused["outside_opaque_ms"] >= fused["kernels_without_core_ms"]
    assert isinstance(fused["outside_opaque_estimate_ms"], float)  # the older whole-run estimate, kept to compare
    assert data["runners"]["unfused"]["outside_opaque_method"].startswith("measured")


@pytest.mark.parametrize("model", MODELS)
def test_kernels_and_memory_come_from_the_plan(runs: dict, model: str) -> None:
    _, data, _ = runs[model]
    r = data["runners"]
    assert r["fused"]["kernels"] == data["plan"]["kernels_after"]
    assert r["unfused"]["kernels"] == data["plan"]["kernels_before"]
    assert r["reference"]["kernels"] is None
    assert r["fused"]["peak_method"].startswith("planned") and r["unfused"]["peak_method"].startswith("planned")
    assert r["fused"]["peak_bytes"] > 0 and r["unfused"]["peak_bytes"] > 0
    for name in ("fused", "unfused"):  # with each thread's blocks of the kernel that has the largest
        entry = r[name]
        assert entry["footprint_bytes"] == entry["peak_bytes"] + data["threads"] * entry["thread_block_bytes"]
    if HAS_ORT:
        assert r["ort_disable"]["kernels"] == r["unfused"]["kernels"]  # the same graph, nothing fused
        assert r["ort_all"]["kernels"] <= r["ort_disable"]["kernels"]


@pytest.mark.parametrize("model", MODELS)
def test_ratios_agree_with_the_runner_numbers(runs: dict, model: str) -> None:
    _, data, _ = runs[model]
    r, ratios = data["runners"], data["ratios"]
    fused_ms = r["fused"]["median_ms"]
    assert set(ratios["fused_speedup"]) == set(r) - {"fused"}
    for name, speedup in ratios["fused_speedup"].items():
        assert math.isclose(speedup, r[name]["median_ms"] / fused_ms, rel_tol=1e-9)
    for name, speedup in ratios["fused_speedup_best"].items():
        assert math.isclose(speedup, r[name]["min_ms"] / r["fused"]["min_ms"], rel_tol=1e-9)
        assert r[name]["min_ms"] == min(r[name]["times_ms"])
    assert math.isclose(ratios["peak_bytes_fused_over_unfused"], r["fused"]["peak_bytes"] / r["unfused"]["peak_bytes"])
    assert math.isclose(ratios["kernels_fused_over_unfused"], r["fused"]["kernels"] / r["unfused"]["kernels"])
    assert math.isclose(ratios["outside_opaque_unfused_over_fused"],
                        r["unfused"]["outside_opaque_ms"] / r["fused"]["outside_opaque_ms"])
    assert math.isclose(ratios["outside_opaque_best_unfused_over_fused"],
                        r["unfused"]["outside_opaque_best_ms"] / r["fused"]["outside_opaque_best_ms"])
    if HAS_ORT:
        assert math.isclose(ratios["kernels_fused_over_ort_all"], r["fused"]["kernels"] / r["ort_all"]["kernels"])


def test_json_records_the_conditions(runs: dict) -> None:
    assert runs["resnet-tiny"][1]["isolation"] == "in-process"
    _, data, _ = runs["bert-tiny"]
    assert data["isolation"] == "one process per runner"
    assert data["threads"] == 2 and data["repeat"] == 1 and data["warmup"] == 0
    assert "OMP_NUM_THREADS=2" in data["thread_limits"]
    assert data["machine"]["cpus_usable"] >= 1
    assert data["inputs"] == {"input_ids": [1, 16], "attention_mask": [1, 16], "token_type_ids": [1, 16]}
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "bert-tiny", *FAST, "--runners", "reference,fused", "--in-process"])
    out = capsys.readouterr().out
    assert code == 0
    assert "median ms" in out and "fused" in out and "reference" in out
    assert "skipped unfused: not in --runners" in out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_goes_to_a_terminal_stderr_only(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["bench", "bert-tiny", *FAST, "--runners", "fused", "--json", "--in-process"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["runners"]["fused"]["outputs_ok"]
    assert terminal.getvalue()  # rich drew (and, being transient, erased) its bar there


@pytest.mark.parametrize("argv, message", [
    (["--runners", "fused,nope"], "unknown runner nope"),
    (["--skip", "reference,unfused,fused,ort_disable,ort_all,torch_eager,torch_compile"], "no runner left"),
    (["--pause", "-1"], "--pause must be a non-negative number"),
    (["--rtol", "nan"], "--rtol must be a non-negative number"),
])
def test_bad_options_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code = main(["bench", "bert-tiny", *argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_mismatch_is_loud_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "bert-tiny", *FAST, "--runners", "unfused", "--rtol", "0", "--atol", "1e-12", "--json",
                 "--in-process"])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    if data["runners"]["unfused"]["max_abs_error"] == 0.0:
        pytest.fail("the compiled kernels matched the interpreter bit for bit; pick a model where they do not")
    assert code == 1
    assert data["mismatches"] == ["unfused"] and not data["outputs_ok"]
    assert "OUTPUT MISMATCH: unfused differs from the reference" in captured.err


@pytest.fixture(scope="module")
def tiny_setup() -> BenchSetup:
    from autofusion.api import optimize

    g = models.build("bert-tiny")
    return BenchSetup(g, optimize(g), models.random_inputs(g), threads=2)


def test_harness_flags_wrong_outputs_and_failed_runners(tiny_setup: BenchSetup) -> None:
    def wrong(setup: BenchSetup) -> Runner:
        def call() -> dict[str, np.ndarray]:
            return {k: v + 0.5 for k, v in run_graph(setup.graph, setup.feeds).items()}
        return Runner("wrong", call, None, "n/a", 0.0, "tracemalloc")

    def broken(setup: BenchSetup) -> Runner:
        raise RuntimeError("no kernel today")

    def absent(setup: BenchSetup) -> Runner:
        raise RunnerSkipped("needs a package this machine lacks")

    result = run_bench(tiny_setup, ["reference", "wrong", "broken", "absent"], repeat=1, warmup=0, pause=0,
                       factories={"wrong": wrong, "broken": broken, "absent": absent})
    assert result.mismatches == ["wrong"]
    assert result.failed == {"broken": "RuntimeError: no kernel today"}
    assert result.skipped == {"absent": "needs a package this machine lacks"}
    data = to_json(result, {})
    assert data["runners"]["wrong"]["max_abs_error"] == pytest.approx(0.5)
    assert not data["outputs_ok"]
    assert data["max_abs_error"] is None  # no fused runner in this run
    from autofusion.cli.cmd_bench import _verdict

    assert _verdict(data) == 1


def test_rounds_alternate_the_order_and_pool_every_run(tiny_setup: BenchSetup) -> None:
    """With rounds, the sequence runs again in reverse order every other round, and each runner's
    median is over all its timed runs; a round that goes wrong makes the runner wrong."""
    order: list[str] = []
    calls = {"late_mismatch": 0}

    def logged(name: str):  # type: ignore[no-untyped-def]
        def factory(setup: BenchSetup) -> Runner:
            order.append(name)
            return Runner(name, lambda: run_graph(setup.graph, setup.feeds), None, "n/a", 0.0, "tracemalloc")
        return factory

    def late_mismatch(setup: BenchSetup) -> Runner:
        calls["late_mismatch"] += 1
        shift = 0.5 if calls["late_mismatch"] == 3 else 0.0  # only the third round is wrong

        def call() -> dict[str, np.ndarray]:
            return {k: v + shift for k, v in run_graph(setup.graph, setup.feeds).items()}
        return Runner("late_mismatch", call, None, "n/a", 0.0, "tracemalloc")

    result = run_bench(tiny_setup, ["a", "b", "late_mismatch"], repeat=2, warmup=0, pause=0, rounds=3,
                       factories={"a": logged("a"), "b": logged("b"), "late_mismatch": late_mismatch})
    assert order == ["a", "b", "b", "a", "a", "b"]
    a = result.get("a")
    assert a is not None and len(a.times_ms) == 6 and len(a.extra["round_medians_ms"]) == 3
    assert a.median_ms == pytest.approx(float(np.median(a.times_ms)))
    assert result.mismatches == ["late_mismatch"]
    assert to_json(result, {})["rounds"] == 3


def test_only_the_first_round_times_kernels_one_by_one(tiny_setup: BenchSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-kernel timing (for the time outside the cores) runs in round 1 only: later rounds' would be
    thrown away."""
    import autofusion.bench.harness as harness

    calls: list[int] = []
    real = harness.time_ops

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(harness, "time_ops", counted)
    result = run_bench(tiny_setup, ["unfused", "fused"], repeat=1, warmup=0, pause=0, rounds=3)
    assert len(calls) == (2 if harness.has_kernel_hook() else 0)
    fused = result.get("fused")
    assert fused is not None and len(fused.times_ms) == 3 and fused.outside_opaque_ms is not None


def test_missing_packages_skip_with_the_reason(tiny_setup: BenchSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails as if it were not installed
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    for name, package in (("torch_eager", "torch"), ("torch_compile", "torch"), ("ort_all", "onnxruntime")):
        with pytest.raises(RunnerSkipped, match=f"{package} is not installed"):
            prepare(name, tiny_setup)


def test_unknown_runner_name(tiny_setup: BenchSetup) -> None:
    with pytest.raises(ValueError, match="unknown runner"):
        prepare("tvm", tiny_setup)


# -- the pieces -----------------------------------------------------------------------------------


def test_op_times_split_opaque_cores_from_the_rest() -> None:
    g = models.build("bert-tiny")
    times = time_ops(g, models.random_inputs(g), repeat=1, threads=2)
    reg = default_registry()
    assert times.kernels_opaque == sum(1 for n in g.nodes if n.op in OPAQUE_CORES)
    assert times.kernels_other == sum(1 for n in g.nodes if n.op not in OPAQUE_CORES and not reg[n.op].view)
    assert times.opaque_core > 0 and times.other_calls > 0


def test_memory_probes_see_an_allocation() -> None:
    size = 48 << 20
    traced = peak_traced(lambda: np.ones(size // 8, np.float64))
    assert traced.peak_bytes is not None and traced.peak_bytes >= size
    rss = peak_rss_delta(lambda: np.ones(size // 8, np.float64))
    if rss.peak_bytes is None:
        pytest.skip(rss.method)  # no /proc: the probe says why instead of a number
    assert rss.peak_bytes >= size // 2


def test_limit_threads_sets_every_pool() -> None:
    done = limit_threads(2)
    assert {"OMP_NUM_THREADS=2", "OPENBLAS_NUM_THREADS=2"} <= set(done)
    assert any("openblas" in d for d in done if ":" in d) or not Path("/proc/self/maps").exists()


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("model", ["bert-tiny", "gpt2-tiny", "resnet-tiny", "resnet-tiny-bn", "lstm-tiny"])
def test_torch_conversion_matches_the_reference(model: str) -> None:
    import torch

    from autofusion.runtime import compare_outputs
    from autofusion.runtime.torch_ops import numpy_outputs, to_torch_module, torch_feeds

    g = models.build(model)
    feeds = models.random_inputs(g)
    with torch.inference_mode():
        got = numpy_outputs(g, to_torch_module(g)(*torch_feeds(g, feeds)))
    report = compare_outputs(run_graph(g, feeds), got, rtol=1e-4, atol=1e-5)
    assert report.ok, report.summary()


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_torch_conversion_names_the_op_it_lacks() -> None:
    from autofusion.ir import GraphBuilder
    from autofusion.runtime.torch_ops import UnsupportedOpError, to_torch_module

    b = GraphBuilder("g")
    x = b.input("x", (2, 3))
    g = b.build([b.op("HardSwish", x)])
    with pytest.raises(UnsupportedOpError, match="HardSwish"):
        to_torch_module(g)
    setup = BenchSetup(g, unfused_plan(g), {"x": np.ones((2, 3), np.float32)}, threads=2)
    with pytest.raises(RunnerSkipped, match="HardSwish"):
        prepare("torch_eager", setup)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_torch_compile_runner_on_a_small_graph() -> None:
    from autofusion.ir import GraphBuilder

    b = GraphBuilder("small")
    x = b.input("x", (4, 8))
    y = b.op("Tanh", b.op("Add", b.op("MatMul", x, b.const(np.eye(8, dtype=np.float32))),
                          b.const(np.ones(8, np.float32))))
    g = b.build([y])
    feeds = {"x": np.arange(32, dtype=np.float32).reshape(4, 8) / 32}
    setup = BenchSetup(g, unfused_plan(g), feeds, threads=2)
    result = run_bench(setup, ["torch_compile"], repeat=1, warmup=0, pause=0)
    if "torch_compile" in result.skipped:  # inductor could not compile here: the reason must say so
        assert "torch.compile (inductor) failed" in result.skipped["torch_compile"]
        return
    r = result.get("torch_compile")
    assert r is not None and r.outputs_ok, r
    assert r.setup_seconds > 0


# -- optimisation benchmark pieces ----------------------------------------------------------------


def test_random_graphs_are_valid_and_seeded() -> None:
    a, b = random_graph(3, ops=20), random_graph(3, ops=20)
    assert [n.op for n in a.nodes] == [n.op for n in b.nodes]
    assert len(a.nodes) >= 20
    run_graph(a, models.random_inputs(a))


def test_no_strategy_beats_the_exact_one() -> None:
    regions = region_costs(random_graph(1, ops=20))
    assert regions
    for r in regions:
        assert r.exact_solved, r.notes
        for strategy, cost in r.costs.items():
            assert cost >= r.costs["exact"] * (1 - 1e-9), (strategy, r)
    for s in ("greedy", "dp", "beam"):
        assert summarise(regions, s).min_percent >= 0


def test_gap_summary_counts_copies_and_leaves_out_unsolved_regions() -> None:
    solved = RegionCosts("a", 3, 2, {"greedy": 1.1, "exact": 1.0}, {"greedy": (), "exact": ()})
    exact_gave_up = RegionCosts("b", 40, 1, {"greedy": 5.0, "exact": 4.0},
                                {"exact": ("exact: too many candidate groups, solved by beam search",)})
    same = RegionCosts("c", 2, 1, {"greedy": 2.0, "exact": 2.0}, {})
    s = summarise([solved, exact_gave_up, same], "greedy")
    assert s.regions == 3 and s.worse_regions == 2
    assert s.max_percent == pytest.approx(10.0)
    assert s.mean_percent == pytest.approx(20.0 / 3)
    assert exact_gave_up.gap_percent("greedy") is None


def _optimize_bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("optimize_bench", ROOT / "benchmarks" / "optimize_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_optimize_bench_times_a_case_in_a_child_process() -> None:
    bench = _optimize_bench()
    result = bench.run_child(["--child-time", "synthetic120", "--repeat", "1"], timeout=300)
    assert "error" not in result, result
    assert result["nodes"] >= 120 and len(result["runs"]) == 1
    run = result["runs"][0]
    assert run["total_s"] >= run["rules_s"] and run["saturate_s"] >= 0 and run["extract_s"] >= 0
    assert result["peak_rss_bytes"] >= result["rss_before_optimize_bytes"] > 0
    assert result["kernels_after"] <= result["kernels_before"]


@pytest.mark.skipif(not HAS_ORT, reason="onnxruntime is not installed")
def test_optimize_bench_counts_kernels_against_onnxruntime(tmp_path: Path) -> None:
    bench = _optimize_bench()
    path = str(tmp_path / "bert.onnx")
    from autofusion.export import save_onnx

    save_onnx(unfused_plan(models.build("bert-tiny")), path)
    counted = bench.count_kernels(path)
    assert counted["ours_kernels"] < counted["ours_kernels_unfused"]
    assert counted["ort_all_kernels"] == sum(c for op, c in counted["ort_all_ops"].items()
                                             if op not in ("Reshape", "Squeeze", "Unsqueeze", "Flatten",
                                                           "Identity", "Constant"))
    before, after = counted["intermediate_bytes_before"], counted["intermediate_bytes_after"]
    assert counted["intermediate_reduction"] == pytest.approx(1 - after / before)
    assert counted["met_kernels"] == (counted["ours_kernels"] < counted["ort_all_kernels"])


def test_a_crashing_worker_is_a_failed_runner(tmp_path: Path) -> None:
    from autofusion.bench.harness import measure_in_worker

    job = tmp_path / "job.pkl"
    job.write_bytes(b"not a pickle")
    measured = measure_in_worker(job, "fused")
    assert measured.result is None
    assert measured.failed is not None and "worker process exited with status 1" in measured.failed


def test_a_setup_removes_its_own_folder_and_keeps_a_given_one(tmp_path: Path) -> None:
    import gc

    from autofusion.ir import GraphBuilder

    b = GraphBuilder("g")
    g = b.build([b.op("Relu", b.input("x", (2, 3)))])
    setup = BenchSetup(g, unfused_plan(g), {"x": np.ones((2, 3), np.float32)}, threads=2)
    own = setup.workdir
    (own / "model.onnx").write_bytes(b"x")
    del setup
    gc.collect()
    assert not own.exists()
    given = BenchSetup(g, unfused_plan(g), {"x": np.ones((2, 3), np.float32)}, threads=2, workdir=tmp_path)
    (given.workdir / "model.onnx").write_bytes(b"x")
    del given
    gc.collect()
    assert (tmp_path / "model.onnx").exists()


def test_runs_are_timed_with_a_steady_allocator_and_probed_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory probe (first run) with glibc's threshold fixed low, so freed buffers leave the
    process; warm-up, settling and timed runs with it at its steady maximum; then the low one and a
    trim."""
    import autofusion.bench.environment as environment
    from autofusion.bench import harness

    monkeypatch.setattr(harness, "SETTLE_SECONDS", 0.0)  # one settling call
    events: list[object] = []

    class FakeLibc:
        def mallopt(self, param: int, value: int) -> int:
            events.append(("mallopt", param, value))
            return 1

        def malloc_trim(self, pad: int) -> int:
            events.append("trim")
            return 1

    monkeypatch.setattr(environment, "_libc", lambda: FakeLibc())

    def factory(setup: BenchSetup) -> Runner:
        def call() -> dict[str, np.ndarray]:
            events.append("call")
            return dict(run_graph(setup.graph, setup.feeds))
        return Runner("probe", call, None, "n/a", 0.0, "tracemalloc")

    from autofusion.ir import GraphBuilder

    b = GraphBuilder("g")
    g = b.build([b.op("Relu", b.input("x", (2, 3)))])
    setup = BenchSetup(g, unfused_plan(g), {"x": np.ones((2, 3), np.float32)}, threads=2)
    reference = run_graph(g, setup.feeds)
    measured = harness.measure("probe", setup, reference, repeat=3, warmup=1, rtol=1e-5, atol=1e-5,
                               factories={"probe": factory}, per_kernel=False)
    assert measured.result is not None and measured.result.outputs_ok
    steady = [("mallopt", -3, environment.STEADY_MMAP_THRESHOLD), ("mallopt", -1, 2 * environment.STEADY_MMAP_THRESHOLD)]
    low = [("mallopt", -3, environment.MMAP_THRESHOLD), ("mallopt", -1, environment.TRIM_THRESHOLD)]
    at = events.index(steady[0])
    assert at > events.index("call")  # the first (probed) run came before
    assert events[at:] == [*steady, *["call"] * 5, *low, "trim"]


def test_timed_runs_follow_untimed_calls_for_the_settling_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the warm-up runs a runner is called untimed for SETTLE_SECONDS before its timed runs:
    right after its setup (a compile, a tuner, another runtime's pools still spinning) a runner ran
    at twice its settled time or more, and 3 warm-up runs of a 2 ms kernel did not cover that."""
    from autofusion.bench import harness

    monkeypatch.setattr(harness, "SETTLE_SECONDS", 0.05)
    stamps: list[float] = []

    def factory(setup: BenchSetup) -> Runner:
        def call() -> dict[str, np.ndarray]:
            stamps.append(time.perf_counter())
            return dict(run_graph(setup.graph, setup.feeds))
        return Runner("probe", call, None, "n/a", 0.0, "tracemalloc")

    from autofusion.ir import GraphBuilder

    b = GraphBuilder("g")
    g = b.build([b.op("Relu", b.input("x", (2, 3)))])
    setup = BenchSetup(g, unfused_plan(g), {"x": np.ones((2, 3), np.float32)}, threads=2)
    measured = harness.measure("probe", setup, run_graph(g, setup.feeds), repeat=3, warmup=1, rtol=1e-5,
                               atol=1e-5, factories={"probe": factory}, per_kernel=False)
    assert measured.result is not None and len(measured.result.times_ms) == 3
    # the probed run, the warm-up run, then settling calls spanning 0.05 s, then the 3 timed runs
    settling = stamps[2:-3]
    assert len(settling) >= 2 and settling[-1] - settling[0] >= 0.05 - 0.01
