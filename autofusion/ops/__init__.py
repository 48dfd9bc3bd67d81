"""The op registry: classes, signatures, inference, numpy references and cost formulas of ops."""

from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import InferContext, OpClass, OpDef, OpRegistry, ShapeError, UnknownOpError

__all__ = ["InferContext", "OpClass", "OpDef", "OpRegistry", "ShapeError", "UnknownOpError", "default_registry"]
