"""FX graphs that TorchDynamo traced with symbolic sizes, made static for one call's sizes.

After an input's shape changes, Dynamo traces the function again with that size symbolic (``s0``):
the placeholders' example values have symbolic shapes, the size may come in as an integer
placeholder, and the graph computes views' sizes from it. The SuperKernels take static shapes, so
:func:`specialized` gives the graph at one call's sizes: the example values propagated from the
call's tensors, and every integer the graph computes replaced by its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autofusion.frontends.fx_nodes import MODULE_STATE, example_value, is_module_state


def has_symbolic_sizes(gm: Any, example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo traced ``gm`` with a size symbolic: an integer input that is a SymInt, or a
    placeholder whose example tensor has a dimension that is not a plain int."""
    import torch

    if any(isinstance(v, torch.SymInt) for v in example_inputs):
        return True
    for node in gm.graph.nodes:
        value = example_value(node) if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and any(type(d) is not int for d in value.shape):
            return True
    return False


def record_module_state(gm: Any) -> None:
    """Mark each placeholder of ``gm`` with whether it carries module state (a parameter or buffer):
    Dynamo's graph arguments say so only until the backend returns, and a graph compiled per size
    is compiled later, at a call."""
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta[MODULE_STATE] = is_module_state(node)


def specialized(gm: Any, args: Sequence[Any]) -> Any:
    """A copy of ``gm`` at the sizes of ``args`` (the call's tensors and integers, one per
    placeholder): each node's example value is a fake tensor of its static shape, and each integer
    the graph computes (a size, a product of sizes) is a constant in the nodes that read it. The
    placeholders stay, so the copy is called as ``gm`` is."""
    import torch
    import torch.fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))  # (node_copy copies each node's meta)
    copy = torch.fx.GraphModule(gm, graph)
    _read_scalar_inputs(copy, args)
    with torch.no_grad():
        FakeTensorProp(copy, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
    for node in list(copy.graph.nodes):
        if node.op == "output":
            continue
        value = node.meta.get("val")
        node.meta["example_value"] = value
        constant = _constant(value)
        if constant is not None:
            _replace_by_constant(node, constant)
            if node.op != "placeholder":
                copy.graph.erase_node(node)
    copy.recompile()
    return copy


def scalar_inputs(gm: Any) -> tuple[int, ...]:
    """The positions of the placeholders ``gm`` reads a number from (``.item()``): with
    ``dynamic=True`` Dynamo passes a module's float attribute (a LayerNorm's eps) as a 0-d tensor.
    A static graph holds their values as constants, so they are part of what it is built for."""
    return tuple(sorted({i for i, _ in _item_reads(gm)}))


def _item_reads(gm: Any) -> list[tuple[int, Any]]:
    """(placeholder position, the node reading its number) for each ``.item()`` of an input."""
    placeholders = {node: i for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    reads = []
    for node in gm.graph.nodes:
        reads_item = (node.op == "call_method" and node.target == "item") or "_local_scalar_dense" in str(node.target)
        source = node.args[0] if reads_item and node.args else None
        if source in placeholders:
            reads.append((placeholders[source], node))
    return reads


def _read_scalar_inputs(gm: Any, args: Sequence[Any]) -> None:
    """Each ``.item()`` of an input replaced by its value in this call (fake tensors have none)."""
    for position, node in _item_reads(gm):
        _replace_by_constant(node, args[position].item())
        gm.graph.erase_node(node)


def _constant(value: Any) -> Any:
    """``value`` as a constant an FX node may take: a number, or a shape (``x.size()``) as a tuple of
    ints; None for anything else (a tensor)."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (tuple, list)) and value and all(type(v) is int for v in value):
        return tuple(value)
    return None


def _replace_by_constant(node: Any, value: Any) -> None:
    """Every use of ``node`` reads ``value`` instead."""
    import torch.fx

    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda a: value if a is node else a)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a: value if a is node else a)
