"""Runs a fusion plan with Triton: each group as one generated Triton kernel where it renders.

A group the Triton backend cannot render as one kernel (an LSTM cell unrolled over time, a
convolution with a pooling epilogue) runs as one Triton kernel per op, on the device; only ops
without any Triton kernel run with the op registry's reference implementations (the same numpy
code as :func:`autofusion.ir.run_graph`, on the host). With ``fallback=False`` the first group
that is not one kernel is refused with its CodegenError instead.
Set ``TRITON_INTERPRET=1`` before importing triton to run the kernels on the CPU.

Calls from several threads are safe: each call has its own tensors. Triton's interpreter patches
``triton.language`` for the launch it runs, process-wide, so under ``TRITON_INTERPRET=1`` calls take
turns (one lock for every model); on a device they run concurrently.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import numpy as np

from autofusion.codegen.errors import CodegenError
from autofusion.codegen.triton import TritonKernel, render_triton_group
from autofusion.decide.plan import FusedGroup, Plan
from autofusion.graph.graph import Graph
from autofusion.ir.interpreter import check_feeds
from autofusion.ops.registry import OpRegistry

_INTERPRETER_LOCK = threading.Lock()  # the interpreter's patching of triton.language is process-wide


def _launch_guard() -> contextlib.AbstractContextManager[object]:
    """The lock calls take turns on under Triton's interpreter; nothing on a device."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return _INTERPRETER_LOCK if interpreted else contextlib.nullcontext()


@dataclass(frozen=True)
class _Step:
    group: FusedGroup
    kernel: TritonKernel | None  # None: run with the reference ops
    launch: Any = None
    reason: str = ""


def per_op_groups(graph: Graph, group: FusedGroup, registry: OpRegistry) -> list[FusedGroup]:
    """``group`` as groups of one op each (one per output of a multi-output op, as Split's parts
    differ in size), in the group's order: what runs on the device when the group as a whole has
    no Triton kernel."""
    out: list[FusedGroup] = []
    for name in group.nodes:
        node = graph.node_by_name[name]
        inputs = tuple(dict.fromkeys(t for t in node.inputs if t))
        for t in (o for o in node.outputs if o):
            out.append(FusedGroup(f"{group.name}_op{len(out)}", (name,), inputs, (t,),
                                  "opaque" if registry[node.op].core else "pointwise"))
    return out


class TritonModel:
    """A plan compiled to Triton kernels; call it with numpy feeds to get numpy outputs."""

    def __init__(self, plan: Plan, fallback: bool = True, device: str = "cpu",
                 registry: OpRegistry | None = None, directory: Path | None = None) -> None:
        import torch  # noqa: F401  (fails early with ImportError when the gpu extra is missing)

        self.plan, self.device = plan, device
        self.registry = registry or plan.registry
        self._dir = directory or Path(tempfile.mkdtemp(prefix="autofusion_triton_"))
        steps: list[_Step] = []
        split: dict[str, str] = {}
        for group in plan.groups:
            if group.template == "view":
                steps.append(_Step(group, None, reason="view"))
                continue
            try:
                steps.append(self._step(group))
            except CodegenError as e:
                if not fallback:
                    raise
                split[group.name] = str(e)
                steps += [self._step_or_reference(part) for part in per_op_groups(plan.graph, group, self.registry)]
        self.steps = tuple(steps)
        self.split = MappingProxyType(split)  # groups run as one kernel per op, with the reason

    def _step(self, group: FusedGroup) -> _Step:
        kernel = render_triton_group(self.plan.graph, group, registry=self.registry, kinds=self.plan.kinds)
        return _Step(group, kernel, self._load(kernel).launch)

    def _step_or_reference(self, group: FusedGroup) -> _Step:
        try:
            return self._step(group)
        except CodegenError as e:
            return _Step(group, None, reason=str(e))

    @property
    def kernels(self) -> tuple[TritonKernel, ...]:
        return tuple(s.kernel for s in self.steps if s.kernel is not None)

    @property
    def fallbacks(self) -> Mapping[str, str]:
        """Groups (or ops of a split group) run with the reference ops on the host, with the reason
        (view groups need no kernel)."""
        return {s.group.name: s.reason for s in self.steps if s.kernel is None}

    def _load(self, kernel: TritonKernel) -> ModuleType:
        path = self._dir / f"{kernel.name}.py"
        path.write_text(kernel.source)
        spec = importlib.util.spec_from_file_location(f"autofusion_triton_{kernel.name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with _launch_guard():
            return self._run(feeds)

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        graph = self.plan.graph
        env: dict[str, Any] = {k: torch.from_numpy(np.array(c.array)).to(self.device)
                               for k, c in graph.constants.items()}
        env.update({k: torch.from_numpy(np.array(v)).to(self.device) for k, v in check_feeds(graph, feeds).items()})
        for step in self.steps:
            if step.kernel is None:
                self._run_reference(step.group, env)
                continue
            for t in step.group.outputs:
                tt = graph.type_of(t)
                env[t] = torch.empty(tt.shape, dtype=getattr(torch, tt.dtype.value), device=self.device)
            step.launch(*(env[t].contiguous() for t in step.kernel.params))
        return {o: env[o].cpu().numpy() for o in graph.outputs}

    def _run_reference(self, group: FusedGroup, env: dict[str, Any]) -> None:
        import torch

        graph = self.plan.graph
        for name in group.nodes:
            node = graph.node_by_name[name]
            args = [env[i].cpu().numpy() if i else None for i in node.inputs]
            with np.errstate(all="ignore"):
                results = self.registry[node.op].reference(args, node.attrs)
            for out, value in zip(node.outputs, results):
                if out:
                    env[out] = torch.from_numpy(np.ascontiguousarray(value)).to(self.device)
