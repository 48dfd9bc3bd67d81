"""Graphviz DOT pictures of a graph before fusion and of a fusion plan.

Node identifiers are generated (``n0``, ``n1``, ...); every user-supplied name appears only inside
quoted, escaped labels, so any tensor or node name gives valid DOT. In the plan picture each fused
kernel is a coloured ``cluster_`` subgraph labelled with its kernel name, template and rules;
tensors that stay inside a kernel are drawn dashed, materialised ones solid.

>>> from autofusion.ir import GraphBuilder
>>> b = GraphBuilder("g")
>>> print(graph_dot(b.build([b.op("Relu", b.input("x", (2,)))])).splitlines()[0])
digraph "g" {
"""

from __future__ import annotations

from collections.abc import Sequence

from autofusion.decide.plan import FusedGroup, Plan
from autofusion.graph.graph import Graph, Node
from autofusion.graph.types import TensorType
from autofusion.kinds import KindRegistry, default_kinds


def template_colour(template: str, kinds: KindRegistry | None = None) -> str:
    """The fill colour the pictures and the report use for kernels of kind ``template``."""
    return (kinds or default_kinds()).colour(template)


def quote(text: str) -> str:
    """``text`` as a DOT double-quoted string (backslashes, quotes and newlines escaped)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "\\n")
    return f'"{escaped}"'


def _short(name: str, limit: int = 40) -> str:
    """Long exporter names (``/encoder/layer.0/attention/self/query/MatMul``) keep their tail."""
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


def _shape(t: TensorType) -> str:
    return f"{t.dtype}[{','.join(map(str, t.shape))}]"


class _Ids:
    """Generated DOT node ids for graph nodes and for graph inputs/outputs."""

    def __init__(self, graph: Graph) -> None:
        self.node = {n.name: f"n{i}" for i, n in enumerate(graph.nodes)}
        self.input = {name: f"in{i}" for i, name in enumerate(graph.inputs)}
        self.output = {name: f"out{i}" for i, name in enumerate(graph.outputs)}


def _header(name: str, title: str) -> list[str]:
    return [
        f"digraph {quote(name)} {{",
        f"  label={quote(title)}; labelloc=t; fontsize=18; fontname=\"Helvetica\";",
        "  rankdir=TB; nodesep=0.25; ranksep=0.35;",
        '  node [shape=box, style="rounded,filled", fillcolor="white", fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555", arrowsize=0.6];',
    ]


def _node_line(ids: _Ids, node: Node, fill: str | None = None) -> str:
    label = f"{node.op}\n{_short(node.name)}"
    colour = f", fillcolor={quote(fill)}" if fill else ""
    return f"{ids.node[node.name]} [label={quote(label)}, tooltip={quote(node.name)}{colour}];"


def _io_lines(graph: Graph, ids: _Ids) -> list[str]:
    lines = []
    for name, nid in ids.input.items():
        label = f"{_short(name)}\n{_shape(graph.types[name])}"
        lines.append(f'  {nid} [label={quote(label)}, shape=ellipse, style=filled, fillcolor="#e8e8ff"];')
    for name, nid in ids.output.items():
        label = f"{_short(name)}\n{_shape(graph.types[name])}"
        lines.append(f'  {nid} [label={quote(label)}, shape=ellipse, style=filled, fillcolor="#e8ffe8"];')
    return lines


def _edges(graph: Graph, ids: _Ids, internal: frozenset[str] = frozenset()) -> list[str]:
    """One edge per (producer, consumer, tensor); constants (weights) are not drawn."""
    lines = []
    for node in graph.nodes:
        for tensor in dict.fromkeys(node.inputs):
            if not tensor or tensor in graph.constants:
                continue
            producer = graph.producers.get(tensor)
            source = ids.node[producer.name] if producer is not None else ids.input.get(tensor)
            if source is None:
                continue
            style = ', style=dashed, color="#999999"' if tensor in internal else ""
            lines.append(f"  {source} -> {ids.node[node.name]} [label={quote(_shape(graph.types[tensor]))}{style}];")
    for name, nid in ids.output.items():
        producer = graph.producers.get(name)
        if producer is not None:
            lines.append(f"  {ids.node[producer.name]} -> {nid};")
        elif name in ids.input:
            lines.append(f"  {ids.input[name]} -> {nid};")
    return lines


def graph_dot(graph: Graph, title: str | None = None) -> str:
    """The graph as DOT: one box per node (op and name), edges labelled with tensor types."""
    ids = _Ids(graph)
    lines = _header(graph.name or "graph", title or f"{graph.name}: {len(graph.nodes)} nodes")
    lines += _io_lines(graph, ids)
    lines += [f"  {_node_line(ids, n)}" for n in graph.nodes]
    lines += _edges(graph, ids)
    lines.append("}")
    return "\n".join(lines) + "\n"


def group_label(group: FusedGroup) -> str:
    """Kernel name, template and kind, then the rules that fused it (one per line)."""
    rules = [f"{r.name} ({r.file.rsplit('/', 1)[-1]}:{r.line})" if r.file else r.name for r in group.rules]
    return "\n".join([f"{group.name}  [{group.template}, {group.kind}]", *rules])


def plan_dot(plan: Plan, title: str | None = None) -> str:
    """The plan's graph as DOT with one coloured cluster per fused kernel."""
    graph = plan.graph
    ids = _Ids(graph)
    lines = _header(graph.name or "graph", title or f"{graph.name} fused: {plan.kernels} kernels")
    lines += _io_lines(graph, ids)
    internal: set[str] = set()
    for index, group in enumerate(plan.groups):
        members = [graph.node_by_name[n] for n in group.nodes]
        colour = template_colour(group.template, plan.kinds)
        if not group.fused:
            fill = "#f7f7f7" if group.template == "view" else None
            lines.append(f"  {_node_line(ids, members[0], fill)}")
            continue
        outputs = set(group.outputs)
        internal.update(o for n in members for o in n.outputs if o and o not in outputs)
        lines.append(f"  subgraph cluster_{index} {{")
        lines.append(f"    label={quote(group_label(group))}; labeljust=l; fontsize=11;")
        lines.append(f'    style="rounded,filled"; fillcolor={quote(colour)}; color="#666666"; penwidth=1.2;')
        lines += [f"    {_node_line(ids, n)}" for n in members]
        lines.append("  }")
    lines += _edges(graph, ids, frozenset(internal))
    lines.append("}")
    return "\n".join(lines) + "\n"


def cluster_count(dot: str) -> int:
    """Clusters in a DOT text (what tests and callers check against the plan's fused groups)."""
    return sum(1 for line in dot.splitlines() if line.strip().startswith("subgraph cluster_"))


def legend_templates(groups: Sequence[FusedGroup]) -> list[str]:
    """Templates of the fused groups, in first-use order (for a colour legend)."""
    return list(dict.fromkeys(g.template for g in groups if g.fused))
