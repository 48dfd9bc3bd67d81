"""Two processes optimising and compiling the same model at once against one fresh cache directory,
also after its entries were corrupted, and a cache on a read-only filesystem: correct results in each case.
Eight threads running one compiled model (fused, profiling, unfused) at once: every result right."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from autofusion.api import optimize
from autofusion.graph.graph import Graph
from autofusion.ir import GraphBuilder, run_graph
from autofusion.models import build, random_inputs
from autofusion.runtime import CompileCache, CompiledModel, compare_outputs
from autofusion.runtime.loader import WorkspacePool
from autofusion.runtime.unfused import UnfusedRunner

_CHILD = r"""
import sys, time
from pathlib import Path
import numpy as np
from autofusion.api import optimize
from autofusion.ir import GraphBuilder, run_graph
from autofusion.runtime import CompileCache, CompiledModel, compare_outputs

cache_dir, go = sys.argv[1], Path(sys.argv[2])
b = GraphBuilder("race")
x = b.input("x", (8, 16))
w = b.const(np.linspace(-1, 1, 16 * 12, dtype=np.float32).reshape(16, 12))
h = b.op("Relu", b.op("Add", b.op("MatMul", x, w), b.const(np.full(12, 0.25, np.float32))))
g = b.build([b.op("Softmax", b.op("Tanh", h), axis=-1)])
plan = optimize(g, strategy="dp")
while not go.exists():  # both processes reach the compiler together
    time.sleep(0.005)
cache = CompileCache(cache_dir)
model = CompiledModel(plan, cache=cache)
feeds = {"x": np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)}
report = compare_outputs(run_graph(g, feeds), model.run(feeds))
assert report.ok, report.summary()
print(cache.hits, cache.misses, model.library_path)
"""


def _race(cache: Path, go: Path) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent))
    go.unlink(missing_ok=True)
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(cache), str(go)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(out.strip())
    return outs


def _entries(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".sha256")]


def test_two_processes_compile_the_same_model_at_once_then_after_corruption(tmp_path: Path) -> None:
    cache, go = tmp_path / "cache", tmp_path / "go"
    first = _race(cache, go)
    libraries = {line.split()[2] for line in first}
    assert len(libraries) == 1  # one content-addressed entry, shared
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]
    lib = Path(libraries.pop())
    # damage every entry: flip bytes in the library (same length), garble one sidecar, truncate objects
    data = bytearray(lib.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
    damaged = tmp_path / "damaged"
    damaged.write_bytes(bytes(data))
    os.replace(damaged, lib)
    for entry in _entries(cache):
        if entry != lib and entry.suffix == ".o":
            damaged.write_bytes(entry.read_bytes()[:10])
            os.replace(damaged, entry)
        elif entry != lib:
            entry.with_name(entry.name + ".sha256").write_text("0" * 64)
    second = _race(cache, go)
    # the damage is detected (a miss and a rebuild); the process that comes second may then find the
    # rebuilt entry intact, so only one miss is guaranteed
    assert any(int(line.split()[1]) >= 1 for line in second)
    third = _race(cache, go)
    assert all(int(line.split()[1]) == 0 for line in third)  # the rebuilt entries are intact again


def test_cache_on_a_read_only_filesystem_falls_back_and_computes_correctly() -> None:
    # permission bits do not stop root; a read-only filesystem stops everyone
    if not Path("/proc/self").is_dir():
        pytest.skip("needs a read-only filesystem at /proc")
    cache = CompileCache("/proc/autofusion-cache")
    assert cache.fallback and cache.requested == Path("/proc/autofusion-cache")
    b = GraphBuilder("ro")
    x = b.input("x", (5, 7))
    g = b.build([b.op("Sigmoid", b.op("Mul", x, b.const(np.float32(1.5))))])
    feeds = {"x": np.linspace(-3, 3, 35, dtype=np.float32).reshape(5, 7)}
    model = CompiledModel(optimize(g), cache=cache)
    assert model.library_path.is_relative_to(cache.root)
    assert compare_outputs(run_graph(g, feeds), model.run(feeds)).ok


def _feeds(count: int, name: str = "bert-tiny") -> tuple[Graph, list[dict[str, np.ndarray]]]:
    graph = build(name)
    return graph, [random_inputs(graph, seed=i) for i in range(count)]


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny", "resnet-tiny", "lstm-tiny"])
def test_compiled_model_is_correct_from_eight_threads_at_once(problems_from_threads, name: str) -> None:
    graph, feeds = _feeds(16, name)
    model = CompiledModel(optimize(graph))
    assert problems_from_threads(model.run, feeds, threads=8, calls=200) == []


def test_profiling_build_keeps_each_threads_timings(problems_from_threads) -> None:
    graph, feeds = _feeds(4)
    model = CompiledModel(optimize(graph), profile=True)
    seen: list[dict[str, float]] = []

    def run_and_time(f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = model.run(f)
        seen.append(model.step_seconds())
        return out

    assert problems_from_threads(run_and_time, feeds, threads=8, calls=200) == []
    assert all(set(s) == set(model.source.profiled) and min(s.values()) >= 0.0 for s in seen)


def test_unfused_runner_is_correct_from_eight_threads_at_once(problems_from_threads) -> None:
    graph, feeds = _feeds(8)
    runner = UnfusedRunner(graph)
    assert problems_from_threads(runner.run, feeds, threads=8, calls=200) == []


def test_workspace_pool_gives_calls_at_once_their_own_workspace() -> None:
    pool = WorkspacePool(1000)
    with pool.lease() as first, pool.lease() as second:
        assert first.ctypes.data != second.ctypes.data
        assert first.nbytes == second.nbytes == 1000 and first.ctypes.data % 64 == 0
    with pool.lease() as again:  # released workspaces are reused, not reallocated
        assert again.ctypes.data in (first.ctypes.data, second.ctypes.data)
    assert pool.allocated == 2


def test_workspace_pool_serves_calls_of_different_sizes_from_the_smallest_that_fits() -> None:
    pool = WorkspacePool(100)  # a library over symbolic sizes asks for what each binding needs
    with pool.lease(5000) as big:  # the free 100 bytes give way to 5000
        assert big.nbytes == 5000
    with pool.lease(300) as fits, pool.lease(50) as small:
        assert fits.ctypes.data == big.ctypes.data and small.nbytes == 64  # a second one, of what it asked
    with pool.lease(60) as again:
        assert again.nbytes == 64  # the smallest free one that fits, not the 5000
    assert pool.allocated == 2


def test_a_bounded_pool_makes_calls_beyond_it_wait(problems_from_threads) -> None:
    graph, feeds = _feeds(8)
    model = CompiledModel(optimize(graph), max_concurrent=2)
    assert problems_from_threads(model.run, feeds, threads=8, calls=50) == []
    assert model.workspaces.allocated <= 2
    pool = WorkspacePool(100, limit=1)
    order: list[str] = []

    def second() -> None:
        with pool.lease():
            order.append("second")

    with pool.lease():
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(0.2)  # it cannot lease while the only workspace is out
        order.append("first done")
    waiter.join()
    assert order == ["first done", "second"] and pool.allocated == 1
    with pytest.raises(ValueError, match="at least 1"):
        WorkspacePool(100, limit=0)
