"""Graph IR: immutable graphs of typed tensors, a builder, inference, a verifier, an interpreter."""

from autofusion.graph.graph import Const, FrozenMap, Graph, Node, freeze_attrs
from autofusion.graph.types import DType, TensorType
from autofusion.ir.builder import GraphBuilder, graph_from_nodes
from autofusion.ir.interpreter import InterpreterError, run_graph
from autofusion.ir.verify import VerifyError, verify

__all__ = [
    "Const",
    "DType",
    "FrozenMap",
    "Graph",
    "GraphBuilder",
    "InterpreterError",
    "Node",
    "TensorType",
    "VerifyError",
    "freeze_attrs",
    "graph_from_nodes",
    "run_graph",
    "verify",
]
