"""Cost models: what a kernel (a group of nodes run together) is predicted to cost.

``CostModel`` is a Protocol so users can plug their own. Invariant: a group's cost depends only on
the graph and the set of nodes in it, and the cost of a plan is the sum over its kernels.

The analytic model is a roofline per kernel: ``launch + sync + max(memory, flops / peak)``, where
memory is the kernel's traffic (its distinct inputs, as much of each as its ops read, and its
materialised outputs, plus the operands its cores read again when they run one after another) over
bandwidth: the weights' at the cache level all the graph's weights fit in (the rest of the model
runs between two uses), the rest at the level the kernel's working set fits in. Flops count
recomputation: a producer inlined into a consumer with a larger iteration space (a broadcast) or
into a multi-pass reduction is computed once per use, not once per element of its own. A pointwise
op whose cost per element the profile measured (``op_seconds``, written by calibration) costs that
per evaluation; otherwise the flops of opaque cores (GEMM, conv) run at the profile's
``matmul_peak_flops`` and those of pointwise math routines (exp, erf, sin...) at its
``math_peak_flops`` when it has them, the rest at ``peak_flops``.

Its three parts can be read apart with :meth:`AnalyticCostModel.terms`: the memory cost (bytes the
kernel moves, and the bytes fusion saved by keeping intermediates in registers), the compute cost
(flops including recomputation) and the fixed launch and synchronisation cost.

:func:`default_cost_model` is what the engine uses when the caller names no model: the model of a
calibration file (``autofusion calibrate`` writes one) when there is one, else the analytic model
with the shipped ``cpu-2core`` profile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from autofusion.decide.groups import group_io
from autofusion.decide.plan import CostBreakdown
from autofusion.graph.graph import FrozenMap, Graph
from autofusion.ir.infer import node_context
from autofusion.kinds.builtin import LOOKAHEAD_STEPS, row_families
from autofusion.kinds.facts import GroupFacts
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpClass, OpRegistry

PROFILE_DIR = Path(__file__).parent / "profiles"
SHIPPED_CALIBRATION = PROFILE_DIR / "calibrated" / "cpu-2core.json"

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
    matmul_peak_flops: float | None = None  # rate of opaque cores (GEMM, conv); None: peak_flops
    math_peak_flops: float | None = None  # rate of pointwise math routines (exp, erf); None: peak_flops
    op_seconds: FrozenMap[str, float] = field(default_factory=FrozenMap)  # measured compute per element, by op
    # energy estimate: joules = seconds x package_watts + bytes moved x joules_per_byte (energy_source says why)
    package_watts: float = 0.0
    joules_per_byte: float = 0.0
    energy_source: str = ""
    # each cache level's read speed as a stream of reads measures it (calibrate's memory probe):
    # what a packed core streaming its weights from there gets; () where not measured. From DRAM
    # they come at dram_bandwidth (fitted: the probe's DRAM reads vary 22-29 GB/s by the minute)
    stream_bandwidths: tuple[float, ...] = ()
    fitted_on: str = ""  # the CPU (its model name) the constants were measured on; "" for published figures

    def __post_init__(self) -> None:
        if self.stream_bandwidths and len(self.stream_bandwidths) != len(self.caches):
            raise ValueError(f"stream_bandwidths: {len(self.stream_bandwidths)} values for "
                             f"{len(self.caches)} cache levels")

    @property
    def matmul_flops_rate(self) -> float:
        return self.matmul_peak_flops or self.peak_flops

    @property
    def math_flops_rate(self) -> float:
        return self.math_peak_flops or self.peak_flops

    def bandwidth_for(self, working_set: int) -> float:
        """Bandwidth of the smallest cache level the working set fits in (DRAM otherwise)."""
        for c in self.caches:
            if working_set <= c.bytes:
                return c.bandwidth
        return self.dram_bandwidth

    def stream_bandwidth_for(self, working_set: int) -> float:
        """Read speed of a stream from the level the working set fits in (``bandwidth_for`` where
        the profile has no measured stream speeds)."""
        level = self.level_index(working_set)
        if not self.stream_bandwidths or level == len(self.caches):
            return self.bandwidth_for(working_set)
        return self.stream_bandwidths[level]

    def level_index(self, working_set: int) -> int:
        """0 for the first cache level the working set fits in, ..., ``len(caches)`` for DRAM."""
        for i, c in enumerate(self.caches):
            if working_set <= c.bytes:
                return i
        return len(self.caches)

    @property
    def bandwidths(self) -> tuple[float, ...]:
        """Bandwidth per level, cache levels first and DRAM last (indexed by :meth:`level_index`)."""
        return tuple(c.bandwidth for c in self.caches) + (self.dram_bandwidth,)

    def joules(self, seconds: float, bytes_moved: float) -> float:
        """Estimated energy of a run: the package's power for its time, plus its memory traffic."""
        return seconds * self.package_watts + bytes_moved * self.joules_per_byte

    def replace(self, **changes: Any) -> HardwareProfile:
        from dataclasses import replace

        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The profile as the JSON object :meth:`from_json` reads."""
        data = asdict(self)
        data["caches"] = [asdict(c) for c in self.caches]
        for optional in ("matmul_peak_flops", "math_peak_flops"):
            if data[optional] is None:
                del data[optional]
        data["op_seconds"] = dict(sorted(self.op_seconds.items()))
        if not self.op_seconds:
            del data["op_seconds"]
        data["stream_bandwidths"] = list(self.stream_bandwidths)
        for optional in ("package_watts", "joules_per_byte", "energy_source", "stream_bandwidths", "fitted_on"):
            if not data[optional]:
                del data[optional]
        return data

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
            matmul_peak_flops=float(data["matmul_peak_flops"]) if data.get("matmul_peak_flops") else None,
            math_peak_flops=float(data["math_peak_flops"]) if data.get("math_peak_flops") else None,
            op_seconds=FrozenMap({str(k): float(v) for k, v in dict(data.get("op_seconds", {})).items()}),
            package_watts=float(data.get("package_watts", 0.0)),
            joules_per_byte=float(data.get("joules_per_byte", 0.0)),
            energy_source=str(data.get("energy_source", "")),
            stream_bandwidths=tuple(float(b) for b in data.get("stream_bandwidths", ())),
            fitted_on=str(data.get("fitted_on", "")),
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
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"hardware profile {path}: malformed ({e})") from None


@runtime_checkable
class CostModel(Protocol):
    """Predicts the cost of running ``nodes`` of ``graph`` as one kernel."""

    name: str

    def group_cost(self, graph: Graph, nodes: Sequence[str]) -> CostBreakdown: ...


MATH_FLOPS_PER_ELEMENT = 4  # pointwise ops this dear per element call a math routine (exp, erf, sin...)


class NodeCost(NamedTuple):
    """What one node costs wherever it runs."""

    flops: int
    numel: int  # elements of its first output
    view: bool
    op_class: OpClass
    op: str
    math: bool  # a pointwise op that calls a math routine
    reads: int | None = None  # bytes it reads of its inputs when that is less than all of them (a Gather's rows)


NodeWork = dict[str, NodeCost]


def model_profile(model: CostModel) -> HardwareProfile | None:
    """The hardware profile behind ``model``: its own, or its analytic part's (a learned model);
    None for a model without one (a plugin's)."""
    for holder in (model, getattr(model, "analytic", None)):
        profile = getattr(holder, "profile", None)
        if isinstance(profile, HardwareProfile):
            return profile
    return None


def node_work(graph: Graph, registry: OpRegistry) -> NodeWork:
    """The :class:`NodeCost` of every node."""
    out = {}
    for node in graph.nodes:
        opdef = registry[node.op]
        ctx = node_context(node, graph.types, graph.constants)
        outs = tuple(graph.types[o] for o in node.outputs if o)
        numel = max(1, outs[0].numel) if outs else 1
        math = opdef.op_class is OpClass.POINTWISE and opdef.flops_per_element >= MATH_FLOPS_PER_ELEMENT
        reads = opdef.count_bytes(ctx, outs) - sum(t.nbytes for t in outs)
        whole = sum(graph.types[i].nbytes for i in node.inputs if i)
        out[node.name] = NodeCost(opdef.count_flops(ctx, outs), numel, opdef.view, opdef.op_class, node.op, math,
                                  reads if 0 <= reads < whole else None)
    return out


def evaluations(graph: Graph, nodes: Sequence[str], work: NodeWork) -> dict[str, float]:
    """How many elements of each node a kernel of ``nodes`` computes (its own numel when it is
    computed once; more when inlined into a broadcast or a multi-pass reduction).

    A value is computed once in each loop that reads it, however many of that loop's ops read it
    (the compiler computes a repeated expression once): the loop writing the outputs, and each pass
    of a family of sibling reductions (:func:`row_families`)."""
    members = set(nodes)
    _, outputs = group_io(graph, nodes)
    materialised = set(outputs)
    by_name = graph.node_by_name
    reductions = [n for n in nodes if work[n].op_class is OpClass.REDUCTION]
    family_of = {n: i for i, family in enumerate(row_families(GroupFacts(graph, frozenset(members), {}), reductions))
                 for n in family}
    once = _once_per_row(graph, members, reductions, work)
    loops: dict[str, dict[object, float]] = {n: {} for n in nodes}  # node -> evaluations, by the loop needing them
    demand: dict[str, float] = {}
    for name in sorted(members, key=graph.node_index.__getitem__, reverse=True):
        node, mine = by_name[name], loops[name]
        numel, op_class, op = work[name].numel, work[name].op_class, work[name].op
        if any(o in materialised for o in node.outputs):
            mine["out"] = max(mine.get("out", 0.0), float(numel))
        demand[name] = sum(mine.values())
        if name in once:  # computed once per row, in its own stage, however many read it
            demand[name] = min(demand[name], float(numel))
            mine = {("row", name): demand[name]}
        if op_class is OpClass.OPAQUE:  # opaque cores read their inputs from memory: no prologue inlining,
            for i in node.inputs:  # but what the group computes for them it computes, once (a pooled conv)
                producer = graph.producers.get(i)
                if producer is not None and producer.name in members:
                    theirs = loops[producer.name]
                    theirs["out"] = max(theirs.get("out", 0.0), float(work[producer.name].numel))
            continue
        for i in node.inputs:
            producer = graph.producers.get(i)
            if producer is None or producer.name not in members:
                continue
            theirs = loops[producer.name]
            if op_class is OpClass.REDUCTION:
                reads = demand[name] / numel * graph.types[i].numel * REDUCTION_PASSES.get(op, 1)
                needs: dict[object, float] = {("pass", family_of[name]): reads}
            else:
                needs = mine
            for loop, count in needs.items():
                theirs[loop] = max(theirs.get(loop, 0.0), count)
    return demand


def _once_per_row(graph: Graph, members: set[str], reductions: Sequence[str], work: NodeWork) -> set[str]:
    """The reductions and what the group computes from their results alone at their reduced size
    (a mean scaled, a variance's reciprocal square root): a stage computes each once per row."""
    once = set(reductions)
    for name in sorted(members, key=graph.node_index.__getitem__):
        node = graph.node_by_name[name]
        inside = [graph.producers[i].name for i in node.inputs if i in graph.producers and graph.producers[i].name in members]
        if (work[name].op_class is OpClass.POINTWISE and inside and all(p in once for p in inside)
                and all(work[p].numel == work[name].numel for p in inside)):
            once.add(name)
    return once


@dataclass(frozen=True)
class GroupTerms:
    """What a kernel does, before any machine constant: the inputs of every cost model.

    ``intermediate_bytes`` are the bytes of values the kernel keeps in registers instead of writing
    to memory (what fusion saved); ``flops`` count recomputation, ``flops_once`` count each node once.
    """

    bytes_in: int
    bytes_out: int
    intermediate_bytes: int
    flops: float
    flops_once: float
    kernels: int  # 0 for a group of views only (no kernel runs), else 1
    matmul_flops: float = 0.0  # the part of ``flops`` done by opaque cores (GEMM, conv)
    math_flops: float = 0.0  # the part done by pointwise math routines (exp, tanh, erf...)
    pointwise: tuple[tuple[str, float, float, bool], ...] = ()  # per pointwise op: evaluations, flops, math
    # traffic beyond ``bytes``: an input read again by each further opaque core (an LSTM's weights, once a step)
    reread_bytes: int = 0
    const_traffic: int = 0  # the part of the traffic (reads included) that reads constants (weights)
    resident_bytes: int = 0  # the graph's constants in all: where weights live between two runs
    streamed_const: int = 0  # the part of const_traffic opaque cores read: packed weights, streamed

    @property
    def bytes(self) -> int:
        """Distinct bytes the kernel reads and writes: its working set."""
        return self.bytes_in + self.bytes_out

    @property
    def traffic(self) -> int:
        """Bytes moved, with the reads of every core that reads an input again."""
        return self.bytes + self.reread_bytes

    def memory_split(self) -> tuple[tuple[int, int, bool], ...]:
        """(bytes, the working set that places them, whether a core streams them) for the weights
        cores read, the other constants and the rest: weights come from where all the graph's
        constants fit, since the rest of the model runs between two uses; activations from where
        the kernel's own working set fits."""
        placed = max(self.resident_bytes, self.bytes)
        return ((self.streamed_const, placed, True), (self.const_traffic - self.streamed_const, placed, False),
                (self.traffic - self.const_traffic, self.bytes, False))

    @property
    def recompute_flops(self) -> float:
        """Extra work the fused kernel does by evaluating inlined producers more than once."""
        return max(0.0, self.flops - self.flops_once)


def group_terms(graph: Graph, nodes: Sequence[str], work: NodeWork) -> GroupTerms:
    """The :class:`GroupTerms` of running ``nodes`` as one kernel."""
    if all(work[n][2] for n in nodes):
        return GroupTerms(0, 0, 0, 0.0, 0.0, 0)
    inputs, outputs = group_io(graph, nodes)
    read = _input_reads(graph, nodes, inputs, work)
    bytes_in = sum(read.values())
    bytes_out = sum(graph.types[t].nbytes for t in outputs)
    materialised = set(outputs)
    by_name = graph.node_by_name
    kept = sum(graph.types[o].nbytes for n in nodes if not work[n][2]
               for o in by_name[n].outputs if o and o not in materialised)
    demand = evaluations(graph, nodes, work)
    flops = sum(work[n][0] * demand[n] / work[n][1] for n in nodes)
    once = float(sum(work[n][0] for n in nodes))
    matmul = sum(work[n].flops * demand[n] / work[n].numel for n in nodes if work[n].op_class is OpClass.OPAQUE)
    math = sum(work[n].flops * demand[n] / work[n].numel for n in nodes if work[n].math)
    by_op: dict[str, tuple[float, float, bool]] = {}
    for n in nodes:
        cost = work[n]
        if cost.op_class is OpClass.POINTWISE and not cost.view:
            evals, fl, _ = by_op.get(cost.op, (0.0, 0.0, cost.math))
            by_op[cost.op] = (evals + demand[n], fl + cost.flops * demand[n] / cost.numel, cost.math)
    pointwise = tuple((op, e, f, m) for op, (e, f, m) in sorted(by_op.items()))
    reread, const_traffic, streamed = _reads(graph, nodes, read, work)
    return GroupTerms(int(bytes_in), int(bytes_out), int(kept), float(flops), once, 1, float(matmul), float(math),
                      pointwise, reread, const_traffic, graph.parameter_bytes, streamed)


def _input_reads(graph: Graph, nodes: Sequence[str], inputs: Sequence[str], work: NodeWork) -> dict[str, int]:
    """Bytes the kernel reads of each input: all of it, unless every node of the group reading it
    reads only a part, as the op's ``bytes_moved`` says (a Gather reads its rows of an embedding
    table, its largest input, and the rest whole)."""
    partial: dict[str, int] = {}
    whole: set[str] = set()
    by_name = graph.node_by_name
    for n in nodes:
        ins = [i for i in dict.fromkeys(by_name[n].inputs) if i]
        reads = work[n].reads
        if reads is None or not ins:
            whole.update(ins)
            continue
        largest = max(ins, key=lambda i: graph.types[i].nbytes)
        rest = [i for i in ins if i != largest]
        whole.update(rest)
        partial[largest] = partial.get(largest, 0) + max(0, reads - sum(graph.types[i].nbytes for i in rest))
    return {t: graph.types[t].nbytes if t in whole else min(graph.types[t].nbytes, partial.get(t, 0))
            for t in inputs}


def _reads(graph: Graph, nodes: Sequence[str], read: dict[str, int], work: NodeWork) -> tuple[int, int, int]:
    """(bytes read again, bytes of constants read in all, the part of those cores read) by ``nodes``
    run as one kernel. An opaque
    core streams its operands from memory. In a kernel whose cores run one after another (one core
    waits for another's result: an LSTM's steps) every such core reads its operands again, a weight
    once a step, and the cores that wait for none (an LSTM's input projections) are computed
    LOOKAHEAD_STEPS steps at once, their weight read once per that many steps; cores side by side (a
    horizontal GEMM) read a shared operand once."""
    by_name = graph.node_by_name
    waiting, free = _cores_by_dependence(graph, nodes, work)
    readers: dict[str, int] = {}
    ahead: dict[str, int] = {}  # reads by cores that wait for no other core
    for cores, free_core in ((waiting, False), (free, True)):
        for n in cores:
            for i in dict.fromkeys(by_name[n].inputs):
                if i:
                    readers[i] = readers.get(i, 0) + 1
                    if free_core:
                        ahead[i] = ahead.get(i, 0) + 1
    in_turn = bool(waiting) and any(count > 1 for count in readers.values())
    reread = const = streamed = 0
    for t, nbytes in read.items():
        reads = readers.get(t, 1) - ahead.get(t, 0) + -(-ahead.get(t, 0) // LOOKAHEAD_STEPS)
        extra = nbytes * (max(1, reads) - 1) if in_turn else 0
        reread += extra
        if t in graph.constants:
            const += nbytes + extra
            streamed += nbytes + extra if t in readers else 0
    return reread, const, streamed


def _cores_by_dependence(graph: Graph, nodes: Sequence[str], work: NodeWork) -> tuple[list[str], list[str]]:
    """The group's opaque cores that depend, inside the group, on another of its cores, and those
    that do not, in graph order."""
    members = set(nodes)
    below_core: set[str] = set()  # nodes of the group that depend on one of its cores
    waiting: list[str] = []
    free: list[str] = []
    for name in sorted(members, key=graph.node_index.__getitem__):
        core = work[name].op_class is OpClass.OPAQUE
        below = any(producer is not None and producer.name in members
                    and (producer.name in below_core or work[producer.name].op_class is OpClass.OPAQUE)
                    for producer in (graph.producers.get(i) if i else None for i in graph.node_by_name[name].inputs))
        if below:
            below_core.add(name)
        if core:
            (waiting if below else free).append(name)
    return waiting, free


@dataclass(frozen=True)
class AnalyticSeconds:
    """The analytic model's prediction split into its parts; ``total`` is what plans add up."""

    memory: float
    compute: float
    launch: float
    sync: float

    @property
    def total(self) -> float:
        return self.launch + self.sync + max(self.memory, self.compute)


def compute_parts(terms: GroupTerms, op_seconds: Mapping[str, float]) -> tuple[float, float, float, float]:
    """(seconds of the ops measured in ``op_seconds``, and the plain, math-routine and matmul flops
    of the rest) of a kernel: what the compute side of the roofline is made of."""
    plain, math, measured = terms.flops - terms.matmul_flops - terms.math_flops, terms.math_flops, 0.0
    for op, evals, flops, is_math in terms.pointwise:
        per_element = op_seconds.get(op)
        if per_element is not None:  # a measured op: its own cost per element replaces its flops
            measured += evals * per_element
            math, plain = (math - flops, plain) if is_math else (math, plain - flops)
    return measured, max(0.0, plain), max(0.0, math), terms.matmul_flops


def analytic_seconds(terms: GroupTerms, profile: HardwareProfile) -> AnalyticSeconds:
    """Roofline of one kernel under ``profile`` (all zero for a kernel that does not run)."""
    if terms.kernels == 0:
        return AnalyticSeconds(0.0, 0.0, 0.0, 0.0)
    measured, plain, math, matmul = compute_parts(terms, profile.op_seconds)
    compute = (measured + plain / profile.peak_flops + math / profile.math_flops_rate
               + matmul / profile.matmul_flops_rate)
    memory = sum(nbytes / (profile.stream_bandwidth_for(working_set) if streamed else profile.bandwidth_for(working_set))
                 for nbytes, working_set, streamed in terms.memory_split())
    return AnalyticSeconds(memory, compute, profile.launch_seconds, profile.sync_seconds)


class AnalyticCostModel:
    """Roofline per kernel with launch and sync overheads, from a :class:`HardwareProfile`."""

    def __init__(self, profile: HardwareProfile | None = None, registry: OpRegistry | None = None) -> None:
        self.profile = profile or HardwareProfile.load("cpu-2core")
        self.registry = registry or default_registry()
        self.name = f"analytic:{self.profile.name}"
        self.source = "" if profile else "shipped profile cpu-2core"  # where the constants came from
        # per graph object (hashing one hashes every weight); a few, as a plan over symbolic sizes is
        # priced on a graph per representative binding, alternately
        self._work: list[tuple[Graph, NodeWork]] = []

    def work(self, graph: Graph) -> NodeWork:
        for g, w in self._work:
            if g is graph:
                return w
        w = node_work(graph, self.registry)
        self._work = [(graph, w), *self._work[:3]]
        return w

    def terms(self, graph: Graph, nodes: Sequence[str]) -> GroupTerms:
        """Bytes, saved bytes and flops (with recomputation) of ``nodes`` as one kernel."""
        return group_terms(graph, nodes, self.work(graph))

    def seconds(self, graph: Graph, nodes: Sequence[str]) -> AnalyticSeconds:
        """The prediction split into memory, compute, launch and sync seconds."""
        return analytic_seconds(self.terms(graph, nodes), self.profile)

    def group_cost(self, graph: Graph, nodes: Sequence[str]) -> CostBreakdown:
        terms = self.terms(graph, nodes)
        if terms.kernels == 0:
            return CostBreakdown(0.0, 0, 0, 0, self.name)  # views move no data and launch nothing
        seconds = analytic_seconds(terms, self.profile).total
        return CostBreakdown(seconds, terms.traffic, int(terms.flops), 1, self.name)


# -- the default model --------------------------------------------------------------------------
