"""Calibration: generated kernels compile and compute the right thing, the fit recovers known
constants, the accuracy measures, and a whole `autofusion calibrate` run on a tiny budget."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autofusion.calibrate import (
    KINDS,
    Timer,
    TimingOptions,
    accuracy,
    alternatives,
    fit_profile,
    pair_agreement,
    plan_of,
    random_feeds,
    random_kernel,
)
from autofusion.cli.main import main
from autofusion.codegen.cores import cpu_model
from autofusion.decide.cost import CacheLevel, GroupTerms, HardwareProfile, analytic_seconds
from autofusion.decide.learned import load_calibration
from autofusion.ir import run_graph, verify
from autofusion.runtime import CompileCache, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
QUICK = TimingOptions(target_seconds=0.002, min_repeats=3, max_repeats=20)


@pytest.mark.parametrize("kind", KINDS)
def test_generated_kernels_are_valid_graphs_of_their_kind(kind: str) -> None:
    rng = np.random.default_rng(11)
    for _ in range(20):
        spec = random_kernel(rng, 1 << 16, kind)
        verify(spec.graph)
        assert spec.kind == kind and spec.label.startswith(kind)
        assert max(t.numel for t in spec.graph.types.values()) <= 1 << 17
        for partition in alternatives(spec.graph):
            assert sorted(n for part in partition for n in part) == sorted(n.name for n in spec.graph.nodes)


def test_every_kind_compiles_and_matches_the_interpreter_fused_and_split() -> None:
    rng = np.random.default_rng(5)
    timer = Timer(CompileCache(CACHE), QUICK)
    for kind in KINDS:
        spec = random_kernel(rng, 2048, kind)
        feeds = random_feeds(spec.graph, rng)
        expected = run_graph(spec.graph, feeds)
        for partition in alternatives(spec.graph)[:2]:
            model = timer.compile(plan_of(spec.graph, partition))
            report = compare_outputs(expected, model.run(feeds), rtol=1e-3, atol=1e-4)
            assert report.ok, f"{spec.label}: {report.summary()}"
        assert timer.net(plan_of(spec.graph, alternatives(spec.graph)[0]), feeds) > 0


def _terms(rng: np.random.Generator, n: int) -> list[GroupTerms]:
    out = []
    for _ in range(n):
        nbytes = int(2 ** rng.uniform(8, 27))
        flops = float(nbytes * 2 ** rng.uniform(-4, 4))
        out.append(GroupTerms(nbytes // 2, nbytes - nbytes // 2, 0, flops, flops, 1))
    return out


def test_fit_recovers_the_constants_that_made_the_times() -> None:
    truth = HardwareProfile("truth", 4e10, (CacheLevel("L1", 1 << 16, 3e11), CacheLevel("L2", 1 << 21, 9e10)),
                            2e10, 1e-7, 2e-6)
    prior = truth.replace(peak_flops=1e11, dram_bandwidth=5e9, launch_seconds=1e-5, sync_seconds=0.0,
                          caches=(CacheLevel("L1", 1 << 16, 1e11), CacheLevel("L2", 1 << 21, 1e11)))
    terms = _terms(np.random.default_rng(0), 200)
    times = [analytic_seconds(t, truth).total for t in terms]
    fitted = fit_profile(terms, times, prior, launch_seconds=1e-7, name="fitted", description="test")
    assert fitted.name == "fitted" and fitted.caches[0].bytes == 1 << 16
    for got, want in [(fitted.peak_flops, 4e10), (fitted.dram_bandwidth, 2e10),
                      (fitted.caches[0].bandwidth, 3e11), (fitted.caches[1].bandwidth, 9e10),
                      (fitted.launch_seconds + fitted.sync_seconds, 2.1e-6)]:
        assert got == pytest.approx(want, rel=0.2)  # the weak pull towards the prior biases a little
    assert fitted.launch_seconds == pytest.approx(1e-7)


def test_fit_keeps_bandwidth_falling_with_level_even_when_data_say_otherwise() -> None:
    upside_down = HardwareProfile("odd", 1e13, (CacheLevel("L1", 1 << 16, 1e10), CacheLevel("L2", 1 << 21, 1e11)),
                                  1e11, 0.0, 1e-6)
    terms = _terms(np.random.default_rng(1), 120)
    times = [analytic_seconds(t, upside_down).total for t in terms]
    fitted = fit_profile(terms, times, HardwareProfile.load("cpu-2core"), 0.0, "fitted", "")
    assert all(a >= b for a, b in zip(fitted.bandwidths, fitted.bandwidths[1:]))
    with pytest.raises(ValueError, match="at least 4"):
        fit_profile(terms[:2], times[:2], upside_down, 0.0, "x", "")


def test_accuracy_measures() -> None:
    perfect = accuracy([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert perfect.kendall_tau == pytest.approx(1.0) and perfect.median_rel_error == 0.0
    reversed_ = accuracy([4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0])
    assert reversed_.kendall_tau == pytest.approx(-1.0)
    assert accuracy([2.0, 2.0, 2.0], [1.0, 2.0, 4.0]).median_rel_error == pytest.approx(0.5)
    agree, pairs = pair_agreement([[1.0, 2.0, 3.0], [5.0, 1.0]], [[1.0, 3.0, 2.0], [2.0, 1.0]])
    assert pairs == 4 and agree == pytest.approx(3 / 4)
    clear, clear_pairs = pair_agreement([[1.0, 2.0], [1.0, 2.0]], [[1.0, 1.1], [2.0, 1.0]], min_ratio=1.25)
    assert clear_pairs == 1 and clear == 0.0  # the 10% pair is left out, the clear one is misordered
    with pytest.raises(ValueError):
        accuracy([1.0], [1.0])


def test_calibrate_command_on_a_tiny_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "cal.json"
    profile_out = tmp_path / "profile.json"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal: the progress bar shows
    code = main(["calibrate", "--budget", "40", "--kernels", "12", "--regions", "2", "--max-elements", "4096",
                 "--seed", "3", "--repeat-seconds", "0.002", "--cache", CACHE, "--out", str(out), "--profile-out",
                 str(profile_out), "--json", "--models", "bert-tiny", "--model-kernels", "lstm-tiny"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert "calibrating" in captured.err  # the progress bar was drawn on stderr, not stdout
    for kind in ("analytic", "learned"):
        assert -1.0 <= report[kind]["kendall_tau"] <= 1.0
        assert report[kind]["median_rel_error"] >= 0.0
        assert 0.0 <= report[kind]["pair_agreement"] <= 1.0 and report[kind]["pairs"] >= 2
        assert report[kind]["pairs_clear"] <= report[kind]["pairs"]
    assert report["heldout_kernels"] + report["train_kernels"] == 12
    assert report["default_model"] in ("analytic", "learned") and report["file"] == str(out)
    cal = load_calibration(out)
    assert cal.report == {k: v for k, v in report.items()
                          if k not in ("file", "profile", "machine", "cost_model_before", "kernels_per_model", "undo")}
    assert set(report["kernels_per_model"]) == {"bert-tiny"} and report["undo"] == (
        f"to undo: rm {out}  (or set AUTOFUSION_CALIBRATION=none to plan without it)")
    assert HardwareProfile.load(profile_out) == cal.profile
    assert cal.cost_model().name.endswith(":cpu-2core")
    assert "-O" in cal.machine["cflags"] and cal.machine["threads"] >= 1 and cal.machine["statistic"] == "median"
    assert len(cal.profile.op_seconds) >= 10  # the per-op costs were timed
    # the memory probe ran: its reads are kept, and the cores' stream speeds are its per level
    probe = cal.machine["read_probe"]
    assert len(probe) >= 3 and all(size > 0 and speed > 0 for size, speed in probe)
    assert len(cal.profile.stream_bandwidths) == len(cal.profile.caches)
    assert cal.profile.fitted_on == cpu_model()  # where the constants were measured
    assert report["model_cases"] == ["lstm-tiny"] and report["model_kernels"] > 0
    assert [r["plan"] for r in report["analytic"]["plans"]] == ["unfused", "engine", "small"]
    assert isinstance(report["analytic"]["model_pairs_misordered"], list)

    code = main(["calibrate", "--show", str(out), "--report"])
    text = capsys.readouterr().out
    assert code == 0 and "kendall tau" in text and "learned" in text and "fitted profile" in text
    assert "read by a core's stream (memory probe)" in text
    assert "whole runs of the models' plans" in text and "family held out" in text


def test_calibrate_says_what_changed_and_how_to_undo(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import autofusion.decide
    from autofusion.cli import cmd_calibrate

    shipped = Path(autofusion.decide.__file__).parent / "profiles" / "calibrated" / "cpu-2core.json"
    monkeypatch.setattr(cmd_calibrate, "_calibrate", lambda args: load_calibration(shipped))  # no timing here
    monkeypatch.setenv("AUTOFUSION_CACHE", str(tmp_path))  # the user calibration the engine loads lives here
    monkeypatch.delenv("AUTOFUSION_CALIBRATION", raising=False)
    target = tmp_path / "calibration.json"
    assert main(["calibrate", "--models", "bert-tiny,lstm-tiny"]) == 0
    first = capsys.readouterr().out
    assert "kernels per built-in model, planned with analytic:cpu-2core" in first
    assert "bert-tiny" in first and "lstm-tiny" in first
    assert "now plan with this calibration by default" in first and f"to undo: rm {target}" in first
    assert main(["calibrate", "--models", "none"]) == 0
    second = capsys.readouterr().out
    assert f"to undo: mv {target}.previous {target}" in second and "kernels per built-in model" not in second
    assert (tmp_path / "calibration.json.previous").is_file()
    code = main(["fuse", "bert-tiny"])
    assert code == 0 and f"calibration {target}" in capsys.readouterr().out  # fuse says what it planned with
    other = tmp_path / "other.json"
    (tmp_path / "other.json.previous").write_text("{}")  # a stale file of that name: not what it replaced
    assert main(["calibrate", "--models", "none", "--out", str(other)]) == 0
    assert f"to undo: rm {other}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--budget", "-1"], "positive number"),
    (["calibrate", "--models", "bert-huge"], "unknown model 'bert-huge'"),
    (["calibrate", "--kernels", "0"], "positive integer"),
    (["calibrate", "--show", "/no/such/calibration.json"], "not found"),
    (["calibrate", "--prior", "no-such-profile"], "not found"),
    (["calibrate", "--model-kernels", "bert-huge:8"], "--model-kernels: unknown model 'bert-huge'"),
    (["calibrate", "--model-kernels", "lstm:x"], "positive integer"),
])
def test_calibrate_bad_input_is_one_line_and_exit_2(argv: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_too_small_a_budget_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["calibrate", "--budget", "0.01", "--kernels", "3", "--regions", "0", "--max-elements", "256",
                 "--cache", CACHE, "--out", str(tmp_path / "c.json"), "--model-kernels", "none"])
    err = capsys.readouterr().err
    assert code == 2 and "need at least" in err and "--budget" in err
    assert not (tmp_path / "c.json").exists()


def test_the_clear_pairs_a_model_orders_wrong_are_listed_widest_first() -> None:
    from autofusion.calibrate.models import RegionPair
    from autofusion.calibrate.run import misordered_pairs
    from autofusion.ir import GraphBuilder

    b = GraphBuilder("pair")
    x = b.input("x", (4, 4))
    g = b.build([b.op("Relu", b.op("Add", x, x))])
    add, relu = (n.name for n in g.nodes)

    def pair(fused_s: float, split_s: float) -> RegionPair:
        return RegionPair("bert", g, (add, relu), ((add,), (relu,)), (fused_s, split_s))

    pairs = [pair(2.0, 1.0), pair(1.0, 1.5), pair(1.0, 1.05), pair(3.0, 1.0)]
    predicted = [(0.5, 1.0),  # fused predicted faster, measured 2x slower: wrong
                 (0.5, 1.0),  # right
                 (2.0, 1.0),  # wrong, but 5 % apart: not a clear pair
                 (0.9, 1.0)]  # wrong, 3x: the widest
    wrong = misordered_pairs(pairs, predicted)
    assert [w["measured_ratio"] for w in wrong] == [3.0, 2.0]
    assert wrong[0]["fused_ops"] == "Add -> Relu" and wrong[0]["parts"] == 2 and wrong[0]["family"] == "bert"
    assert wrong[1]["measured_ms"] == [2000.0, 1000.0] and wrong[1]["predicted_ms"] == [500.0, 1000.0]
    assert misordered_pairs(pairs, predicted, limit=1) == wrong[:1]
    # a side below the clock's resolution: still a clear pair (as pair_agreement counts it), listed
    # first, with no ratio
    timed_zero = misordered_pairs([pair(1e-6, 0.0), *pairs], [(0.5, 1.0), *predicted])
    assert timed_zero[0]["measured_ratio"] is None and timed_zero[1:] == wrong


def test_fit_prices_streamed_weights_at_the_probes_speed_and_fits_the_rest() -> None:
    caches = (CacheLevel("L1", 1 << 16, 3e11), CacheLevel("L2", 1 << 21, 9e10), CacheLevel("L3", 1 << 26, 3e10))
    truth = HardwareProfile("truth", 4e10, caches, 2e10, 1e-7, 2e-6, stream_bandwidths=(4e11, 2e11, 6e10))
    rng = np.random.default_rng(2)
    terms = [replace(t, const_traffic=s, streamed_const=s, resident_bytes=s)
             for t, s in zip(_terms(rng, 200), (int(2 ** rng.uniform(10, 25)) for _ in range(200)))]
    times = [analytic_seconds(t, truth).total for t in terms]
    prior = truth.replace(peak_flops=1e11, dram_bandwidth=5e9, caches=tuple(replace(c, bandwidth=1e11) for c in caches))
    fitted = fit_profile(terms, times, prior, launch_seconds=1e-7, name="fitted", description="test")
    assert fitted.stream_bandwidths == truth.stream_bandwidths  # measured, kept
    for got, want in [(fitted.peak_flops, 4e10), (fitted.caches[1].bandwidth, 9e10), (fitted.caches[2].bandwidth, 3e10)]:
        assert got == pytest.approx(want, rel=0.2)
    # the same kernels fitted without the probe's speeds: the cache levels absorb the streams
    blind = fit_profile(terms, times, prior.replace(stream_bandwidths=()), 1e-7, "blind", "test")
    assert blind.stream_bandwidths == ()
    errors = [abs(analytic_seconds(t, p).total / m - 1) for p in (fitted, blind) for t, m in zip(terms, times)]
    assert np.median(errors[:200]) < np.median(errors[200:])
