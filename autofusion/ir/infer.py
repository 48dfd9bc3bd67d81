"""Shape and dtype inference over a whole graph, through the op registry."""

from __future__ import annotations

from collections.abc import Mapping

from autofusion.graph.graph import Const, Node
from autofusion.graph.types import TensorType
from autofusion.ops.registry import InferContext, OpRegistry, ShapeError


def node_context(
    node: Node,
    types: Mapping[str, TensorType],
    constants: Mapping[str, Const],
) -> InferContext:
    """The inference context of ``node`` given the types and constants known so far."""
    in_types = tuple(types.get(i) if i else None for i in node.inputs)
    consts = tuple((constants[i].array if i in constants else None) if i else None for i in node.inputs)
    return InferContext(node, in_types, consts)


def infer_node(
    node: Node,
    types: Mapping[str, TensorType],
    constants: Mapping[str, Const],
    registry: OpRegistry,
) -> tuple[TensorType, ...]:
    """Output types of ``node``; ShapeError says what is inconsistent, naming the node."""
    for i in node.inputs:
        if i and i not in types:
            raise ShapeError(f"node {node.name!r} ({node.op}): input {i!r} is not defined before it")
    opdef = registry[node.op]
    n_in = len(node.inputs)
    if n_in < opdef.min_inputs or (opdef.max_inputs is not None and n_in > opdef.max_inputs):
        raise ShapeError(f"node {node.name!r} ({node.op}): takes {opdef.min_inputs}"
                         f"..{opdef.max_inputs if opdef.max_inputs is not None else 'n'} inputs, got {n_in}")
    try:
        outs = registry.infer(node_context(node, types, constants))
    except ShapeError as e:
        raise ShapeError(f"node {node.name!r} ({node.op}): {e}") from None
    except (ValueError, IndexError, TypeError, KeyError) as e:
        raise ShapeError(f"node {node.name!r} ({node.op}): bad inputs or attributes: {e}") from None
    return outs[: len(node.outputs)] if node.outputs else outs
