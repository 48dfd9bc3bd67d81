"""Cost models: what a kernel (a group of nodes run together) is predicted to cost.

``CostModel`` is a Protocol so users can plug their own. Invariant: a group's cost depends only on
the graph and the set of nodes in it, and the cost of a plan is the sum over its kernels.

The analytic model is a roofline per kernel: ``launch + sync + max(bytes / bandwidth, flops / peak)``,
where bytes are the kernel's distinct inputs and materialised outputs, bandwidth is the bandwidth of
the cache level the kernel's working set fits in, and flops count recomputation: a producer inlined
into a consumer with a larger iteration space (a broadcast) or into a multi-pass reduction is
computed once per use, not once per element of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from autofusion.decide.groups import group_io
from autofusion.decide.plan import CostBreakdown
from autofusion.ir.graph import Graph
from autofusion.ir.infer import node_context
from autofusion.ops.registry import OpClass, OpRegistry, default_registry

PROFILE_DIR = Path(__file__).parent / "profiles"

# passes a reduction makes over its input (each pass re-evaluates an inlined prologue)
REDUCTION_PASSES = {"Softmax": 3, "LogSoftmax": 3, "LayerNormalization": 3, "InstanceNormalization": 3}


@dataclass(frozen=True)
class CacheLevel:
    level: str
    bytes: int
    bandwidth: float


@dataclass(frozen=True)
class HardwareProfile:
    """Machine constants the analytic model needs; loaded from a JSON profile file."""

    name: str
    peak_flops: float
    caches: tuple[CacheLevel, ...]
    dram_bandwidth: float
    launch_seconds: float
    sync_seconds: float
    description: str = ""

    def bandwidth_for(self, working_set: int) -> float:
        """Bandwidth of the smallest cache level the working set fits in (DRAM otherwise)."""
        for c in self.caches:
            if working_set <= c.bytes:
                return c.bandwidth
        return self.dram_bandwidth

    def replace(self, **changes: float) -> HardwareProfile:
        from dataclasses import replace

        return replace(self, **changes)

    @classmethod
    def from_json(cls, data: dict) -> HardwareProfile:  # type: ignore[type-arg]
        return cls(
            name=str(data["name"]),
            peak_flops=float(data["peak_flops"]),
            caches=tuple(CacheLevel(str(c["level"]), int(c["bytes"]), float(c["bandwidth"]))
                         for c in data.get("caches", [])),
            dram_bandwidth=float(data["dram_bandwidth"]),
            launch_seconds=float(data["launch_seconds"]),
            sync_seconds=float(data.get("sync_seconds", 0.0)),
            description=str(data.get("description", "")),
        )

    @classmethod
    def load(cls, name_or_path: str | Path) -> HardwareProfile:
        """A shipped profile by name (``cpu-2core``, ``nvidia-h200``) or a JSON file path."""
        path = Path(name_or_path)
        if not path.suffix:
            path = PROFILE_DIR / f"{name_or_path}.json"
        try:
            return cls.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
            raise ValueError(f"hardware profile {str(name_or_path)!r} not found (shipped: {known})") from None
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"hardware profile {path}: malformed ({e})") from None


@runtime_checkable
class CostModel(Protocol):
    """Predicts the cost of running ``nodes`` of ``graph`` as one kernel."""

    name: str

    def group_cost(self, graph: Graph, nodes: Sequence[str]) -> CostBreakdown: ...


NodeWork = dict[str, tuple[int, int, bool, OpClass, str]]


def node_work(graph: Graph, registry: OpRegistry) -> NodeWork:
    """Per node: (flops, numel of first output, is view, class, op)."""
    out = {}
    for node in graph.nodes:
        opdef = registry[node.op]
        ctx = node_context(node, graph.types, graph.constants)
        outs = tuple(graph.types[o] for o in node.outputs if o)
        numel = max(1, outs[0].numel) if outs else 1
        out[node.name] = (opdef.count_flops(ctx, outs), numel, opdef.view, opdef.op_class, node.op)
    return out


def evaluations(graph: Graph, nodes: Sequence[str], work: NodeWork) -> dict[str, float]:
    """How many elements of each node a kernel of ``nodes`` computes (its own numel when it is
    computed once; more when inlined into a broadcast or a multi-pass reduction)."""
    members = set(nodes)
    _, outputs = group_io(graph, nodes)
    materialised = set(outputs)
    demand: dict[str, float] = {n: 0.0 for n in nodes}
    by_name = graph.node_by_name
    for name in sorted(members, key=graph.node_index.__getitem__, reverse=True):
        node = by_name[name]
        flops, numel, _, op_class, op = work[name]
        if any(o in materialised for o in node.outputs):
            demand[name] = max(demand[name], float(numel))
        if op_class is OpClass.OPAQUE:
            continue  # opaque cores read their inputs from memory: no prologue inlining
        per_element = demand[name] / numel
        for i in node.inputs:
            producer = graph.producers.get(i)
            if producer is None or producer.name not in members:
                continue
            if op_class is OpClass.REDUCTION:
                in_numel = graph.types[i].numel
                passes = REDUCTION_PASSES.get(op, 1)
                demand[producer.name] += per_element * in_numel * passes
            else:
                demand[producer.name] += demand[name]
    return demand


class AnalyticCostModel:
    """Roofline per kernel with launch and sync overheads, from a :class:`HardwareProfile`."""

    def __init__(self, profile: HardwareProfile | None = None, registry: OpRegistry | None = None) -> None:
        self.profile = profile or HardwareProfile.load("cpu-2core")
        self.registry = registry or default_registry()
        self.name = f"analytic:{self.profile.name}"
        self._work: tuple[Graph, NodeWork] | None = None  # per graph object: hashing one hashes every weight

    def work(self, graph: Graph) -> NodeWork:
        if self._work is None or self._work[0] is not graph:
            self._work = (graph, node_work(graph, self.registry))
        return self._work[1]

    def group_cost(self, graph: Graph, nodes: Sequence[str]) -> CostBreakdown:
        work = self.work(graph)
        if all(work[n][2] for n in nodes):
            return CostBreakdown(0.0, 0, 0, 0, self.name)  # views move no data and launch nothing
        inputs, outputs = group_io(graph, nodes)
        nbytes = sum(graph.types[t].nbytes for t in inputs) + sum(graph.types[t].nbytes for t in outputs)
        demand = evaluations(graph, nodes, work)
        flops = 0.0
        for n in nodes:
            f, numel, _, _, _ = work[n]
            flops += f * demand[n] / numel
        p = self.profile
        seconds = p.launch_seconds + p.sync_seconds + max(nbytes / p.bandwidth_for(nbytes), flops / p.peak_flops)
        return CostBreakdown(seconds, int(nbytes), int(flops), 1, self.name)


