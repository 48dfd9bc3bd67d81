"""The structure of an ONNX graph as plain data, and the checks on it: one definition per tensor,
supported ops and attributes, no dangling inputs, no cycles; dead nodes are dropped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from autofusion.frontends.onnx_proto import DEFAULT_DOMAINS, OnnxImportError, attribute_value
from autofusion.ops.registry import OpRegistry


@dataclass(frozen=True)
class OnnxNode:
    """One ONNX node as plain data: its position, op, tensor names and converted attributes."""

    index: int
    name: str
    op: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]

    @property
    def label(self) -> str:
        return f"node {self.name!r} ({self.op})" if self.name else f"node #{self.index} ({self.op})"


def read_node(index: int, proto: onnx.NodeProto) -> OnnxNode:
    """The node with its attributes converted (subgraph attributes are left out: those ops are unsupported)."""
    where = f"node {proto.name!r} ({proto.op_type})" if proto.name else f"node #{index} ({proto.op_type})"
    attrs = {a.name: attribute_value(a, where) for a in proto.attribute
             if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)}
    outputs = list(proto.output)
    while outputs and not outputs[-1]:
        outputs.pop()  # trailing empty names: optional outputs the model does not want
    return OnnxNode(index, proto.name, proto.op_type, proto.domain, tuple(proto.input), tuple(outputs), attrs)


def check_single_definitions(nodes: list[OnnxNode], defined: set[str]) -> None:
    """Every tensor has one definition: an input, an initializer or one node output."""
    seen = set(defined)
    for n in nodes:
        for o in n.outputs:
            if o and o in seen:
                raise OnnxImportError(f"tensor {o!r} is defined twice ({n.label} and an earlier definition)")
            seen.add(o)


def live_nodes(nodes: list[OnnxNode], outputs: Sequence[str]) -> list[OnnxNode]:
    """The nodes some graph output depends on, in model order."""
    producer = {o: n for n in nodes for o in n.outputs if o}
    live: set[int] = set()
    stack = [producer[o] for o in outputs if o in producer]
    while stack:
        node = stack.pop()
        if node.index in live:
            continue
        live.add(node.index)
        stack.extend(producer[i] for i in node.inputs if i in producer)
    return [n for n in nodes if n.index in live]


def check_supported(nodes: list[OnnxNode], registry: OpRegistry) -> None:
    """One error listing every unsupported op type with its count; then unknown attributes."""
    missing: Counter[str] = Counter()
    for n in nodes:
        if n.domain not in DEFAULT_DOMAINS:
            missing[f"{n.domain}.{n.op}"] += 1
        elif n.op not in registry and n.op != "Constant":
            missing[n.op] += 1
    if missing:
        listed = ", ".join(f"{op} (x{count})" for op, count in sorted(missing.items()))
        raise OnnxImportError(f"unsupported ops: {listed}; autofusion supports {len(registry)} ai.onnx ops "
                              "(see `autofusion.ops.default_registry().names`)")
    for n in nodes:
        if n.op == "Constant":
            continue
        known = registry[n.op].attrs
        unknown = sorted(set(n.attrs) - set(known))
        if unknown:
            raise OnnxImportError(f"{n.label}: unknown attribute(s) {unknown} (known: {sorted(known)})")


def topological(nodes: list[OnnxNode], defined: set[str], outputs: Sequence[str]) -> list[OnnxNode]:
    """Nodes in dependency order; dangling inputs and cycles are errors."""
    producer = {o: n for n in nodes for o in n.outputs if o}
    for n in nodes:
        for i in n.inputs:
            if i and i not in producer and i not in defined:
                raise OnnxImportError(f"{n.label} reads {i!r}, which no node, graph input or initializer defines")
    for o in outputs:
        if o not in producer and o not in defined:
            raise OnnxImportError(f"graph output {o!r} is not defined by any node, input or initializer")
    waiting = {n.index: {producer[i].index for i in n.inputs if i in producer} for n in nodes}
    by_index = {n.index: n for n in nodes}
    users: dict[int, list[int]] = {}
    for idx, deps in waiting.items():
        for d in deps:
            users.setdefault(d, []).append(idx)
    ready = sorted(i for i, deps in waiting.items() if not deps)
    order: list[OnnxNode] = []
    while ready:
        idx = ready.pop(0)
        order.append(by_index[idx])
        for u in users.get(idx, []):
            waiting[u].discard(idx)
            if not waiting[u]:
                ready.append(u)
        ready.sort()
    if len(order) != len(nodes):
        stuck = {i for i, deps in waiting.items() if deps}
        raise OnnxImportError(f"the graph has a cycle: {_cycle_of(stuck, waiting, by_index)}")
    return order


def _cycle_of(stuck: set[int], waiting: Mapping[int, set[int]], nodes: Mapping[int, OnnxNode]) -> str:
    """One cycle among the stuck nodes, as 'a -> b -> a'."""
    path: list[int] = []
    at = min(stuck)
    while at not in path:
        path.append(at)
        at = min(d for d in waiting[at] if d in stuck)
    loop = path[path.index(at):] + [at]
    return " -> ".join(nodes[i].label for i in reversed(loop))
