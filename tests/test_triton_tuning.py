"""Triton launch configurations: every configuration of every kernel kind computes the reference's
numbers, and the tuner keeps the fastest, caches it per device and distrusts a damaged cache."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from autofusion.graph.graph import Graph
from autofusion.ir import run_graph
from autofusion.ir.builder import GraphBuilder

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU
pytest.importorskip("torch", reason="the Triton backend needs torch (pip install autofusion[gpu])",
                    exc_type=ImportError)
pytest.importorskip("triton", reason="the Triton backend needs triton (pip install autofusion[gpu])",
                    exc_type=ImportError)

from triton_cases import feeds_for, one_group_plan  # noqa: E402

from autofusion.codegen.triton import TritonKernel  # noqa: E402
from autofusion.codegen.triton.configs import Config, label, tile_configs  # noqa: E402
from autofusion.runtime.cache import CompileCache  # noqa: E402
from autofusion.runtime.triton_runner import TritonModel  # noqa: E402
from autofusion.runtime.triton_tuning import (  # noqa: E402
    MARGIN,
    TritonTuner,
    TritonTuningStore,
    TritonTuningWarning,
)

RNG = np.random.default_rng(7)


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def pointwise() -> Graph:
    b = GraphBuilder("pointwise")
    x = b.input("x", (3, 700))
    return b.build([b.op("Relu", b.op("Mul", x, b.const(np.float32(1.5))))])


def row_reduction() -> Graph:
    b = GraphBuilder("softmax")
    x = b.input("x", (5, 40))
    return b.build([b.op("Softmax", b.op("Add", x, x), axis=-1)])


def gemm() -> Graph:
    b = GraphBuilder("gemm")
    a = b.input("a", (2, 70, 40))
    return b.build([b.op("Relu", b.op("Add", b.op("MatMul", a, b.const(_w(40, 90))), b.const(_w(90))))])


def horizontal() -> Graph:
    b = GraphBuilder("horizontal")
    a = b.input("a", (70, 40))
    return b.build([b.op("MatMul", a, b.const(_w(40, 24))), b.op("Relu", b.op("MatMul", a, b.const(_w(40, 40))))])


def conv() -> Graph:
    b = GraphBuilder("conv")
    x = b.input("x", (1, 8, 10, 10))
    return b.build([b.op("Relu", b.op("Conv", x, b.const(_w(20, 8, 3, 3)), b.const(_w(20)), pads=[1, 1, 1, 1]))])


def lstm() -> Graph:
    b = GraphBuilder("lstm")
    x = b.input("x", (4, 2, 5))
    ys = b.op_multi("LSTM", [x, b.const(_w(1, 24, 5)), b.const(_w(1, 24, 6))], 3, hidden_size=6)
    return b.build([ys[0]])


CASES: dict[str, tuple[Callable[[], Graph], str]] = {
    "pointwise": (pointwise, "pointwise"), "row_reduction": (row_reduction, "reduction"),
    "looped_reduction": (row_reduction, "reduction"), "gemm": (gemm, "gemm_epilogue"),
    "horizontal_gemm": (horizontal, "horizontal_gemm"), "conv": (conv, "conv_epilogue"), "lstm": (lstm, "opaque"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_configuration_of_each_kernel_kind_computes_the_reference(case: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Tuning only picks among configurations that all compute the same numbers (fp32 rounding)."""
    if case == "looped_reduction":  # rows walked in blocks: blocks of 16 here, the row is 40 long
        from autofusion.codegen.triton import configs
        from autofusion.codegen.triton import reduce as red

        monkeypatch.setattr(red, "MAX_BLOCK", 16)
        monkeypatch.setattr(configs, "LOOP_BLOCKS", (16, 8, 32))
    build, template = CASES[case]
    graph = build()
    model = TritonModel(one_group_plan(graph, template), fallback=False, tune=False)
    (kernel,) = model.kernels
    assert len(kernel.configs) >= 2, f"{case}: nothing to tune"
    feeds = feeds_for(graph)
    want = run_graph(graph, feeds)
    for cfg in kernel.configs:
        model.configure(kernel.name, cfg)
        for call in ("step by step", "replayed"):
            got = model(feeds)
            for name, ref in want.items():
                np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{name} with {label(cfg)}, {call}")
        assert model.variants[kernel.name] == label(cfg)


def test_tiles_are_cut_to_the_problem_and_listed_once() -> None:
    configs = tile_configs(20, 18, 24)
    assert configs[0] == (("BM", 32), ("BN", 32), ("BK", 32), ("num_warps", 4))  # the default: what always ran
    assert len(configs) == 1  # every cap cut to 32 by a problem this small: nothing to tune
    assert len(tile_configs(70, 90, 40)) == len(set(tile_configs(70, 90, 40))) == 8
    assert all(dict(c)["BN"] == 48 for c in tile_configs(100, 200, 64, fixed_bn=48))


def test_a_configuration_the_kernel_does_not_have_is_refused() -> None:
    model = TritonModel(one_group_plan(pointwise(), "pointwise"), fallback=False, tune=False)
    (kernel,) = model.kernels
    with pytest.raises(ValueError, match="is not a configuration"):
        model.configure(kernel.name, (("BLOCK", 96), ("num_warps", 4)))
    with pytest.raises(ValueError, match="no Triton kernel"):
        model.configure("k_nothing", kernel.default)


# -- the tuner -----------------------------------------------------------------------------------


class FakeKernel:
    """The parts of a TritonKernel the tuner reads."""

    def __init__(self, configs: tuple[Config, ...], source: str = "kernel source") -> None:
        self.name, self.source, self.configs = "k_fake", source, configs

    @property
    def default(self) -> Config:
        return self.configs[0]


BLOCKS = tuple((("BLOCK", b), ("num_warps", 4)) for b in (128, 256, 512))


def _tuner(tmp_path: Path, seconds: dict[Config, float]) -> tuple[TritonTuner, list[Config]]:
    """A tuner whose timer answers ``seconds`` of the configuration just launched; the launches made."""
    launched: list[Config] = []

    def timer(call: Callable[[], object]) -> float:
        call()
        return seconds[launched[-1]]

    return TritonTuner(TritonTuningStore(CompileCache(tmp_path), "cpu"), timer), launched


def test_the_tuner_keeps_the_fastest_and_answers_from_its_store_after(tmp_path: Path) -> None:
    kernel = FakeKernel(BLOCKS)
    tuner, launched = _tuner(tmp_path, {BLOCKS[0]: 3e-5, BLOCKS[1]: 1e-5, BLOCKS[2]: 2e-5})
    assert tuner.choose(kernel, launched.append) == BLOCKS[1]  # type: ignore[arg-type]
    assert set(launched) == set(BLOCKS) and tuner.tuned == 1
    tuner.store.save()
    again, relaunched = _tuner(tmp_path, {})  # a new process: the file answers, nothing is launched
    assert again.choose(kernel, relaunched.append) == BLOCKS[1] and relaunched == []  # type: ignore[arg-type]
    entry = next(iter(json.loads(again.store.path.read_text())["entries"].values()))
    assert entry["times_us"] == {"BLOCK=128 warps=4": 30.0, "BLOCK=256 warps=4": 10.0, "BLOCK=512 warps=4": 20.0}


def test_the_default_stays_unless_another_is_clearly_faster(tmp_path: Path) -> None:
    close = 1e-5 * (1 - MARGIN / 2)
    tuner, launched = _tuner(tmp_path, {BLOCKS[0]: 1e-5, BLOCKS[1]: close, BLOCKS[2]: 2e-5})
    assert tuner.choose(FakeKernel(BLOCKS), launched.append) == BLOCKS[0]  # type: ignore[arg-type]


def test_a_configuration_the_device_cannot_run_is_left_out(tmp_path: Path) -> None:
    """A block too large for the device's shared memory fails to compile: that configuration is
    not a candidate; the default failing is the kernel's own error."""
    tuner, launched = _tuner(tmp_path, {BLOCKS[0]: 3e-5, BLOCKS[1]: 1e-5, BLOCKS[2]: 2e-5})

    def launch(cfg: Config) -> None:
        if cfg == BLOCKS[1]:
            raise RuntimeError("out of resources: shared memory")
        launched.append(cfg)

    assert tuner.choose(FakeKernel(BLOCKS), launch) == BLOCKS[2]  # type: ignore[arg-type]
    assert BLOCKS[1] not in launched

    def default_fails(cfg: Config) -> None:
        raise RuntimeError("the default does not compile")

    with pytest.raises(RuntimeError, match="the default does not compile"):
        tuner.choose(FakeKernel(BLOCKS, source="another kernel"), default_fails)  # type: ignore[arg-type]


def test_a_kernel_with_one_configuration_is_not_timed(tmp_path: Path) -> None:
    tuner, launched = _tuner(tmp_path, {})
    assert tuner.choose(FakeKernel(BLOCKS[:1]), launched.append) == BLOCKS[0] and launched == []  # type: ignore[arg-type]


@pytest.mark.parametrize("damage", ["truncated", "edited", "foreign", "not_a_configuration"])
def test_a_damaged_or_foreign_tuning_file_is_ignored_with_a_warning(tmp_path: Path, damage: str) -> None:
    from autofusion.runtime.entry_file import checksum

    kernel = FakeKernel(BLOCKS)
    tuner, launched = _tuner(tmp_path, {BLOCKS[0]: 3e-5, BLOCKS[1]: 1e-5, BLOCKS[2]: 2e-5})
    tuner.choose(kernel, launched.append)  # type: ignore[arg-type]
    tuner.store.save()
    path = tuner.store.path
    data = json.loads(path.read_text())
    entry = next(iter(data["entries"].values()))
    if damage == "truncated":
        path.write_text(path.read_text()[:40])
    elif damage == "edited":  # a configuration forced by hand: the checksum no longer matches
        entry["config"] = [["BLOCK", 512], ["num_warps", 4]]
        path.write_text(json.dumps(data))
    elif damage == "foreign":  # copied from another device
        data["fingerprint"] = "0" * 64
        path.write_text(json.dumps(data))
    else:  # written by other code, checksum and all: a configuration this kernel does not have
        entry["config"] = [["BLOCK", 96], ["num_warps", 4]]
        data["checksum"] = checksum(data["entries"])
        path.write_text(json.dumps(data))
    if damage == "not_a_configuration":  # a valid file: the entry is simply not forced on the kernel
        again, relaunched = _tuner(tmp_path, {BLOCKS[0]: 3e-5, BLOCKS[1]: 1e-5, BLOCKS[2]: 2e-5})
    else:
        with pytest.warns(TritonTuningWarning, match="ignored, kernels are tuned again"):
            again, relaunched = _tuner(tmp_path, {BLOCKS[0]: 3e-5, BLOCKS[1]: 1e-5, BLOCKS[2]: 2e-5})
    assert again.choose(kernel, relaunched.append) == BLOCKS[1] and relaunched  # type: ignore[arg-type]


def test_a_model_tunes_in_its_first_run_and_reuses_the_cache(tmp_path: Path) -> None:
    """With tuning on, the first run times each kernel with a choice and saves the file; a model built
    later answers from it without timing anything, and both compute the reference's numbers."""
    graph = pointwise()  # six configurations, each launch cheap under the interpreter
    feeds = feeds_for(graph)
    want = run_graph(graph, feeds)
    timed: list[int] = []

    def timer(call: Callable[[], object]) -> float:
        call()
        timed.append(1)
        return 1e-3

    first = TritonModel(one_group_plan(graph, "pointwise"), fallback=False, tune=True, cache=tmp_path,
                        timer=timer)
    np.testing.assert_allclose(first(feeds)[next(iter(want))],
                               want[next(iter(want))], rtol=1e-4, atol=1e-5)
    assert first.tuned == 1 and timed
    (kernel,) = first.kernels
    assert first.variants[kernel.name] == label(kernel.default)  # all timed alike: the default stays

    def no_timer(call: Callable[[], object]) -> float:
        raise AssertionError("a cached kernel was timed again")

    second = TritonModel(one_group_plan(graph, "pointwise"), fallback=False, tune=True, cache=tmp_path,
                         timer=no_timer)
    got = second(feeds)
    np.testing.assert_allclose(got[next(iter(want))], want[next(iter(want))], rtol=1e-4, atol=1e-5)
    assert second.tuned == 0


def test_on_the_cpu_the_runner_does_not_tune_unless_asked(tmp_path: Path) -> None:
    model = TritonModel(one_group_plan(pointwise(), "pointwise"), fallback=False, cache=tmp_path)
    model(feeds_for(model.plan.graph))
    assert model.tuned == 0 and not (tmp_path / "triton-tuning").exists()
    kernel: TritonKernel = model.kernels[0]
    assert model.variants == {kernel.name: label(kernel.default)}
