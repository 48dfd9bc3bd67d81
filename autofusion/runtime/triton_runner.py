"""Runs a fusion plan with Triton: each group as one generated Triton kernel where it renders.

A group the Triton backend cannot render as one kernel runs as several, on the device: a convolution
with a pooling epilogue as the convolution with its epilogue and then the pooling op, any other group
as one Triton kernel per op; an op without any Triton kernel runs as torch's own op on the device
(:mod:`autofusion.runtime.torch_ops`), and only an op torch has no conversion for runs with the op
registry's reference implementation (the same numpy code as :func:`autofusion.ir.run_graph`, on the
host). A group of views (Reshape, Flatten, Squeeze...) needs no kernel: its outputs are its input's
tensor in their shapes, on the device. With ``fallback=False`` the first group
that is not one kernel is refused with its CodegenError instead.
Set ``TRITON_INTERPRET=1`` before importing triton to run the kernels on the CPU.

After the first run the steps are bound to fixed buffers, one device allocation laid out by the
buffer planner, and on a CUDA device captured in one CUDA graph (:mod:`autofusion.runtime.triton_replay`;
``replay=False`` keeps launching step by step with tensors of each call's own). Calls from several
threads are safe: on the fixed buffers they take turns; and Triton's interpreter patches
``triton.language`` for the launch it runs, process-wide, so under ``TRITON_INTERPRET=1`` calls take
turns anyway (one lock for every model).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import numpy as np

from autofusion.codegen.errors import CodegenError
from autofusion.codegen.triton import TritonKernel, render_triton_group
from autofusion.codegen.triton.configs import Config, label
from autofusion.decide.plan import FusedGroup, Plan
from autofusion.graph.graph import Graph
from autofusion.ir.interpreter import InterpreterError, check_feeds
from autofusion.ops.registry import OpRegistry
from autofusion.runtime.cache import CompileCache
from autofusion.runtime.triton_replay import Replay
from autofusion.runtime.triton_tuning import Timer, TritonTuner, TritonTuningStore, cuda_timer, wall_timer
from autofusion.runtime.tuning import tune_by_default

_INTERPRETER_LOCK = threading.Lock()  # the interpreter's patching of triton.language is process-wide


def _launch_guard() -> contextlib.AbstractContextManager[object]:
    """The lock calls take turns on under Triton's interpreter; nothing on a device."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return _INTERPRETER_LOCK if interpreted else contextlib.nullcontext()


@dataclass(frozen=True)
class _Step:
    group: FusedGroup
    kernel: TritonKernel | None  # None: views, torch ops on the device, or the reference ops on the host
    launch: Any = None
    reason: str = ""
    torch: bool = False  # no Triton kernel: torch's ops on the device


def per_op_groups(graph: Graph, group: FusedGroup, registry: OpRegistry) -> list[FusedGroup]:
    """``group`` as groups of one op each, in the group's order: what runs on the device when the
    group as a whole has no Triton kernel. A multi-output op gives one group per output something
    reads (Split's parts differ in size; an unread output is not computed)."""
    wanted = set(group.outputs) | {t for n in group.nodes for t in graph.node_by_name[n].inputs}
    out: list[FusedGroup] = []
    for name in group.nodes:
        node = graph.node_by_name[name]
        inputs = tuple(dict.fromkeys(t for t in node.inputs if t))
        op_class = registry[node.op].op_class
        template = ("opaque" if registry[node.op].core or op_class == "opaque" else
                    "reduction" if op_class == "reduction" else "pointwise")
        outputs = [o for o in node.outputs if o and o in wanted] or [o for o in node.outputs if o][:1]
        out += [FusedGroup(f"{group.name}_op{len(out) + i}", (name,), inputs, (t,), template)
                for i, t in enumerate(outputs)]
    return out


def pooling_split(graph: Graph, group: FusedGroup, registry: OpRegistry) -> list[FusedGroup] | None:
    """A convolution group ending in a pooling op as two groups, the convolution with its epilogue and
    the pooling op with whatever follows it; None for any other group."""
    pools = [n for n in group.nodes if registry[graph.node_by_name[n].op].pooling]
    cores = [n for n in group.nodes if registry[graph.node_by_name[n].op].core == "conv"]
    if len(pools) != 1 or len(cores) != 1:
        return None
    after = {pools[0]}
    for name in group.nodes:  # in order: a node reading what the pooling op or a later node computes
        node = graph.node_by_name[name]
        if any(graph.producers.get(t) is not None and graph.producers[t].name in after for t in node.inputs if t):
            after.add(name)
    if cores[0] in after:
        return None
    head = tuple(n for n in group.nodes if n not in after)
    tail = tuple(n for n in group.nodes if n in after)
    made_by_head = {o for n in head for o in graph.node_by_name[n].outputs if o}
    read_by_tail = {t for n in tail for t in graph.node_by_name[n].inputs if t}
    head_out = tuple(t for t in dict.fromkeys([*group.outputs, *sorted(read_by_tail)]) if t in made_by_head)
    tail_in = tuple(dict.fromkeys(t for n in tail for t in graph.node_by_name[n].inputs
                                  if t and t not in {o for m in tail for o in graph.node_by_name[m].outputs}))
    tail_out = tuple(t for t in group.outputs if t not in made_by_head)
    head_in = tuple(t for t in group.inputs if any(t in graph.node_by_name[n].inputs for n in head))
    return [FusedGroup(f"{group.name}_conv", head, head_in, head_out, "conv_epilogue"),
            FusedGroup(f"{group.name}_pool", tail, tail_in, tail_out, "opaque")]


class TritonModel:
    """A plan compiled to Triton kernels; call it with numpy feeds to get numpy outputs."""

    def __init__(self, plan: Plan, fallback: bool = True, device: str | None = None,
                 registry: OpRegistry | None = None, directory: Path | None = None, tune: bool | None = None,
                 cache: CompileCache | str | Path | None = None, timer: Timer | None = None, replay: bool = True,
                 cuda_graph: bool | None = None) -> None:
        import torch  # fails early with ImportError when the gpu extra is missing

        if device is None:  # the GPU where torch sees one; else the CPU, under Triton's interpreter
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.plan, self.device = plan, device
        if tune is None:  # timing Triton's interpreter says nothing about a device; AUTOFUSION_TUNE=0 is off
            tune = str(device).startswith("cuda") and tune_by_default()
        self._tuner: TritonTuner | None = None
        if tune:
            store = TritonTuningStore(cache if isinstance(cache, CompileCache) else CompileCache(cache), device)
            self._tuner = TritonTuner(store, timer or (cuda_timer(device) if str(device).startswith("cuda")
                                                        else wall_timer))
        self._configs: dict[str, Config] = {}  # kernel name -> the configuration it launches with
        self._tune_lock = threading.Lock()
        # after the first run: the steps bound to fixed buffers (and on a device captured in a CUDA graph)
        self._replay_wanted, self._cuda_graph_wanted = replay, cuda_graph
        self._replay: Replay | None = None
        self._prepare_lock = threading.Lock()
        self.replay_problem = ""  # why the steps are not captured in a CUDA graph on a device, if they are not
        self.registry = registry or plan.registry
        # Triton reads a kernel's source file when it compiles: the folder lives as long as the model
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="autofusion_triton_"))
            weakref.finalize(self, shutil.rmtree, directory, True)  # removed with the model, at exit at the latest
        self._dir = directory
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
                steps += self._split_steps(group)
        self.steps = tuple(steps)
        self.split = MappingProxyType(split)  # groups run as one kernel per op, with the reason
        # weights go to the device once, not on every call
        self._weights = {k: torch.from_numpy(np.array(c.array)).to(device) for k, c in plan.graph.constants.items()}

    def _step(self, group: FusedGroup) -> _Step:
        kernel = render_triton_group(self.plan.graph, group, registry=self.registry, kinds=self.plan.kinds)
        return _Step(group, kernel, self._load(kernel).launch)

    def _split_steps(self, group: FusedGroup) -> list[_Step]:
        """A convolution and its pooling op as two kernels where both render, else one kernel per op."""
        parts = pooling_split(self.plan.graph, group, self.registry)
        if parts is not None:
            try:
                return [self._step(part) for part in parts]
            except CodegenError:
                pass
        return self._per_op_steps(group)

    def _per_op_steps(self, group: FusedGroup) -> list[_Step]:
        """One kernel per op (and output); an op with no Triton kernel runs once, on the host."""
        steps: list[_Step] = []
        on_host: set[str] = set()
        for part in per_op_groups(self.plan.graph, group, self.registry):
            node = part.nodes[0]
            if node in on_host:
                continue
            try:
                steps.append(self._step(part))
            except CodegenError as e:
                on_host.add(node)  # torch or the reference computes all its outputs at once
                steps.append(_Step(part, None, reason=str(e), torch=self._torch_runs(part)))
        return steps

    def _torch_runs(self, group: FusedGroup) -> bool:
        """Whether torch has a conversion for every op of ``group``."""
        from autofusion.runtime.torch_ops import UnsupportedOpError, lower

        try:
            for name in group.nodes:
                lower(self.plan.graph.node_by_name[name], self.plan.graph)
        except UnsupportedOpError:
            return False
        return True

    @property
    def kernels(self) -> tuple[TritonKernel, ...]:
        return tuple(s.kernel for s in self.steps if s.kernel is not None)

    @property
    def fallbacks(self) -> Mapping[str, str]:
        """Groups (or ops of a split group) run with the reference ops on the host, with the reason."""
        return {s.group.name: s.reason for s in self.steps
                if s.kernel is None and not s.torch and s.group.template != "view"}

    @property
    def variants(self) -> Mapping[str, str]:
        """Each kernel's launch configuration (block sizes, warps): the default until a run has
        chosen one (tuning happens in the first run)."""
        return {k.name: label(self.chosen(k)) for k in self.kernels}

    @property
    def launches(self) -> str:
        """How a call runs the steps, for a report."""
        if self._replay is None:
            return "launched one by one (prepared after the first run)" if self._replay_wanted else "launched one by one"
        if self._replay.cuda_graph is not None:
            return "one CUDA graph per call"
        return "bound once to fixed buffers, launched in order" + (f" ({self.replay_problem})"
                                                                    if self.replay_problem else "")

    @property
    def workspace_bytes(self) -> int | None:
        """The one device allocation of the intermediate tensors, once prepared."""
        return self._replay.workspace_bytes if self._replay is not None else None

    def weights(self) -> Mapping[str, Any]:
        return self._weights

    def chosen(self, kernel: TritonKernel) -> Config:
        """The configuration ``kernel`` launches with."""
        return self._configs.get(kernel.name, kernel.default)

    @property
    def tuning(self) -> str:
        """How the launch configurations were chosen, for a report."""
        if self._tuner is None:
            return "untuned (the defaults)"
        return (f"tuned on this device ({self._tuner.tuned} kernel(s) measured in this process, the others "
                f"from {self._tuner.store.path})")

    @property
    def tuned(self) -> int:
        """Kernels this model measured (not answered from the tuning cache)."""
        return self._tuner.tuned if self._tuner is not None else 0

    def configure(self, kernel: str, config: Config) -> None:
        """Launch ``kernel`` with ``config`` from the next call on (the next call runs step by step and
        prepares the replay again); ValueError if it is not one of the kernel's."""
        found = [k for k in self.kernels if k.name == kernel]
        if not found:
            raise ValueError(f"no Triton kernel {kernel!r} in this model")
        if tuple(config) not in found[0].configs:
            raise ValueError(f"{label(tuple(config))} is not a configuration of {kernel} "
                             f"({'; '.join(label(c) for c in found[0].configs)})")
        with self._prepare_lock:
            self._configs[kernel] = tuple(config)
            self._replay = None  # the bound launches hold the old configuration: prepared again

    @property
    def on_torch(self) -> Mapping[str, str]:
        """Ops with no Triton kernel run by torch's own ops on the device, with the reason."""
        return {s.group.name: s.reason for s in self.steps if s.torch}

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

    def run_device(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The outputs as tensors on the device, from feeds given as tensors (moved to the device
        if they are elsewhere): no copy through the host, as a caller timing the kernels wants."""
        graph = self.plan.graph
        for name in graph.inputs:  # what check_feeds checks of arrays
            if name not in feeds:
                raise InterpreterError(f"missing input {name!r}")
            want, got = graph.types[name], feeds[name]
            if tuple(got.shape) != want.shape or str(got.dtype) != f"torch.{want.dtype.value}":
                raise InterpreterError(f"input {name!r}: {got.dtype} {tuple(got.shape)}, graph expects "
                                       f"{want.dtype} {want.shape}")
        with _launch_guard():
            return self._run_tensors({k: feeds[k].to(self.device) for k in graph.inputs})

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        arrays = check_feeds(self.plan.graph, feeds)
        outputs = self._run_tensors({k: torch.from_numpy(np.array(v)).to(self.device) for k, v in arrays.items()})
        return {o: t.cpu().numpy() for o, t in outputs.items()}

    def _run_tensors(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        replay = self._replay
        if replay is not None:
            return replay(feeds)
        outputs = self._run_steps(feeds)
        if self._replay_wanted:
            self._prepare(feeds)
        return outputs

    def _prepare(self, feeds: Mapping[str, Any]) -> None:
        """Bind the steps to fixed buffers once the first run has chosen every configuration; on a
        CUDA device capture them in a CUDA graph unless an op runs on the host. The capture's warm
        run reads ``feeds``: uninitialised token ids would send a Gather off its table."""
        with self._prepare_lock:
            if self._replay is not None:
                return
            graph = self._cuda_graph_wanted
            if graph is None:
                graph = str(self.device).startswith("cuda")
                if graph and self.fallbacks:
                    self.replay_problem = f"{len(self.fallbacks)} op(s) on the host: no CUDA graph"
                    graph = False
            try:
                self._replay = Replay(self, graph, feeds)
            except Exception as e:  # noqa: BLE001 - a capture torch refuses: the bound launches still run
                if not graph:
                    raise
                self.replay_problem = f"CUDA graph capture failed: {type(e).__name__}: {str(e)[:200]}"
                self._replay = Replay(self, False, feeds)

    def _run_steps(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        graph = self.plan.graph
        env: dict[str, Any] = {**self._weights, **feeds}
        tuned = self.tuned
        try:
            self._launch_steps(env)
        finally:
            if self._tuner is not None and self.tuned > tuned:  # what this run measured, for later runs
                self._tuner.store.save()
        return {o: env[o] for o in graph.outputs}

    def _launch_steps(self, env: dict[str, Any]) -> None:
        import torch

        graph = self.plan.graph
        for step in self.steps:
            if step.torch or step.group.template == "view":  # a view is its input reshaped, no copy
                self.run_torch(step.group, env)
                continue
            if step.kernel is None:
                self.run_reference(step.group, env)
                continue
            for t in step.group.outputs:
                tt = graph.type_of(t)
                env[t] = torch.empty(tt.shape, dtype=getattr(torch, tt.dtype.value), device=self.device)
            args = [env[t].contiguous() for t in step.kernel.params]
            step.launch(*args, **dict(self._config(step, args)))

    def _config(self, step: _Step, args: list[Any]) -> Config:
        """The step's configuration: chosen before, the default, or measured now on ``args`` (its
        outputs are all it writes, so launching it again with each configuration changes nothing)."""
        assert step.kernel is not None
        kernel = step.kernel
        if kernel.name in self._configs or self._tuner is None:
            return self.chosen(kernel)
        with self._tune_lock:  # one tuning at a time: two would time each other
            cfg = self._tuner.choose(kernel, lambda c: step.launch(*args, **dict(c)))
        self._configs[kernel.name] = cfg
        return cfg

    def run_torch(self, group: FusedGroup, env: dict[str, Any]) -> None:
        """The group's ops as torch's own, on the device."""
        from autofusion.runtime.torch_ops import run_node

        graph = self.plan.graph
        for name in group.nodes:
            node = graph.node_by_name[name]
            for out, value in zip(node.outputs, run_node(node, graph, env)):
                if out:
                    env[out] = value

    def run_reference(self, group: FusedGroup, env: dict[str, Any]) -> None:
        """The group's ops with the reference implementations, on the host."""
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
