"""CompiledModel: a plan compiled into one SuperKernel library, run with one call."""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autofusion.codegen.cores import CoreChooser, DefaultChooser, Machine, this_machine
from autofusion.codegen.superkernel import LibrarySource, render_plan
from autofusion.codegen.templates import TemplateSet
from autofusion.decide.plan import Plan
from autofusion.graph.dims import evaluate
from autofusion.graph.graph import Graph
from autofusion.ir.symbolic import BindError, binding_of_shapes, representative_binding, symbols_of
from autofusion.runtime.cache import CompileCache
from autofusion.runtime.compiler import compile_library
from autofusion.runtime.loader import (
    LibraryContext,
    RunError,
    WorkspacePool,
    checked_feeds,
    data_address,
    default_threads,
    load_library,
    pointer_array,
    ready_feeds,
)
from autofusion.runtime.sanitize import refusal, sanitizer_loaded
from autofusion.runtime.toolchain import CompileError, Toolchain, detect_toolchain
from autofusion.runtime.tuning import Progress, Tuner, render_tuned, tune_by_default

CALL_SHAPES_KEPT = 64  # input shapes whose sizes, output shapes and workspace a model remembers


@dataclass(frozen=True)
class _Call:
    """What a call with one set of input shapes needs, worked out once for those shapes."""

    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    sizes: np.ndarray | None  # the binding, in af_run_sized's order (None: a static library)
    offsets: np.ndarray | None  # where each workspace block goes at these sizes (af_place_sized)
    workspace_bytes: int


class CompiledModel:
    """``plan`` compiled to a SuperKernel and loaded; ``run(feeds)`` returns the graph outputs.

    >>> # from autofusion.decide import unfused_plan
    >>> # model = CompiledModel(unfused_plan(graph)); model.run({"x": x})["y"]

    Weights are handed to the library once, at load; each run passes only the input, output and
    workspace pointers. ``run`` is safe from any number of threads at once: each call leases a
    workspace of its own from a pool (``workspaces``), so calls neither share buffers nor wait for
    each other; the pool grows to the most calls that ran at once, or to ``max_concurrent``
    workspaces, beyond which calls wait their turn (a server bounds its memory so).

    Matrix products run the core the tuner measured fastest on this machine for their shape
    (runtime/tuning.py, cached per machine); ``tune=False`` (or ``$AUTOFUSION_TUNE=0``) takes the
    untuned default instead, deterministically; ``cores`` hands in a chooser of one's own;
    ``tune_nearby``: a product tuned at rows within 2x of its own takes that choice unmeasured.

    A plan over symbolic sizes (``optimize(load_onnx(path))`` of a model with dynamic axes) compiles
    into one library that serves every binding: ``run`` reads the sizes off the feeds (a shape that
    contradicts the graph is a RunError naming the input and axis), and each call's workspace is
    placed for its sizes. Its cores are chosen (or tuned) at the sizes given to
    ``optimize(sizes=...)``, else for a typical call (codegen/sizes.py ``typical``). A plan whose
    kernels cannot all take run-time sizes is a CodegenError here; :class:`autofusion.runtime.DynamicModel`
    then compiles one library per binding.
    """

    def __init__(self, plan: Plan, threads: int | None = None, cache: CompileCache | str | Path | None = None,
                 toolchain: Toolchain | None = None, templates: TemplateSet | None = None,
                 profile: bool = False, tune: bool | None = None, cores: CoreChooser | None = None,
                 progress: Progress | None = None, max_concurrent: int | None = None,
                 tune_nearby: bool = False) -> None:
        self.plan = plan
        self.symbols = symbols_of(plan.graph)  # sizes each call passes, in af_run_sized's order
        self.threads = default_threads(threads)
        self.cache = cache if isinstance(cache, CompileCache) else CompileCache(cache)
        tc = runnable_toolchain(toolchain)
        self.chooser = cores or core_chooser(tc, self.cache, self.threads, tune, progress, tune_nearby)
        self.source: LibrarySource = render_tuned(
            self.chooser, lambda chooser: render_plan(plan, templates, profile=profile, chooser=chooser))
        self.library_path = compile_library(self.source, tc, self.cache)
        lib = load_library(self.library_path)
        self.machine = library_machine(lib, self.chooser.machine)
        lib.af_run.restype = ctypes.c_int
        lib.af_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        if self.symbols:
            lib.af_place_sized.restype = ctypes.c_int64
            lib.af_place_sized.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            lib.af_num_blocks.restype = ctypes.c_int
            lib.af_run_placed.restype = ctypes.c_int
            lib.af_run_placed.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int]
        self._lib = lib
        self._context = LibraryContext(self, lib, self.source.constants)
        self._ctx = self._context.ctx
        assert self.source.buffers is not None
        self.workspaces = WorkspacePool(self.source.buffers.workspace_bytes, max_concurrent)
        graph = plan.graph
        self._out_specs = [(o, graph.types[o].shape, graph.types[o].dtype.numpy) for o in graph.outputs]
        self._in_dtypes = [np.dtype(graph.types[i].dtype.numpy) for i in graph.inputs]
        self._calls: OrderedDict[tuple[object, ...], _Call] = OrderedDict()  # by the feeds' shapes
        self._calls_lock = threading.Lock()
        self._static_call = None if self.symbols else _Call(
            tuple(graph.types[i].shape for i in graph.inputs),  # type: ignore[arg-type]
            tuple(shape for _, shape, _ in self._out_specs),  # type: ignore[arg-type]
            None, None, self.source.buffers.workspace_bytes)

    @property
    def peak_bytes(self) -> int:
        """Peak activation memory of the plan's buffer plan (workspace bytes; for symbolic sizes, at
        the representative binding)."""
        assert self.source.buffers is not None
        if not self.symbols:
            return self.source.buffers.peak_bytes
        at = representative_binding(self.plan.graph, self.plan.stats.get("priced_at"))
        return self.workspace_bytes(at)

    def workspace_bytes(self, binding: Mapping[str, int]) -> int:
        """The workspace a call at ``binding`` (a size for each symbol) takes; for a static plan, its
        one workspace."""
        if not self.symbols:
            assert self.source.buffers is not None
            return self.source.buffers.workspace_bytes
        return self._placed(binding)[2]

    def _placed(self, binding: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray, int]:
        """(sizes in af_sizes order, each workspace block's offset, workspace bytes) at ``binding``."""
        sizes = np.array([binding[s] for s in self.symbols], np.int64)
        offsets = np.zeros(max(1, int(self._lib.af_num_blocks())), np.int64)
        need = int(self._lib.af_place_sized(sizes.ctypes.data, offsets.ctypes.data))
        if need < 0:
            raise MemoryError("the library could not place its workspace")
        return sizes, offsets, need

    def binding(self, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        """The sizes ``feeds`` give each symbol ({} for a static plan); RunError naming the input and
        axis where they contradict the graph (rank, a fixed size, a bound, two sizes for one symbol)."""
        return feeds_binding(self.plan.graph, feeds) if self.symbols else {}

    def step_seconds(self) -> dict[str, float]:
        """Seconds each group's step took in this thread's last ``run`` (a model built with
        ``profile=True``; each thread keeps its own timings)."""
        if not self.source.profile:
            raise RunError("step_seconds needs a profiling build: CompiledModel(plan, profile=True)")
        if not self.source.profiled:
            return {}
        self._lib.af_profile.restype = ctypes.POINTER(ctypes.c_double)
        times = self._lib.af_profile()
        return {group: float(times[i]) for i, group in enumerate(self.source.profiled)}

    def step_samples(self, feeds: Mapping[str, np.ndarray], runs: int) -> dict[str, list[float]]:
        """Seconds of each group's step over ``runs`` runs of a profiling build, by group."""
        samples: dict[str, list[float]] = {}
        for _ in range(runs):
            self.run(feeds)
            for group, seconds in self.step_seconds().items():
                samples.setdefault(group, []).append(seconds)
        return samples

    def run(self, feeds: Mapping[str, np.ndarray], threads: int | None = None) -> dict[str, np.ndarray]:
        """Run the model on ``feeds``; RunError when a feed is missing or mistyped."""
        call = self._call(feeds)
        inputs = ready_feeds(self.plan.graph.inputs, feeds, call.in_shapes, self._in_dtypes)
        if inputs is None:
            arrays = checked_feeds(self.plan.graph, feeds, call.in_shapes)
            inputs = [arrays[name] for name in self.plan.graph.inputs]
        outputs = [np.empty(shape, dtype) for shape, (_, _, dtype) in zip(call.out_shapes, self._out_specs)]
        self._invoke(call, pointer_array(inputs), pointer_array(outputs), threads)
        result: dict[str, np.ndarray] = {}
        for (name, _, _), arr in zip(self._out_specs, outputs):
            result.setdefault(name, arr)
        return result

    def output_shapes(self, in_shapes: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
        """The outputs' shapes (in the graph's order) for inputs of ``in_shapes`` (one per graph
        input, in order); RunError naming the input where a shape contradicts the graph."""
        return self._call_of_shapes(in_shapes).out_shapes

    def run_addresses(self, in_shapes: Sequence[tuple[int, ...]], inputs: Sequence[int], outputs: Sequence[int],
                      threads: int | None = None) -> None:
        """Run on memory the caller owns, with no array made per call (the torch backend's tensors):
        ``inputs[i]`` is the address of graph input i, C-contiguous, of shape ``in_shapes[i]`` (checked
        here) and of the graph's dtype (the caller's to check); ``outputs[j]`` has room for output j
        at ``output_shapes(in_shapes)[j]``."""
        call = self._call_of_shapes(in_shapes)
        if len(inputs) != len(in_shapes):
            raise RunError(f"{len(inputs)} input addresses for {len(in_shapes)} shapes")
        if len(outputs) != len(self._out_specs):
            raise RunError(f"{len(outputs)} output addresses, the graph has {len(self._out_specs)} outputs")
        self._invoke(call, (ctypes.c_void_p * max(1, len(inputs)))(*inputs),
                     (ctypes.c_void_p * max(1, len(outputs)))(*outputs), threads)

    def _invoke(self, call: _Call, in_ptrs: ctypes.Array[ctypes.c_void_p], out_ptrs: ctypes.Array[ctypes.c_void_p],
                threads: int | None) -> None:
        """One run of the library on a workspace of its own."""
        nt = default_threads(threads) if threads is not None else self.threads
        workspace = self.workspaces.acquire(call.workspace_bytes)
        try:
            if call.sizes is None:  # the pointer arrays pass as void pointers as they are (argtypes)
                rc = self._lib.af_run(self._ctx, in_ptrs, out_ptrs, data_address(workspace), nt)
            else:
                assert call.offsets is not None
                rc = self._lib.af_run_placed(self._ctx, data_address(call.sizes), data_address(call.offsets),
                                             in_ptrs, out_ptrs, data_address(workspace), nt)
        finally:
            self.workspaces.release(workspace)
        if rc != 0:
            raise RunError(f"af_run returned {rc}")

    def _call(self, feeds: Mapping[str, np.ndarray]) -> _Call:
        """The call for the feeds' shapes: remembered, else worked out (RunError where they contradict
        the graph); a static library has one."""
        if self._static_call is not None:
            return self._static_call
        key = tuple(np.shape(feeds[n]) if n in feeds else None for n in self.plan.graph.inputs)
        return self._remembered(key, lambda: self.binding(feeds))

    def _call_of_shapes(self, in_shapes: Sequence[tuple[int, ...]]) -> _Call:
        """The call for inputs of ``in_shapes``, each checked against the graph (RunError)."""
        graph = self.plan.graph
        shapes = tuple(tuple(s) for s in in_shapes)
        if len(shapes) != len(graph.inputs):
            raise RunError(f"{len(shapes)} inputs given, the graph takes {len(graph.inputs)}")
        if self._static_call is None:
            return self._remembered(shapes, lambda: shapes_binding(graph, dict(zip(graph.inputs, shapes))))
        for name, shape, expected in zip(graph.inputs, shapes, self._static_call.in_shapes):
            if shape != expected:
                raise RunError(f"input {name!r}: shape {shape}, graph expects {expected}")
        return self._static_call

    def _remembered(self, key: tuple[tuple[int, ...] | None, ...], binding: Callable[[], dict[str, int]]) -> _Call:
        """The call remembered for input shapes ``key``, else worked out at ``binding()``."""
        with self._calls_lock:
            found = self._calls.get(key)
        if found is not None:
            return found
        bound = binding()
        sizes, offsets, need = self._placed(bound)
        call = _Call(tuple(key),  # type: ignore[arg-type]
                     tuple(tuple(evaluate(d, bound) for d in shape) for _, shape, _ in self._out_specs), sizes,
                     offsets, need)
        with self._calls_lock:
            self._calls[key] = call
            while len(self._calls) > CALL_SHAPES_KEPT:
                self._calls.popitem(last=False)
        return call


def feeds_binding(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The sizes the arrays ``feeds`` give each of ``graph``'s symbols; RunError naming the input and
    axis where they contradict the graph."""
    return shapes_binding(graph, {k: np.shape(v) for k, v in feeds.items()})


def shapes_binding(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The sizes inputs of ``shapes`` (by input name) give each of ``graph``'s symbols; RunError naming
    the input and axis where they contradict the graph."""
    try:
        return binding_of_shapes(graph, shapes)
    except BindError as e:
        raise RunError(str(e)) from None


def runnable_toolchain(toolchain: Toolchain | None) -> Toolchain:
    """``toolchain`` (default: detected), refused when this CPU cannot run what it builds."""
    tc = toolchain or detect_toolchain()
    if tc.sanitize and not sanitizer_loaded():  # loading one here would abort the process
        raise CompileError(refusal(tc.cc))
    if not tc.runnable:
        raise CompileError(f"this CPU cannot run code built for {tc.isa} (AUTOFUSION_ISA={tc.isa}); such a "
                           "library can be compiled (autofusion fuse --emit) but not loaded here")
    return tc


def core_chooser(toolchain: Toolchain, cache: CompileCache, threads: int, tune: bool | None = None,
                 progress: Progress | None = None, nearby: bool = False) -> CoreChooser:
    """The tuner (``tune``, default ``$AUTOFUSION_TUNE`` or on) or the untuned default chooser;
    ``nearby``: the tuner lends a product the choice tuned for it at nearby rows (Tuner.nearby_rows)."""
    machine = this_machine(toolchain.isa)
    if not (tune_by_default() if tune is None else tune):
        return DefaultChooser(machine)

    def build(plan: Plan, chooser: CoreChooser) -> CompiledModel:
        return CompiledModel(plan, threads=threads, cache=cache, toolchain=toolchain, cores=chooser)

    return Tuner(toolchain, cache, threads, build, machine, progress, nearby_rows=nearby)


def library_machine(lib: ctypes.CDLL, expected: Machine) -> Machine:
    """The machine the library's cores were built for, as the library itself reports it (a compiler
    whose baseline already has AVX2 builds the AVX2 kernels without -march)."""
    lib.af_isa.restype = ctypes.c_char_p
    isa = lib.af_isa().decode()
    return expected if isa == expected.isa else Machine(isa, expected.l2)
