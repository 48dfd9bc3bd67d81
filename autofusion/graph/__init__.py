"""The IR's data: typed tensors and the immutable graph of nodes, with no knowledge of any op.

The op registry (``autofusion.ops``) describes ops over these types, and the IR's tools
(``autofusion.ir``: builder, shape inference, verifier, interpreter) use both; ``autofusion.ir``
re-exports these names, so ``from autofusion.ir import Graph`` reads as before.
"""

from autofusion.graph.graph import Const, FrozenMap, Graph, Node, freeze_attrs
from autofusion.graph.types import DType, TensorType

__all__ = ["Const", "DType", "FrozenMap", "Graph", "Node", "TensorType", "freeze_attrs"]
