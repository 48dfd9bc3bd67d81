"""Scatter maps: where an element lands in a tensor computed from it by data movement alone.

A GEMM's epilogue holds a tile of the product; a training graph splits a QKV product into heads and
transposes them ([tokens, 3 x width] -> 3 x [batch, heads, tokens, dims]), each head a graph output
that the backward reads. Stored where those ops put it, each element of the tile needs no pass of
its own afterwards. ``landing`` follows a tensor's producers inside a group back to its source
through views (Reshape and the like), Transpose, Split and unit-step Slice, and maps an index of
the source forward: the tensor's index of that element, and the conditions under which the
element is in the tensor at all (the other parts of a Split, a Slice's cut ends).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass

from autofusion.codegen import index as ix
from autofusion.codegen.index import Index
from autofusion.codegen.views import static_slices
from autofusion.graph.dims import is_static
from autofusion.graph.graph import Graph, Node
from autofusion.ops.registry import OpRegistry

MOVES = frozenset({"Transpose", "Split", "Slice"})  # besides the registry's views


@dataclass(frozen=True)
class Cut:
    """``lo <= expr < hi``: the elements a Split part or a Slice keeps of an axis of ``whole``."""

    expr: str  # the source's index expression along the axis cut
    lo: int
    hi: int
    whole: int

    def conditions(self) -> tuple[str, ...]:
        """As comparisons (C or Triton), without the bounds that hold for every index of the axis."""
        return ((f"{self.expr} >= {self.lo}",) if self.lo > 0 else ()) + (
            (f"{self.expr} < {self.hi}",) if self.hi < self.whole else ())


@dataclass(frozen=True)
class Landing:
    """Element ``idx`` of the source is element ``index`` of the target when it is inside every
    cut, and in no element of the target otherwise."""

    index: Index
    cuts: tuple[Cut, ...]

    def conditions(self) -> tuple[str, ...]:
        return tuple(c for cut in self.cuts for c in cut.conditions())


def source_of(graph: Graph, members: Set[str], tensor: str, registry: OpRegistry) -> str:
    """The first tensor up ``tensor``'s producers (itself included) that no member moves data into."""
    while True:
        node = graph.producers.get(tensor)
        if node is None or node.name not in members or not _moves(node, registry):
            return tensor
        tensor = node.inputs[0]


def landing(graph: Graph, members: Set[str], source: str, target: str, idx: Index, registry: OpRegistry,
            reshape: Callable[[Index, Sequence[int], Sequence[int]], Index] = ix.reshape) -> Landing | None:
    """Where element ``idx`` of ``source`` lands in ``target``; None when ``target`` is not made
    from ``source`` by member views, transposes, splits and unit-step slices of static shapes.
    ``reshape`` is the backend's index arithmetic for a view (C's by default)."""
    steps = _steps(graph, members, source, target, registry)
    if steps is None:
        return None
    cuts: list[Cut] = []
    for node, pos in steps:
        in_shape, out_shape = graph.types[node.inputs[0]].shape, graph.types[node.outputs[pos]].shape
        if not all(is_static(n) for n in (*in_shape, *out_shape)):
            return None
        if node.op == "Transpose":
            perm = node.attr("perm")
            order = tuple(range(len(idx)))[::-1] if perm is None else tuple(int(p) for p in perm)
            idx = tuple(idx[p] for p in order)
        elif node.op in ("Split", "Slice"):
            cut = _cut(graph, node, pos)
            if cut is None:
                return None
            axis, start = cut
            cuts.append(Cut(idx[axis], start, start + int(out_shape[axis]), int(in_shape[axis])))
            idx = tuple(ix.sub(e, start) if d == axis else e for d, e in enumerate(idx))
        else:  # a view: the same elements in order, under the output's shape
            idx = reshape(idx, in_shape, out_shape)
    return Landing(idx, tuple(cuts))


def _moves(node: Node, registry: OpRegistry) -> bool:
    return registry[node.op].view or node.op in MOVES


def _steps(graph: Graph, members: Set[str], source: str, target: str,
           registry: OpRegistry) -> list[tuple[Node, int]] | None:
    """The (node, output position) chain from ``source`` to ``target``, source first."""
    steps: list[tuple[Node, int]] = []
    tensor = target
    while tensor != source:
        node = graph.producers.get(tensor)
        if node is None or node.name not in members or not _moves(node, registry):
            return None
        steps.append((node, node.outputs.index(tensor)))
        tensor = node.inputs[0]
    return steps[::-1]


def _cut(graph: Graph, node: Node, pos: int) -> tuple[int, int] | None:
    """(axis, first source index) of a Split's output ``pos`` or a Slice cutting one axis with
    step 1; None for any other slice."""
    in_shape = graph.types[node.inputs[0]].shape
    rank = len(in_shape)
    if node.op == "Split":
        axis = int(node.attr("axis", 0)) % rank
        return axis, sum(int(graph.types[node.outputs[k]].shape[axis]) for k in range(pos))
    slices = static_slices(graph, node)
    if slices is None:
        return None
    cuts = [(d, range(int(n))[s]) for d, (n, s) in enumerate(zip(in_shape, slices)) if range(int(n))[s] != range(int(n))]
    if len(cuts) != 1 or cuts[0][1].step != 1:
        return None
    return cuts[0][0], cuts[0][1].start
