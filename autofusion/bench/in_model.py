"""Every distinct matrix-product core timed inside the whole model, in autofusion and onnxruntime.

A core timed alone (``bench.cores``) pays a Python call, an output allocation and cold caches that
it does not pay in the model; in resnet18 on a Xeon a 3x3 convolution took 1.23 ms alone and 0.93 ms
in the model. Here both runtimes run the whole model, each timing its own kernels: our profiling
build (``CompiledModel(profile=True)``) times each kernel, onnxruntime's profiler each node. Both are
keyed by the product they compute, ``(kind, rows, columns, depth)``: rows are every row of every
call (a batched product's calls and a convolution's images x positions), columns the output channels
of all groups, depth a group's inner dimension, read from each onnxruntime node's shapes.

What each side's time holds differs as the runtimes fuse differently: our kernel's epilogue (bias,
activation, residual add, pooling) is in ours, onnxruntime's fused activation or sum in its node,
and a kernel with several cores (a horizontal GEMM) gives each core its share of the kernel's time
by FLOPs. Each side's time of a core is the mean over its instances of their medians.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.bench.timing import RUNNER_PAUSE_SECONDS, wake
from autofusion.codegen.cores import CoreSpec

CoreKey = tuple[str, int, int, int]  # (kind, rows of all calls, columns of all groups, depth)
GEMM_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "FusedGemm"})
POOL_OPS = frozenset({"MaxPool", "AveragePool"})


class OnnxRuntimeFailed(RuntimeError):
    """onnxruntime could not load or run the model, with its own message."""


def spec_key(spec: CoreSpec) -> CoreKey:
    """A core's key: a convolution's calls are images x groups, its n the channels of one group."""
    if spec.kind == "conv":
        groups = spec.geometry[-1][0] if spec.geometry else 1
        return ("conv", spec.calls // groups * spec.m, spec.n * groups, spec.k)
    return ("gemm", spec.calls * spec.m, spec.n, spec.k)


def _shapes(arg: Any) -> list[list[int]]:
    """``[{"float": [1, 64, 56, 56]}, ...]`` (onnxruntime's ``input_type_shape``) as shapes."""
    return [next(iter(entry.values())) for entry in arg or []]


def ort_node_key(op: str, inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> CoreKey | None:
    """The core an onnxruntime node computes, from its op and shapes; None when it has none.

    Convolutions come in NCHW (weight [M, C/g, kh, kw]) and channel-blocked forms (input
    [N, C/b, H, W, b], weight [M/b, C/b, kh, kw, b, b], or [M/b, C, kh, kw, b] for an NCHW input)."""
    if not inputs or not outputs:
        return None
    out = list(outputs[0])
    if op in POOL_OPS:  # no product: matched to a convolution whose kernel pools (the stem's)
        return ("pool", math.prod(out), 0, 0)
    if op in ("Conv", "FusedConv") and len(inputs) >= 2 and len(out) >= 3 and len(inputs[1]) >= len(out):
        w = list(inputs[1])
        # channel-blocked output: a weight of one more axis, or an NCHW input of one fewer (the stem)
        blocked = len(w) == len(out) + 1 or len(inputs[0]) == len(out) - 1
        spatial = out[2:-1] if blocked else out[2:]
        channels = out[1] * out[-1] if blocked else out[1]
        depth = w[1] * math.prod(w[2:2 + len(spatial)]) * (w[-2] if len(w) == len(spatial) + 4 else 1)
        return ("conv", out[0] * math.prod(spatial), channels, depth)
    # from A and the output alone: a weight onnxruntime packed ahead is missing from the shapes it lists
    if op in GEMM_OPS and len(out) >= 2:
        a = list(inputs[0])
        rows, cols = math.prod(out[:-1]), out[-1]
        # A's last axis, or its next to last where A is transposed (FusedMatMul, Gemm's transA)
        depth = a[-1] if len(a) == 1 or a[-2] * math.prod(out[:-2]) == rows else a[-2]
        return ("gemm", rows, cols, depth)
    return None


@dataclass
class InModelCore:
    """One distinct core: its instances and time per instance in each runtime's run of the model."""

    key: CoreKey
    describe: str
    labels: list[str] = field(default_factory=list)
    ours_ms: list[float] = field(default_factory=list)  # per instance: the kernel's median x the core's share
    ort_ms: list[float] = field(default_factory=list)  # per matching node: its median
    ort_parts: str = ""  # matched to onnxruntime's nodes of this product in parts, e.g. "3 x gemm [...]"
    pools: list[int] = field(default_factory=list)  # per instance: elements our kernel's pooling epilogue outputs

    @property
    def flops(self) -> int:
        return 2 * self.key[1] * self.key[2] * self.key[3]

    def mean(self, side: str) -> float | None:
        values = self.ours_ms if side == "autofusion" else self.ort_ms
        return statistics.fmean(values) if values else None

    def ratio(self) -> float | None:
        ours, theirs = self.mean("autofusion"), self.mean("onnxruntime")
        return None if ours is None or not theirs else ours / theirs

    def to_json(self) -> dict[str, Any]:
        ours, theirs = self.mean("autofusion"), self.mean("onnxruntime")
        return {"core": self.describe, "kind": self.key[0], "rows": self.key[1], "columns": self.key[2],
                "depth": self.key[3], "variants": sorted(set(self.labels)), "instances": len(self.ours_ms),
                "onnxruntime_nodes": len(self.ort_ms), "ms_per_instance": {"autofusion": ours, "onnxruntime": theirs},
                "gflops": {side: self.flops / 1e9 / (t / 1e3) for side, t in
                           (("autofusion", ours), ("onnxruntime", theirs)) if t},
                "ratio_vs_onnxruntime": self.ratio(), "onnxruntime_parts": self.ort_parts}


def _describe(key: CoreKey) -> str:
    kind, rows, cols, depth = key
    return f"{kind} [{rows} x {depth}] @ [{depth} x {cols}]"


def our_cores(kernels: Any, medians_ms: Mapping[str, float], label: Callable[[Any, Any], str],
              pools: Mapping[str, int] | None = None) -> tuple[dict[CoreKey, InModelCore], float]:
    """Each kernel's median shared among its cores by FLOPs; also the time of kernels without one.
    ``pools`` gives the elements of the pooling window a kernel ends with (by group name), which
    onnxruntime runs as a node of its own."""
    cores: dict[CoreKey, InModelCore] = {}
    rest = dict(medians_ms)
    for kernel in kernels:
        ms = rest.pop(kernel.group.name, None)
        if ms is None or not kernel.cores:
            if ms is not None:
                rest[kernel.group.name] = ms
            continue
        total = sum(spec.flops for spec, _ in kernel.cores) or 1
        for spec, choice in kernel.cores:
            key = spec_key(spec)
            entry = cores.setdefault(key, InModelCore(key, _describe(key)))
            entry.ours_ms.append(ms * spec.flops / total)
            entry.labels.append(label(choice, spec))
            if (pools or {}).get(kernel.group.name):
                entry.pools.append((pools or {})[kernel.group.name])
    return cores, sum(rest.values())


def ort_node_times(events: Sequence[Mapping[str, Any]], timed: Sequence[bool] | None = None
                   ) -> dict[str, tuple[str, CoreKey | None, float]]:
    """Per node of an onnxruntime profile: (op, core key, median ms) over the runs ``timed`` marks
    (run i is the i-th ``model_run`` event; all runs without ``timed``)."""
    starts = sorted(float(e["ts"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if timed is not None and len(starts) != len(timed):  # the profile stopped recording (it caps its events)
        raise OnnxRuntimeFailed(f"onnxruntime's profile holds {len(starts)} runs of the {len(timed)} made: "
                                "fewer rounds or runs (--rounds, --repeat)")
    per_node: dict[str, list[float]] = {}
    meta: dict[str, tuple[str, CoreKey | None]] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        run = bisect.bisect_right(starts, float(e.get("ts", 0.0))) - 1
        if timed is not None and not (0 <= run < len(timed) and timed[run]):
            continue
        args = e.get("args", {})
        node = name.removesuffix("_kernel_time")
        per_node.setdefault(node, []).append(float(e.get("dur", 0.0)) / 1e3)
        if node not in meta:
            op = str(args.get("op_name", ""))
            meta[node] = (op, ort_node_key(op, _shapes(args.get("input_type_shape")),
                                           _shapes(args.get("output_type_shape"))))
    return {node: (*meta[node], statistics.median(t)) for node, t in per_node.items()}


@dataclass
class InModelResult:
    cores: list[InModelCore]
    ours_total_ms: float  # our kernels' medians, summed
    ours_rest_ms: float  # of kernels without a core
    ort_total_ms: float  # onnxruntime's nodes' medians, summed
    ort_rest_ms: float  # of its nodes without a core we have
    unmatched: dict[str, float]  # onnxruntime nodes computing a core the plan does not have: ms
    # each runtime's whole profiled run, wall clock (medians): onnxruntime's node times can sum to
    # more than its run takes (resnet18 on a Zen 3: 24.2 against 21.0 ms), which flatters ours
    run_ms: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        ratios = [r for r in (c.ratio() for c in self.cores) if r is not None]
        return {"cores": [c.to_json() for c in self.cores],
                "totals_ms": {"autofusion": self.ours_total_ms, "onnxruntime": self.ort_total_ms},
                "whole_run_ms": dict(self.run_ms),
                "outside_cores_ms": {"autofusion": self.ours_rest_ms, "onnxruntime": self.ort_rest_ms},
                "unmatched_onnxruntime_nodes_ms": dict(self.unmatched),
                "worst_ratio_vs_onnxruntime": max(ratios) if ratios else None}


def combine(ours: dict[CoreKey, InModelCore], ours_rest: float,
            ort: Mapping[str, tuple[str, CoreKey | None, float]]) -> InModelResult:
    """Our cores beside onnxruntime's nodes of the same key, largest total FLOPs first.

    A product onnxruntime runs as several nodes (a horizontal GEMM's parts: Q, K and V as three
    products of one shape) is matched to the nodes of that shape beyond those our own cores of the
    shape account for; each part is priced at the mean of all nodes of the shape."""
    by_key: dict[CoreKey, list[tuple[str, float]]] = {}
    ort_rest = 0.0
    for node, (_, key, ms) in ort.items():
        if key is None:
            ort_rest += ms
        else:
            by_key.setdefault(key, []).append((node, ms))
    for key, nodes in by_key.items():
        if key in ours:
            ours[key].ort_ms += [ms for _, ms in nodes]
    claimed: set[CoreKey] = set()
    for key, core in ours.items():
        part = None if core.ort_ms else _parts_of(key, len(core.ours_ms), ours, by_key)
        if part is not None:
            nodes, parts = by_key[part], key[2] // part[2]
            mean = statistics.fmean(ms for _, ms in nodes)
            core.ort_ms = [mean * parts] * len(core.ours_ms)
            core.ort_parts = f"{parts} x {_describe(part)}"
            by_key[part] = nodes[: len(nodes) - parts * len(core.ours_ms)]
            claimed.add(part)
            if part in ours:  # the parts' nodes leave the count of our own core of that shape
                ours[part].ort_ms = [mean] * len(by_key[part])
    for core in ours.values():  # our kernel pools too: onnxruntime's pooling node of that output joins its time
        added, ops = 0.0, set[str]()
        for pooled in core.pools:
            nodes = by_key.get(("pool", pooled, 0, 0), [])
            if nodes and core.ort_ms:
                node, ms = nodes.pop(0)
                added, ops = added + ms, ops | {ort[node][0]}
        if added:
            core.ort_ms = [t + added / len(core.ort_ms) for t in core.ort_ms]
            core.ort_parts = f"its {' and '.join(sorted(ops))} node included, as our kernel pools"
    for key in [k for k in by_key if k[0] == "pool"]:  # pooling nodes no kernel of ours holds
        ort_rest += sum(ms for _, ms in by_key.pop(key))
    unmatched = {n: ms for key, nodes in by_key.items() if key not in ours and key not in claimed for n, ms in nodes}
    cores = sorted(ours.values(), key=lambda c: -c.flops * max(1, len(c.ours_ms)))
    total = sum(sum(c.ours_ms) for c in cores) + ours_rest
    return InModelResult(cores, total, ours_rest, sum(ms for _, _, ms in ort.values()), ort_rest, unmatched)


def _parts_of(key: CoreKey, instances: int, ours: Mapping[CoreKey, InModelCore],
              by_key: Mapping[CoreKey, list[tuple[str, float]]]) -> CoreKey | None:
    """The shape of onnxruntime's nodes that compute ``key``'s core in parts: the same rows and depth,
    columns a divisor, and enough nodes of it beyond our own cores of that shape."""
    kind, rows, cols, depth = key
    for part, nodes in by_key.items():
        if part[0] != kind or part[1] != rows or part[3] != depth or part[2] >= cols or cols % part[2]:
            continue
        own = len(ours[part].ours_ms) if part in ours else 0
        if len(nodes) - own >= cols // part[2] * instances:
            return part
    return None


def measure_in_model(plan: Any, onnx_bytes: bytes, feeds: Mapping[str, np.ndarray], threads: int,
                     runs: int = 10, rounds: int = 5, tune: bool = True, cache: Any = None,
                     progress: Any = None) -> InModelResult:
    """Run the whole model ``rounds`` x ``runs`` times in each runtime, in turn (every other round in
    reverse order, a pause and untimed runs before each block), each timing its own kernels."""
    import onnxruntime as ort

    from autofusion.runtime import CompiledModel

    model = CompiledModel(plan, threads=threads, profile=True, tune=tune, cache=cache, progress=progress)
    with tempfile.TemporaryDirectory(prefix="autofusion-in-model-") as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        opts.log_severity_level = 3
        timed: list[bool] = []  # per onnxruntime run, in order: whether it is one of the timed runs
        try:
            session = ort.InferenceSession(onnx_bytes, opts, providers=["CPUExecutionProvider"])
            ort_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
            session.run(None, ort_feeds)
            timed.append(False)
        except Exception as e:  # noqa: BLE001 - onnxruntime's own errors name the node; passed on as they are
            raise OnnxRuntimeFailed(f"onnxruntime could not run the model: {type(e).__name__}: {str(e)[:500]}") from e
        samples: dict[str, list[float]] = {}
        walls: dict[str, list[float]] = {"autofusion": [], "onnxruntime": []}

        def ours() -> None:
            t0 = time.perf_counter()
            found = model.step_samples(feeds, runs)
            walls["autofusion"].append((time.perf_counter() - t0) / runs)
            for group, seconds in found.items():
                samples.setdefault(group, []).extend(seconds)

        def ort_run(counted: bool) -> None:
            t0 = time.perf_counter()
            session.run(None, ort_feeds)
            if counted:
                walls["onnxruntime"].append(time.perf_counter() - t0)
            timed.append(counted)

        def theirs() -> None:
            for _ in range(runs):
                ort_run(True)

        blocks: list[tuple[Callable[[], None], Callable[[], object]]] = [
            (ours, lambda: model.run(feeds)), (theirs, lambda: ort_run(False))]
        for _, call in blocks:  # first runs: page faults and lazy set-up
            call()
        for r in range(rounds):
            for block, call in blocks if r % 2 == 0 else blocks[::-1]:
                time.sleep(RUNNER_PAUSE_SECONDS)
                wake(call)  # threads that slept through the pause wake up untimed
                block()
        events = json.loads(Path(session.end_profiling()).read_text())
    medians = {group: statistics.median(t) * 1e3 for group, t in samples.items()}
    cores, rest = our_cores(model.source.kernels, medians, lambda c, s: c.label(model.machine, s), _pools(plan))
    result = combine(cores, rest, ort_node_times(events, timed))
    result.run_ms = {name: statistics.median(t) * 1e3 for name, t in walls.items()}
    return result


def _pools(plan: Any) -> dict[str, int]:
    """Group name -> elements of the pooling window it ends with, for the groups that pool."""
    g = plan.graph
    return {group.name: g.type_of(node.outputs[0]).numel for group in plan.groups for node in
            (g.node_by_name[n] for n in group.nodes) if plan.registry[node.op].pooling}
