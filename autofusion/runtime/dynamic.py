"""DynamicModel: a plan for a graph with symbolic sizes, run at whatever sizes its feeds have."""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.codegen.buffers import aligned_empty
from autofusion.codegen.errors import CodegenError
from autofusion.codegen.superkernel import LibrarySource, render_plan
from autofusion.decide.binding import bind_plan
from autofusion.decide.plan import Plan
from autofusion.graph.dims import evaluate
from autofusion.graph.graph import Graph
from autofusion.ir.symbolic import BindError, binding_of_shapes, is_symbolic, symbols_of
from autofusion.kinds import KindError
from autofusion.runtime.cache import CompileCache
from autofusion.runtime.compiler import compile_library
from autofusion.runtime.loader import LibraryContext, RunError, default_threads, load_library, pointer_array
from autofusion.runtime.model import CompiledModel, runnable_toolchain


class DynamicModel:
    """One plan (``optimize`` on a symbolic graph) run on feeds of any valid size.

    >>> # model = DynamicModel(optimize(load_onnx(path, symbolic=True)))
    >>> # model.run({"input_ids": ids})  # any batch and sequence length within the model's bounds

    The sizes are read off the feeds (a shape that contradicts the graph is a RunError naming the
    input and axis). Where every kernel of the plan takes its sizes at run time (kinds in
    ``RUN_TIME_SIZE_KINDS``), the plan is compiled once, into one library that serves every
    binding (``library_path``); otherwise each binding's SuperKernel is compiled on its first call
    (the compile cache keeps it on disk) and kept loaded for the ``keep`` most recent bindings, and
    ``one_library_refused`` says why. ``options`` go to each CompiledModel (threads, tune, cache,
    ...); the one library takes threads, cache and toolchain of them (its cores are the untuned
    default, chosen for the representative sizes). Safe from many threads: a binding is compiled
    once however many calls ask for it.
    """

    def __init__(self, plan: Plan, keep: int = 8, **options: Any) -> None:
        if not is_symbolic(plan.graph):
            raise ValueError("the plan's graph has no symbolic sizes: use CompiledModel")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.plan = plan
        self.symbols = symbols_of(plan.graph)
        self.keep = keep
        self._options = options
        self._models: OrderedDict[tuple[int, ...], CompiledModel] = OrderedDict()
        self._compiling: dict[tuple[int, ...], threading.Lock] = {}
        self._lock = threading.Lock()
        self.compiles = 0  # SuperKernels built (or taken from the compile cache) so far
        self.one_library_refused = ""
        self._one: _OneLibrary | None = None
        try:
            self._one = _OneLibrary(plan, options.get("threads"), options.get("cache"), options.get("toolchain"))
            self.compiles = 1
        except (CodegenError, KindError) as e:
            self.one_library_refused = str(e)

    @property
    def library_path(self) -> Path | None:
        """The one library that serves every binding (None when each binding has its own)."""
        return self._one.path if self._one is not None else None

    def binding(self, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        """The sizes ``feeds`` give each symbol; RunError naming the input and axis if they contradict
        the graph (rank, a fixed size, a bound, two sizes for one symbol)."""
        try:
            return binding_of_shapes(self.plan.graph, {k: np.shape(v) for k, v in feeds.items()})
        except BindError as e:
            raise RunError(str(e)) from None

    def model(self, binding: Mapping[str, int]) -> CompiledModel:
        """The compiled model of ``binding`` alone (compiled now if it is not loaded)."""
        key = tuple(int(binding[s]) for s in self.symbols)
        with self._lock:
            found = self._models.get(key)
            if found is not None:
                self._models.move_to_end(key)
                return found
            gate = self._compiling.setdefault(key, threading.Lock())
        with gate:  # one compile per binding, however many callers wait for it
            with self._lock:
                found = self._models.get(key)
            if found is None:
                found = CompiledModel(bind_plan(self.plan, dict(zip(self.symbols, key))), **self._options)
                with self._lock:
                    self.compiles += 1
                    self._models[key] = found
                    while len(self._models) > self.keep:
                        self._models.popitem(last=False)
                    self._compiling.pop(key, None)
        return found

    def run(self, feeds: Mapping[str, np.ndarray], threads: int | None = None) -> dict[str, np.ndarray]:
        """Run the model at the sizes of ``feeds``."""
        binding = self.binding(feeds)
        if self._one is not None:
            return self._one.run(feeds, binding, threads)
        return self.model(binding).run(feeds, threads)


class _OneLibrary:
    """A plan over symbolic sizes compiled once: ``af_run_sized`` takes the sizes of each call."""

    def __init__(self, plan: Plan, threads: int | None, cache: CompileCache | str | Path | None,
                 toolchain: Any) -> None:
        self.plan = plan
        self.symbols = symbols_of(plan.graph)
        self.threads = default_threads(threads)
        self.source: LibrarySource = render_plan(plan)
        store = cache if isinstance(cache, CompileCache) else CompileCache(cache)
        self.path = compile_library(self.source, runnable_toolchain(toolchain), store)
        lib = load_library(self.path)
        lib.af_workspace_bytes_sized.restype = ctypes.c_int64
        lib.af_workspace_bytes_sized.argtypes = [ctypes.c_void_p]
        lib.af_run_sized.restype = ctypes.c_int
        lib.af_run_sized.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int]
        self._lib = lib
        self._context = LibraryContext(self, lib, self.source.constants)  # keeps the constants alive
        self._ctx = self._context.ctx
        self._free: list[np.ndarray] = []  # workspaces not in use, reused by later calls that fit
        self._lock = threading.Lock()

    def run(self, feeds: Mapping[str, np.ndarray], binding: Mapping[str, int],
            threads: int | None) -> dict[str, np.ndarray]:
        graph = self.plan.graph
        arrays = {name: np.ascontiguousarray(feeds[name]) for name in graph.inputs}
        _check_dtypes(graph, arrays)
        sizes = np.array([binding[s] for s in self.symbols], np.int64)
        outputs = [np.empty(tuple(evaluate(d, binding) for d in graph.types[o].shape), graph.types[o].dtype.numpy)
                   for o in graph.outputs]
        need = int(self._lib.af_workspace_bytes_sized(sizes.ctypes.data))
        if need < 0:
            raise MemoryError("the library could not place its workspace")
        workspace = self._lease(need)
        try:
            in_ptrs, out_ptrs = pointer_array([arrays[n] for n in graph.inputs]), pointer_array(outputs)
            rc = self._lib.af_run_sized(self._ctx, sizes.ctypes.data, ctypes.cast(in_ptrs, ctypes.c_void_p),
                                        ctypes.cast(out_ptrs, ctypes.c_void_p), workspace.ctypes.data,
                                        default_threads(threads) if threads is not None else self.threads)
        finally:
            with self._lock:
                self._free.append(workspace)
        if rc != 0:
            raise RunError(f"af_run_sized returned {rc}")
        result: dict[str, np.ndarray] = {}
        for name, arr in zip(graph.outputs, outputs):
            result.setdefault(name, arr)
        return result

    def _lease(self, nbytes: int) -> np.ndarray:
        """A free workspace of at least ``nbytes`` (the largest free one grows when none fits)."""
        with self._lock:
            fits = [i for i, w in enumerate(self._free) if w.nbytes >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
            if self._free:  # none is large enough: the largest is replaced by a larger one
                self._free.pop(max(range(len(self._free)), key=lambda i: self._free[i].nbytes))
        return aligned_empty(max(64, nbytes))


def _check_dtypes(graph: Graph, arrays: Mapping[str, np.ndarray]) -> None:
    """RunError for a feed of another dtype than its input's (shapes were checked by the binding)."""
    for name, arr in arrays.items():
        want = graph.types[name].dtype
        if arr.dtype != want.numpy:
            raise RunError(f"input {name!r}: dtype {arr.dtype}, graph expects {want}")

