"""Loops: instances of a recurrence's cell, chained along their carried values.

A loop rule's body gives, for each carried value, the term computing its next value. Each match of
the body's terms is one time step's cell; cells whose inputs for the carried values are the
previous cell's outputs form a chain, and a chain of two or more steps is one loop candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autofusion.dsl.ir import FusionRule
from autofusion.engine.match import Match
from autofusion.engine.space import LoopCandidate, RuleRef
from autofusion.graph.graph import Graph


def chain_cells(
    graph: Graph,
    rule: FusionRule,
    ref: RuleRef,
    matches: Sequence[Sequence[Match]],
    node_of: Callable[[str], str],
) -> list[LoopCandidate]:
    """Loop candidates of ``rule`` from the matches of its body terms (one list per carried value)."""
    carried = rule.carried
    if not carried or len(matches) != len(carried):
        return []
    # a step: the carried values it reads (e-classes) -> its nodes and the values it produces
    steps: dict[tuple[str, ...], tuple[set[str], list[str]]] = {}
    for i, ms in enumerate(matches):
        for m in ms:
            reads = tuple(m.vars.get(c, "") for c in carried)
            if "" in reads:
                continue
            nodes, produced = steps.setdefault(reads, (set(), [""] * len(carried)))
            nodes.update(n for n in (node_of(e) for _, e, _, _ in m.ops) if n)
            produced[i] = m.root
    complete = {reads: v for reads, v in steps.items() if all(v[1])}
    following = {reads: tuple(produced) for reads, (_, produced) in complete.items()}
    starts = set(complete) - set(following.values())
    out = []
    for start in sorted(starts):
        chain = [start]
        while following[chain[-1]] in complete and len(chain) <= len(complete):
            chain.append(following[chain[-1]])
        if len(chain) >= 2:
            index = {n.name: i for i, n in enumerate(graph.nodes)}
            cells = tuple(tuple(sorted(complete[r][0] | _input_slices(graph, complete[r][0]), key=index.__getitem__))
                          for r in chain)
            out.append(LoopCandidate(ref, rule.template or "lstm_scan", cells, rule.params))
    return out


def _input_slices(graph: Graph, cell: set[str]) -> set[str]:
    """Gathers that pick this step's slice of a model input (x[:, t]) for this step alone: in the loop
    kernel they are an offset into the input, not a tensor stored for each step before the loop."""
    out = set()
    for name in cell:
        for t in graph.node_by_name[name].inputs:
            node = graph.producers.get(t)
            if (node is None or node.op != "Gather" or node.name in cell or graph.producers.get(node.inputs[0])
                    is not None or graph.types[node.inputs[1]].shape != () or not graph.is_const(node.inputs[1])):
                continue
            if all(c.name in cell for c in graph.consumers.get(t, ())):
                out.add(node.name)
    return out
