"""The runtimes a benchmark puts side by side, each behind one interface.

Every runner is built by a ``prepare_*`` function from a :class:`BenchSetup`; one that needs a
package that is not installed (or cannot work on this machine) raises :class:`RunnerSkipped`
with the reason, and the benchmark reports it instead of a number.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.bench.device_runners import DeviceOutputs, device_feeds, synchronize
from autofusion.codegen.buffers import BufferPlan
from autofusion.decide import unfused_plan
from autofusion.decide.plan import Plan
from autofusion.graph.graph import Graph
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

RUNNER_NAMES: tuple[str, ...] = ("reference", "unfused", "fused", "ort_disable", "ort_all", "torch_eager",
                                 "torch_compile")
# ONNX ops that only change metadata: onnxruntime runs them without touching the data (or folds them)
ONNX_VIEW_OPS = frozenset({"Constant", *(op for op in default_registry().names if default_registry()[op].view)})

Outputs = Mapping[str, np.ndarray]


class RunnerSkipped(Exception):
    """A runner that cannot run here; the message says why."""


class BenchSetup:
    """What every runner gets: the source graph, the optimised plan, feeds and the thread count."""

    def __init__(self, graph: Graph, plan: Plan, feeds: Mapping[str, np.ndarray], threads: int,
                 registry: OpRegistry | None = None, workdir: Path | None = None, device: str = "cpu") -> None:
        self.device = device  # "cuda": the device runners (bench/device_runners.py) run on the GPU
        self.graph = graph
        self.plan = plan
        self.feeds = dict(feeds)
        self.threads = threads
        self.registry = registry or default_registry()
        # a folder of its own is removed with the setup; one passed in is the caller's to remove
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="autofusion-bench-"))
            weakref.finalize(self, shutil.rmtree, workdir, True)  # removed with the setup, at exit at the latest
        self.workdir = workdir

    @functools.cached_property
    def onnx_bytes(self) -> bytes:
        """The source graph as ONNX (every op a plain node), serialised once for both ORT runners."""
        from autofusion.export import to_onnx

        return to_onnx(unfused_plan(self.graph, self.registry)).SerializeToString()


@dataclass
class Runner:
    """A prepared runtime. ``call`` runs the model once on the setup's feeds.

    ``memory`` says how its peak memory is measured: ``planned`` (``planned_peak`` holds the
    runtime's buffer plan), ``tracemalloc``, ``rss`` or ``device`` (a CUDA device's; measured on its
    first call). ``reported`` entries go into the result as they are.
    """

    name: str
    call: Callable[[], Outputs]
    kernels: int | None
    kernels_method: str
    setup_seconds: float
    memory: str
    planned_peak: int | None = None
    planned_method: str = ""
    extra: dict[str, Any] | None = None
    reported: dict[str, Any] | None = None


RunnerFactory = Callable[[BenchSetup], Runner]


def prepare(name: str, setup: BenchSetup, factories: Mapping[str, RunnerFactory] | None = None) -> Runner:
    """The runner called ``name`` (from ``factories`` first, else the built-in ones); RunnerSkipped
    when it cannot run here."""
    factory = (factories or {}).get(name) or _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown runner {name!r}; runners: {', '.join(RUNNER_NAMES)}")
    t0 = time.perf_counter()
    runner = factory(setup)
    runner.setup_seconds = time.perf_counter() - t0
    return runner


def _reference(setup: BenchSetup) -> Runner:
    from autofusion.ir.interpreter import run_graph

    return Runner("reference", lambda: run_graph(setup.graph, setup.feeds, setup.registry), None,
                  "n/a: the numpy interpreter runs op by op", 0.0, "tracemalloc")


def _unfused(setup: BenchSetup) -> Runner:
    from autofusion.bench.opaque import planned_buffers
    from autofusion.runtime import UnfusedRunner

    runner = UnfusedRunner(setup.graph, threads=setup.threads)
    buffers = planned_buffers(runner)
    return Runner("unfused", lambda: runner.run(setup.feeds), runner.plan.kernels,
                  "kernels launched: one per op that is not a view", 0.0, "planned",
                  buffers.peak_bytes,
                  "planned: the runtime's buffer plan for the unfused plan (peak live intermediates and scratch)",
                  {"runtime": runner}, _footprint(buffers, setup.threads))


def _footprint(buffers: BufferPlan, threads: int) -> dict[str, int]:
    """Besides the activations: the largest per-thread blocks of a kernel, and the total with them."""
    return {"thread_block_bytes": buffers.thread_bytes, "footprint_bytes": buffers.footprint(threads)}


def _fused(setup: BenchSetup) -> Runner:
    from autofusion.runtime import CompiledModel

    model = CompiledModel(setup.plan, threads=setup.threads)
    assert model.source.buffers is not None
    return Runner("fused", lambda: model.run(setup.feeds), setup.plan.kernels,
                  "kernels launched: the plan's non-view groups", 0.0, "planned", model.peak_bytes,
                  "planned: the runtime's buffer plan for the fused plan (peak live intermediates and scratch)",
                  None, _footprint(model.source.buffers, setup.threads))


def _ort(setup: BenchSetup, name: str, level: str) -> Runner:
    try:
        import onnxruntime as ort
    except ImportError:
        raise RunnerSkipped("onnxruntime is not installed (pip install onnxruntime)") from None
    optimized = setup.workdir / f"{name}.onnx"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    opts.intra_op_num_threads = setup.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.optimized_model_filepath = str(optimized)
    # weights of the saved optimised graph go to a side file: only its nodes are read back
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{name}.weights")
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    opts.log_severity_level = 3
    session = ort.InferenceSession(setup.onnx_bytes, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def call() -> Outputs:
        return dict(zip(names, session.run(names, setup.feeds)))

    return Runner(name, call, onnx_kernels(optimized),
                  "nodes of onnxruntime's optimised graph, view-only ops (Reshape, Squeeze, Unsqueeze, Flatten, "
                  "Identity, Constant) counted as zero", 0.0, "rss")


def onnx_kernels(path: Path) -> int:
    """Nodes of the ONNX model at ``path`` (and its functions' bodies are not expanded), views excluded."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return sum(1 for n in model.graph.node if n.op_type not in ONNX_VIEW_OPS)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise RunnerSkipped("torch is not installed (pip install torch==2.13.0)") from None
    return torch


def _torch_module(setup: BenchSetup) -> tuple[Any, Any, tuple[Any, ...]]:
    torch = _import_torch()
    from autofusion.runtime.torch_ops import UnsupportedOpError, to_torch_module, torch_feeds

    torch.set_num_threads(setup.threads)
    try:
        module = to_torch_module(setup.graph)
    except UnsupportedOpError as e:
        raise RunnerSkipped(f"the graph has an op the torch conversion lacks: {e}") from None
    if setup.device != "cpu":
        return torch, module.to(setup.device), tuple(device_feeds(setup.graph, setup.feeds, setup.device).values())
    return torch, module, torch_feeds(setup.graph, setup.feeds)


def _torch_outputs(setup: BenchSetup, outputs: tuple[Any, ...]) -> Outputs:
    """A torch module's outputs: numpy on the CPU; on a device left there until checked."""
    from autofusion.runtime.torch_ops import numpy_outputs

    if setup.device == "cpu":
        return numpy_outputs(setup.graph, outputs)
    synchronize(setup.device)
    return DeviceOutputs(dict(zip(setup.graph.outputs, outputs)))


def _memory(setup: BenchSetup) -> str:
    return "rss" if setup.device == "cpu" else "device"


def _torch_eager(setup: BenchSetup) -> Runner:
    torch, module, args = _torch_module(setup)  # first: says "not installed" before torch_ops imports torch

    def call() -> Outputs:
        with torch.inference_mode():
            return _torch_outputs(setup, module(*args))

    views = sum(1 for n in setup.graph.nodes if setup.registry[n.op].view)
    return Runner("torch_eager", call, len(setup.graph.nodes) - views,
                  "torch calls of the converted graph that are not views (each one or more aten kernels)", 0.0,
                  _memory(setup))


def _torch_compile(setup: BenchSetup) -> Runner:
    torch, module, args = _torch_module(setup)  # first: says "not installed" before torch_ops imports torch

    metrics: Any = None
    try:
        import torch._inductor.metrics

        metrics = torch._inductor.metrics
        metrics.reset()
    except ImportError:
        pass
    compiled = torch.compile(module)  # the default backend: inductor

    def call() -> Outputs:
        with torch.inference_mode():
            return _torch_outputs(setup, compiled(*args))

    try:
        call()  # compiles: the setup time, not the measured runs
    except Exception as e:  # inductor needs a working C++ toolchain; report why it could not compile
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunnerSkipped(f"torch.compile (inductor) failed on this machine: {type(e).__name__}: {first}") from None
    generated = int(getattr(metrics, "generated_kernel_count", 0)) if metrics is not None else 0
    if generated:
        return Runner("torch_compile", call, generated,
                      "kernels inductor generated (calls to library GEMM/conv kernels not counted)", 0.0,
                      _memory(setup))
    return Runner("torch_compile", call, None, "n/a: inductor reported no kernel count (cached compile)", 0.0,
                  _memory(setup))


def _triton(setup: BenchSetup) -> Runner:
    """The plan's Triton SuperKernel on the setup's device (the interpreter on the CPU)."""
    _import_torch()
    try:
        import triton  # noqa: F401
    except ImportError:
        raise RunnerSkipped("triton is not installed (pip install 'autofusion[gpu]')") from None
    from autofusion.runtime.triton_runner import TritonModel

    model = TritonModel(setup.plan, device=setup.device)
    feeds = device_feeds(setup.graph, setup.feeds, setup.device)
    model.run_device(feeds)  # compiles, tunes on a device, and prepares the replay: setup time

    def call() -> Outputs:
        outputs = model.run_device(feeds)
        synchronize(setup.device)
        return DeviceOutputs(outputs)

    return Runner("triton", call, len(model.kernels), "Triton kernels of the plan (groups split per op counted "
                  "apart; views and torch's ops not counted)", 0.0, _memory(setup),
                  reported={"launches": model.launches, "workspace_bytes": model.workspace_bytes,
                            "tuning": model.tuning, "split": dict(model.split), "on_torch": dict(model.on_torch),
                            "host": dict(model.fallbacks)})


def _ort_cuda(setup: BenchSetup) -> Runner:
    try:
        import onnxruntime as ort
    except ImportError:
        raise RunnerSkipped("onnxruntime is not installed (pip install onnxruntime-gpu)") from None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RunnerSkipped("onnxruntime has no CUDA provider here (pip install onnxruntime-gpu)")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(setup.onnx_bytes, opts, providers=["CUDAExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def call() -> Outputs:  # the feeds go to the device and the outputs back in each call, as run() does
        return dict(zip(names, session.run(names, setup.feeds)))

    return Runner("ort_cuda", call, None, "n/a: onnxruntime's CUDA provider does not list its kernels", 0.0, "rss")


_FACTORIES: dict[str, RunnerFactory] = {
    "reference": _reference,
    "unfused": _unfused,
    "fused": _fused,
    "ort_disable": lambda s: _ort(s, "ort_disable", "ORT_DISABLE_ALL"),
    "ort_all": lambda s: _ort(s, "ort_all", "ORT_ENABLE_ALL"),
    "torch_eager": _torch_eager,
    "torch_compile": _torch_compile,
    "triton": _triton,
    "ort_cuda": _ort_cuda,
}
