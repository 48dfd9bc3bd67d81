"""The op registry: classes, signatures, inference, numpy references and cost formulas of ops."""

import autofusion.ir  # noqa: F401  (the IR package first: it imports the registry, which imports the IR)
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import InferContext, OpClass, OpDef, OpRegistry, ShapeError, UnknownOpError

__all__ = ["InferContext", "OpClass", "OpDef", "OpRegistry", "ShapeError", "UnknownOpError", "default_registry"]
