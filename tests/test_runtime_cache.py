"""The compiler driver and its cache: hits, damaged entries, unwritable directories, compile errors,
concurrent builds; and the runners' handling of bad feeds and thread counts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from class_planner import greedy_plan

from autofusion.codegen import TemplateSet, render_plan
from autofusion.codegen.superkernel import LibrarySource
from autofusion.decide import unfused_plan
from autofusion.ir import GraphBuilder, run_graph
from autofusion.runtime import (
    CompileCache,
    CompiledModel,
    CompileError,
    RunError,
    UnfusedRunner,
    compare_outputs,
    compile_library,
    detect_toolchain,
)


def tiny_plan(scale: float = 2.0):  # noqa: ANN201
    b = GraphBuilder("tiny")
    x = b.input("x", (3, 4))
    g = b.build([b.op("Mul", b.op("Relu", x), b.const(np.float32(scale)))])
    return unfused_plan(g)


FEEDS = {"x": np.array([[-1, 2, 3, -4]] * 3, np.float32)}


def test_second_compile_hits_the_cache(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    first = CompiledModel(tiny_plan(), cache=cache)
    assert cache.misses > 0
    hits_before = cache.hits
    cache.misses = 0
    second = CompiledModel(tiny_plan(), cache=cache)
    assert cache.misses == 0 and cache.hits > hits_before
    assert second.library_path == first.library_path
    np.testing.assert_array_equal(second.run(FEEDS)["mul_3_out"], np.maximum(FEEDS["x"], 0) * 2)


def test_truncated_entry_is_detected_and_rebuilt(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    lib = CompiledModel(tiny_plan(3.0), cache=cache).library_path
    # a crash mid-write or a full disk left damaged entries (new files: the loaded library stays mapped)
    damaged = tmp_path / "damaged"
    damaged.write_bytes(lib.read_bytes()[:100])
    os.replace(damaged, lib)
    for obj in (tmp_path / "obj").glob("*.o"):
        damaged.write_bytes(b"garbage")
        os.replace(damaged, obj)
    cache.misses = 0
    model = CompiledModel(tiny_plan(3.0), cache=cache)
    assert cache.misses >= 2  # both the library and the objects were rebuilt
    np.testing.assert_array_equal(model.run(FEEDS)["mul_3_out"], np.maximum(FEEDS["x"], 0) * 3)


def test_unwritable_cache_falls_back_to_temp_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = CompileCache(blocker / "cache")  # cannot be created under a regular file
    assert cache.fallback and cache.root != blocker / "cache"
    model = CompiledModel(tiny_plan(4.0), cache=cache)
    assert model.library_path.is_relative_to(cache.root)
    np.testing.assert_array_equal(model.run(FEEDS)["mul_3_out"], np.maximum(FEEDS["x"], 0) * 4)


@pytest.mark.skipif(os.geteuid() == 0, reason="permission bits do not stop root")
def test_read_only_cache_dir_falls_back(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        cache = CompileCache(ro)
        assert cache.fallback
        assert CompiledModel(tiny_plan(5.0), cache=cache).run(FEEDS)
    finally:
        ro.chmod(0o700)


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE", str(tmp_path / "env-cache"))
    assert CompileCache().root == tmp_path / "env-cache"


def test_compile_error_names_the_kept_source_and_first_errors(tmp_path: Path) -> None:
    broken = LibrarySource("broken", (("bad.c", '#include "af_runtime.h"\nint f(void) { return undefined_name; }\n'),),
                           TemplateSet().runtime_header(), (), ())
    with pytest.raises(CompileError) as info:
        compile_library(broken, cache=tmp_path)
    message = str(info.value)
    path = re.search(r"while compiling (\S+\.c)", message)
    assert path and Path(path.group(1)).is_file()  # the generated file stays on disk for inspection
    assert "undefined_name" in message and "error" in message


def test_missing_compiler_is_a_clear_error() -> None:
    with pytest.raises(CompileError, match="not found"):
        detect_toolchain("no-such-compiler-autofusion")


_CONCURRENT = """
import sys
import numpy as np
from autofusion.decide import unfused_plan
from autofusion.ir import GraphBuilder, run_graph
from autofusion.runtime import CompiledModel
b = GraphBuilder("race")
x = b.input("x", (64,))
g = b.build([b.op("Sin", b.op("Exp", x))])
m = CompiledModel(unfused_plan(g), cache=sys.argv[1])
y = m.run({"x": np.zeros(64, np.float32)})[g.outputs[0]]
assert np.allclose(y, np.sin(1.0)), y
"""


def test_concurrent_processes_share_one_cache(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent))
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    assert list((tmp_path / "lib").glob("*.so"))
    assert not list((tmp_path / "lib").glob(".*.tmp"))


def test_bad_feeds_raise_run_error(tmp_path: Path) -> None:
    plan = tiny_plan()
    for runner in (CompiledModel(plan, cache=tmp_path), UnfusedRunner(plan.graph, cache=tmp_path)):
        with pytest.raises(RunError, match="missing input 'x'"):
            runner.run({})
        with pytest.raises(RunError, match="shape"):
            runner.run({"x": np.zeros((4, 3), np.float32)})
        with pytest.raises(RunError, match="dtype"):
            runner.run({"x": np.zeros((3, 4), np.float64)})


def test_feeds_of_any_layout_give_the_same_outputs(tmp_path: Path) -> None:
    """Contiguous arrays of the graph's dtype take the short path; read-only, strided and
    Fortran-ordered ones the checked path, which copies them: the outputs are the same."""
    model = CompiledModel(tiny_plan(), cache=tmp_path)
    x = FEEDS["x"]
    expected = model.run(FEEDS)
    read_only = x.copy()
    read_only.flags.writeable = False
    strided = np.zeros((3, 8), np.float32)
    strided[:, ::2] = x
    for feed in (x, read_only, strided[:, ::2], np.asfortranarray(x)):
        out = model.run({"x": feed})
        assert out.keys() == expected.keys()
        for name in out:
            np.testing.assert_array_equal(out[name], expected[name])
    np.testing.assert_array_equal(next(iter(expected.values())), np.maximum(x, 0) * 2)


def test_threads_argument_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    model = CompiledModel(tiny_plan(), cache=tmp_path)
    assert model.threads == 1
    assert CompiledModel(tiny_plan(), cache=tmp_path, threads=3).threads == 3
    with pytest.raises(ValueError):
        CompiledModel(tiny_plan(), cache=tmp_path, threads=0)


def test_superkernel_exports_one_entry_point(tmp_path: Path) -> None:
    source = render_plan(tiny_plan())
    lib = compile_library(source, cache=tmp_path)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if " T " in line}
    assert {"af_run", "af_create", "af_destroy"} <= exported
    assert not any(s.startswith("k0_") for s in exported)  # kernels stay internal: one entry point



def test_generated_code_builds_and_runs_without_openmp(tmp_path: Path) -> None:
    tc = detect_toolchain()
    serial = replace(tc, cflags=tuple(f for f in tc.cflags if f != "-fopenmp") + ("-fopenmp-simd",),
                     ldflags=(), openmp=False)
    b = GraphBuilder("serial")
    x = b.input("x", (64, 600))
    h = b.op("Relu", b.op("MatMul", x, b.const(np.full((600, 300), 0.01, np.float32) + np.eye(600, 300, dtype=np.float32))))
    g = b.build([b.op("Softmax", h, axis=-1)])
    model = CompiledModel(greedy_plan(g), cache=tmp_path, toolchain=serial)
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 600)).astype(np.float32)}
    assert compare_outputs(run_graph(g, feeds), model.run(feeds)).ok
