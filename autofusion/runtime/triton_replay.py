"""A Triton plan prepared once and replayed per call: the GPU form of the SuperKernel's one entry point.

After its first run (which compiles the kernels and tunes their launch configurations), a
``TritonModel`` prepares its steps once: every intermediate tensor gets its place in one device
allocation laid out by the buffer planner (``codegen/buffers.py``, the C backend's: live ranges in
steps, best fit), graph inputs and outputs get tensors of their own, views are taken once of those
fixed buffers, and each kernel's launch is bound to its tensors and configuration. A call copies its
feeds into the input tensors, runs the bound launches in order and returns copies of the outputs.

On a CUDA device, when every step runs there (no op on the host), the bound launches are captured
once in a CUDA graph (``torch.cuda.CUDAGraph``) and a call replays the graph: one launch for the
whole plan. Calls share the fixed buffers, so they take turns (one lock per model).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from autofusion.codegen.buffers import plan_buffers
from autofusion.codegen.triton import TritonKernel
from autofusion.codegen.triton.configs import Config
from autofusion.decide.plan import ZERO_COST, FusedGroup, Plan

Action = Callable[[], object]


class PreparedStep(Protocol):
    """What the replay needs of a runner's step."""

    @property
    def group(self) -> FusedGroup: ...
    @property
    def kernel(self) -> TritonKernel | None: ...
    @property
    def launch(self) -> Any: ...
    @property
    def torch(self) -> bool: ...


class Runner(Protocol):
    """What the replay needs of a TritonModel."""

    plan: Plan
    device: str

    @property
    def steps(self) -> Sequence[PreparedStep]: ...

    def weights(self) -> Mapping[str, Any]: ...
    def chosen(self, kernel: TritonKernel) -> Config: ...
    def run_torch(self, group: FusedGroup, env: dict[str, Any]) -> None: ...
    def run_reference(self, group: FusedGroup, env: dict[str, Any]) -> None: ...


class Replay:
    """The runner's steps bound to fixed tensors, its inputs holding ``feeds``; ``graph`` captures
    them in a CUDA graph."""

    def __init__(self, runner: Runner, graph: bool, feeds: Mapping[str, Any]) -> None:
        import torch

        self.runner = runner
        g = runner.plan.graph
        steps_plan = Plan(g, tuple(s.group for s in runner.steps), ZERO_COST, ZERO_COST)
        buffers = plan_buffers(steps_plan, scratch={})
        self.workspace_bytes = buffers.workspace_bytes
        device = runner.device
        self.arena = torch.empty(max(1, buffers.workspace_bytes), dtype=torch.uint8, device=device)

        def fresh(t: str) -> Any:
            tt = g.type_of(t)
            return torch.empty(tt.shape, dtype=getattr(torch, tt.dtype.value), device=device)

        self.tensors: dict[str, Any] = dict(runner.weights())
        for t in g.inputs:
            self.tensors[t] = fresh(t).copy_(feeds[t])
        for t, p in buffers.placements.items():
            if p.kind == "workspace":  # its place in the one allocation, for its live range only
                tt = g.type_of(t)
                self.tensors[t] = self.arena[p.index:p.index + tt.nbytes].view(getattr(torch, tt.dtype.value)).view(
                    tt.shape)
        self.actions: list[Action] = []
        for step in runner.steps:
            self.actions += self._bind(step, fresh)
        self.cuda_graph: Any = None
        self._lock = threading.Lock()
        if graph:
            self._capture()

    def _bind(self, step: PreparedStep, fresh: Callable[[str], Any]) -> list[Action]:
        """The step's actions on the fixed tensors (none for views: taken once, here)."""
        env = self.tensors
        if step.group.template == "view":
            self.runner.run_torch(step.group, env)  # a view of a fixed buffer stays valid
            return []
        for t in step.group.outputs:
            if t not in env:  # graph outputs, and what the planner gave the caller
                env[t] = fresh(t)
        if step.kernel is not None:
            args = [env[t] for t in step.kernel.params]
            cfg = dict(self.runner.chosen(step.kernel))
            launch = step.launch
            return [lambda: launch(*args, **cfg)]
        run = self.runner.run_torch if step.torch else self.runner.run_reference
        group, g = step.group, self.runner.plan.graph
        # every output of its ops: one step computes all of a multi-output op's (the LSTM's y, y_h, y_c)
        made = dict.fromkeys([*group.outputs, *(o for n in group.nodes for o in g.node_by_name[n].outputs if o)])
        for t in made:
            if t not in env:
                env[t] = fresh(t)
        outputs = {t: env[t] for t in made}

        def computed() -> None:  # torch's op (or the host's) makes new tensors: copied into the fixed ones
            scratch = dict(env)
            run(group, scratch)
            for t, fixed in outputs.items():
                fixed.copy_(scratch[t])
        return [computed]

    def _capture(self) -> None:
        import torch

        stream = torch.cuda.Stream(device=self.runner.device)
        stream.wait_stream(torch.cuda.current_stream(self.runner.device))
        with torch.cuda.stream(stream):  # a warm run off the default stream, as capture wants
            self._launch_all()
        torch.cuda.current_stream(self.runner.device).wait_stream(stream)
        self.cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.cuda_graph):
            self._launch_all()

    def _launch_all(self) -> None:
        for action in self.actions:
            action()

    def __call__(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Outputs (copies: the fixed buffers are the next call's) of a run on ``feeds`` (tensors)."""
        g = self.runner.plan.graph
        with self._lock:
            for t in g.inputs:
                self.tensors[t].copy_(feeds[t])
            if self.cuda_graph is not None:
                self.cuda_graph.replay()
            else:
                self._launch_all()
            return {o: self.tensors[o].clone() for o in g.outputs}
