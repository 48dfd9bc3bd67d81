"""DynamicModel: a plan for a graph with symbolic sizes, run at whatever sizes its feeds have."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.codegen.errors import CodegenError
from autofusion.decide.binding import bind_plan
from autofusion.decide.plan import Plan
from autofusion.ir.symbolic import is_symbolic, symbols_of
from autofusion.kinds import KindError
from autofusion.runtime.model import CompiledModel, feeds_binding


class DynamicModel:
    """One plan (``optimize`` on a symbolic graph) run on feeds of any valid size.

    >>> # model = DynamicModel(optimize(load_onnx(path)))
    >>> # model.run({"input_ids": ids})  # any batch and sequence length within the model's bounds

    The sizes are read off the feeds (a shape that contradicts the graph is a RunError naming the
    input and axis). Where every kernel of the plan takes its sizes at run time (kinds in
    ``RUN_TIME_SIZE_KINDS``), the plan is one CompiledModel, one library that serves every binding
    (``library_path``); otherwise each binding's SuperKernel is compiled on its first call (the
    compile cache keeps it on disk) and kept loaded for the ``keep`` most recent bindings, and
    ``one_library_refused`` says why. ``options`` go to each CompiledModel (threads, tune, cache,
    ...). Safe from many threads: a binding is compiled once however many calls ask for it.
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
        self._one: CompiledModel | None = None
        try:
            self._one = CompiledModel(plan, **options)
            self.compiles = 1
        except (CodegenError, KindError) as e:
            self.one_library_refused = str(e)

    @property
    def library_path(self) -> Path | None:
        """The one library that serves every binding (None when each binding has its own)."""
        return self._one.library_path if self._one is not None else None

    def binding(self, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        """The sizes ``feeds`` give each symbol; RunError naming the input and axis if they contradict
        the graph (rank, a fixed size, a bound, two sizes for one symbol)."""
        return feeds_binding(self.plan.graph, feeds)

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
        if self._one is not None:
            return self._one.run(feeds, threads)
        return self.model(self.binding(feeds)).run(feeds, threads)
