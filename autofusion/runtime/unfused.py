"""UnfusedRunner: every op its own compiled kernel, called one at a time from Python.

This is how a model runs without fusion: one kernel launch per op, every intermediate tensor a
separate numpy allocation, written to memory and read back by the next op. View ops (Reshape,
Squeeze, ...) are numpy views, as a framework would do.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.codegen.buffers import aligned_empty
from autofusion.codegen.kernel_context import KernelSource
from autofusion.codegen.superkernel import render_unfused
from autofusion.codegen.templates import TemplateSet
from autofusion.decide import unfused_plan
from autofusion.decide.plan import FusedGroup, Plan
from autofusion.graph.graph import Graph
from autofusion.runtime.cache import CompileCache
from autofusion.runtime.compiler import compile_library
from autofusion.runtime.loader import (
    RunError,
    checked_feeds,
    default_threads,
    load_library,
    pointer_array,
)
from autofusion.runtime.model import core_chooser, runnable_toolchain
from autofusion.runtime.toolchain import Toolchain
from autofusion.runtime.tuning import render_tuned


@dataclass
class _Step:
    group: FusedGroup
    kernel: KernelSource | None = None
    fn: Any = None  # the ctypes function of the kernel
    derived: list[np.ndarray] = field(default_factory=list)


class UnfusedRunner:
    """Runs ``graph`` (or ``plan``'s groups) kernel by kernel through ctypes with numpy buffers."""

    def __init__(self, graph: Graph, threads: int | None = None, cache: CompileCache | str | Path | None = None,
                 toolchain: Toolchain | None = None, templates: TemplateSet | None = None,
                 plan: Plan | None = None, tune: bool | None = None) -> None:
        self.graph = plan.graph if plan is not None else graph  # a plan may hold a rewritten graph
        self.plan = plan or unfused_plan(graph)
        self.threads = default_threads(threads)
        self.cache = cache if isinstance(cache, CompileCache) else CompileCache(cache)
        tc = runnable_toolchain(toolchain)
        chooser = core_chooser(tc, self.cache, self.threads, tune)
        plan_ = self.plan
        self.source = render_tuned(chooser, lambda c: render_unfused(plan_, templates, chooser=c))
        self.library_path = compile_library(self.source, tc, self.cache)
        lib = load_library(self.library_path)
        kernels = {k.group.name: k for k in self.source.kernels}
        self._steps: list[_Step] = []
        for group in self.plan.groups:
            k = kernels.get(group.name)
            if k is None:
                self._steps.append(_Step(group))
                continue
            fn = getattr(lib, f"af_call_{self.source.function[group.name]}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            self._steps.append(_Step(group, k, fn, [np.ascontiguousarray(a) for _, a in k.derived]))
        self._lib = lib
        self._consts = {t: np.ascontiguousarray(c.array) for t, c in self.graph.constants.items()}

    def run(self, feeds: Mapping[str, np.ndarray], threads: int | None = None) -> dict[str, np.ndarray]:
        """Run op by op; returns the graph outputs by name."""
        g = self.graph
        nt = default_threads(threads) if threads is not None else self.threads
        env: dict[str, np.ndarray] = dict(self._consts)
        env.update(checked_feeds(g, feeds))
        for step in self._steps:
            if step.kernel is None:  # views: numpy reshapes, no copy
                for name in step.group.nodes:
                    node = g.node_by_name[name]
                    for out in node.outputs:
                        if out:
                            env[out] = env[node.inputs[0]].reshape(g.types[out].shape)
                continue
            self._call(step.kernel, step.fn, step.derived, env, nt)
        fresh = set(g.inputs) | set(g.constants)  # never hand back the caller's own array or a weight
        return {o: np.array(env[o]) if o in fresh or not env[o].flags.owndata else env[o] for o in g.outputs}

    def _call(self, k: KernelSource, fn: object, derived: list[np.ndarray], env: dict[str, np.ndarray],
              nt: int) -> None:
        g = self.graph
        args: list[np.ndarray] = []
        d = iter(derived)
        for p in k.params:
            if p.role == "out":
                t = g.types[p.tensor]
                env[p.tensor] = np.empty(t.shape, t.dtype.numpy)
                args.append(env[p.tensor])
            elif p.role == "derived":
                args.append(next(d))
            else:
                args.append(env[p.tensor])
        scratch = aligned_empty(max(64, k.scratch_bytes))
        ptrs = pointer_array(args)
        rc = fn(ctypes.cast(ptrs, ctypes.c_void_p), scratch.ctypes.data, nt)  # type: ignore[operator]
        if rc != 0:
            raise RunError(f"kernel {k.name} returned {rc}")
