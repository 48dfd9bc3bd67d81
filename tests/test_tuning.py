"""Cores chosen by measurement: candidates, the tuner's choice and its cache, every variant's numbers,
instruction sets chosen for the toolchain."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from autofusion.codegen.cores import (
    CoreChoice,
    CoreSpec,
    DefaultChooser,
    FixedChooser,
    Machine,
    k_pass,
    native_isa,
    requested_isa,
)
from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.runtime import CompileCache, CompiledModel, CompileError, compare_outputs, detect_toolchain
from autofusion.runtime.tuning import (
    TUNE_MIN_FLOPS,
    Tuner,
    TuningCacheWarning,
    TuningStore,
    candidates,
    core_graph,
    core_plan,
    render_tuned,
    tunable,
)

RNG = np.random.default_rng(11)
MACHINE = Machine("avx2", l2=512 * 1024)
BIG = CoreSpec("gemm", 128, 768, 768, packable=True)


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# -- the default and the candidates ---------------------------------------------------------------


def test_default_blocking_follows_the_l2_cache() -> None:
    assert MACHINE.default_kc() == 512  # 512 KiB L2 / 8 = 64 KiB = 512 rows of a 32-column panel
    assert Machine("avx512", l2=1024 * 1024).default_kc() == 1024
    assert Machine("avx512", l2=768 * 1024).default_kc() == 768
    assert Machine("portable", l2=64 * 1024).default_kc() == 128  # never below KC_MIN
    assert Machine("portable", l2=1 << 24).default_kc() == 1024  # nor above KC_MAX
    with pytest.raises(ValueError, match="unknown instruction set"):
        Machine("sse9")


def test_default_chooser_packs_what_can_be_packed() -> None:
    chooser = DefaultChooser(MACHINE)
    assert chooser.choose(BIG) == CoreChoice("packed", 512)
    assert chooser.choose(CoreSpec("gemm", 128, 64, 128)) == CoreChoice("blas")
    assert CoreChoice("packed", 512).label(MACHINE) == "packed avx2 6x16 kc512"
    assert CoreChoice("blas").label(MACHINE) == "openblas sgemm"
    with pytest.raises(ValueError):
        CoreChoice("mkl")


AVX512 = Machine("avx512", l2=2 * 1024 * 1024)
FFN_IN = CoreSpec("gemm", 128, 3072, 768, packable=True)  # BERT's: 3,072 columns, 64 wide panels


def test_the_wide_micro_kernel_is_the_default_where_it_pays() -> None:
    """With AVX-512, a constant weight whose width is a multiple of 48 runs the 8 x 48 kernel from
    16 rows on; narrower or ragged widths, few rows, convolutions, run-time operands and the other
    instruction sets keep the 32-column kernel."""
    chooser = DefaultChooser(AVX512)
    wide = CoreChoice("packed", 1024, wide=True)
    assert chooser.choose(FFN_IN) == wide and wide.label(AVX512) == "packed avx512 8x48 kc1024"
    assert chooser.choose(CoreSpec("gemm", 16, 768, 768, packable=True)) == wide
    for narrow in (CoreSpec("gemm", 128, 64, 768, packable=True), CoreSpec("gemm", 128, 1000, 768, packable=True),
                   CoreSpec("gemm", 8, 3072, 768, packable=True)):
        assert chooser.choose(narrow) == CoreChoice("packed", 1024), narrow
    conv = CoreSpec("conv", 3136, 96, 576, packable=True, taps=True)
    assert chooser.choose(conv) == CoreChoice("taps", 1024)
    assert chooser.choose(CoreSpec("gemm", 128, 768, 64, repackable=True)) == CoreChoice("repack", 1024)
    assert DefaultChooser(MACHINE).choose(FFN_IN) == CoreChoice("packed", 512)
    # its panel rows are 192 bytes: on a 1 MiB L2, an eighth holds 640 of them
    assert Machine("avx512", l2=1024 * 1024).default_kc(wide=True) == 640
    with pytest.raises(ValueError, match="packed weights only"):
        CoreChoice("taps", 512, wide=True)


def _conv_spec(width: int, stride: int = 1) -> CoreSpec:
    """A 3x3 convolution, 64 -> 64 channels, pad 1, on a square image ``width`` wide, as codegen/conv.py
    describes it (geometry: input, weight, strides, pads, dilations, group)."""
    out = (width + 2 - 3) // stride + 1
    geometry = ((1, 64, width, width), (64, 64, 3, 3), (stride, stride), (1, 1, 1, 1), (1, 1), (1,))
    return CoreSpec("conv", out * out, 64, 576, packable=True, geometry=geometry, taps=True)


def test_a_taps_label_names_the_blocks_the_convolution_runs() -> None:
    """AVX-512 cuts output rows of 7 or more positions into blocks of up to 14 within the row
    (AF_TAPS_MR, af_sgemm.c.j2); narrower rows, and every row on AVX2, take blocks of the packed
    kernel's rows across row ends: the label says which (it said 12x32 for every convolution)."""
    taps = CoreChoice("taps", 1024)
    assert _conv_spec(56).row_width == 56 and _conv_spec(14, stride=2).row_width == 7
    assert taps.label(AVX512, _conv_spec(56)) == "taps avx512 14x32 kc1024"
    assert taps.label(AVX512, _conv_spec(14, stride=2)) == "taps avx512 14x32 kc1024"  # 7 wide: one block a row
    assert taps.label(AVX512, _conv_spec(5)) == "taps avx512 12x32 kc1024"  # 5 wide: across row ends
    assert taps.label(AVX512) == "taps avx512 12x32 kc1024"  # no geometry: the packed kernel's shape
    assert taps.label(MACHINE, _conv_spec(56)) == "taps avx2 6x16 kc1024"
    assert CoreChoice("packed", 1024).label(AVX512, _conv_spec(56)) == "packed avx512 12x32 kc1024"  # im2col
    assert CoreSpec("gemm", 128, 64, 64).row_width is None and CoreSpec("conv", 9, 8, 8).row_width is None


def test_a_wide_choice_a_core_or_machine_cannot_take_falls_back() -> None:
    wide = CoreChoice("packed", 512, wide=True)
    assert FixedChooser(wide, AVX512).choose(FFN_IN) == wide
    assert wide.label(AVX512) == "packed avx512 8x48 kc512"
    for other in (MACHINE, Machine("avx"), Machine("portable")):  # AVX2, AVX and the portable build have none
        assert FixedChooser(wide, other).choose(FFN_IN) == CoreChoice("packed", 512)
    conv = CoreSpec("conv", 3136, 96, 576, packable=True)
    assert FixedChooser(wide, AVX512).choose(conv) == CoreChoice("packed", 512)
    assert FixedChooser(wide, AVX512).choose(CoreSpec("gemm", 128, 768, 64, repackable=True)) == CoreChoice("blas")


def test_candidates_offer_both_micro_kernels_where_there_are_two() -> None:
    wide, narrow = CoreChoice("packed", 1024, wide=True), CoreChoice("packed", 1024)
    assert candidates(FFN_IN, AVX512)[:2] == [wide, narrow] and candidates(FFN_IN, AVX512)[-1] == CoreChoice("blas")
    ragged = CoreSpec("gemm", 128, 1000, 768, packable=True)
    assert candidates(ragged, AVX512)[:2] == [narrow, wide]
    for other in (MACHINE, Machine("portable")):  # a machine without one is offered none
        assert not any(c.wide for c in candidates(FFN_IN, other))


def test_a_stored_wide_choice_is_read_back(tmp_path: Path) -> None:
    wide = CoreChoice("packed", 1024, wide=True)
    times = {c: 3e-4 for c in candidates(FFN_IN, AVX512)}
    times[wide] = 1e-4
    tc = detect_toolchain()
    tuner = Tuner(tc, CompileCache(tmp_path), threads=2, build=_fake_build(times, []), machine=AVX512)
    assert tuner.choose(FFN_IN) == wide
    again = Tuner(tc, CompileCache(tmp_path), threads=2, build=_fake_build(times, []), machine=AVX512)
    assert again.store.get(FFN_IN, 2) == wide and again.tuned == 0


def test_candidates_are_the_default_other_blockings_and_openblas() -> None:
    assert candidates(BIG, MACHINE) == [CoreChoice("packed", 512), CoreChoice("packed", 128),
                                        CoreChoice("packed", 256), CoreChoice("packed", 1024), CoreChoice("blas")]
    # K = 200: every pass of 256 rows or more is one pass, the same code as the default
    shallow = CoreSpec("gemm", 128, 768, 200, packable=True)
    assert candidates(shallow, MACHINE) == [CoreChoice("packed", 512), CoreChoice("packed", 128),
                                            CoreChoice("blas")]
    # K = 100: one pass whatever the blocking
    assert candidates(CoreSpec("gemm", 128, 768, 100, packable=True), MACHINE) == [
        CoreChoice("packed", 512), CoreChoice("blas")]
    # K = 576 (ResNet's 3 x 3 x 64): 512 and 1,024 both make one pass of 576 rows, timed once
    assert candidates(CoreSpec("conv", 3136, 64, 576, packable=True), MACHINE) == [
        CoreChoice("packed", 512), CoreChoice("packed", 128), CoreChoice("packed", 256), CoreChoice("blas")]


def test_k_is_cut_into_passes_of_nearly_equal_length() -> None:
    assert [k_pass(k, 512) for k in (100, 512, 576, 768, 1152, 2304, 3072, 4608)] == [
        100, 512, 576, 384, 576, 461, 512, 512]
    assert k_pass(2304, 1024) == 1152 and k_pass(600, 128) == 120 and k_pass(5, 0) == 5
    for k in range(1, 700, 7):  # passes of at most 1.5 kc + 1, the last one short by less than a pass
        for kc in (64, 128, 512):
            step, passes = k_pass(k, kc), -(-k // k_pass(k, kc))
            assert step <= max(k, kc * 3 // 2 + 1) and k - (passes - 1) * step > step - passes


def test_a_core_spec_key_tells_cores_apart() -> None:
    keys = {CoreSpec("gemm", 8, 768, 3072, True).key(), CoreSpec("gemm", 8, 3072, 768, True).key(),
            CoreSpec("gemm", 8, 768, 3072, False).key(), CoreSpec("conv", 8, 768, 3072, True).key()}
    assert len(keys) == 4


# -- the tuner, with a fake build: what it chooses and what it stores ---------------------------


class _FakeModel:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, feeds: object) -> dict[str, np.ndarray]:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return {}


def _fake_build(times: dict[CoreChoice, float], built: list[CoreChoice]):
    def build(plan: Plan, chooser: FixedChooser) -> _FakeModel:
        built.append(chooser.choice)
        return _FakeModel(times[chooser.choice])
    return build


def _tuner(tmp_path: Path, times: dict[CoreChoice, float], built: list[CoreChoice]) -> Tuner:
    tc = detect_toolchain()
    return Tuner(tc, CompileCache(tmp_path), threads=2, build=_fake_build(times, built), machine=MACHINE)


def test_the_tuner_keeps_the_fastest_and_remembers_it(tmp_path: Path) -> None:
    fast = CoreChoice("packed", 256)
    times = {c: 4e-4 for c in candidates(BIG, MACHINE)}
    times[fast] = 1e-4
    built: list[CoreChoice] = []
    steps: list[tuple[int, int, str]] = []
    tuner = _tuner(tmp_path, times, built)
    tuner.progress = lambda done, total, what: steps.append((done, total, what))
    assert tuner.choose(BIG) == fast
    assert set(built) == set(candidates(BIG, MACHINE)) and tuner.tuned == 1
    assert steps[0][:2] == (0, 1) and steps[-1][:2] == (1, 1)
    again: list[CoreChoice] = []
    second = _tuner(tmp_path, times, again)  # a new process on the same machine: from the file
    assert second.choose(BIG) == fast and again == [] and second.tuned == 0
    other_threads = Tuner(detect_toolchain(), CompileCache(tmp_path), threads=1,
                          build=_fake_build(times, again), machine=MACHINE)
    assert other_threads.store.get(BIG, 1) is None  # results are per thread count


def test_the_default_stays_unless_another_is_clearly_faster(tmp_path: Path) -> None:
    times = {c: 3e-4 for c in candidates(BIG, MACHINE)}
    times[CoreChoice("blas")] = 2.95e-4  # within the margin: noise, not a reason to change the code
    assert _tuner(tmp_path, times, []).choose(BIG) == CoreChoice("packed", 512)


class _Clock:
    """A clock the fake models below advance: timings without waiting, and without noise."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _TimedModel:
    """Takes ``seconds(call)`` on the clock at its call-th run."""

    def __init__(self, clock: _Clock, seconds: Callable[[int], float]) -> None:
        self.clock, self.seconds, self.calls = clock, seconds, 0

    def run(self, feeds: object) -> dict[str, np.ndarray]:
        self.clock.now += self.seconds(self.calls)
        self.calls += 1
        return {}


@pytest.mark.parametrize("stays_fast", [True, False])
def test_a_challenger_must_win_again_in_rounds_of_its_own(tmp_path: Path, stays_fast: bool) -> None:
    """OpenBLAS, fast in the sweep over all candidates, replaces the default only if it is still
    faster in the rounds of the two alone that follow: a slow minute that fell on the default's
    samples in the sweep does not change the code."""
    from autofusion.runtime import tuning

    clock = _Clock()
    blas = CoreChoice("blas")
    sweep_calls = 2 + tuning.ROUNDS * math.ceil(tuning.SAMPLE_SECONDS / 1e-4)  # warm-up, then its samples

    def build(plan: Plan, chooser: FixedChooser) -> _TimedModel:
        if chooser.choice != blas:
            return _TimedModel(clock, lambda call: 3e-4)
        return _TimedModel(clock, lambda call: 1e-4 if stays_fast or call < sweep_calls else 4e-4)

    tuner = Tuner(detect_toolchain(), CompileCache(tmp_path), threads=2, build=build, machine=MACHINE, clock=clock)
    choice, times = tuner._measure(BIG)
    assert times[blas.label(MACHINE)] == pytest.approx(0.1)  # ms, in the sweep
    assert choice == (blas if stays_fast else candidates(BIG, MACHINE)[0])


def test_small_and_unpackable_cores_are_not_measured(tmp_path: Path) -> None:
    built: list[CoreChoice] = []
    tuner = _tuner(tmp_path, {}, built)
    small = CoreSpec("gemm", 4, 16, 16, packable=True)
    assert small.flops < TUNE_MIN_FLOPS
    assert tuner.choose(small) == CoreChoice("packed", 512)
    assert tuner.choose(CoreSpec("gemm", 128, 768, 768, packable=False)) == CoreChoice("blas")
    assert built == []


def test_render_tuned_measures_missing_cores_once_then_renders_with_them(tmp_path: Path) -> None:
    times = {c: 2e-4 for c in candidates(BIG, MACHINE)}
    times[CoreChoice("blas")] = 5e-5
    built: list[CoreChoice] = []
    tuner = _tuner(tmp_path, times, built)
    answers: list[list[CoreChoice]] = []

    def render(chooser) -> list[CoreChoice]:
        answers.append([chooser.choose(BIG), chooser.choose(BIG)])
        return answers[-1]

    assert render_tuned(tuner, render) == [CoreChoice("blas")] * 2
    assert len(answers) == 2 and answers[0] == [CoreChoice("packed", 512)] * 2  # first pass: the default
    assert len(built) == len(candidates(BIG, MACHINE))  # the core measured once, not twice
    answers.clear()
    assert render_tuned(tuner, render) == [CoreChoice("blas")] * 2 and len(answers) == 1  # all cached


# -- the cache file: damaged or foreign files are never trusted -----------------------------------


def test_a_choice_is_not_carried_over_to_another_openblas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenBLAS is a candidate: a choice made against its kernels for one core (AVX-512) is not
    reused where it runs another's (``OPENBLAS_CORETYPE=Haswell``), which times differently."""
    import autofusion.runtime.tuning as tuning

    times = {c: 3e-4 for c in candidates(BIG, MACHINE)}
    times[CoreChoice("blas")] = 1e-4
    monkeypatch.setattr(tuning, "blas_config", lambda: "OpenBLAS 0.3 DYNAMIC_ARCH SkylakeX")
    assert _tuner(tmp_path, times, []).choose(BIG) == CoreChoice("blas")
    assert _tuner(tmp_path, times, []).store.get(BIG, 2) == CoreChoice("blas")  # same OpenBLAS: remembered
    monkeypatch.setattr(tuning, "blas_config", lambda: "OpenBLAS 0.3 DYNAMIC_ARCH Haswell")
    assert _tuner(tmp_path, times, []).store.get(BIG, 2) is None  # another core: measured again


def _stored(tmp_path: Path) -> TuningStore:
    times = {c: 3e-4 for c in candidates(BIG, MACHINE)}
    times[CoreChoice("blas")] = 1e-4
    tuner = _tuner(tmp_path, times, [])
    tuner.choose(BIG)
    return tuner.store


@pytest.mark.parametrize("damage", ["garbage", "truncated", "edited", "foreign", "invalid_choice", "format"])
def test_a_damaged_or_foreign_cache_is_ignored_with_a_warning(tmp_path: Path, damage: str) -> None:
    store = _stored(tmp_path)
    text = store.path.read_text()
    data = json.loads(text)
    if damage == "garbage":
        store.path.write_bytes(b"\x00\xffnot json")
    elif damage == "truncated":
        store.path.write_text(text[: len(text) // 2])
    elif damage == "edited":  # someone forced a choice by hand: the checksum no longer matches
        next(iter(data["entries"].values()))["impl"] = "packed"
        store.path.write_text(json.dumps(data))
    elif damage == "foreign":  # copied from another machine
        data["fingerprint"] = "0" * 64
        store.path.write_text(json.dumps(data))
    elif damage == "invalid_choice":
        from autofusion.runtime.entry_file import checksum as _checksum

        next(iter(data["entries"].values()))["impl"] = "mkl"
        data["checksum"] = _checksum(data["entries"])
        store.path.write_text(json.dumps(data))
    else:
        data["format"] = 99
        store.path.write_text(json.dumps(data))
    built: list[CoreChoice] = []
    times = {c: 3e-4 for c in candidates(BIG, MACHINE)}
    times[CoreChoice("packed", 256)] = 1e-4
    with pytest.warns(TuningCacheWarning, match="ignored"):
        tuner = _tuner(tmp_path, times, built)
    assert tuner.store.entries == {}
    assert tuner.choose(BIG) == CoreChoice("packed", 256) and built  # measured again, not read
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _tuner(tmp_path, times, []).store.get(BIG, 2) == CoreChoice("packed", 256)  # rewritten whole


# -- every variant computes the same numbers -------------------------------------------------------


def _plan(g: Graph, template: str) -> Plan:
    return Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: template), ZERO_COST,
                ZERO_COST)


def _gemm_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    b = GraphBuilder("tuned_gemm")
    x = b.input("x", (67, 700))
    y = b.op("Gemm", x, b.const(f32(700, 530, scale=0.05)), b.const(f32(530)), alpha=0.5)
    return b.build([b.op("Relu", y)]), {"x": f32(67, 700)}


def _horizontal_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    b = GraphBuilder("tuned_qkv")
    x = b.input("x", (2, 21, 96))
    outs = [b.op("MatMul", x, b.const(f32(96, n, scale=0.1))) for n in (96, 40, 96)]
    return b.build(outs), {"x": f32(2, 21, 96)}


def _conv_graph(groups: int = 1, stride: int = 2) -> tuple[Graph, dict[str, np.ndarray]]:
    b = GraphBuilder("tuned_conv")
    x = b.input("x", (1, 16, 15, 15))
    c = b.op("Conv", x, b.const(f32(32, 16 // groups, 3, 3, scale=0.2)), b.const(f32(32)), pads=(1, 1, 1, 1),
             strides=(stride, stride), group=groups)
    bn = b.op("BatchNormalization", c, b.const(f32(32)), b.const(f32(32)), b.const(f32(32)),
              b.const(np.abs(f32(32)) + 0.5))
    return b.build([b.op("Relu", bn)]), {"x": f32(1, 16, 15, 15)}


CHOICES = [CoreChoice("packed", 128), CoreChoice("packed", 256), CoreChoice("packed", 1024), CoreChoice("taps", 128),
           CoreChoice("taps", 1024), CoreChoice("blas"), CoreChoice("packed", 256, wide=True)]


@pytest.mark.parametrize("choice", CHOICES, ids=lambda c: f"{c.impl}{c.kc}{'w' if c.wide else ''}")
@pytest.mark.parametrize("case", ["gemm", "horizontal", "conv_bn", "conv_bn_groups", "conv_bn_stride1"])
def test_every_core_choice_matches_the_reference(tmp_path: Path, case: str, choice: CoreChoice) -> None:
    """Each candidate the tuner may pick, forced, against the reference: K over several passes,
    constant weights left unpacked for OpenBLAS (concatenated for a horizontal product, folded with
    BatchNormalization for a convolution), a stride-1 convolution's taps read in place (a core that
    cannot, takes the nearest choice it can)."""
    graph, feeds = {"gemm": _gemm_graph, "horizontal": _horizontal_graph, "conv_bn": _conv_graph,
                    "conv_bn_groups": lambda: _conv_graph(2), "conv_bn_stride1": lambda: _conv_graph(1, 1)}[case]()
    template = {"gemm": "gemm_epilogue", "horizontal": "horizontal_gemm"}.get(case, "conv_epilogue")
    model = CompiledModel(_plan(graph, template), cache=tmp_path, cores=FixedChooser(choice))
    report = compare_outputs(run_graph(graph, feeds), model.run(feeds))
    assert report.ok, report.summary()
    cores = [core for k in model.source.kernels for core in k.cores]
    assert [c for _, c in cores] == [choice.fitting(spec, model.chooser.machine) for spec, _ in cores]
    assert len(cores) == 1
    code = "\n".join(k.code for k in model.source.kernels)
    assert ("af_sgemm_packed" in code) == choice.packed
    assert ("af_sgemm_packed_wide(" in code) == cores[0][1].wide
    assert ("af_sgemm_packed_taps(" in code) == (cores[0][1].taps)


def test_depthwise_convolution_with_batchnorm_reads_the_folded_weights(tmp_path: Path) -> None:
    """One output channel per group cannot be packed; the folded BatchNormalization must still
    reach the weights sgemm reads."""
    b = GraphBuilder("depthwise_bn")
    x = b.input("x", (1, 8, 9, 9))
    c = b.op("Conv", x, b.const(f32(8, 1, 3, 3)), pads=(1, 1, 1, 1), group=8)
    bn = b.op("BatchNormalization", c, b.const(f32(8)), b.const(f32(8)), b.const(f32(8)),
              b.const(np.abs(f32(8)) + 0.5))
    g = b.build([b.op("Relu", bn)])
    feeds = {"x": f32(1, 8, 9, 9)}
    model = CompiledModel(_plan(g, "conv_epilogue"), cache=tmp_path)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()


def test_tuned_and_untuned_models_compute_the_same_numbers(tmp_path: Path) -> None:
    """The real tuner on a core large enough to be tuned: it measures the candidates here, and
    whatever it picks changes the results by fp32 rounding at most."""
    b = GraphBuilder("tuned_mlp")
    x = b.input("x", (96, 512))
    h = b.op("Relu", b.op("Add", b.op("MatMul", x, b.const(f32(512, 400, scale=0.05))), b.const(f32(400))))
    g = b.build([h])
    feeds = {"x": f32(96, 512)}
    spec_flops = 2 * 96 * 512 * 400
    assert spec_flops >= TUNE_MIN_FLOPS
    plan = _plan(g, "gemm_epilogue")
    untuned = CompiledModel(plan, cache=tmp_path, tune=False).run(feeds)[g.outputs[0]]
    tuned_model = CompiledModel(plan, cache=tmp_path, tune=True)
    assert isinstance(tuned_model.chooser, Tuner) and tuned_model.chooser.tuned == 1
    entry = next(iter(tuned_model.chooser.store.entries.values()))
    assert set(entry["times_ms"]) == {c.label(tuned_model.chooser.machine)
                                      for c in candidates(CoreSpec("gemm", 96, 400, 512, True),
                                                          tuned_model.chooser.machine)}
    tuned = tuned_model.run(feeds)[g.outputs[0]]
    np.testing.assert_allclose(tuned, untuned, rtol=1e-5, atol=1e-5)
    report = compare_outputs(run_graph(g, feeds), tuned_model.run(feeds))
    assert report.ok, report.summary()
    assert CompiledModel(plan, cache=tmp_path, tune=True).chooser.tuned == 0  # once per machine


def test_core_graph_rebuilds_a_convolution_core() -> None:
    spec = CoreSpec("conv", 64, 32, 144, True, 1, ((1, 16, 15, 15), (32, 16, 3, 3), (2, 2), (1, 1, 1, 1),
                                                   (1, 1), (1,)))
    g, feeds = core_graph(spec)
    assert [n.op for n in g.nodes] == ["Conv"] and feeds["x"].shape == (1, 16, 15, 15)
    assert g.types[g.outputs[0]].shape == (1, 32, 8, 8) and not g.inputs[1:]


def test_a_convolution_with_its_weight_given_at_run_time_is_tuned_with_it_as_an_input(tmp_path: Path) -> None:
    """Packed per call (the default) or OpenBLAS, measured with the weight a graph input; the
    stored choice is that core's alone (its key is not the constant-weight core's)."""
    geometry = ((8, 32, 32, 32), (64, 32, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1,))
    spec = CoreSpec("conv", 256, 64, 288, False, 8, geometry, taps=True, repackable=True)
    assert tunable(spec) and spec.key() != CoreSpec("conv", 256, 64, 288, True, 8, geometry, taps=True).key()
    # K = 288: one pass at 256 rows as at 512 (k_pass), so 256 is not timed again
    assert candidates(spec, MACHINE) == [CoreChoice("repack", 512), CoreChoice("repack", 128), CoreChoice("blas")]
    g, feeds = core_graph(spec)
    assert g.inputs == ("x", "w") and feeds["w"].shape == (64, 32, 3, 3)
    times = {c: 3e-4 for c in candidates(spec, MACHINE)}
    times[CoreChoice("blas")] = 1e-4
    built: list[CoreChoice] = []
    assert _tuner(tmp_path, times, built).choose(spec) == CoreChoice("blas") and len(built) == 3


def test_a_transposed_a_takes_passes_whose_panels_fit_a_quarter_of_l2() -> None:
    """A weight gradient's X^T is kept in panels, a tile's rows (at most 192) per step of K: a pass of
    kc steps should take at most a quarter of L2 (512 KiB of a 2 MiB L2: 640 steps), never below
    KC_MIN; a product of fewer rows takes the default."""
    big_l2 = Machine("avx512", l2=2 * 1024 * 1024)
    grad = CoreSpec("gemm", 1024, 256, 512, repackable=True, a_transposed=True)
    assert big_l2.kc_for(grad) == 640 and DefaultChooser(big_l2).choose(grad) == CoreChoice("repack", 640)
    assert big_l2.kc_for(CoreSpec("gemm", 8, 1024, 512, repackable=True, a_transposed=True)) == big_l2.default_kc()
    assert big_l2.kc_for(CoreSpec("gemm", 1024, 256, 512, repackable=True)) == big_l2.default_kc() == 1024
    assert MACHINE.kc_for(grad) == 128  # 128 KiB / 4 / 768 bytes a step: KC_MIN
    assert candidates(grad, big_l2)[0] == CoreChoice("repack", 640)
    assert len({grad.key(), CoreSpec("gemm", 1024, 256, 512, repackable=True).key(),
                CoreSpec("gemm", 1024, 256, 512, repackable=True, b_transposed=True).key()}) == 3
    assert grad.describe() == "gemm [512 x 1024]^T @ [512 x 256]"


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (False, False)])
@pytest.mark.parametrize("m,n,k", [(97, 64, 300), (140, 33, 129)])
def test_a_product_of_run_time_operands_is_timed_as_the_model_computes_it(
        tmp_path: Path, ta: bool, tb: bool, m: int, n: int, k: int) -> None:
    """A training graph's products (weights are inputs) are tuned: the tuner's one-kernel plan reads
    its operands through the same transposes, so its core is the model's (the same key), and each
    candidate computes the product (K over several passes, edge rows and columns)."""
    spec = CoreSpec("gemm", m, n, k, repackable=True, a_transposed=ta, b_transposed=tb)
    assert tunable(CoreSpec("gemm", 512, 256, 1024, repackable=True, a_transposed=ta, b_transposed=tb))
    plan, feeds = core_plan(spec)
    assert len(plan.groups) == 1
    a = feeds["x"].T if ta else feeds["x"]
    b = feeds["w"].T if tb else feeds["w"]
    for choice in (CoreChoice("repack", 128), CoreChoice("blas")):
        model = CompiledModel(plan, cache=tmp_path, cores=FixedChooser(choice))
        (core, used), = [c for kernel in model.source.kernels for c in kernel.cores]
        assert core.key() == spec.key() and used == choice
        np.testing.assert_allclose(model.run(feeds)[plan.graph.outputs[0]], a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", [
    CoreSpec("gemm", 40, 64, 200, repackable=True, calls=3, b_transposed=True),  # attention's Q K^T
    CoreSpec("gemm", 40, 64, 200, repackable=True, calls=3, a_transposed=True),
    CoreSpec("gemm", 97, 64, 300, packable=True, a_transposed=True),  # a constant weight, X^T read in place
], ids=["batched_bt", "batched_at", "packed_at"])
def test_core_plan_rebuilds_the_core_with_its_transposes(tmp_path: Path, spec: CoreSpec) -> None:
    """What the tuner and bench-cores time is the model's core: the same key, the same numbers."""
    plan, feeds = core_plan(spec)
    graph = plan.graph
    choice = CoreChoice("repack" if spec.repackable else "packed", 128)
    model = CompiledModel(plan, cache=tmp_path, cores=FixedChooser(choice))
    (core, _), = [c for kernel in model.source.kernels for c in kernel.cores]
    assert core.key() == spec.key()
    report = compare_outputs(run_graph(graph, feeds), model.run(feeds))
    assert report.ok, report.summary()


# -- instruction sets ------------------------------------------------------------------------------


def test_the_toolchain_builds_for_the_instruction_set_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOFUSION_ISA", raising=False)  # (the suite may run with another set asked for)
    native = detect_toolchain()
    assert native.isa == native_isa() and native.runnable
    avx2 = detect_toolchain(isa="avx2")
    assert avx2.isa == "avx2" and ("-march=haswell" in avx2.cflags or native.isa == "avx2")
    monkeypatch.setenv("AUTOFUSION_ISA", "portable")
    assert detect_toolchain().isa == "portable"
    monkeypatch.setenv("AUTOFUSION_ISA", "sse9")
    with pytest.raises(CompileError, match="unknown instruction set 'sse9'"):
        detect_toolchain()


def test_a_library_this_cpu_cannot_run_is_refused_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from autofusion.runtime import toolchain

    native = detect_toolchain(isa="avx512")  # built with -march=native where this CPU has AVX-512
    tc = dataclasses.replace(native, cflags=tuple(f for f in native.cflags if f != "-march=native")
                             + ("-march=skylake-avx512",))
    monkeypatch.setattr(toolchain, "cpu_flags", lambda: frozenset({"sse2", "avx", "avx2", "fma"}))
    assert not tc.runnable
    g, feeds = _gemm_graph()
    with pytest.raises(CompileError, match="cannot run code built for avx512"):
        CompiledModel(_plan(g, "gemm_epilogue"), cache=tmp_path, toolchain=tc)


@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_a_model_built_for_another_instruction_set_runs_and_says_so(tmp_path: Path, isa: str) -> None:
    tc = detect_toolchain(isa=isa)
    if not tc.runnable:
        pytest.skip(f"this CPU cannot run {isa} code")
    g, feeds = _gemm_graph()
    model = CompiledModel(_plan(g, "gemm_epilogue"), cache=tmp_path, toolchain=tc)
    assert model.machine.isa == isa  # af_isa() of the library
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    labels = {c.label(model.machine) for k in model.source.kernels for _, c in k.cores}
    rows, cols = model.machine.micro_kernel
    assert labels == {f"packed {isa} {rows}x{cols} kc{model.machine.default_kc()}"}


# -- the commands -----------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from autofusion.cli.main import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bench_cores_times_each_core_in_every_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    code, out, err = _cli(capsys, "bench-cores", "bert-tiny", "--json", "--repeat", "2", "--rounds", "2",
                          "--no-tune")
    assert code == 0, err
    data = json.loads(out)
    assert data["tuned"] is False and data["isa"] == requested_isa()
    cores = data["cores"]
    assert {c["kind"] for c in cores} == {"gemm"} and sum(c["count_in_model"] for c in cores) > len(cores)
    for c in cores:
        assert set(c["median_ms"]) == {"autofusion", "onnxruntime", "openblas"}
        assert c["ratio_vs_onnxruntime"] == pytest.approx(c["median_ms"]["autofusion"] / c["median_ms"]["onnxruntime"])
        assert c["variant"] == "openblas sgemm" or c["variant"].split()[:2] in (["packed", data["isa"]],
                                                                              ["repack", data["isa"]])
    packed = [c for c in cores if c["variant"].startswith("packed")]
    assert packed and any(c["variant"].startswith("repack") for c in cores)  # attention: two activations
    floor = data["floor"]
    assert floor["floor_ms"] > 0 and floor["gflop"] == pytest.approx(
        sum(c["gflop"] * c["count_in_model"] for c in cores))
    code, out, _ = _cli(capsys, "bench-cores", "resnet-tiny", "--repeat", "1", "--rounds", "1", "--no-tune",
                        "--top", "2")
    assert code == 0 and "conv [" in out and "ours/ort" in out and "GEMM floor" in out


def test_bench_cores_on_a_model_without_cores_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from autofusion.decide import unfused_plan
    from autofusion.export import to_onnx

    b = GraphBuilder("relu_only")
    g = b.build([b.op("Relu", b.input("x", (4, 4)))])
    path = tmp_path / "relu.onnx"
    path.write_bytes(to_onnx(unfused_plan(g)).SerializeToString())
    code, _, err = _cli(capsys, "bench-cores", str(path), "--no-tune")
    assert code == 2 and "no MatMul, Gemm or Conv core" in err and "Traceback" not in err


def test_run_profile_names_the_core_of_each_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "run", "bert-tiny", "--backend", "c", "--profile", "--json", "--no-tune")
    assert code == 0, err
    kernels = json.loads(out)["kernels"]
    labelled = [k for k in kernels if k["cores"]]
    assert labelled and all(k["cores"] for k in kernels if k["template"] in ("gemm_epilogue", "horizontal_gemm"))
    assert all(not k["cores"] for k in kernels if k["template"] in ("pointwise", "reduction"))
    isa = requested_isa()
    assert any(label.startswith(f"packed {isa} ") for k in labelled for label in k["cores"])
    code, out, _ = _cli(capsys, "run", "bert-tiny", "--backend", "c", "--profile", "--no-tune")
    assert code == 0 and "core" in out and f"packed {isa}" in out



def test_a_deeply_nested_cache_file_is_ignored_too(tmp_path: Path) -> None:
    store = _stored(tmp_path)
    store.path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.warns(TuningCacheWarning, match="ignored"):
        assert _tuner(tmp_path, {}, []).store.entries == {}


def test_a_stored_choice_the_core_cannot_take_is_not_forced(tmp_path: Path) -> None:
    from autofusion.runtime.entry_file import checksum as _checksum

    store = _stored(tmp_path)
    data = json.loads(store.path.read_text())
    next(iter(data["entries"].values())).update(impl="taps", kc=512)  # a GEMM cannot read taps
    data["checksum"] = _checksum(data["entries"])
    store.path.write_text(json.dumps(data))
    assert _tuner(tmp_path, {}, []).store.get(BIG, 2) == CoreChoice("packed", 512)


def test_two_tuners_saving_keep_each_others_entries(tmp_path: Path) -> None:
    other = CoreSpec("gemm", 128, 3072, 768, packable=True)
    times = {c: 3e-4 for c in candidates(BIG, MACHINE)}
    first, second = _tuner(tmp_path, times, []), _tuner(tmp_path, times, [])  # both load an empty file
    first.choose(BIG)
    second.choose(other)  # saves after the first: must not drop the first's entry
    third = _tuner(tmp_path, times, [])
    assert third.store.get(BIG, 2) is not None and third.store.get(other, 2) is not None
    assert oct(third.store.path.stat().st_mode & 0o777) == "0o644"
    assert not list(third.store.path.parent.glob(".tuning-*"))  # no temporary file left behind


def test_a_batch_of_unfolded_products_is_not_tuned(tmp_path: Path) -> None:
    built: list[CoreChoice] = []
    batched = CoreSpec("gemm", 128, 768, 768, packable=True, calls=4)
    assert _tuner(tmp_path, {}, built).choose(batched) == CoreChoice("packed", 512) and built == []


def test_a_runtime_that_cannot_take_a_core_is_skipped_with_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.bench import cores as bench_cores

    def broken(spec: CoreSpec, threads: int) -> None:
        raise RuntimeError("no kernel for this op")

    monkeypatch.setattr(bench_cores, "_onnxruntime", broken)
    spec = CoreSpec("gemm", 8, 64, 64, packable=True)
    machine = Machine(requested_isa())
    [result] = bench_cores.measure_cores([(spec, CoreChoice("packed", 256), 1)], machine, 1, runs=1, rounds=1)
    assert result.skipped == {"onnxruntime": "RuntimeError: no kernel for this op"}
    assert set(result.times_ms) == {"autofusion", "openblas"}


def test_an_unknown_instruction_set_is_a_clear_error_at_the_command_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AUTOFUSION_ISA", "sse9")
    code, _, err = _cli(capsys, "run", "bert-tiny", "--backend", "c")
    assert code == 2 and "unknown instruction set 'sse9'" in err and "internal error" not in err
    code, _, err = _cli(capsys, "fuse", "bert-tiny", "--emit", str(tmp_path / "emit"))  # codegen alone
    assert code == 2 and "unknown instruction set 'sse9'" in err and "internal error" not in err
    assert not (tmp_path / "emit").exists()  # nothing half-written


def test_a_forced_instruction_set_needs_every_extension_its_march_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from autofusion.runtime import toolchain

    built = detect_toolchain(isa="avx2")  # -march=native where AVX2 is this CPU's own: forced here
    tc = dataclasses.replace(built, cflags=tuple(f for f in built.cflags if f != "-march=native") + ("-march=haswell",))
    monkeypatch.setattr(toolchain, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "bmi1", "f16c", "movbe", "abm"}))
    assert not tc.runnable  # no BMI2: -march=haswell may emit it
    monkeypatch.setattr(toolchain, "cpu_flags", lambda: frozenset(toolchain.ISA_NEEDS["avx2"]))
    assert tc.runnable


def test_a_product_at_nearby_rows_lends_its_choice_only_where_asked(tmp_path: Path) -> None:
    """With ``nearby_rows`` a product not tuned at its rows takes the choice tuned for the same
    product at the nearest rows within 2x, unmeasured; further rows, another product, a convolution
    or a tuner without the option measure as before."""
    fast = CoreChoice("packed", 256)
    times = {c: 4e-4 for c in candidates(BIG, MACHINE)}
    times[fast] = 1e-4
    built: list[CoreChoice] = []
    assert _tuner(tmp_path, times, built).choose(BIG) == fast  # tuned at BIG's rows
    tc = detect_toolchain()
    lent: list[CoreChoice] = []
    nearby = Tuner(tc, CompileCache(tmp_path), threads=2, build=_fake_build(times, lent), machine=MACHINE,
                   nearby_rows=True)
    for rows in (BIG.m // 2 + 1, BIG.m * 2, BIG.m - 1):
        assert nearby.choose(dataclasses.replace(BIG, m=rows)) == fast
    assert lent == [] and nearby.tuned == 0
    assert nearby.cached(dataclasses.replace(BIG, m=BIG.m * 2 + 1)) is None  # beyond 2x
    assert nearby.cached(dataclasses.replace(BIG, m=BIG.m + 1, k=BIG.k + 64)) is None  # another product
    assert _tuner(tmp_path, times, []).cached(dataclasses.replace(BIG, m=BIG.m + 1)) is None  # not asked
    conv = CoreSpec("conv", 3136, 64, 576, packable=True, taps=True,
                    geometry=((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), (1,)))
    assert nearby.store.nearby(conv, 2) is None
