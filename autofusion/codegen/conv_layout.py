"""Which tensors one convolution kernel hands to the next channels-last ([N, H, W, C]).

A packed convolution computes its tile as [positions x channels]; stored channel-major (NCHW) it is
transposed first, and the next convolution copies each channel's rows into its slab. Where a tensor
goes from one convolution kernel's tile epilogue straight into other convolutions' inputs, and nowhere
else, it is stored as its tile is: the producer writes rows of channels without the transpose, and each
consumer copies whole rows of positions into a channels-last slab and reads its taps at a pitch of C.
Nothing else sees such a tensor (not a graph input or output, no view, no other reader), so the layout
is the two kernels' business; the decision is made once per plan, before any kernel is rendered. So far
only where it was measured to pay: every consumer strided (a ResNet stage's output, into the next
stage's entry and downsample, see ``_strided``), with output rows the taps kernel cuts into blocks
within a row, which only AVX-512's has (TAPS_ROW_MIN): there a block's positions are read from one
pointer at constant displacements. Built for AVX2 (blocks across row ends, a register per position's
start) the same hand-over made ResNet-18's stride-2 3x3 convolutions 1.11-1.32x slower, and the
producers, whose epilogue then reads a channel-major residual across channels, 1.07-1.15x (Xeon).
"""

from __future__ import annotations

from collections.abc import Sequence

from autofusion.codegen.cores import TAPS_ROW_MIN, Machine
from autofusion.decide.plan import FusedGroup
from autofusion.graph.graph import Graph, Node
from autofusion.graph.types import DType
from autofusion.ops.registry import OpClass, OpRegistry

RENDERED_ALONE = frozenset({"conv_epilogue", "opaque"})  # kinds that render one Conv through codegen/conv.py


def channels_last_tensors(graph: Graph, groups: Sequence[FusedGroup], registry: OpRegistry,
                          machine: Machine) -> frozenset[str]:
    """The tensors stored [N, H, W, C] between convolution kernels built for ``machine`` (see the
    module doc)."""
    row_min = TAPS_ROW_MIN.get(machine.isa)
    if row_min is None:
        return frozenset()
    conv_of = {group.name: _lone_conv(graph, group, registry) for group in groups}
    group_of = {n: group for group in groups for n in group.nodes}
    found = set()
    for group in groups:
        conv = conv_of[group.name]
        if conv is None or len(group.outputs) != 1 or any(registry[graph.node_by_name[n].op].pooling
                                                           for n in group.nodes):
            continue  # (one output: nothing else of the kernel reads the convolution's values back)
        for t in group.outputs:
            consumers: Sequence[Node] = graph.consumers.get(t, ())
            if (consumers and t not in graph.outputs and t not in graph.inputs
                    and _tile_value(graph, group, conv, t, registry)
                    and all(c.op == "Conv" and c.inputs[0] == t and t not in c.inputs[1:] and _strided(c)
                            and graph.types[c.outputs[0]].shape[-1] >= row_min
                            and conv_of[group_of[c.name].name] is c for c in consumers)):
                found.add(t)
    return frozenset(found)


def _strided(conv: Node) -> bool:
    """Whether ``conv`` has a stride above 1: its channel-major slab is copied one strided element
    at a time, phase by phase, where a channels-last one copies runs of channels (ResNet-18's stride-2
    convolutions 0.80-0.96x the time, the 1x1 ones 0.89-0.93x); a stride-1 one copies whole rows
    either way, and its taps read 14 positions from 14 cache lines instead of one (ResNet's 3x3
    stride-1 convolutions 1.02-1.08x the time; Xeon with AVX-512, in the model)."""
    return any(int(s) > 1 for s in conv.attr("strides") or ())


def _lone_conv(graph: Graph, group: FusedGroup, registry: OpRegistry) -> Node | None:
    """The group's Conv where it is the group's only core and its kernel renders it over a 2-D image of
    float32 with one group of channels (a depthwise or grouped one reads its input otherwise)."""
    if group.template not in RENDERED_ALONE:
        return None
    nodes = [graph.node_by_name[n] for n in group.nodes]
    cores = [n for n in nodes if registry[n.op].core]
    if len(cores) != 1 or cores[0].op != "Conv":
        return None
    conv = cores[0]
    xt, wt = graph.types[conv.inputs[0]], graph.types[conv.inputs[1]]
    shape = xt.shape
    if (len(shape) != 4 or xt.dtype != DType.FLOAT32 or wt.dtype != DType.FLOAT32 or int(conv.attr("group", 1)) != 1
            or not all(isinstance(d, int) for d in shape) or shape[1] < 2):
        return None
    return conv


def _tile_value(graph: Graph, group: FusedGroup, conv: Node, tensor: str, registry: OpRegistry) -> bool:
    """Whether ``tensor`` is the convolution's output or computed from it, element for element, by the
    group's pointwise ops: the tile epilogue writes it while the tile is in cache."""
    y = conv.outputs[0]
    if graph.types[tensor].shape != graph.types[y].shape or graph.types[tensor].dtype != DType.FLOAT32:
        return False
    members = set(group.nodes)
    seen: dict[str, bool] = {}

    def from_conv(t: str) -> bool:
        if t == y:
            return True
        if t not in seen:
            node = graph.producers.get(t)
            seen[t] = (node is not None and node.name in members and registry[node.op].op_class is OpClass.POINTWISE
                       and any(graph.types[i].shape == graph.types[y].shape and from_conv(i) for i in node.inputs if i))
        return seen[t]

    return from_conv(tensor)
